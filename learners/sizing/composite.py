"""One Sizer over per-category learners: the rules every algorithm shares.

An algorithm is a factory of :class:`CategoryLearner` (one per category, each
owning some resources); most are :class:`PerResource`, one independent
:class:`ResourceLearner` per resource. :class:`Composite` adds what no algorithm
should decide alone:

- the TaskVine retry rule: only the exhausted resource is re-predicted, from the
  value it reached; the others keep what the failed attempt had, unless a
  :class:`JointLearner` grows them (never shrinks them) with it;
- a retry that would not grow the exhausted resource doubles it instead;
- allocations stay within ``[minimum, worker]`` and at least :data:`SMALLEST`; a task that
  exhausts a whole worker (or a size the user fixed) is :class:`Unfittable`;
- sizes the user declared always win;
- with ``prior``, a category's first tasks start from what is known instead of a
  whole worker: the task's request, else the larger of the workflow's other
  categories' largest peak and the task's share of its stage's allocation, never
  below :data:`PRIOR_FLOOR` (or, for memory and disk, the share if less); an attempt
  killed before the category's first record doubles the start of the category's later
  tasks; where nothing tells a size (no request, no stage share, no other category),
  the category starts slowly, its running attempts growing with its records
  (:meth:`Composite.ready`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from learners.resources import PACKED, RESOURCES, Resource, Resources
from learners.sizing.base import Bound, Exhaustion, Record, Running, TaskFeatures, Unfittable
from learners.sizing.budget import BUDGET
from learners.sizing.history import History
from learners.sizing.ksegments import Steps

SMALLEST: dict[Resource, float] = {"cores": 0.01, "memory": 64.0, "disk": 64.0, "wall": 1.0}
"""The smallest allocation of each resource: a learner's 0 (all records 0) becomes this. A
memory or disk limit below 64 MB protects no co-tenant, and a small process's measured peak
varies by more than a learner's margin (a ``sleep 2``, measured at 3.23 MB once as its shell,
was killed at a learned 3.17 MB)."""
PRIOR_FLOOR: dict[Resource, float] = {"cores": 1.0, "memory": 1024.0, "disk": 1024.0}
"""The least a category's first tasks get from the prior when the user asks for nothing: one
core (Slurm's and Nextflow's default per task) and a gigabyte of memory and of disk, so that
a category learns from its own records before it gets less than another category's tiny
peaks; no more memory or disk than the task's share of its stage, which the user sized (a
stage of 2 cores and 1 GB ran its first tasks one at a time, each with the gigabyte)."""
PROBES = 4
"""Attempts of a category with nothing but its own records to size them by that run at once
before its first record, and more that may run per record (:meth:`Composite.ready`)."""
RAMPED = round(1 / BUDGET)
"""Records of a category past which its tasks start freely: the next task exceeds the
largest of ``n`` records with a chance of ``1 / (n + 1)``, within the retry budget."""


class ResourceLearner(Protocol):
    """One resource of one category."""

    def first(self, task: TaskFeatures) -> float:
        """The value for a task's first attempt."""
        ...

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        """The value after an attempt with ``allocated`` was killed having reached ``measured``."""
        ...

    def observe(self, value: float, record: Record) -> None:
        """A successful attempt's peak of this resource."""
        ...

    def exhausted(self, allocated: float, measured: float) -> None:
        """An attempt with ``allocated`` was killed having reached ``measured``."""
        ...


@runtime_checkable
class JointLearner(Protocol):
    """A category learner whose retry may grow resources other than the exhausted one."""

    def alongside(self, resource: Resource, measured: float, grown: float) -> dict[Resource, float]:
        """The other resources of a retry after an attempt killed having reached ``measured``
        of ``resource``, which the retry grows to ``grown``; those left out keep theirs."""
        ...


@runtime_checkable
class StepLearner(Protocol):
    """A memory learner that can also allocate over time (k-Segments)."""

    def steps(self, task: TaskFeatures) -> Steps | None:
        """The allocation per monitoring sample, or None while it cannot predict."""
        ...

    def retry_steps(self, steps: Steps, failed_at: int) -> Steps:
        """The allocation after ``steps`` failed at sample ``failed_at``."""
        ...


class CategoryLearner(Protocol):
    """The learner of one category for the resources it owns."""

    resources: tuple[Resource, ...]

    def first(self, task: TaskFeatures) -> dict[Resource, float]:
        """The values of a first attempt; a resource left out (declared, or not known yet)
        gets the declared size, the prior or a whole worker."""
        ...

    def retry(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> float: ...

    def observe(self, record: Record) -> None: ...

    def exhausted(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> None: ...


class PerResource:
    """A category learner made of independent resource learners."""

    def __init__(self, learners: Mapping[Resource, ResourceLearner]) -> None:
        self.learners = dict(learners)
        self.resources = tuple(self.learners)

    def first(self, task: TaskFeatures) -> dict[Resource, float]:
        declared = task.declared
        return {r: ln.first(task) for r, ln in self.learners.items() if r not in declared}

    def retry(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> float:
        return self.learners[resource].retry(task, allocated, measured)

    def observe(self, record: Record) -> None:
        for r, learner in self.learners.items():
            value = record.peak[r]
            if value >= 0 and math.isfinite(value):
                learner.observe(value, record)

    def exhausted(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> None:
        self.learners[resource].exhausted(allocated, measured)


class Together:
    """Category learners side by side, each sizing the resources it owns."""

    def __init__(self, parts: Iterable[CategoryLearner]) -> None:
        self.parts = tuple(parts)
        self._owner = {r: part for part in self.parts for r in part.resources}
        self.resources = tuple(self._owner)

    def first(self, task: TaskFeatures) -> dict[Resource, float]:
        out: dict[Resource, float] = {}
        for part in self.parts:
            out.update(part.first(task))
        return out

    def retry(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> float:
        return self._owner[resource].retry(task, resource, allocated, measured)

    def observe(self, record: Record) -> None:
        for part in self.parts:
            part.observe(record)

    def exhausted(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> None:
        self._owner[resource].exhausted(task, resource, allocated, measured)

    def part_for(self, resource: Resource) -> CategoryLearner:
        return self._owner[resource]


class Composite:
    """A :class:`~learners.sizing.base.Sizer` keeping one learner per category."""

    def __init__(
        self,
        name: str,
        new_learner: Callable[[str], CategoryLearner],
        *,
        resources: tuple[Resource, ...],
        worker: Resources,
        minimum: Resources | None = None,
        prior: bool = False,
        running: Running | None = None,
    ) -> None:
        self.name = name
        self.resources = resources
        """The resources this sizer allocates; the others stay unreserved (0, wall unbounded)."""
        self._sized = frozenset(resources)
        self.packed = tuple(r for r in resources if r in PACKED)
        """Those of them a worker has a fixed amount of."""
        self.worker = worker
        self.minimum = minimum or Resources(wall=0.0)
        self.prior = prior
        self.running = running or Running()
        """The attempts the executor runs, where it reports them (the replay does)."""
        self.history = History()
        """The latest records of every category: the sizer's state across runs."""
        self._new_learner = new_learner
        self._learners: dict[str, CategoryLearner] = {}
        self._top: dict[Resource, dict[str, float]] = {r: {} for r in RESOURCES}
        """Largest peak per resource and category."""
        self._records: Counter[str] = Counter()
        """Successful attempts per category."""
        self._killed: dict[tuple[str, Resource], float] = {}
        """Largest value reached by a killed attempt, per category and resource."""
        self._capacities: dict[Resources, Resources] = {}
        """What :meth:`capacity` found, per size of the task's own worker."""
        self._declared: dict[tuple[object, ...], Resources] = {}
        """What :meth:`_as_declared` found, per task's worker and declared sizes."""

    def learner(self, category: str) -> CategoryLearner:
        learner = self._learners.get(category)
        if learner is None:
            learner = self._learners[category] = self._new_learner(category)
        return learner

    def allocate(
        self,
        task: TaskFeatures,
        previous: Resources | None = None,
        exhaustion: Exhaustion | None = None,
    ) -> Resources:
        if exhaustion is None and self.declares_all(task):
            return self._as_declared(task)
        learner = self.learner(task.category)
        if exhaustion is None:
            values = learner.first(task)
            if self.prior:
                values.update(self._cold_start(task))
        else:
            if previous is None:
                raise ValueError("a retry needs the previous allocation")
            values = {r: previous[r] for r in self.resources}
            r = exhaustion.resource
            values[r] = self._grown(task, learner, previous, exhaustion)
            if isinstance(learner, JointLearner):
                joint = learner.alongside(r, exhaustion.measured, values[r])
                for other, value in joint.items():
                    if other not in task.declared:
                        values[other] = max(previous[other], value)
        return self._finish(task, values)

    def declares_all(self, task: TaskFeatures) -> bool:
        """Whether ``task`` declares every resource this sizer sizes: nothing learnt changes
        its size."""
        return task.declared.keys() >= self._sized

    def _as_declared(self, task: TaskFeatures) -> Resources:
        """The size of a task that declares every resource this sizer sizes: what it declares,
        put in the worker's bounds. Nothing learnt changes it and a stage's tasks declare
        alike, so it is found once per worker and declaration."""
        key = (task.worker, *task.declared.items())
        found = self._declared.get(key)
        if found is None:
            found = self._declared[key] = self._finish(task, {})
        return found

    def ready(self, task: TaskFeatures) -> bool:
        """Whether the task's first attempt may start now. A category that nothing but its
        own records tells the size of (no resource declared or requested, no stage share,
        no other category; with the prior on) starts slowly: :data:`PROBES` attempts on
        whole workers, then :data:`PROBES` more running at once per record, until
        :data:`RAMPED` records. Started at once, its tasks would each take a whole worker,
        or, once one record came, all be sized from it (on the bucketing paper's
        exponential workflow, 151 of 152 such tasks were killed); this way ``PROBES``
        tasks are sized from each number ``n`` of records, of which about
        ``PROBES / (n + 1)`` exceed them."""
        records = self._records[task.category]
        if not self.prior or records >= RAMPED:
            return True
        if self.running.count(task.category) < PROBES * (1 + records):
            return True
        return bool(self._prior(task)) or any(r in task.declared for r in self.resources)

    def _grown(
        self,
        task: TaskFeatures,
        learner: CategoryLearner,
        previous: Resources,
        exhaustion: Exhaustion,
    ) -> float:
        r = exhaustion.resource
        had = previous[r]
        if r in task.declared:
            declared = task.declared[r]
            if declared > had:  # raised since the attempt (a failed run taken up, its file edited)
                return declared
            raise Unfittable(task.category, r, Bound.DECLARED, declared, exhaustion.measured)
        capacity = self.capacity(task)[r]
        if had >= capacity:
            raise Unfittable(task.category, r, Bound.WORKER, capacity, exhaustion.measured)
        if r not in self.resources:
            raise ValueError(f"sizer {self.name!r} does not size {r}, so it cannot be exhausted")
        value = learner.retry(task, r, had, exhaustion.measured)
        return value if value > had else 2 * had

    def _cold_start(self, task: TaskFeatures) -> dict[Resource, float]:
        """First values of the resources the task's category has no record of yet."""
        return {
            r: max(value, 2 * self._killed.get((task.category, r), 0.0))
            for r, value in self._prior(task).items()
            if task.category not in self._top[r]
        }

    def _prior(self, task: TaskFeatures) -> dict[Resource, float]:
        """What tells the task's size apart from its category's own records: its request,
        else the larger of the other categories' largest peak and its stage share."""
        out: dict[Resource, float] = {}
        for r in self.resources:
            if r in task.declared:
                continue
            if r in task.requested:
                out[r] = task.requested[r]
                continue
            known = [v for c, v in self._top[r].items() if c != task.category]
            floor = PRIOR_FLOOR.get(r, 0.0)
            if r in task.share:
                known.append(task.share[r])
                if r != "cores":  # one core, as Slurm gives
                    floor = min(floor, task.share[r])
            if known:
                out[r] = max(*known, floor)
        return out

    def capacity(self, task: TaskFeatures) -> Resources:
        """The largest worker ``task`` may run on: the sizer's, or the task's own if smaller
        (kept per worker size: every task of a stage asks with the same one)."""
        own = task.worker
        if own is None:
            return self.worker
        found = self._capacities.get(own)
        if found is None:
            mine = self.worker
            found = self._capacities[own] = Resources(
                min(mine.cores, own.cores),
                min(mine.memory, own.memory),
                min(mine.disk, own.disk),
                min(mine.wall, own.wall),
            )
        return found

    def _finish(self, task: TaskFeatures, values: Mapping[Resource, float]) -> Resources:
        """Clamp to [minimum, worker], at least SMALLEST, put in the declared sizes."""
        worker = self.capacity(task)
        out: dict[str, float] = {r: 0.0 for r in PACKED}
        out["wall"] = math.inf
        for r in self.resources:
            if r not in task.declared:
                value = values.get(r, worker[r])
                out[r] = min(max(value, self.minimum[r], SMALLEST[r]), worker[r])
        for name, value in task.declared.items():
            if name not in out:
                known = ", ".join(out)
                raise ValueError(f"unknown resource {name!r} declared (known: {known})")
            if value > worker[name]:  # type: ignore[index]
                limit = worker[name]  # type: ignore[index]
                raise Unfittable(task.category, name, Bound.WORKER, limit, value, declares=True)
            out[name] = value
        return Resources(**out)

    def observe(self, record: Record) -> None:
        category = record.task.category
        self.learner(category).observe(record)
        self._records[category] += 1
        self.history.add(record)
        for r in self.resources:
            value = record.peak[r]
            if math.isfinite(value):
                top = self._top[r]
                top[category] = max(top.get(category, 0.0), value)

    def observe_exhaustion(
        self, task: TaskFeatures, allocation: Resources, exhaustion: Exhaustion
    ) -> None:
        if exhaustion.resource in self.resources:
            r = exhaustion.resource
            self.learner(task.category).exhausted(task, r, allocation[r], exhaustion.measured)
            key = (task.category, r)
            self._killed[key] = max(self._killed.get(key, 0.0), exhaustion.measured)

    def state(self) -> dict[str, Any]:
        """What the sizer learnt, as plain data (its latest records)."""
        return self.history.state()

    def restore(self, state: Mapping[str, Any]) -> None:
        """Learn again what :meth:`state` kept (from an earlier run of the same workflow)."""
        for record in History.records(state):
            self.observe(record)

    def memory_steps(self, task: TaskFeatures) -> Steps | None:
        """The task's memory as a step function over monitoring samples, when the sizer
        has one (k-Segments) and memory is neither declared nor unsized; else None.

        For executors that can change a running task's limit (the replay, the
        simulator); :meth:`allocate` gives the same sizer's peak.
        """
        learner = self._step_learner(task)
        steps = learner.steps(task) if learner else None
        return None if steps is None else self._clip(task, steps)

    def memory_retry(self, task: TaskFeatures, steps: Steps, failed_at: int) -> Steps:
        """The step function after ``steps`` failed at sample ``failed_at``.

        Raises :class:`Unfittable` when the failing step already had a whole worker's memory.
        """
        learner = self._step_learner(task)
        if learner is None:
            raise ValueError(f"sizer {self.name!r} has no step function for memory")
        capacity = self.capacity(task).memory
        if steps.over(failed_at + 1)[failed_at] >= capacity:
            raise Unfittable(task.category, "memory", Bound.WORKER, capacity)
        return self._clip(task, learner.retry_steps(steps, failed_at))

    def _step_learner(self, task: TaskFeatures) -> StepLearner | None:
        if "memory" in task.declared or "memory" not in self.resources:
            return None
        learner = self.learner(task.category)
        if isinstance(learner, Together):
            learner = learner.part_for("memory")
        memory = learner.learners.get("memory") if isinstance(learner, PerResource) else None
        return memory if isinstance(memory, StepLearner) else None

    def _clip(self, task: TaskFeatures, steps: Steps) -> Steps:
        low = max(self.minimum.memory, SMALLEST["memory"])
        return steps.clipped(low, self.capacity(task).memory)
