"""A simulated Slurm cluster: a pure discrete-event core, no asyncio.

The core keeps its own event heap and clock; :meth:`Simulator.advance_to` runs
every event up to a time and :meth:`Simulator.next_event_time` says when the
next one is due, so an asyncio adapter (``backends/sim/backend.py``) can sleep until
then while benchmarks drive the core at full speed.

Scheduling follows Slurm's ``sched/backfill`` in its EASY form: jobs start in
priority order while they fit; the first that does not gets a reservation at
the earliest time enough resources free up, computed from the running jobs'
*requested* end times (the shadow time); lower-priority jobs may start now only
if they fit now and either end before the shadow time or use only resources the
reservation does not need. A job whose user is at a per-user limit is passed
over and takes no reservation; a backfilled job that brings the blocked job's
user to its limit makes the pass start over.

Speed comes from keeping scheduling incremental: the free-core total is a
counter, running jobs are kept ordered by requested end, the queue is mirrored
in numpy arrays so a backfill scan is a few vector operations, and a job that
merely joins the tail of the queue is tested alone against the standing
reservation instead of rescanning the queue. Node by node accounting is needed
only where node boundaries can bind: pinned (``nodes``) jobs, and jobs asking
for more memory per core than the nodes' default share (Slurm's DefMemPerCPU).
"""

from __future__ import annotations

import copy
import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np

from backends.base import (
    Dependency,
    DependencyKind,
    DependencyStatus,
    JobState,
    SubmitError,
    dependency_status,
)
from backends.sim.placement import EPS, Nodes, Placement, place
from backends.sim.site import FairShare, UserLimits
from backends.sim.workload import ClusterSpec, JobStream

Priority = Literal["submit", "eligible"]
Values = TypeVar("Values", float, np.ndarray)  # one job's, or many jobs' at once

INF = math.inf
_DEAD = np.iinfo(np.int64).max  # a queue slot whose job has left the queue
_END, _NODE_DOWN, _NODE_UP, _WITHDRAW = 0, 1, 2, 3


@dataclass(slots=True, eq=False)
class SimJob:
    """One job of the simulated cluster; times on the simulator's clock."""

    id: int
    cores: int
    time_limit: float
    submit: float
    run: float | None  # actual runtime; None: runs until released or its time limit
    nodes: int | None = None
    mem_per_core: float = 0.0
    name: str = ""
    user: int = 0
    watched: bool = False
    stream_index: int = -1
    heavy: bool = False  # more memory per core than the nodes' default share
    state: JobState = JobState.PENDING
    reason: str = ""
    eligible: float | None = None
    origin: float = 0.0  # when its age starts counting: submit or eligible time
    start: float | None = None
    end: float | None = None
    dependency: tuple[DependencyKind, tuple[SimJob, ...]] | None = None
    placement: Placement | None = None
    requested_end: float = INF

    @property
    def simple(self) -> bool:
        """Placeable on any free cores: no node count, default memory share."""
        return self.nodes is None and not self.heavy

    def shares(self) -> list[tuple[int, int, float]]:
        """(node index, cores, memory MB) per node of a placed job."""
        if self.placement is None:
            return []
        idx, cores = self.placement
        return [(i, c, c * self.mem_per_core) for i, c in zip(idx, cores, strict=True)]


@dataclass(slots=True)
class _Reservation:
    """The blocked head job's reservation at ``shadow``.

    ``extra`` bounds the cores a job running past the shadow time may take.
    With ``spare`` arrays the bound is per node (a pinned head, or memory that
    binds); without, the head can use any cores and ``extra`` is exact.
    """

    shadow: float
    extra: float
    spare_cores: np.ndarray | None = None
    spare_mem: np.ndarray | None = None


class _Queue:
    """Eligible pending jobs in priority order, mirrored in numpy arrays for backfill scans.

    The order is by (key, job id), the key smaller first: the time age counts from
    under FIFO priorities, minus the priority under fair share. A job that leaves
    stays in place as a dead slot (cores ``_DEAD``) until the next compaction, so
    slots do not move during a scheduling pass.
    """

    _FIELDS = (
        ("key", np.float64),
        ("ids", np.int64),
        ("cores", np.int64),
        ("limit", np.float64),
        ("user", np.int64),
        ("origin", np.float64),
    )

    def __init__(self) -> None:
        self.jobs: list[SimJob] = []
        self.key = self.ids = self.cores = self.limit = self.user = self.origin = np.empty(0)
        self._allocate(1024)
        self.lo = 0  # no live job before this slot
        self.live = 0
        self.heavy = 0  # live jobs asking for more than the default memory per core

    def _allocate(self, capacity: int, keep: np.ndarray | None = None) -> None:
        """Arrays of ``capacity`` slots holding the first slots (or the ``keep`` ones)."""
        n = len(self.jobs)
        for name, kind in self._FIELDS:
            old = getattr(self, name)
            new = np.empty(capacity, kind)
            kept = old[:n] if keep is None else old[keep]
            new[: len(kept)] = kept
            setattr(self, name, new)

    def __len__(self) -> int:
        return self.live

    def push(self, job: SimJob, key: float) -> bool:
        """Insert by (key, id); True if the job went anywhere but the tail."""
        jobs, n = self.jobs, len(self.jobs)
        if n == len(self.cores):
            self._allocate(2 * n)
        tail = not n or (key, job.id) > (self.key[n - 1], self.ids[n - 1])
        if tail:
            slot = n
        else:
            keys = self.key[:n]
            slot = int(np.searchsorted(keys, key, "left"))
            high = int(np.searchsorted(keys, key, "right"))
            slot += int(np.searchsorted(self.ids[slot:high], job.id))
            for name, _ in self._FIELDS:
                array = getattr(self, name)
                array[slot + 1 : n + 1] = array[slot:n]
            self.lo = min(self.lo, slot)
        jobs.insert(slot, job)
        self.key[slot], self.ids[slot], self.cores[slot] = key, job.id, job.cores
        self.limit[slot], self.user[slot], self.origin[slot] = job.time_limit, job.user, job.origin
        self.live += 1
        self.heavy += job.heavy
        return not tail

    def kill(self, slot: int) -> None:
        self.cores[slot] = _DEAD
        self.live -= 1
        self.heavy -= self.jobs[slot].heavy

    def remove(self, job: SimJob) -> None:
        n = len(self.jobs)
        self.kill(int(np.flatnonzero((self.ids[:n] == job.id) & (self.cores[:n] != _DEAD))[0]))

    def head(self) -> int:
        """Slot of the highest-priority live job, or -1."""
        if not self.live:
            self.lo = len(self.jobs)
            return -1
        cores, lo = self.cores, self.lo
        while cores[lo] == _DEAD:
            lo += 1
        self.lo = lo
        return lo

    def compact(self) -> None:
        """Drop dead slots once they outnumber live ones."""
        n = len(self.jobs)
        if n - self.live >= max(1024, self.live):
            self.reorder(np.flatnonzero(self.cores[:n] != _DEAD))

    def reorder(self, order: np.ndarray, keys: np.ndarray | None = None) -> None:
        """Keep the slots ``order`` lists, in that order, with new ``keys`` if given."""
        self.jobs = [self.jobs[i] for i in order.tolist()]
        self._allocate(max(1024, 2 * len(self.jobs)), keep=order)
        if keys is not None:
            self.key[: len(keys)] = keys
        self.lo = 0


@dataclass
class SimStats:
    """Counters of one simulation."""

    submitted: int = 0
    started: int = 0
    backfilled: int = 0
    finished: int = 0
    full_passes: int = 0
    tail_passes: int = 0


class _Arrivals:
    """The background stream as Python lists: cheaper per job than numpy scalars."""

    def __init__(self, jobs: JobStream) -> None:
        self.submit: list[float] = jobs.submit.tolist()
        self.cores: list[int] = jobs.cores.tolist()
        self.run: list[float] = jobs.run.tolist()
        self.limit: list[float] = jobs.limit.tolist()
        self.user: list[int] = jobs.user.tolist()
        self.patience: list[float] = jobs.patience.tolist()
        self.cursor = 0
        self.next = self.submit[0] if self.submit else INF
        self.starts = np.full(len(self.submit), np.nan)

    def shared(self) -> list[object]:
        """The read-only lists a fork may share."""
        return [self.submit, self.cores, self.run, self.limit, self.user, self.patience]


class _Users:
    """Per-user state: running jobs and cores (for the limits), fair-share usage.

    Users ``0 .. count - 2`` are the background's, held to ``limits``; the last
    user submits the jobs of :meth:`Simulator.submit` (leadtime's pilots), which no
    limit holds.
    """

    def __init__(self, count: int, limits: UserLimits | None, fair: FairShare | None) -> None:
        self.count = count
        self.limits = limits
        self.jobs = np.zeros(count, np.int64)  # running
        self.cores = np.zeros(count, np.int64)
        unlimited = np.iinfo(np.int64).max // 2
        self.max_jobs = np.full(count, limits.jobs if limits else unlimited, np.int64)
        self.max_cores = np.full(count, limits.cores if limits else unlimited, np.int64)
        self.max_jobs[-1] = self.max_cores[-1] = unlimited
        self.half_life = fair.half_life if fair is not None else INF
        self.usage = [0.0] * count  # decayed core-seconds at ``since``
        self.since = [0.0] * count
        self.factor = np.ones(count)  # Fair Tree's fair-share factor

    def allow(self, users: np.ndarray, cores: np.ndarray) -> np.ndarray:
        """Which jobs (of these users and cores) their users' limits let start now."""
        return (self.jobs[users] < self.max_jobs[users]) & (
            self.cores[users] + cores <= self.max_cores[users]
        )

    def run(self, job: SimJob, now: float, sign: int = 1) -> None:
        """``job`` starts (or, with ``sign`` -1, ends)."""
        u = job.user
        if self.half_life < INF:
            elapsed = now - self.since[u]
            self.usage[u] = _decayed(self.usage[u], elapsed, int(self.cores[u]), self.half_life)
            self.since[u] = now
        self.jobs[u] += sign
        self.cores[u] += sign * job.cores

    def fair_factors(self, now: float) -> np.ndarray:
        """Every user's usage brought to ``now``, and Fair Tree's factor: users ranked by
        usage (every user an equal share), 1 for the least, ties sharing the higher."""
        elapsed = now - np.array(self.since)
        usage = _decayed(np.array(self.usage), elapsed, self.cores, self.half_life)
        self.usage, self.since = usage.tolist(), [now] * self.count
        below = np.searchsorted(np.sort(usage), usage, "left")
        self.factor = (self.count - below) / self.count
        return self.factor


def _decayed(usage: Values, elapsed: Values, running: Values, h: float) -> Values:
    """Usage ``elapsed`` seconds on, decayed with half-life ``h`` while ``running`` cores add
    to it (floats or arrays alike)."""
    rate = math.log(2) / h
    return usage * np.exp(-elapsed * rate) - running / rate * np.expm1(-elapsed * rate)


class Simulator:
    """Nodes, a queue, EASY backfill, dependencies, time limits and node failures.

    ``priority="submit"`` orders the queue by submission (Slurm's
    ``priority/basic``); ``"eligible"`` by the time a job became eligible (age
    counted from eligibility under ``priority/multifactor``). ``backfill=False``
    is pure FIFO. With ``kill_invalid_depend`` a job whose dependency can never
    be satisfied is cancelled (Slurm's SchedulerParameters flag); by default it
    stays pending with reason ``DependencyNeverSatisfied``, as in Slurm 22.05.

    ``limits`` hold each background user to so many running jobs and cores
    (Slurm's MaxJobsPerUser, MaxTRESPerUser); ``fair_share`` orders the queue by
    Slurm's multifactor priority instead, age counted from submission or
    eligibility as ``priority`` says, recomputed at the first event at least
    ``calc_period`` after the last computation.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        stream: JobStream | None = None,
        start: float = 0.0,
        priority: Priority = "submit",
        backfill: bool = True,
        kill_invalid_depend: bool = False,
        limits: UserLimits | None = None,
        fair_share: FairShare | None = None,
    ) -> None:
        if priority not in ("submit", "eligible"):
            raise ValueError(f"priority must be 'submit' or 'eligible', got {priority!r}")
        self.cluster = cluster
        self.priority = priority
        self.backfill = backfill
        self.kill_invalid_depend = kill_invalid_depend
        self.now = float(start)
        self.stats = SimStats()
        self.listener: Callable[[SimJob], None] | None = None

        n, c = cluster.nodes, cluster.cores_per_node
        assert cluster.memory_per_node_mb is not None
        self.node_names = cluster.node_names()
        self._node_index = {name: i for i, name in enumerate(self.node_names)}
        self._default_mem = cluster.memory_per_node_mb / c  # Slurm's DefMemPerCPU
        self._nodes = Nodes(n, c, cluster.memory_per_node_mb)
        self._heavy_running = 0
        self._node_token = [0] * n

        self._queue = _Queue()
        self._running: list[tuple[float, int, SimJob]] = []  # by requested end
        self._events: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._next_id = 1
        self._jobs: dict[int, SimJob] = {}
        self._dependents: dict[int, list[SimJob]] = {}
        self._blocked: SimJob | None = None  # the head the last pass could not start
        self._reservation: _Reservation | None = None
        self._dirty = False  # something other than tail arrivals changed
        self._scanned = 0  # queue slots seen by the last pass

        self._in_pass = False  # jobs made eligible during a pass wait for its end
        self._deferred: list[SimJob] = []

        stream = stream if stream is not None else _empty_stream()
        self._arrivals = _Arrivals(stream)
        self.now = min(self.now, self._arrivals.next)
        own_user = int(stream.user.max()) + 1 if len(stream) else 0
        self._users = _Users(own_user + 1, limits, fair_share)
        self._fair = fair_share
        self._next_calc = -INF

    # ------------------------------------------------------------------ clock

    def next_event_time(self) -> float:
        """When the next event is due (``inf`` when none is)."""
        events = self._events
        while events and not self._live_event(events[0]):
            heapq.heappop(events)
        due = events[0][0] if events else INF
        arrival = self._arrivals.next
        return arrival if arrival < due else due

    def advance_to(self, t: float) -> None:
        """Run every event due at or before ``t``; the clock ends at ``t``."""
        while (due := self.next_event_time()) <= t:
            self._step(due)
        self.now = max(self.now, t)

    def run(self) -> None:
        """Run until nothing is left to happen (pilots still running keep it going)."""
        while (due := self.next_event_time()) < INF:
            self._step(due)

    def _step(self, t: float) -> None:
        self.now = max(self.now, t)
        self._fire_events(t)
        self._admit_arrivals(t)
        self._schedule()

    @property
    def stream_starts(self) -> np.ndarray:
        """Start time of each background job (NaN while not started)."""
        return self._arrivals.starts

    # ------------------------------------------------------------ job control

    def submit(
        self,
        cores: int,
        time_limit: float,
        *,
        nodes: int | None = None,
        memory_mb: float | None = None,
        run: float | None = None,
        dependency: Dependency | None = None,
        name: str = "",
        watch: bool = False,
    ) -> SimJob:
        """Submit a job now; ``run`` None makes it run until released or timed out."""
        job = self._new_job(cores, time_limit, nodes, memory_mb, run, name)
        job.watched = watch
        self._jobs[job.id] = job
        self.stats.submitted += 1
        status = "ok"
        if dependency is not None:
            job.dependency = (dependency.kind, self._resolve(dependency))
            for dep in job.dependency[1]:
                self._dependents.setdefault(dep.id, []).append(job)
            status = self._dependency_status(job)
        if status == "ok":
            self._make_eligible(job)
            self._notify(job)
        else:
            job.reason = "Dependency" if status == "wait" else "DependencyNeverSatisfied"
            self._notify(job)
            if status == "never" and self.kill_invalid_depend:
                self._finish(job, JobState.CANCELLED)
        self._schedule()
        return job

    def fork(self) -> Simulator:
        """An independent copy of the cluster now, sharing the read-only background stream."""
        a = self._arrivals
        shared = {id(x): x for x in a.shared()}
        shared[id(a.starts)] = a.starts.copy()
        listener, self.listener = self.listener, None
        try:
            return copy.deepcopy(self, shared)
        finally:
            self.listener = listener

    def what_if_wait(
        self,
        cores: int,
        time_limit: float,
        *,
        nodes: int | None = None,
        memory_mb: float | None = None,
        horizon: float = 30 * 86400.0,
    ) -> float:
        """How long a job submitted now would wait, replayed on a fork (``horizon`` at most).

        In the fork, every job runs to its known end: background jobs their
        recorded runtime, pilots (which end when released) their time limit.
        """
        return self.fork()._wait_of_new(cores, time_limit, nodes, memory_mb, horizon)

    def expected_wait(
        self,
        cores: int,
        time_limit: float,
        *,
        nodes: int | None = None,
        memory_mb: float | None = None,
        horizon: float = 30 * 86400.0,
        without: int | None = None,
    ) -> float:
        """How long a job submitted now would wait as the scheduler foresees it (Slurm's
        ``sbatch --test-only``): on a fork where no other job arrives and every job runs to
        its time limit, the only end the scheduler knows, and job ``without`` (if it is
        still there) is cancelled."""
        fork = self.fork()
        if without is not None and without in fork._jobs:
            fork.cancel(fork._jobs[without])
        a = fork._arrivals
        a.cursor, a.next = len(a.submit), INF
        fork._events = [e for e in fork._events if e[2] not in (_END, _WITHDRAW)]
        heapq.heapify(fork._events)
        for job in (*fork._jobs.values(), *fork._queue.jobs):
            if job.state is JobState.PENDING:
                job.run = None
        for end, _, job in fork._running:
            job.run = None
            fork._push(end, _END, job)
        return fork._wait_of_new(cores, time_limit, nodes, memory_mb, horizon)

    def _wait_of_new(
        self,
        cores: int,
        time_limit: float,
        nodes: int | None,
        memory_mb: float | None,
        horizon: float,
    ) -> float:
        """Submit a job now and run until it starts: its wait (``horizon`` at most)."""
        now = self.now
        job = self.submit(cores, time_limit, nodes=nodes, memory_mb=memory_mb)
        while job.start is None and (due := self.next_event_time()) <= now + horizon:
            self._step(due)
        return horizon if job.start is None else job.start - now

    def check(self, cores: int, nodes: int | None, memory_mb: float | None) -> None:
        """Raise SubmitError if such a job could never run here (as sbatch refuses it)."""
        if cores < 1:
            raise SubmitError(f"a job needs at least one core, got {cores}", option="cores")
        per_core = self._default_mem if memory_mb is None else float(memory_mb) / cores
        self._check_geometry(cores, nodes, per_core)

    def job(self, job_id: int) -> SimJob:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise KeyError(f"no job {job_id} in the simulated cluster") from None

    def cancel(self, job: SimJob) -> None:
        """Cancel a pending or running job; finished jobs are left alone."""
        if not job.state.finished:
            self._finish(job, JobState.CANCELLED)
            self._schedule()

    def release(self, job: SimJob) -> None:
        """A running job ends COMPLETED now; a pending one is cancelled."""
        if job.state is JobState.RUNNING:
            self._finish(job, JobState.COMPLETED)
            self._schedule()
        else:
            self.cancel(job)

    def fail_node(self, name: str, at: float | None = None, duration: float | None = None) -> None:
        """Node ``name`` fails at ``at`` (default now): its jobs end NODE_FAIL; it returns
        after ``duration`` seconds (never without one)."""
        index = self._node_index.get(name)
        if index is None:
            names = f"{self.node_names[0]}..{self.node_names[-1]}"
            raise ValueError(f"no node {name!r}; the nodes are {names}")
        at = self.now if at is None else float(at)
        if at < self.now:
            raise ValueError(f"cannot fail {name} at {at}: the clock is already at {self.now}")
        if duration is not None and duration < 0:
            raise ValueError(f"negative failure duration {duration}")
        self._push(at, _NODE_DOWN, (index, duration))
        self.advance_to(self.now)

    def reason(self, job: SimJob) -> str:
        """Slurm's pending reason: Dependency, Priority, Resources, ...; empty otherwise."""
        if job.state is not JobState.PENDING or job.eligible is None:
            return job.reason
        return "Resources" if job is self._blocked else "Priority"

    def node_up(self, name: str) -> bool:
        return self._nodes.up[self._node_index[name]]

    def free_cores(self) -> int:
        return self._nodes.free_total

    # -------------------------------------------------------------- internals

    def _new_job(
        self,
        cores: int,
        time_limit: float,
        nodes: int | None,
        memory_mb: float | None,
        run: float | None,
        name: str,
    ) -> SimJob:
        if not time_limit > 0:
            raise SubmitError(f"time limit must be positive, got {time_limit}", option="time")
        if run is not None and run < 0:
            raise SubmitError(f"negative runtime {run}", option="run")
        if cores < 1:
            raise SubmitError(f"a job needs at least one core, got {cores}", option="cores")
        mem_per_core = self._default_mem if memory_mb is None else float(memory_mb) / cores
        self._check_geometry(cores, nodes, mem_per_core)
        job = SimJob(
            id=self._next_id,
            cores=cores,
            time_limit=float(time_limit),
            submit=self.now,
            run=None if run is None else float(run),
            nodes=nodes,
            mem_per_core=mem_per_core,
            name=name,
            user=self._users.count - 1,
            heavy=mem_per_core > self._default_mem + EPS,
        )
        self._next_id += 1
        return job

    def _check_geometry(self, cores: int, nodes: int | None, mem_per_core: float) -> None:
        """Reject what could not run even on the whole, idle cluster (as sbatch does)."""
        c = self.cluster
        node_mem = float(c.memory_per_node_mb or 0)
        if cores > c.total_cores:
            raise SubmitError(f"{cores} cores requested, the cluster has {c.total_cores}", "cores")
        if nodes is not None:
            if not 1 <= nodes <= c.nodes:
                raise SubmitError(f"{nodes} nodes requested, the cluster has {c.nodes}", "nodes")
            per_node = cores // nodes
            if cores % nodes:
                raise SubmitError(f"{cores} cores do not split evenly over {nodes} nodes", "nodes")
            if per_node > c.cores_per_node:
                message = f"{per_node} cores per node requested, nodes have {c.cores_per_node}"
                raise SubmitError(message, "nodes")
            fits = per_node * mem_per_core <= node_mem + EPS
        else:
            per_node = c.cores_per_node
            if mem_per_core > 0:
                per_node = min(per_node, math.floor((node_mem + EPS) / mem_per_core))
            fits = per_node * c.nodes >= cores
        if not fits:
            raise SubmitError(
                f"{cores * mem_per_core:.0f} MB for {cores} core{'s' * (cores != 1)} does not "
                f"fit nodes of "
                f"{node_mem:.0f} MB and {c.cores_per_node} cores",
                option="mem",
            )

    def _resolve(self, dependency: Dependency) -> tuple[SimJob, ...]:
        jobs = []
        for raw in dependency.job_ids:
            try:
                jobs.append(self._jobs[int(raw)])
            except (ValueError, KeyError):
                raise SubmitError(
                    f"Job dependency problem: no job {raw!r}", option="dependency"
                ) from None
        if not jobs:
            raise SubmitError("Job dependency problem: no job ids", option="dependency")
        return tuple(jobs)

    def _push(self, t: float, kind: int, payload: object, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload, token))

    def _live_event(self, event: tuple[float, int, int, object, int]) -> bool:
        _, _, kind, payload, token = event
        if kind == _END:
            assert isinstance(payload, SimJob)
            return payload.state is JobState.RUNNING
        if kind == _NODE_UP:
            assert isinstance(payload, int)
            return self._node_token[payload] == token
        if kind == _WITHDRAW:
            assert isinstance(payload, SimJob)
            return not payload.state.finished
        return True

    def _fire_events(self, t: float) -> None:
        events = self._events
        while events and events[0][0] <= t:
            event = heapq.heappop(events)
            if not self._live_event(event):
                continue
            _, _, kind, payload, _ = event
            if kind == _END:
                assert isinstance(payload, SimJob)
                job = payload
                timed_out = job.run is None or job.run >= job.time_limit
                self._finish(job, JobState.TIMEOUT if timed_out else JobState.COMPLETED)
            elif kind == _WITHDRAW:
                assert isinstance(payload, SimJob)
                self._finish(payload, JobState.CANCELLED)
            elif kind == _NODE_DOWN:
                assert isinstance(payload, tuple)
                self._node_down(*payload)
            else:
                assert isinstance(payload, int)
                self._node_return(payload)

    def _admit_arrivals(self, t: float) -> None:
        a = self._arrivals
        if a.next > t:
            return
        i, submit, n = a.cursor, a.submit, len(a.submit)
        mem = self._default_mem
        while i < n and submit[i] <= t:
            job = SimJob(self._next_id, a.cores[i], a.limit[i], submit[i], a.run[i], None, mem)
            job.stream_index, job.user = i, a.user[i]
            self._next_id += 1
            self._make_eligible(job)
            if a.patience[i] < INF:
                self._push(submit[i] + a.patience[i], _WITHDRAW, job)
            i += 1
        self.stats.submitted += i - a.cursor
        a.cursor = i
        a.next = submit[i] if i < n else INF

    def _make_eligible(self, job: SimJob) -> None:
        job.eligible = self.now
        job.reason = ""
        job.origin = job.submit if self.priority == "submit" else self.now
        if self._in_pass:
            self._deferred.append(job)  # slots must not move under a pass
        else:
            self._enqueue(job)

    def _enqueue(self, job: SimJob) -> None:
        key = -self._priority(job.cores, job.user, job.origin) if self._fair else job.origin
        # Jobs join at the tail, where a tail pass finds them, unless an older job
        # becomes eligible (a dependency met) or fair share ranks them higher.
        if self._queue.push(job, key) or job.heavy:
            self._dirty = True  # heavy: memory may bind, the reservation must be per node

    def _priority(self, cores: Values, user: Values, origin: Values) -> Values:
        """Slurm's multifactor priority of jobs (scalars or arrays alike)."""
        fair = self._fair
        assert fair is not None
        age = np.minimum((self.now - origin) / fair.max_age, 1.0)
        size = cores / self.cluster.total_cores
        factor = self._users.factor[user]
        return fair.age_weight * age + fair.fairshare_weight * factor + fair.size_weight * size

    def _reprioritise(self) -> None:
        """Every queued job's priority anew (Slurm's PriorityCalcPeriod), the queue re-sorted."""
        fair = self._fair
        assert fair is not None
        self._next_calc = self.now + fair.calc_period
        self._users.fair_factors(self.now)
        queue = self._queue
        if not queue.live:
            return
        live = np.flatnonzero(queue.cores[: len(queue.jobs)] != _DEAD)
        keys = -self._priority(queue.cores[live], queue.user[live], queue.origin[live])
        order = np.lexsort((queue.ids[live], keys))
        if not np.array_equal(order, np.arange(live.size)):
            self._dirty = True  # a new order: a full pass
        self._scanned = int(np.searchsorted(live, self._scanned))  # the same jobs, compacted
        queue.reorder(live[order], keys[order])

    @staticmethod
    def _dependency_status(job: SimJob) -> DependencyStatus:
        """Slurm's test of ``job``'s dependency (see :func:`backends.base.dependency_status`)."""
        assert job.dependency is not None
        kind, deps = job.dependency
        return dependency_status(kind, (dep.state for dep in deps))

    def _dependency_changed(self, job: SimJob) -> None:
        """Re-test the jobs waiting on ``job``, which just started or ended."""
        for waiter in self._dependents.get(job.id, ()):
            if waiter.state is not JobState.PENDING or waiter.reason != "Dependency":
                continue
            status = self._dependency_status(waiter)
            if status == "ok":
                self._make_eligible(waiter)
                self._notify(waiter)
            elif status == "never":
                waiter.reason = "DependencyNeverSatisfied"
                self._notify(waiter)
                if self.kill_invalid_depend:
                    self._finish(waiter, JobState.CANCELLED)

    def _notify(self, job: SimJob) -> None:
        if job.watched and self.listener is not None:
            self.listener(job)

    def _finish(self, job: SimJob, state: JobState) -> None:
        was = job.state
        job.state = state
        job.end = self.now
        if state is JobState.TIMEOUT:
            job.reason = "TimeLimit"
        elif state is JobState.NODE_FAIL:
            job.reason = "NodeDown"
        elif job.reason != "DependencyNeverSatisfied":
            job.reason = ""
        if was is JobState.RUNNING:
            self._release(job)
        elif job.eligible is not None:
            self._queue.remove(job)
        self._dirty = True
        self.stats.finished += 1
        self._notify(job)
        if job.id in self._dependents:
            self._dependency_changed(job)

    def _release(self, job: SimJob) -> None:
        assert job.placement is not None
        self._nodes.give(job.placement, job.mem_per_core)
        if job.heavy:
            self._heavy_running -= 1
        running = self._running
        del running[bisect_left(running, (job.requested_end, job.id))]
        self._users.run(job, self.now, -1)

    def _start(self, slot: int, job: SimJob, placement: Placement) -> None:
        self._queue.kill(slot)
        self._nodes.take(placement, job.mem_per_core)
        if job.heavy:
            self._heavy_running += 1
        now = self.now
        job.placement = placement
        job.state = JobState.RUNNING
        job.reason = ""
        job.start = now
        job.requested_end = end = now + job.time_limit
        insort(self._running, (end, job.id, job))
        self._users.run(job, now)
        run = job.run
        self._push(end if run is None or run >= job.time_limit else now + run, _END, job)
        self.stats.started += 1
        if job.stream_index >= 0:
            self._arrivals.starts[job.stream_index] = now
        if job.watched:
            self._notify(job)
        if job.id in self._dependents:
            self._dependency_changed(job)

    # ------------------------------------------------------------- placement

    def _fit(self, job: SimJob) -> Placement | None:
        """Where ``job`` would run now, or None."""
        nodes = self._nodes
        if job.cores > nodes.free_total:
            return None
        if job.simple and not self._heavy_running:
            return nodes.best_fit(job.cores)  # memory cannot bind: cores suffice
        return self._place(job, *nodes.arrays())

    def _place(self, job: SimJob, cores: np.ndarray, mem: np.ndarray) -> Placement | None:
        return place(job.cores, job.nodes, job.mem_per_core, cores, mem)

    # ------------------------------------------------------------ scheduling

    def _schedule(self) -> None:
        """A scheduling pass: full after a change, else a test of the new tail jobs alone
        (against the standing reservation, if a job is blocked)."""
        if self._fair is not None and self.now >= self._next_calc:
            self._reprioritise()
        queue = self._queue
        while True:
            dirty, self._dirty = self._dirty, False
            self._in_pass = True
            if dirty:
                if len(queue) or self._blocked is not None:
                    self._full_pass()
            elif self._scanned < len(queue.jobs):
                self.stats.tail_passes += 1
                if self._blocked is None:
                    self._start_in_order(self._scanned)
                elif self._reservation is not None:
                    self._backfill(self._scanned)
            self._in_pass = False
            self._scanned = len(queue.jobs)
            deferred, self._deferred = self._deferred, []
            for job in deferred:
                self._enqueue(job)
                self._dirty = True
            if not self._dirty:
                return

    def _full_pass(self) -> None:
        self.stats.full_passes += 1
        queue = self._queue
        queue.compact()
        self._blocked = None
        self._reservation = None
        self._start_in_order(queue.head())

    def _start_in_order(self, slot: int) -> None:
        """Start jobs from ``slot`` on in priority order while they fit; the first that does
        not is blocked: it gets the reservation, and the jobs behind it are backfilled."""
        queue = self._queue
        slot = self._next_startable(slot)
        while slot >= 0:
            job = queue.jobs[slot]
            placement = self._fit(job)
            if placement is None:
                break
            self._start(slot, job, placement)
            slot = self._next_startable(slot + 1)
        else:
            return
        self._blocked = job
        if self.backfill:
            self._reservation = self._reserve(job)
            self._backfill(slot + 1)

    def _next_startable(self, slot: int) -> int:
        """The first live slot from ``slot`` on whose job its user's limits let start, or -1."""
        queue = self._queue
        n = len(queue.jobs)
        if slot < 0:
            return -1
        cores = queue.cores
        while slot < n and cores[slot] == _DEAD:
            slot += 1
        if slot >= n or self._users.limits is None:
            return slot if slot < n else -1
        job = queue.jobs[slot]
        if self._users.allow(job.user, job.cores):
            return slot
        ok = self._users.allow(queue.user[slot:n], cores[slot:n]) & (cores[slot:n] != _DEAD)
        found = np.flatnonzero(ok)
        return slot + int(found[0]) if found.size else -1

    def _reserve(self, head: SimJob) -> _Reservation:
        """The head's reservation: when and where enough resources free up."""
        running = self._running
        if head.simple and not self._heavy_running and not self._queue.heavy:
            # Memory cannot bind: counting cores is exact.
            free = self._nodes.free_total
            need, freed = head.cores - free, 0
            i, n = 0, len(running)
            while i < n:
                shadow = running[i][0]
                while i < n and running[i][0] == shadow:
                    freed += running[i][2].cores
                    i += 1
                if freed >= need:
                    return _Reservation(shadow, free + freed - head.cores)
            return _Reservation(INF, INF)
        free_cores, free_mem = self._nodes.arrays()
        cores, mem = free_cores.copy(), free_mem.copy()
        total, i, n = self._nodes.free_total, 0, len(running)
        while i < n:
            shadow = running[i][0]
            while i < n and running[i][0] == shadow:
                job = running[i][2]
                assert job.placement is not None
                idx, k = job.placement
                cores[idx] += k
                mem[idx] += np.multiply(k, job.mem_per_core)
                total += job.cores
                i += 1
            if total >= head.cores and (placed := self._place(head, cores, mem)) is not None:
                idx, k = placed
                cores[idx] -= k
                mem[idx] -= np.multiply(k, head.mem_per_core)
                extra = int(np.minimum(cores, free_cores).sum())
                return _Reservation(shadow, extra, cores, mem)
        return _Reservation(INF, INF)

    def _backfill(self, first: int) -> None:
        """Start jobs from slot ``first`` on that do not delay the reservation."""
        res, queue = self._reservation, self._queue
        assert res is not None
        nodes = self._nodes
        while nodes.free_total > 0:
            end = len(queue.jobs)
            if first >= end:
                return
            window = res.shadow - self.now
            cores = queue.cores[first:end]
            free = nodes.free_total
            fits = cores <= free
            if res.extra < free:  # jobs running past the shadow must fit in extra
                fits &= (queue.limit[first:end] <= window) | (cores <= res.extra)
            if self._users.limits is not None:
                fits &= self._users.allow(queue.user[first:end], cores)
            candidates = np.flatnonzero(fits)
            if not candidates.size:
                return
            started = False
            for i in candidates.tolist():
                slot = first + i
                job = queue.jobs[slot]
                if job.time_limit <= window:
                    placement = self._fit(job)
                    if placement is not None:
                        self._start(slot, job, placement)
                        started = True
                elif (placement := self._fit_past(job, res)) is not None:
                    self._start(slot, job, placement)
                    self._commit(res, job, placement)
                    started = True
                if started:
                    self.stats.backfilled += 1
                    first = slot + 1
                    break
            if self._users.limits is not None and self._blocked is not None:
                head = self._blocked
                if not self._users.allow(head.user, head.cores):
                    self._dirty = True  # its user's limit now holds the head: start over
                    return
            if not started:
                return

    def _fit_past(self, job: SimJob, res: _Reservation) -> Placement | None:
        """Where a job running past the shadow time fits without touching the reservation."""
        if res.spare_cores is None:
            return self._fit(job)
        assert res.spare_mem is not None
        free_cores, free_mem = self._nodes.arrays()
        cores = np.minimum(free_cores, res.spare_cores)
        mem = np.minimum(free_mem, res.spare_mem)
        return self._place(job, cores, mem)

    def _commit(self, res: _Reservation, job: SimJob, placement: Placement) -> None:
        if res.spare_cores is None:
            res.extra -= job.cores
            return
        assert res.spare_mem is not None
        idx, k = placement
        res.spare_cores[idx] -= k
        res.spare_mem[idx] -= np.multiply(k, job.mem_per_core)
        free_cores = np.array(self._nodes.free_cores)
        res.extra = int(np.minimum(free_cores, res.spare_cores).sum())

    # ---------------------------------------------------------------- nodes

    def _node_down(self, index: int, duration: float | None) -> None:
        hit = [job for _, _, job in self._running if job.placement and index in job.placement[0]]
        for job in hit:
            self._finish(job, JobState.NODE_FAIL)
        self._nodes.fail(index)
        self._node_token[index] += 1
        if duration is not None:
            self._push(self.now + duration, _NODE_UP, index, self._node_token[index])
        self._dirty = True

    def _node_return(self, index: int) -> None:
        self._nodes.restore(index)
        self._dirty = True


def _empty_stream() -> JobStream:
    empty = np.empty(0)
    return JobStream(empty, np.empty(0, np.int64), empty, empty)
