"""The simulated Slurm cluster behind the :class:`~backends.base.BatchBackend` protocol.

A thin asyncio shell over :class:`backends.sim.simulator.Simulator`: the core runs
on the loop's clock (virtual in simulations), one loop timer is kept for the
core's next event while a pilot is pending or running, and every change of a
pilot's state becomes a :class:`~backends.base.JobInfo` in :meth:`updates`.
The core is created at first use, at the loop's current time, after replaying
the background load's warm-up at full speed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

from backends.base import (
    JobInfo,
    JobState,
    NodeShare,
    PilotRequest,
    ResumeRefused,
    SubmitError,
)
from backends.sim.simulator import INF, Priority, SimJob, Simulator
from backends.sim.site import NO_POLICY, QueueModel, SitePolicy
from backends.sim.swf import SwfTrace, load_trace
from backends.sim.workload import WEEK, Background, ClusterSpec, TraceReplay
from learners.resources import Resources
from workflows.spec import Allocation

#: The cluster of a mock without background load nor an explicit cluster.
DEFAULT_CLUSTER = ClusterSpec(nodes=16, cores_per_node=32)
DISK_MB = 1_000_000.0
"""Scratch disk of a simulated node (1 TB)."""


class MockSlurm:
    """A simulated Slurm cluster: nodes, EASY backfill, dependencies, background load under
    its site policy (per-user limits, fair share: :class:`~backends.sim.site.SitePolicy`).

    Time limits are rounded up to whole minutes, as ``sbatch --time`` does.
    ``partition`` must be unset or the cluster's partition; ``account``, ``qos``
    and ``extra`` options are accepted and ignored (the mock keeps no accounts).
    """

    name = "mock"
    simulated = True
    queued = True

    def __init__(
        self,
        cluster: ClusterSpec | None = None,
        *,
        background: Background | None = None,
        priority: Priority = "submit",
        backfill: bool = True,
        kill_invalid_depend: bool = False,
    ) -> None:
        if cluster is None:
            cluster = background.default_cluster() if background is not None else DEFAULT_CLUSTER
        self.cluster = cluster
        self.node_count = cluster.nodes
        self.background = background
        site = background.site if background is not None else NO_POLICY
        self._options = {
            "priority": priority,
            "backfill": backfill,
            "kill_invalid_depend": kill_invalid_depend,
            "limits": site.limits,
            "fair_share": site.fair_share,
        }
        self._sim: Simulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._updates: asyncio.Queue[JobInfo] = asyncio.Queue()
        self._active = 0  # pilots pending or running: while any is, the timer runs
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @classmethod
    def from_trace(
        cls,
        trace: str | Path | SwfTrace,
        *,
        offset: float | None = None,
        start_job: int | None = None,
        warmup: float = WEEK,
        scale: int = 1,
        cluster: ClusterSpec | None = None,
        priority: Priority = "submit",
        backfill: bool = True,
        kill_invalid_depend: bool = False,
        model: QueueModel | str = QueueModel.SITE,
    ) -> MockSlurm:
        """A cluster under replayed trace load (HPC2N, KTH, CTC or an SWF path), see
        :class:`~backends.sim.workload.TraceReplay`, under ``model``'s site policy; the cluster
        defaults to the trace's (:meth:`~backends.sim.workload.TraceReplay.default_cluster`)."""
        log = trace if isinstance(trace, SwfTrace) else load_trace(trace)
        load = TraceReplay(
            log,
            offset=offset,
            start_job=start_job,
            warmup=warmup,
            scale=scale,
            site=SitePolicy.of(model, log),
        )
        return cls(
            cluster,
            background=load,
            priority=priority,
            backfill=backfill,
            kill_invalid_depend=kill_invalid_depend,
        )

    async def cluster_name(self) -> str:
        """The simulated cluster and its load: ``simulated:HPC2N:9x28:131072M:submit``."""
        c, load = self.cluster, self.background
        trace = getattr(load, "trace", None)
        what = (
            trace.name
            if trace is not None
            else f"synthetic {getattr(load, 'utilisation', '')}"
            if load is not None
            else "idle"
        )
        size = f"{c.nodes}x{c.cores_per_node}:{c.memory_per_node_mb}M"
        return f"simulated:{what}:{size}:{self._options['priority']}"

    async def largest_node(self, partitions: set[str | None]) -> Resources:
        """Every node of the simulated cluster is the same; one that leaves memory unset has
        4 GB a core."""
        c = self.cluster
        memory = c.memory_per_node_mb or 4096.0 * c.cores_per_node
        return Resources(c.cores_per_node, memory, DISK_MB)

    async def reattach(
        self, request: PilotRequest, job_id: str | None, submitted: float
    ) -> str | None:
        raise ResumeRefused("a simulated run lives in its manager's memory: run it again")

    @property
    def simulator(self) -> Simulator:
        """The core (for failure injection and inspection); exists after first use."""
        if self._sim is None:
            raise RuntimeError("the simulated cluster starts at its first use inside the loop")
        return self._sim

    # --------------------------------------------------------- BatchBackend

    async def check(self, request: PilotRequest) -> None:
        self._check(self._sync(), request)

    def _check(self, sim: Simulator, request: PilotRequest) -> None:
        if request.partition not in (None, self.cluster.partition):
            raise SubmitError(
                f"invalid partition {request.partition!r} (the cluster has "
                f"{self.cluster.partition!r})",
                option="partition",
            )
        sim.check(request.cores, request.nodes, request.memory_mb)

    async def expected_wait(
        self, request: PilotRequest, instead_of: str | None = None
    ) -> float | None:
        """The wait the scheduler foresees for ``request`` submitted now, without its
        dependency (as ``sbatch --test-only`` tells), the job ``instead_of`` cancelled; None
        for a pilot it would refuse."""
        sim = self._sync()
        try:
            self._check(sim, request)
        except SubmitError:
            return None
        return sim.expected_wait(
            request.cores,
            _whole_minutes(request.time_limit_s),
            nodes=request.nodes,
            memory_mb=request.memory_mb,
            without=None if instead_of is None else int(instead_of),
        )

    async def submit(self, request: PilotRequest) -> str:
        sim = self._sync()
        self._check(sim, request)
        time_limit = _whole_minutes(request.time_limit_s)
        self._active += 1
        try:
            job = sim.submit(
                request.cores,
                time_limit,
                nodes=request.nodes,
                memory_mb=request.memory_mb,
                dependency=request.dependency,
                name=request.name,
                watch=True,
            )
        except SubmitError:
            self._active -= 1
            raise
        self._rearm()
        return str(job.id)

    async def cancel(self, job_id: str) -> None:
        sim = self._sync()
        sim.cancel(self._job(job_id))
        self._rearm()

    async def release(self, job_id: str) -> None:
        sim = self._sync()
        sim.release(self._job(job_id))
        self._rearm()

    async def info(self, job_id: str) -> JobInfo:
        self._sync()
        return self._info(self._job(job_id))

    async def updates(self) -> AsyncIterator[JobInfo]:
        while True:
            yield await self._updates.get()

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --------------------------------------------------------------- extras

    def fail_node(self, name: str, at: float | None = None, duration: float | None = None) -> None:
        """Fail node ``name`` at loop time ``at`` (default now) for ``duration`` seconds."""
        self._sync().fail_node(name, at=at, duration=duration)
        self._rearm()

    def true_wait(self, allocation: Allocation) -> float:
        """The wait a pilot of ``allocation`` submitted now would have (what-if replay)."""
        return self._sync().what_if_wait(
            allocation.cores,
            _whole_minutes(allocation.time_limit_s),
            nodes=allocation.nodes,
            memory_mb=allocation.memory_mb,
        )

    # ------------------------------------------------------------ internals

    def _sync(self) -> Simulator:
        """The core, advanced to the loop's clock (created, with its warm-up, at first use)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._sim is None:
            stream = None
            if self.background is not None:
                stream = self.background.stream(now, self.cluster)
            self._sim = Simulator(self.cluster, stream=stream, start=now, **self._options)
            self._sim.listener = self._on_change
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("a MockSlurm serves one event loop")
        self._sim.advance_to(now)
        return self._sim

    def _job(self, job_id: str) -> SimJob:
        try:
            return self.simulator.job(int(job_id))
        except ValueError:
            raise KeyError(f"no job {job_id!r} in the simulated cluster") from None

    def _on_change(self, job: SimJob) -> None:
        if job.state.finished:
            self._active -= 1
        self._updates.put_nowait(self._info(job))

    def _info(self, job: SimJob) -> JobInfo:
        sim = self.simulator
        nodes = tuple(
            NodeShare(sim.node_names[i], cores, round(memory)) for i, cores, memory in job.shares()
        )
        return JobInfo(
            job_id=str(job.id),
            state=job.state,
            reason=sim.reason(job) if job.state is JobState.PENDING else job.reason,
            submit_time=job.submit,
            eligible_time=job.eligible,
            start_time=job.start,
            end_time=job.end,
            nodes=nodes,
        )

    def _rearm(self) -> None:
        """Keep one timer at the core's next event while a pilot can still change."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed or not self._active:
            return
        when = self.simulator.next_event_time()
        if when < INF:
            assert self._loop is not None
            self._timer = self._loop.call_at(when, self._tick, when)

    def _tick(self, when: float) -> None:
        self._timer = None
        assert self._loop is not None
        # The loop may wake a hair before ``when``; the core must not stall short of it.
        self.simulator.advance_to(max(self._loop.time(), when))
        self._rearm()


def _whole_minutes(seconds: float) -> float:
    """A time limit as Slurm keeps it: whole minutes, rounded up."""
    return 60.0 * math.ceil(seconds / 60.0)
