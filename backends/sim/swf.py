"""Reader of Standard Workload Format traces (Parallel Workloads Archive).

A trace is a ``;`` header of ``Key: value`` lines and one line of 18
whitespace-separated numbers per job, ``-1`` meaning unknown. Jobs come back as
one numpy structured array so that a replay of 200,000 jobs costs a few vector
operations, not a Python object per line.
"""

from __future__ import annotations

import functools
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workflows.datasets import DataNotFound, data_dir

#: The 18 SWF fields in file order; times in seconds, memory in KB per processor.
FIELDS: tuple[tuple[str, type], ...] = (
    ("job_id", np.int64),
    ("submit", np.float64),
    ("wait", np.float64),
    ("run", np.float64),
    ("alloc_procs", np.int64),
    ("avg_cpu", np.float64),
    ("used_mem", np.int64),
    ("req_procs", np.int64),
    ("req_time", np.float64),
    ("req_mem", np.int64),
    ("status", np.int64),
    ("user", np.int64),
    ("group", np.int64),
    ("app", np.int64),
    ("queue", np.int64),
    ("partition", np.int64),
    ("prev_job", np.int64),
    ("think_time", np.float64),
)
DTYPE = np.dtype([(name, kind) for name, kind in FIELDS])

#: The queue logs shipped with leadtime (``backends/sim/traces``, see its NOTICE), by short name.
BUILTIN_TRACES = {
    "HPC2N": "HPC2N-2002-2.2-cln.swf.gz",
    "KTH": "KTH-SP2-1996-2.1-cln.swf.gz",
    "CTC": "CTC-SP2-1996-3.1-cln.swf.gz",
}
TRACES_DIR = Path(__file__).resolve().parent / "traces"

_HEADER_LINE = re.compile(rb"^\s*;\s*([A-Za-z][A-Za-z0-9]*)\s*:\s*(.*?)\s*$")
_LEADING_INT = re.compile(r"^\s*(-?\d+)")
_NUMBER = re.compile(rb"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


class SwfError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class SwfHeader:
    """The ``; Key: value`` lines, in file order (keys such as ``Queue`` repeat)."""

    entries: tuple[tuple[str, str], ...]

    def get(self, key: str) -> str | None:
        """The first value of ``key`` (case-insensitive), or None."""
        key = key.lower()
        return next((v for k, v in self.entries if k.lower() == key), None)

    def integer(self, key: str) -> int | None:
        """The leading integer of a value: ``MaxNodes: 338 (batch partition; 512 total)`` is 338."""
        value = self.get(key)
        match = _LEADING_INT.match(value) if value else None
        return int(match.group(1)) if match else None

    @property
    def max_procs(self) -> int | None:
        return self.integer("MaxProcs")

    @property
    def max_nodes(self) -> int | None:
        return self.integer("MaxNodes")

    @property
    def unix_start_time(self) -> int | None:
        return self.integer("UnixStartTime")

    @property
    def time_zone_string(self) -> str | None:
        return self.get("TimeZoneString")


@dataclass(frozen=True)
class SwfTrace:
    """A parsed trace: header and a read-only structured array of jobs (fields :data:`FIELDS`)."""

    path: Path
    header: SwfHeader
    jobs: np.ndarray

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".gz").removesuffix(".swf")

    def procs(self) -> np.ndarray:
        """Requested processors, or allocated ones where the request is unknown (CTC)."""
        req, alloc = self.jobs["req_procs"], self.jobs["alloc_procs"]
        return np.where(req > 0, req, alloc)

    def time_limits(self) -> np.ndarray:
        """Requested times; where unknown, the longest request in the trace.

        A job without ``--time`` gets its partition's limit, and the longest
        request seen is the best estimate of that limit the trace offers. A
        trace without any request falls back to its longest runtime.
        """
        req = self.jobs["req_time"]
        known = req > 0
        if known.any():
            fallback = req[known].max()
        else:
            fallback = max(float(self.jobs["run"].max(initial=0.0)), 1.0)
        return np.where(known, req, fallback)

    def max_procs(self) -> int:
        """Processors of the machine: the header's MaxProcs, else the most processors the
        recorded schedule had busy at once, or the largest job if that is more."""
        if self.header.max_procs:
            return self.header.max_procs
        schedule = RecordedSchedule.of(self)
        return max(int(self.procs().max(initial=1)), schedule.peak(schedule.procs))


@dataclass(frozen=True)
class RecordedSchedule:
    """The jobs that ran, as the log records them: start, end, processors, user."""

    start: np.ndarray
    end: np.ndarray
    procs: np.ndarray
    user: np.ndarray

    @classmethod
    def of(cls, trace: SwfTrace) -> RecordedSchedule:
        jobs = trace.jobs
        procs = np.where(jobs["alloc_procs"] > 0, jobs["alloc_procs"], trace.procs())
        ran = (jobs["wait"] >= 0) & (jobs["run"] > 0) & (procs > 0)
        start = (jobs["submit"] + jobs["wait"])[ran]
        return cls(start, start + jobs["run"][ran], procs[ran], jobs["user"][ran])

    def __len__(self) -> int:
        return len(self.start)

    def peak(self, weight: np.ndarray, by_user: bool = False) -> int:
        """The largest total ``weight`` running at once (within one user's jobs with
        ``by_user``; users unknown to the log are left out)."""
        keep = self.user >= 0 if by_user else np.ones(len(self), bool)
        if not keep.any():
            return 0
        w = weight[keep].astype(np.int64)
        times = np.concatenate([self.start[keep], self.end[keep]])
        delta = np.concatenate([w, -w])
        group = np.tile(self.user[keep], 2) if by_user else np.zeros(times.size, np.int64)
        # A user's events in time order, ends before starts at the same instant; each
        # user's running total returns to 0, so one cumulative sum serves every user.
        order = np.lexsort((delta, times, group))
        return int(np.cumsum(delta[order]).max())


def trace_path(trace: str | Path) -> Path:
    """A shipped log's name (HPC2N, KTH, CTC; any case), a path to an SWF file, or the name of
    an SWF log in the data directory's ``swf/`` (``$LEADTIME_DATA``; any case):
    ``SDSC-BLUE`` for ``SDSC-BLUE-2000-4.2-cln.swf.gz``."""
    builtin = BUILTIN_TRACES.get(str(trace).upper())
    if builtin is not None:
        return TRACES_DIR / builtin
    path = Path(trace)
    if path.is_file():
        return path
    tried = f"trace {str(trace)!r} is not one of {', '.join(BUILTIN_TRACES)}, nor a file"
    if path.name != str(trace):
        raise DataNotFound(tried)
    try:
        logs = data_dir() / "swf"
    except DataNotFound:
        raise DataNotFound(f"{tried}, and no data directory is set (LEADTIME_DATA)") from None
    found = _logs_named(logs, path.name)
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise DataNotFound(f"trace {str(trace)!r} names several logs in {logs}: {names}")
    if not found:
        raise DataNotFound(f"{tried}, nor an SWF log {path.name}[-*].swf[.gz] in {logs}")
    return found[0]


def _logs_named(directory: Path, name: str) -> list[Path]:
    """The ``.swf`` and ``.swf.gz`` files of ``directory`` named ``name``, with or without
    their extension, or ``name-...`` (any case)."""
    if not directory.is_dir():
        return []
    key = name.upper()
    found = []
    for path in sorted(directory.iterdir()):
        file = path.name.upper()
        log = file.removesuffix(".GZ")
        if not log.endswith(".SWF") or not path.is_file():
            continue
        stem = log.removesuffix(".SWF")
        if key in (file, log, stem) or stem.startswith(f"{key}-"):
            found.append(path)
    return found


def load_trace(trace: str | Path) -> SwfTrace:
    """:func:`read_swf` of :func:`trace_path`, cached by file (the jobs array is read-only)."""
    return _read_cached(trace_path(trace).resolve())


@functools.lru_cache(maxsize=4)
def _read_cached(path: Path) -> SwfTrace:
    return read_swf(path)


def read_swf(path: str | Path) -> SwfTrace:
    """Parse an SWF file, gzip-compressed (``.gz``) or plain."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise SwfError(f"{path}: cannot read: {e}") from e
    lines = raw.split(b"\n")
    entries: list[tuple[str, str]] = []
    data: list[bytes] = []
    numbers: list[int] = []
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(b";"):
            match = _HEADER_LINE.match(line)
            if match:
                entries.append((match.group(1).decode(), match.group(2).decode(errors="replace")))
            continue
        data.append(stripped)
        numbers.append(lineno)
    table = _parse_numbers(path, data, numbers)
    jobs = np.empty(len(table), DTYPE)
    for column, (name, kind) in enumerate(FIELDS):
        values = table[:, column]
        if kind is np.int64:
            fractional = np.flatnonzero(values != np.floor(values))
            if fractional.size:
                row = int(fractional[0])
                raise SwfError(
                    f"{path}:{numbers[row]}: field {column + 1} ({name}) must be an integer, "
                    f"got {values[row]:g}"
                )
        jobs[name] = values
    jobs.flags.writeable = False
    return SwfTrace(path=path, header=SwfHeader(tuple(entries)), jobs=jobs)


def _parse_numbers(path: Path, data: list[bytes], numbers: list[int]) -> np.ndarray:
    """The job lines as an (n, 18) float array; a bad line is named by its line number."""
    if not data:
        return np.empty((0, len(FIELDS)))
    try:
        table = np.loadtxt(data, dtype=np.float64, ndmin=2, comments=None)
    except ValueError:
        table = None
    if table is not None and table.shape[1] == len(FIELDS):
        bad = np.flatnonzero(~np.isfinite(table).all(axis=1))
        if not bad.size:
            return table
        row = int(bad[0])
        raise SwfError(f"{path}:{numbers[row]}: not a finite number: {data[row].decode()!r}")
    for line, lineno in zip(data, numbers, strict=True):
        fields = line.split()
        if len(fields) != len(FIELDS):
            raise SwfError(f"{path}:{lineno}: expected {len(FIELDS)} fields, found {len(fields)}")
        for column, token in enumerate(fields):
            if not _NUMBER.match(token):
                name = FIELDS[column][0]
                raise SwfError(
                    f"{path}:{lineno}: field {column + 1} ({name}) is not a number: "
                    f"{token.decode(errors='replace')!r}"
                )
    raise SwfError(f"{path}: job lines numpy cannot parse, though each looks numeric")
