"""Read the task-record traces of the data directory (``$LEADTIME_DATA``) into
:class:`~learners.replay.TraceTask`.

Formats, told apart by their header:

- TaskVine transaction logs re-encoded one row per task (ipdps2024, coffea):
  peaks of cores, memory and disk, wall time, average cores, submit times and the
  run's concurrency; one category per row; ordered by task id.
- Tovar et al.'s job sizing CSVs (bioblast, lobster): category, cores, memory, disk, wall time
  (average cores from CPU time where recorded).
- k-Segments task tables with their memory series (``<wf>_memory_series.csv.gz`` beside):
  category = process, input = total input size, cores = peak CPU % / 100,
  requests from ``max_cpus``/``max_mem``; wall time and memory from the series,
  which is therefore read with the table. Tasks whose series is missing are skipped.
- Nextflow traces (nf-core): category = process, input = ``rchar``, cores = %cpu / 100,
  memory = ``peak_rss``, wall = ``realtime``, requests from ``cpus``/``memory``;
  only COMPLETED rows, in submission order, at their submit times.

Memory and disk are in MB of 2^20 bytes.
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from learners.attempt_end import MemorySeries
from learners.replay import TraceTask
from learners.resources import Resource, Resources
from workflows.datasets import data_dir

MB = float(2**20)


class TraceError(ValueError):
    """A trace file is missing, unreadable or of an unknown format."""


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    tasks: tuple[TraceTask, ...]
    resources: tuple[Resource, ...]
    """The resources the trace measured."""
    concurrency: tuple[float, ...] = ()
    """When the recorded run first ran 1, 2, ... tasks at once (seconds after its first
    start; TaskVine logs): where every task held a whole worker, when the workers came."""

    @property
    def has_series(self) -> bool:
        return any(t.series is not None for t in self.tasks)


def load_trace(path: str | Path) -> Trace:
    """The trace at ``path`` (any format above)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist")
    with _open(path) as f:
        header = next(csv.reader(f), [])
    name = path.name.removesuffix(".gz").removesuffix(".csv").removesuffix(".tasks")
    columns = set(header)
    if {"task_id", "category", "peak_memory_mb", "wall_time_s"} <= columns:
        tasks, concurrency = _taskvine(path)
        return Trace(name, tasks, ("cores", "memory", "disk"), concurrency)
    if header[:6] == ["category", "cores", "memory", "disk", "cpu_time", "wall_time"]:
        return Trace(name, _jobsizing(path), ("cores", "memory", "disk"))
    if {"task_idx", "process", "peak_mem_mb", "files_input_total_size"} <= columns:
        return Trace(name, _ksegments(path), ("cores", "memory"))
    if {"process", "peak_rss", "rchar", "realtime", "status"} <= columns:
        return Trace(name, _nextflow(path), ("cores", "memory"))
    raise TraceError(f"{path}: unknown trace format (columns: {', '.join(header[:8])} ...)")


def all_traces() -> list[Path]:
    """Every task trace of the shared data: the ground truth of each format's files."""
    root = data_dir()
    return [
        *sorted((root / "ipdps2024").glob("synthetic_*_whole.tasks.csv")),
        *(root / "jobsizing" / f for f in ("bioblast.csv", "lobsterCMSsimulation.csv")),
        root / "jobsizing" / "coffea.tasks.csv",
        *sorted((root / "k-segments").glob("*_tasks.csv")),
        *sorted((root / "nfcore").glob("trace_*.csv")),
    ]


def _open(path: Path):
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else open(path, newline="")


def _rows(path: Path) -> list[dict[str, str]]:
    with _open(path) as f:
        return list(csv.DictReader(f))


def _float(row: dict[str, str], column: str, path: Path) -> float:
    try:
        return float(row[column])
    except (KeyError, ValueError):
        raise TraceError(f"{path}: bad {column} {row.get(column)!r}") from None


def _taskvine(path: Path) -> tuple[tuple[TraceTask, ...], tuple[float, ...]]:
    rows = sorted(_rows(path), key=lambda row: int(row["task_id"]))
    first = min((_float(row, "submit_us", path) for row in rows), default=0.0)
    tasks = tuple(
        TraceTask(
            row["category"],
            Resources(
                _float(row, "peak_cores", path),
                _float(row, "peak_memory_mb", path),
                _float(row, "peak_disk_mb", path),
                _float(row, "wall_time_s", path),
            ),
            submit=(_float(row, "submit_us", path) - first) / 1e6,
            cpu=_float(row, "avg_cores", path),
        )
        for row in rows
    )
    spans = [(_float(row, "start_s", path), _float(row, "end_s", path)) for row in rows]
    if spans and spans[0][0] > 1e12:  # some logs give start and end in microseconds
        spans = [(start / 1e6, end / 1e6) for start, end in spans]
    return tasks, concurrency(spans)


def concurrency(spans: list[tuple[float, float]]) -> tuple[float, ...]:
    """When 1, 2, ... of the (start, end) spans first ran at once, after the first start."""
    if not spans:
        return ()
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    origin = events[0][0]
    running, reached = 0, []
    for time, step in events:
        running += step
        if running > len(reached):
            reached.append(time - origin)
    return tuple(reached)


def _jobsizing(path: Path) -> tuple[TraceTask, ...]:
    tasks = []
    for row in _rows(path):
        peak = Resources(*(_float(row, c, path) for c in ("cores", "memory", "disk", "wall_time")))
        cpu = _float(row, "cpu_time", path)
        use = cpu / peak.wall if cpu > 0 and peak.wall > 0 else None
        tasks.append(TraceTask(row["category"], peak, cpu=use))
    return tuple(tasks)


def _ksegments(path: Path) -> tuple[TraceTask, ...]:
    series_path = path.with_name(path.name.replace("_tasks.csv", "_memory_series.csv.gz"))
    if not series_path.is_file():
        raise TraceError(f"{path}: its memory series {series_path.name} is missing")
    series = _series(series_path)
    rows = [r for r in _rows(path) if r["mem_file_missing"] == "0" and int(r["task_idx"]) in series]
    rows.sort(key=lambda row: int(row["tid"]))
    tasks = []
    for row in rows:
        s = series[int(row["task_idx"])]
        requested = {
            "cores": _float(row, "max_cpus", path),
            "memory": _float(row, "max_mem", path) / MB,
        }
        cores = _float(row, "peak_cpu_pct", path) / 100
        peak = Resources(cores, float(s.mb.max()), 0.0, float(s.times[-1]))
        size = _float(row, "files_input_total_size", path)
        tasks.append(TraceTask(row["process"], peak, size, requested, s))
    return tuple(tasks)


def _series(path: Path) -> dict[int, MemorySeries]:
    """All series of a ``task_idx,t_s,mem_mb`` file, by task."""
    with gzip.open(path, "rb") as f:
        header, _, body = f.read().partition(b"\n")
    if header.strip() != b"task_idx,t_s,mem_mb":
        raise TraceError(f"{path}: expected columns task_idx,t_s,mem_mb, got {header!r}")
    table = np.array(body.replace(b"\n", b",").rstrip(b",").split(b","), dtype=float).reshape(-1, 3)
    index = table[:, 0].astype(int)
    starts = np.flatnonzero(np.diff(index)) + 1
    out = {}
    for chunk in np.split(table, starts):
        out[int(chunk[0, 0])] = MemorySeries(chunk[:, 1].copy(), chunk[:, 2].copy())
    return out


def _nextflow(path: Path) -> tuple[TraceTask, ...]:
    rows = [r for r in _rows(path) if r["status"] == "COMPLETED"]
    rows.sort(key=lambda row: (int(row["submit"]), int(row["task_id"])))
    first = int(rows[0]["submit"]) if rows else 0
    tasks = []
    for row in rows:
        peak = Resources(
            _float(row, "%cpu", path) / 100,
            _float(row, "peak_rss", path) / MB,
            0.0,
            _float(row, "realtime", path) / 1000,
        )
        requested = {"cores": _float(row, "cpus", path), "memory": _float(row, "memory", path) / MB}
        submit = (int(row["submit"]) - first) / 1000
        size = _float(row, "rchar", path)
        tasks.append(TraceTask(row["process"], peak, size, requested, submit=submit))
    return tuple(tasks)


def taskvine_kills(path: str | Path) -> list[tuple[str, float, float, float]]:
    """The attempts a TaskVine transaction log shows killed for memory or disk, of tasks that
    then succeeded: (resource, allocation / peak, wall time / the successful attempt's
    wall time, (reported - allocation) / (peak - allocation)); the samples of
    :func:`learners.kill_times.fit`. Peaks are the successful attempt's measurements.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"transaction log {path} does not exist")
    allocations: dict[str, dict] = {}
    killed: dict[str, list[tuple[dict, dict, dict]]] = {}
    succeeded: dict[str, dict] = {}
    decoder = json.JSONDecoder()
    with _open(path) as f:
        for line in f:
            parts = line.split(" ", 6)
            if len(parts) < 6 or parts[2] != "TASK":
                continue
            task, event = parts[3], parts[4]
            if event == "RUNNING":
                allocations[task] = json.loads(line[line.index("{") :])
            elif event == "RETRIEVED" and len(parts) == 7:
                status, rest = parts[5], parts[6]
                limits, end = decoder.raw_decode(rest, rest.index("{"))
                measured, _ = decoder.raw_decode(rest, rest.index("{", end))
                if status == "RESOURCE_EXHAUSTION" and task in allocations:
                    killed.setdefault(task, []).append((limits, measured, allocations[task]))
                elif status == "SUCCESS":
                    succeeded[task] = measured
    samples = []
    for task, attempts in killed.items():
        ok = succeeded.get(task)
        if ok is None or ok["wall_time"][0] <= 0:
            continue
        for limits, measured, allocation in attempts:
            for resource in ("memory", "disk"):
                peak = ok[resource][0]
                if resource not in limits or resource not in allocation or peak <= 0:
                    continue
                given = allocation[resource][0]
                span = peak - given
                reached = (measured[resource][0] - given) / span if span > 0 else 1.0
                fraction = measured["wall_time"][0] / ok["wall_time"][0]
                samples.append((resource, given / peak, fraction, reached))
    return samples
