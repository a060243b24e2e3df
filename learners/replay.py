"""Replay a trace of tasks through a sizer on N simulated workers.

Tasks arrive at their recorded submit times (all at 0 where a trace has none)
and start first in, first out: the next task starts as soon as a worker has
room for its allocation (first fit), and is sized (again) then, so early tasks
are sized with little history, as in a real run; a task the sizer is not
``ready`` to size yet waits while the tasks behind it start. Workers may join over time, as
they did in the recorded runs. A task's record reaches the sizer only when it
finishes.

How an attempt ends is :func:`learners.attempt_end.attempt_end`, the rule the
simulated workers follow too: fewer cores than a task uses stretch its run, memory
and disk below its peaks kill it (where its memory series crosses the allocation,
or when the ``peaks`` model says: ``calibrated`` from the bucketing paper's real
runs, the honest model; ``slow`` and ``fast`` as the bounds). A killed attempt is
retried with the sizer's next allocation. With a memory series, allocated and
consumed memory are the trapezoid integrals over the samples (k-Segments'
accounting), and a sizer with a step function (k-Segments) allocates memory over
time and retries selectively or partially.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import numpy as np

from learners.attempt_end import Kills, MemorySeries, Peaks, attempt_end
from learners.metrics import Usage
from learners.resources import PACKED, Resource, Resources
from learners.sizing.base import Exhaustion, Record, Running, Sizer, TaskFeatures, Unfittable
from learners.sizing.ksegments import Steps, trapezoid


@runtime_checkable
class StepSizer(Protocol):
    """A sizer that can also allocate memory over time (see ``Composite.memory_steps``)."""

    def memory_steps(self, task: TaskFeatures) -> Steps | None: ...

    def memory_retry(self, task: TaskFeatures, steps: Steps, failed_at: int) -> Steps: ...


@dataclass(frozen=True, slots=True)
class TraceTask:
    """One task of a trace: what it really needed (``peak.wall`` is its wall time)."""

    category: str
    peak: Resources
    input_size: float | None = None
    requested: Mapping[str, float] = field(default_factory=dict)
    series: MemorySeries | None = None
    submit: float = 0.0
    """Seconds after the trace's first submission."""
    cpu: float | None = None
    """Cores used on average (CPU time / wall time); the peak where unknown."""

    @property
    def features(self) -> TaskFeatures:
        return TaskFeatures(self.category, self.input_size, requested=self.requested)

    @property
    def use(self) -> float:
        """Cores below which the task runs slower."""
        return self.peak.cores if self.cpu is None else self.cpu


@dataclass
class ReplayResult:
    """What one sizer did to one trace."""

    sizer: str
    workers: int
    tasks: int
    completed: int = 0
    attempts: int = 0
    retries: int = 0
    """Attempts killed for exhausting a resource."""
    unfit: int = 0
    """Tasks abandoned: they exhausted a whole worker."""
    makespan: float = 0.0
    usage: dict[Resource, Usage] = field(default_factory=dict)
    worker_seconds: float = 0.0
    """Time workers were there, summed over workers."""

    @property
    def retries_pct(self) -> float:
        return 100.0 * self.retries / self.tasks if self.tasks else 0.0

    @property
    def tasks_per_worker_hour(self) -> float:
        hours = self.worker_seconds / 3600.0
        return self.completed / hours if hours > 0 else math.nan

    def rows(self) -> list[dict[str, float | str | int]]:
        """One row per resource (wastes in resource units x seconds)."""
        return [
            {
                "sizer": self.sizer,
                "resource": r,
                "awe": u.awe,
                "waste_fragmentation": u.fragmentation,
                "waste_failed": u.failed,
                "retries_pct": self.retries_pct,
                "retries": self.retries,
                "unfit": self.unfit,
                "tasks_per_worker_hour": self.tasks_per_worker_hour,
            }
            for r, u in self.usage.items()
        ]


@dataclass
class _Attempt:
    end: float
    exhausted: list[Exhaustion]
    failed_at: int | None
    """Memory sample the attempt failed at (series only)."""
    consumed: dict[Resource, float]
    allocated: dict[Resource, float]


@dataclass
class _Task:
    index: int
    trace: TraceTask
    features: TaskFeatures
    allocation: Resources | None = None
    steps: Steps | None = None
    version: int = -1
    previous: Resources | None = None
    previous_steps: Steps | None = None
    exhausted: list[Exhaustion] = field(default_factory=list)
    failed_at: int | None = None
    started: float = 0.0


def replay(
    tasks: Sequence[TraceTask],
    sizer: Sizer,
    *,
    workers: int,
    worker: Resources,
    resources: tuple[Resource, ...] = PACKED,
    use_series: bool = True,
    peaks: Peaks = "slow",
    time_varying: bool = True,
    arrivals: Sequence[float] | None = None,
    seed: int = 0,
) -> ReplayResult:
    """Run every task of ``tasks`` to completion (or to :class:`Unfittable`) and account for it.

    ``arrivals`` are the times the workers join (all at 0 by default), one per worker;
    ``seed`` seeds the calibrated kill draws. ``time_varying=False`` plays an
    executor that cannot change a running task's limit: sizers with a step function
    (k-Segments) allocate its peak.
    """
    if workers < 1:
        raise ValueError("replay needs at least one worker")
    joins = sorted(arrivals) if arrivals is not None else [0.0] * workers
    if len(joins) != workers:
        raise ValueError(f"{workers} workers but {len(joins)} arrival times")
    packed = tuple(r for r in resources if r in PACKED)
    result = ReplayResult(sizer.name, workers, len(tasks), usage={r: Usage() for r in packed})
    states = [_Task(i, t, replace(t.features, key=i)) for i, t in enumerate(tasks)]
    arriving = sorted(range(len(tasks)), key=lambda i: (tasks[i].submit, i))
    arriving.reverse()
    pending: list[tuple[float, int]] = []
    free: list[dict[str, float]] = []
    in_flight: list[tuple[float, int, int, _Attempt]] = []
    learned = 0
    now = 0.0
    kills = Kills(peaks, np.random.default_rng(seed))
    stepper = sizer if use_series and time_varying and isinstance(sizer, StepSizer) else None
    running: Running | None = getattr(sizer, "running", None)
    """Where the sizer learns which attempts run (see :class:`Running`)."""
    held: dict[str, list[tuple[float, int]]] = {}
    """Per category, the tasks the sizer was not ready to start: asked again when an attempt
    of the category ends or a category's first record comes (what a sizer waits for)."""
    recorded: set[str] = set()

    def size(st: _Task) -> None:
        features = st.features
        if st.previous is None:
            st.allocation = sizer.allocate(features)
            with_steps = stepper is not None and st.trace.series is not None
            st.steps = stepper.memory_steps(features) if with_steps else None
        else:
            alloc, steps = st.previous, st.previous_steps
            for ex in st.exhausted:
                if ex.resource == "memory" and steps is not None and st.failed_at is not None:
                    assert stepper is not None
                    steps = stepper.memory_retry(features, steps, st.failed_at)
                    alloc = alloc.with_("memory", steps.peak)
                else:
                    alloc = sizer.allocate(features, alloc, ex)
            st.allocation, st.steps = alloc, steps
        if st.steps is not None:
            st.allocation = st.allocation.with_("memory", st.steps.peak)
        st.version = learned

    while arriving or pending or in_flight:
        if running is not None:
            running.now = now
        while joins and joins[0] <= now:
            joins.pop(0)
            free.append({r: worker[r] for r in PACKED})
        while arriving and tasks[arriving[-1]].submit <= now:
            index = arriving.pop()
            heapq.heappush(pending, (tasks[index].submit, index))
            if running is not None:
                running.submit(tasks[index].category)
        while pending:
            st = states[pending[0][1]]
            category = st.trace.category
            if st.previous is None and (category in held or not sizer.ready(st.features)):
                held.setdefault(category, []).append(heapq.heappop(pending))
                continue
            if running is not None:
                running.queued = len(pending) + sum(map(len, held.values()))
            if st.allocation is None or st.version != learned:
                try:
                    size(st)
                except Unfittable:
                    heapq.heappop(pending)
                    result.unfit += 1
                    continue
            alloc = st.allocation
            assert alloc is not None
            slot = next((w for w, f in enumerate(free) if _fits(alloc, f)), None)
            if slot is None:
                if not in_flight and not joins and len(free) == workers:
                    raise RuntimeError(f"task {st.index} fits no empty worker: {alloc}")
                break
            heapq.heappop(pending)
            for r in PACKED:
                free[slot][r] -= alloc[r]
            attempt = _run(st, alloc, packed, resources, use_series, kills)
            result.attempts += 1
            st.started = now
            if running is not None:
                running.start(st.trace.category, now)
            heapq.heappush(in_flight, (now + attempt.end, st.index, slot, attempt))
        events = [
            t
            for t in (
                in_flight[0][0] if in_flight else None,
                tasks[arriving[-1]].submit if arriving else None,
                joins[0] if joins and pending else None,
            )
            if t is not None
        ]
        if not events:
            break
        now = min(events)
        if not in_flight or in_flight[0][0] > now:
            continue
        now, index, slot, attempt = heapq.heappop(in_flight)
        st = states[index]
        category = st.trace.category
        if running is not None:
            running.end(category, st.started)
        released = [category] if category in recorded or attempt.exhausted else list(held)
        for waiting in released:
            for item in held.pop(waiting, ()):
                heapq.heappush(pending, item)
        alloc = st.allocation
        assert alloc is not None
        for r in PACKED:
            free[slot][r] += alloc[r]
        if attempt.exhausted:
            result.retries += 1
            for r in packed:
                result.usage[r].failure(attempt.allocated[r])
            for ex in attempt.exhausted:
                sizer.observe_exhaustion(st.features, alloc, ex)
            st.previous, st.previous_steps = alloc, st.steps
            st.exhausted, st.failed_at = attempt.exhausted, attempt.failed_at
            st.allocation = None
            heapq.heappush(pending, (st.trace.submit, index))
        else:
            result.completed += 1
            for r in packed:
                result.usage[r].success(attempt.consumed[r], attempt.allocated[r])
            sizer.observe(_record(st, attempt, use_series))
            recorded.add(category)
            learned += 1
        result.makespan = now
    start = min((t.submit for t in tasks), default=0.0)
    joined = sorted(arrivals) if arrivals is not None else [0.0] * workers
    result.worker_seconds = sum(max(result.makespan - max(t, start), 0.0) for t in joined)
    return result


def _fits(alloc: Resources, free: dict[str, float]) -> bool:
    return all(alloc[r] <= free[r] + 1e-9 for r in PACKED)


def _run(
    st: _Task,
    alloc: Resources,
    packed: tuple[Resource, ...],
    resources: tuple[Resource, ...],
    use_series: bool,
    kills: Kills,
) -> _Attempt:
    """How an attempt with ``alloc`` ends, and what it allocated and consumed.

    Fewer cores than the task uses stretch its run (and its memory series) in proportion.
    """
    task = st.trace
    series = task.series if use_series else None
    peak = task.peak if series is None else task.peak.with_("wall", float(series.times[-1]))
    limits = packed + (("wall",) if "wall" in resources else ())
    ended = attempt_end(
        peak, alloc, kills, use=task.use, series=series, steps=st.steps, limits=limits
    )
    end, stretch = ended.end, ended.stretch
    allocated = {r: alloc[r] * end for r in packed}
    consumed = {r: task.peak[r] * end for r in packed}
    if "cores" in packed:
        consumed["cores"] = min(task.peak.cores, alloc.cores) * end
    if series is not None and "memory" in packed:
        memory_steps = st.steps or Steps(np.array([alloc.memory]), ((0, 0),))
        last = int(np.searchsorted(series.times * stretch, end, side="right"))
        times = series.times[:last] * stretch
        allocated["memory"] = trapezoid(memory_steps.over(last), times)
        consumed["memory"] = trapezoid(series.mb[:last], times)
    return _Attempt(end, list(ended.exhausted), ended.failed_at, consumed, allocated)


def _record(st: _Task, attempt: _Attempt, use_series: bool) -> Record:
    task = st.trace
    series = task.series if use_series else None
    peak = task.peak
    if series is not None:
        peak = Resources(peak.cores, float(series.mb.max()), peak.disk, attempt.end)
        interval = float(np.median(np.diff(series.times))) if len(series.times) > 1 else None
        return Record(st.features, peak, tuple(series.mb.tolist()), interval)
    return Record(st.features, peak)
