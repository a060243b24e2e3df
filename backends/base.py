"""The one protocol every source of allocations implements.

A backend submits pilot jobs, cancels or releases them, and reports every
change of a job's state. Times are on the running loop's clock
(:func:`backends.clock.now`), so simulated and real runs compare.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from learners.resources import Resources

if TYPE_CHECKING:
    from workflows.spec import Allocation

DependencyKind = Literal["afterok", "afterany", "after", "afternotok"]
DependencyStatus = Literal["ok", "wait", "never"]


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True, slots=True)
class Dependency:
    """Slurm's ``--dependency=<kind>:<id>[:<id>...]``."""

    kind: DependencyKind
    job_ids: tuple[str, ...]

    def to_slurm(self) -> str:
        return f"{self.kind}:{':'.join(self.job_ids)}"

    @classmethod
    def parse(cls, text: str) -> Dependency:
        """The dependency :meth:`to_slurm` wrote."""
        kind, *job_ids = text.split(":")
        return cls(kind, tuple(job_ids))  # type: ignore[arg-type]


def dependency_status(kind: DependencyKind, states: Iterable[JobState]) -> DependencyStatus:
    """Slurm's test of a dependency on jobs now in ``states``: all must satisfy it.

    ``after``: the job started or ended (a cancelled pending job counts);
    ``afterany``: it ended in any state; ``afterok``: it ended COMPLETED;
    ``afternotok``: it ended in any other state. A job that ended the wrong
    way makes the dependency impossible ("never").
    """
    status: DependencyStatus = "ok"
    for state in states:
        if kind == "after":
            ok = state is not JobState.PENDING
        elif kind == "afterany":
            ok = state.finished
        elif not state.finished:
            ok = False
        elif (state is JobState.COMPLETED) != (kind == "afterok"):
            return "never"
        else:
            ok = True
        if not ok:
            status = "wait"
    return status


@dataclass(frozen=True, slots=True)
class PilotRequest:
    """One pilot job of ``cores`` cores and ``memory_mb`` MB in total.

    With ``nodes`` set, the cores are split evenly over exactly that many nodes
    (Slurm's ``--nodes``/``--ntasks-per-node``/``--cpus-per-task``); without it,
    the scheduler places them on whatever nodes have room (``--ntasks``), as it
    does for the background jobs of a trace. Memory is shared out with the cores.
    """

    name: str
    cores: int
    time_limit_s: float
    nodes: int | None = None
    memory_mb: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    dependency: Dependency | None = None
    comment: str = ""
    extra: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeShare:
    """The part of one node a running job holds."""

    node: str
    cores: int
    memory_mb: int


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job's state as the backend last saw it.

    ``reason`` is Slurm's pending reason (``Dependency``, ``Priority``,
    ``Resources``, ...). ``eligible_time`` is when the job's dependencies
    were satisfied (its submit time when it has none).
    """

    job_id: str
    state: JobState
    reason: str = ""
    submit_time: float | None = None
    eligible_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    nodes: tuple[NodeShare, ...] = field(default=())

    @property
    def wait(self) -> float | None:
        """Queue wait as Slurm counts it: start minus eligible time."""
        if self.start_time is None or self.eligible_time is None:
            return None
        return self.start_time - self.eligible_time


class SubmitError(Exception):
    """The batch system rejected a submission; ``option`` names the culprit when known."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


def node_share(
    cores: int, nodes: int | None, memory_mb: float | None, node: Resources
) -> Resources:
    """The largest worker a pilot of ``cores`` over ``nodes`` (None: wherever the scheduler
    puts them) brings on a node like ``node``: its cores there (at most the node's), their
    share of the pilot's memory (of the node's memory, a core's share for each, where the
    pilot leaves memory unset), whole MB, and the node's disk."""
    per_node = min(cores / (nodes or 1), node.cores)
    if memory_mb is None:
        memory = node.memory * per_node / node.cores
    else:
        memory = memory_mb * per_node / cores
    return Resources(per_node, math.floor(memory), node.disk)


NODE = Resources(cores=1024, memory=1024 * 4096.0, disk=1_000_000.0)
"""A node as large as any stage may ask, where a backend cannot tell its nodes' size."""


class BatchBackend(Protocol):
    """Where pilots come from: the simulated cluster, local processes or Slurm."""

    name: str
    simulated: bool
    """Its workers come with their pilots, on virtual time (else they connect to a manager)."""
    queued: bool
    """Pilots wait in a batch queue (Slurm, the simulated cluster). Without one (local
    processes) a pilot starts when submitted or when its dependency is met: every wait is 0,
    known, and there is none to learn."""
    true_wait: Callable[[Allocation], float] | None
    """The wait a pilot of an allocation submitted now would have, where the backend knows it
    (the simulated cluster's what-if replay, which the oracle plans with); else None."""
    node_count: int | None
    """How many nodes one pilot can span at most, where the backend knows (an automatic
    allocation is chosen within it); else None."""

    async def largest_node(self, partitions: set[str | None]) -> Resources | None:
        """The largest node of ``partitions`` (None: the default partition), the size a
        stage's workers are planned with before any has arrived (its disk 0 where the batch
        system does not tell it); None where it cannot tell."""
        ...

    async def expected_wait(
        self, request: PilotRequest, instead_of: str | None = None
    ) -> float | None:
        """How long the scheduler itself expects a pilot like ``request`` submitted now
        (its dependency aside) to wait, from the queue as it is (Slurm: ``sbatch
        --test-only``); None where it cannot tell. Submits nothing.

        ``instead_of``: a pending job of the run that ``request`` would replace, left out of
        the foresight (a job that waits ahead of ``request`` would otherwise keep it from
        starting in the scheduler's eyes)."""
        ...

    async def submit(self, request: PilotRequest) -> str:
        """Submit a pilot; return its job id. Raises :class:`SubmitError` on rejection."""
        ...

    async def check(self, request: PilotRequest) -> None:
        """Raise :class:`SubmitError` if ``request`` would be refused; submits nothing."""
        ...

    async def cancel(self, job_id: str) -> None:
        """Cancel a pending or running pilot (it ends CANCELLED)."""
        ...

    async def release(self, job_id: str) -> None:
        """End a pilot that is no longer needed: a running one ends COMPLETED."""
        ...

    async def info(self, job_id: str) -> JobInfo:
        """The state of a job submitted (or reattached) through this backend, as the batch
        system tells it now (what :meth:`updates` reports as it changes); KeyError for a job
        it does not know."""
        ...

    def updates(self) -> AsyncIterator[JobInfo]:
        """Every change of state of a job submitted (or reattached) through this backend,
        in order."""
        ...

    async def close(self) -> None:
        """Stop background work; leaves submitted jobs alone."""
        ...

    async def cluster_name(self) -> str:
        """Which cluster pilots run on, as what the queue-wait learner learns is kept by:
        waits seen on one cluster say nothing of another's."""
        ...

    async def reattach(
        self, request: PilotRequest, job_id: str | None, submitted: float
    ) -> str | None:
        """Take over a pilot that an earlier manager of the run submitted (at Unix time
        ``submitted``): its job id (found by name and comment when its id was never recorded:
        a submission under way when that manager died may land a little later) once its
        updates follow, or None when no such job exists. Raises :class:`ResumeRefused` where
        runs cannot be resumed."""
        ...


class ResumeRefused(Exception):
    """This backend cannot take over the pilots of an earlier manager."""


class BackendError(RuntimeError):
    """The batch system failed (it did not merely refuse a pilot: that is a
    :class:`SubmitError`); the message is the batch system's own, ``system`` names it."""

    system: ClassVar[str] = "the batch system"


@dataclass(frozen=True, slots=True)
class WorkerPlace:
    """What a backend tells a worker that no batch system tells (local processes): its
    pilot's job id (the one name a pilot has; Slurm's workers read theirs from
    ``$SLURM_JOB_ID``, simulated ones are given it), its own id, its share of the node, when
    its pilot ends (Unix time), where its sandboxes go."""

    pilot: str
    worker: str
    capacity: Resources
    end_time: float
    root: Path


def _told_nothing(place: WorkerPlace) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """How a pilot starts a worker, as the orchestrator hands it to a backend (as Parsl hands
    its providers a command line): ``argv``, run once per node, with ``env`` added to the
    environment the batch system gives it, and ``place_args``, the arguments that tell a
    worker its :class:`WorkerPlace` where the backend knows it. The run's secret travels in a
    file or ``env``, never in ``argv``: any user can read a command line."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    place_args: Callable[[WorkerPlace], Sequence[str]] = _told_nothing

    def command(self, place: WorkerPlace) -> tuple[str, ...]:
        """The command line of the worker at ``place``."""
        return (*self.argv, *self.place_args(place))
