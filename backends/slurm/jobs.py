"""What Slurm says about jobs: ``squeue --json`` and ``scontrol show job -o`` read into records.

Records keep Slurm's Unix times, so that two polls of an unchanged job compare equal;
:meth:`JobRecord.info` converts them to the loop's clock when a change is reported.
Parsed against Slurm 22.05 (openapi v0.0.38); numbers given as ``{"set", "number"}``
objects and states given as lists, as later releases print them, are read too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from backends import clock
from backends.base import JobInfo, JobState, NodeShare

# Every state string Slurm prints (base states and the flags that replace them), mapped onto
# the protocol's states. A job that still holds its nodes counts as RUNNING.
_STATES = {
    "PENDING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
    "NODE_FAIL": JobState.NODE_FAIL,
    "BOOT_FAIL": JobState.NODE_FAIL,
}


class SlurmOutputError(Exception):
    """A Slurm command printed something this module cannot read."""


class SlurmReportedError(SlurmOutputError):
    """``squeue --json`` reported a failure inside its output (e.g. no controller)."""


@dataclass(slots=True)
class Seen:
    """What the backend saw of one job itself, in Unix time. Slurm's times are whole seconds,
    cut down: a job submitted at x.7 s reports x, and one released at y.4 s may report
    ending at y, before the moment it was last seen running."""

    submitted: float
    """When we asked for it: none of its times is earlier."""
    pending: float | None = None
    """The last moment it was seen pending: it started later."""
    alive: float | None = None
    """The last moment it was seen not ended: it ended later."""

    def saw(self, state: JobState, at: float) -> None:
        """A query that began at ``at`` found the job in ``state``."""
        if state is JobState.PENDING:
            self.pending = at
        if not state.finished:
            self.alive = at


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as Slurm reported it; times are Unix seconds, None when not (yet) known."""

    job_id: str
    state: JobState
    reason: str = ""
    name: str = ""
    comment: str = ""
    user_id: int | None = None
    submit_time: float | None = None
    eligible_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    nodes: tuple[NodeShare, ...] = ()
    completing: bool = False
    """Slurm shows it COMPLETING in place of how it ended: it has ended, how is not shown,
    and its nodes are cleaning up (a node that no longer answers keeps it so until Slurm
    declares the node down, 5 minutes by default)."""

    def info(self) -> JobInfo:
        """The protocol's view, with times on the running loop's clock."""
        offset = clock.from_epoch(0.0)  # one reading, so that differences stay exact

        def loop_time(t: float | None) -> float | None:
            return None if t is None else t + offset

        return JobInfo(
            job_id=self.job_id,
            state=self.state,
            reason=self.reason,
            submit_time=loop_time(self.submit_time),
            eligible_time=loop_time(self.eligible_time),
            start_time=loop_time(self.start_time),
            end_time=loop_time(self.end_time),
            nodes=self.nodes,
        )

    def bounded(self, seen: Seen | None) -> JobRecord:
        """This job's times within what the backend saw of it itself (see :class:`Seen`)."""
        if seen is None:
            return self

        def at_least(t: float | None, *moments: float | None) -> float | None:
            if t is None:
                return None
            return max(t, seen.submitted, *(m for m in moments if m is not None))

        start = at_least(self.start_time, seen.pending)
        return replace(
            self,
            submit_time=at_least(self.submit_time),
            eligible_time=at_least(self.eligible_time),
            start_time=start,
            end_time=at_least(self.end_time, seen.alive, start),
        )

    def cancelled(self) -> JobRecord:
        """This job, COMPLETING after we cancelled it: cancelled, what is left being Slurm's."""
        return replace(self, state=JobState.CANCELLED, nodes=(), completing=False)

    def vanished(self) -> JobRecord:
        """This job after slurmctld forgot it before we saw it end: its outcome is unknown."""
        return replace(self, state=JobState.FAILED, reason="NotFound", nodes=())


def job_state(name: str) -> JobState:
    try:
        return _STATES[name]
    except KeyError:
        raise SlurmOutputError(f"unknown Slurm job state {name!r}") from None


def _state(shown: str | list[str]) -> tuple[JobState, bool]:
    """A job's state, and whether it is completing with its outcome hidden, from the state
    Slurm shows: one word (22.05 and ``scontrol`` show ``COMPLETING`` in place of how the job
    ended), or the base state and its flags (later releases: ``["CANCELLED",
    "COMPLETING"]`` tells how it ended, its nodes still cleaning up, which is Slurm's)."""
    name = shown[0] if isinstance(shown, list) else shown
    return job_state(name), name == "COMPLETING"


def parse_squeue_json(text: str) -> dict[str, JobRecord]:
    """All jobs in ``squeue --json`` output, by job id.

    Slurm 22.05 prints an empty job list and exit status 0 when the controller does not
    answer, with the failure only in ``errors``: that raises :class:`SlurmOutputError`.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlurmOutputError(f"squeue --json printed no JSON: {e}") from None
    if data.get("errors"):
        messages = "; ".join(
            str(e.get("description") or e.get("error") or e) for e in data["errors"]
        )
        raise SlurmReportedError(f"squeue --json reported: {messages}")
    records = (_from_json(job) for job in data.get("jobs", ()))
    return {r.job_id: r for r in records}


def _from_json(job: Mapping[str, Any]) -> JobRecord:
    state, completing = _state(job["job_state"])
    # Pending jobs carry an estimated start, running ones their time-limit end, and a job
    # cancelled while pending its cancel time as start: only a job that got nodes started.
    started = bool(job.get("batch_host") or job.get("job_resources"))
    reason = job.get("state_reason") or ""
    return JobRecord(
        job_id=str(job["job_id"]),
        state=state,
        reason="" if reason == "None" else reason,
        name=job.get("name") or "",
        comment=job.get("comment") or "",
        user_id=_number(job.get("user_id")),
        submit_time=_time(job.get("submit_time")),
        eligible_time=_time(job.get("eligible_time")),
        start_time=_time(job.get("start_time")) if started else None,
        end_time=_time(job.get("end_time")) if state.finished or completing else None,
        nodes=_json_nodes(job) if state is JobState.RUNNING else (),
        completing=completing,
    )


def _json_nodes(job: Mapping[str, Any]) -> tuple[NodeShare, ...]:
    """Per-node cores and memory from 22.05's ``job_resources.allocated_nodes``.

    That lists allocated cores per socket; the job's CPUs per allocated core (threads)
    turns them into CPUs, the unit ``--cpus-per-task`` counts in.
    """
    resources = job.get("job_resources") or {}
    allocated = resources.get("allocated_nodes")
    if not isinstance(allocated, list):
        return ()
    total_cores = _number(resources.get("allocated_cores")) or 0
    cpus = _number(job.get("cpus")) or 0
    threads = max(1, cpus // total_cores) if total_cores else 1
    shares = []
    for node in allocated:
        cores = sum(
            status.startswith("allocated")  # "allocated" or "allocated_and_in_use"
            for socket in (node.get("sockets") or {}).values()
            for status in (socket.get("cores") or {}).values()
        )
        shares.append(
            NodeShare(
                node=node["nodename"],
                cores=cores * threads,
                memory_mb=_number(node.get("memory_allocated")) or 0,
            )
        )
    return tuple(shares)


def _number(value: Any) -> int | None:
    """A plain number, or a ``{"set": ..., "number": ...}`` object."""
    if isinstance(value, Mapping):
        return value.get("number") if value.get("set") else None
    return value


def _time(value: Any) -> float | None:
    t = _number(value)
    return float(t) if t else None


_SCONTROL_FIELD = re.compile(r"(?:^|\s)([A-Za-z]+)=(\S*)")
_UNSET = {"", "None", "Unknown", "N/A", "(null)"}


def parse_scontrol(line: str) -> JobRecord:
    """One job from ``scontrol show job -o``: the fallback for jobs squeue no longer shows.

    Its times are local wall-clock strings; nodes are not read (the job has ended when
    this is needed).
    """
    fields: dict[str, str] = {}
    for key, value in _SCONTROL_FIELD.findall(line):
        fields.setdefault(key, value)
    if "JobId" not in fields or "JobState" not in fields:
        raise SlurmOutputError(f"scontrol show job printed no job: {line[:200]!r}")
    state, completing = _state(fields["JobState"])
    started = any(fields.get(key, "") not in _UNSET for key in ("BatchHost", "NodeList"))
    reason = fields.get("Reason", "")
    uid = re.search(r"\((\d+)\)", fields.get("UserId", ""))  # UserId=name(uid)
    return JobRecord(
        job_id=fields["JobId"],
        state=state,
        reason="" if reason == "None" else reason,
        name=fields.get("JobName", ""),
        user_id=int(uid.group(1)) if uid else None,
        submit_time=_local_time(fields.get("SubmitTime", "")),
        eligible_time=_local_time(fields.get("EligibleTime", "")),
        start_time=_local_time(fields.get("StartTime", "")) if started else None,
        end_time=_local_time(fields.get("EndTime", "")) if state.finished or completing else None,
        completing=completing,
    )


def _local_time(text: str) -> float | None:
    if text in _UNSET:
        return None
    return datetime.fromisoformat(text).timestamp()


_TEST_ONLY = re.compile(r"\bto start at (\S+)")


def parse_test_only(told: str) -> float | None:
    """The expected start (Unix time) in what ``sbatch --test-only`` tells (``sbatch: Job 12
    to start at 2026-11-24T02:56:38 using 4 processors on nodes n1 in partition debug``);
    None where it tells none."""
    found = _TEST_ONLY.search(told)
    if found is None:
        return None
    try:
        return _local_time(found.group(1))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class NodeSize:
    """The largest node of some partitions: CPUs, memory (MB) and local disk (MB, 0 unknown)."""

    cpus: int
    memory_mb: int
    tmp_disk_mb: int


def parse_sinfo_nodes(out: str, partitions: set[str | None]) -> NodeSize | None:
    """The largest node, field by field, of ``partitions`` (None: the default one) in the
    output of ``sinfo -h -o "%P %c %m %d"``; None when no line names one of them."""
    sizes = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) != 4:
            continue
        name, *numbers = fields
        default = name.endswith("*")
        if name.rstrip("*") not in partitions and not (default and None in partitions):
            continue
        try:  # a "+" marks a partition whose nodes differ: the number is their smallest
            sizes.append([int(n.rstrip("+")) for n in numbers])
        except ValueError:
            raise SlurmOutputError(f"sinfo line {line!r}: expected CPUs, memory and disk") from None
    if not sizes:
        return None
    return NodeSize(*(max(column) for column in zip(*sizes, strict=True)))
