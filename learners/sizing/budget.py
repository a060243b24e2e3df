"""Retry budget: the smallest allocation that keeps a category's expected retries within budget.

Tovar et al. (TPDS 2018) and the bucketing paper (Phung & Thain, IPDPS 2024) pick first
allocations by the waste they expect and pay for it in retries: hundreds per thousand
tasks in the paper's own runs. Here the user's retry budget comes first. A task is
killed when any one resource it can be killed for (memory, disk, wall time: cores only
slow a task down) is below its peak, so each of these ``m`` resources gets ``budget /
m`` of the risk: its first allocation is the ``1 - budget / m`` quantile of the
category's peaks, which under-shoots a new task with the chosen probability whatever
the distribution's shape (see :meth:`BudgetCategory.quantile` for few records). As in
the bucketing paper, the n-th record weighs n, so that the quantile follows a workflow
whose tasks grow as it goes, never below the quantile of every record; the value a
killed attempt reached counts as a record too (the task needed more), so a category
whose tasks outgrow their allocations stops allocating what kills them. The budget is a
limit, not a target: while the share of the category's recent attempts that were killed
is above it (a moving average over about :data:`RECENT` attempts), first attempts get the
largest value seen, and while the category's kills so far exceed the budget of its
records, the quantile's level rises in proportion.

Where the executor reports the attempts it runs (:class:`~learners.sizing.base.Running`),
those that have run longer than every record of their category count as records above
them (censored, as in survival analysis): a category whose tasks all start at once ends
its quickest tasks first, and where memory grows with run time their records are its
smallest. While the running outnumber the budget's share of the records and them, a first
attempt gets the larger of the task's request and the largest record grown by ``1 / n``.

Cores are not a limit: a task given fewer cores than it uses runs slower and holds
them longer, so it wastes none of them; cores above its use are waste. A task's cores
are the share of a worker its memory and disk already take (cores beyond that share
would find no task to serve beside it), or where that is more the use that only
:data:`SLOWED` of the category's tasks exceed, never more than the quantile of the use.
Where the executor tells that no other task waits for room (:attr:`Running.queued`), the
quantile of the use, or the task's request of cores where less: a task slowed then leaves
cores that no task takes, and ends the later for nothing (nf-core methylseq's last tasks).

A retry gets the largest value seen, grown toward twice what the killed attempt reached
(a monitor reports the first sample above the limit, often just above it) by the chance
``1 / k`` that the task exceeds the ``k`` records at or above what it reached (a record
equal to it is a task that needed as much: bioblast's Split tasks all reach 1,304 MB,
and a kill reporting exactly that was retried at twice it); with none, twice what it
reached.

A workflow whose tasks change size in phases (the bucketing paper's trimodal workflow)
kills a whole wave of tasks sized for the phase before, memory within seconds and disk
late, and records of the new phase arrive only as its tasks end. A kill that reached
beyond the category's largest success by more than that lies beyond the median
(:meth:`BudgetCategory.outside`: a tail event stays within it) starts a :class:`Shift`:
until the category has enough successes of its own since, every killing resource of a
first attempt or a retry gets at least its level before the shift times the largest
multiple of it seen since (memory tells disk), and its records since replace the older
ones where they show the new level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from learners.kill_times import KILL_SHARE
from learners.resources import PACKED, Resource, Resources
from learners.sizing.base import Record, TaskFeatures
from learners.sizing.bucketing import Points

BUDGET = 0.05
"""Share of tasks whose first attempt may be killed: half the 10% a default may retry,
the rest left to the cold start and to second retries."""
RECENT = 20
"""Attempts the moving kill share of a category spans, about, or as many as run at once where
more do: a kill tells only after the attempts started beside it, so kills come in bursts of
the category's concurrency (about 300 of bioblast's Analysis tasks run at once, and two
memory kills within seconds took a span of 20 above the budget)."""
SLOWING: frozenset[str] = frozenset({"cores"})
"""Resources a task is not killed for: fewer of them make it slower."""
UNTIMED_CORES = 1.0
"""The most cores a record of a task that ran no time counts for until one that ran comes: it
measured no use of them (CPU time over no wall time), and one core is what Slurm gives a
task unasked (bioblast's first 20 Analysis records ran 0 s at 2 cores, where its tasks that
ran used 1: counted at 2, they gave about 230 first tasks 2 cores, cores AWE 0.971; 0.996)."""
SLOWED = 0.1
"""Share of a category's tasks that may get fewer cores than they use, beyond the worker
share their memory and disk take: a task slowed down ends the run later when it is among
the last, and a run whose workers are not full gains nothing from it (the median use, which
slowed half the tasks, cut the k-Segments sarek trace's tasks per worker-hour from 99.7 to 35.4)."""
PACKING_SLOWED = 2 * SLOWED
"""Share of a category's tasks that may get fewer cores than they use where that lets one more
of its tasks fit on a worker (its memory and disk leave room for it): the worker then runs
``k + 1`` tasks where it ran ``k``, and the tasks the :data:`SLOWED` quantile did not slow
already run at least ``k / (k + 1)`` of their speed (the synthetic exponential workflow: 8.9
cores, one task a worker; 8 cores, two, slowing 10.5% of its tasks instead of 10%)."""


def _kill_share(resource: Resource) -> float:
    """When a kill for ``resource`` comes, as a share of the run: wall time at its end."""
    return KILL_SHARE.get(resource, 1.0)


def _fitting(capacity: float, size: float) -> float:
    """How many of ``size`` fit in ``capacity``: unbounded where the size is none or too small
    for the count to be a number (a peak of 5e-324 cores)."""
    times = capacity / size if size > 0 else math.inf
    return math.floor(times + 1e-9) if math.isfinite(times) else math.inf


def _at(points: Points, level: float) -> float:
    """The smallest record at or above the ``level`` share of ``points``."""
    return points.kth(max(0, math.ceil(level * points.n) - 1))


@dataclass
class Shift:
    """A category whose tasks outgrew what it had shown: its level before, what came since,
    and whether its resources move together."""

    base: dict[Resource, float]
    """Per killing resource, the quantile of the successes before the shift."""
    fence: dict[Resource, float]
    """Per killing resource, what a value had to exceed to show the shift."""
    since: dict[Resource, Points] = field(default_factory=dict)
    """Every value since the shift: successes and what killed attempts reached."""
    succeeded: dict[Resource, Points] = field(default_factory=dict)
    """The successes since the shift."""
    scale: dict[Resource, float] = field(default_factory=dict)
    """Per killing resource, the largest multiple of its base its values reached since."""
    together: dict[Resource, int] = field(default_factory=dict)
    """Per killing resource, successes beyond the fence in another resource and beyond its
    own base (it moved with them), less those within its base (it did not)."""

    def add(self, resource: Resource, value: float, *, success: bool) -> None:
        if resource not in self.base:
            return
        self.since.setdefault(resource, Points()).add(value)
        if success:
            self.succeeded.setdefault(resource, Points()).add(value)
        if self.base[resource] > 0:
            self.scale[resource] = max(self.scale.get(resource, 1.0), value / self.base[resource])

    def learn(self, peak: Resources) -> None:
        """Whether each resource of a success moved with the others beyond their fence."""
        beyond = [r for r in self.base if peak[r] > self.fence[r]]
        for r in self.base:
            if any(other != r for other in beyond):
                self.together[r] = self.together.get(r, 0) + (1 if peak[r] > self.base[r] else -1)

    def follows(self, resource: Resource, other: Resource) -> bool:
        """Whether ``resource`` grows with a rise shown by ``other``: as the successes since
        show, and until they do, if a kill for it would come later (memory is killed within
        seconds, disk as it fills: waiting for a disk kill costs most of a run, a memory
        kill tells at little cost)."""
        together = self.together.get(resource, 0)
        return together > 0 or (together == 0 and _kill_share(resource) > _kill_share(other))

    def multiple(self, resource: Resource) -> float:
        """How much the level of ``resource`` rose: its own largest multiple, or that of a
        resource it follows where more."""
        return max(
            scale
            for other, scale in {resource: 1.0, **self.scale}.items()
            if other == resource or self.follows(resource, other)
        )

    def successes(self, resource: Resource) -> int:
        points = self.succeeded.get(resource)
        return points.n if points else 0

    def floor(self, resource: Resource) -> float:
        """The least a killing resource gets: its base times its multiple, grown by ``1 / n``
        over the ``n`` successes since, as a category's first records are."""
        grown = 1.0 + 1.0 / max(1, self.successes(resource))
        return self.base[resource] * self.multiple(resource) * grown


class BudgetCategory:
    """One category's resources under the retry budget."""

    def __init__(
        self,
        resources: tuple[Resource, ...],
        *,
        budget: float = BUDGET,
        worker: Resources | None = None,
        outlasting: Callable[[float], int] | None = None,
        concurrent: Callable[[], int] | None = None,
        queued: Callable[[], int | None] | None = None,
        busy: Callable[[], int] | None = None,
    ) -> None:
        if not 0 < budget < 1:
            raise ValueError(f"the retry budget is a share of tasks in (0, 1), not {budget}")
        self.resources = resources
        self.worker = worker
        """The worker whose share of memory and disk sets a task's cores (none: the quantile)."""
        self.killers = tuple(r for r in resources if r not in SLOWING)
        self.level = 1.0 - budget / max(1, len(self.killers))
        """The quantile of the peaks a first attempt gets."""
        self.budget = budget
        self.peaks = {r: Points() for r in resources}
        """Successful peaks and the values killed attempts reached."""
        self.successes = {r: Points() for r in resources}
        self.killed = 0.0
        """Moving share of the category's ended attempts that were killed."""
        self.kills = 0
        self.records = 0
        self.shift: Shift | None = None
        self.outlasting = outlasting
        """How many of the category's attempts have run a wall time or longer by now."""
        self.longest = 0.0
        """The longest wall time of a record."""
        self.timed = 0
        """Records that ran some time: the use of cores of one that ran none is no measure
        (CPU time over no wall time; bioblast's first 20 records ran 0 s at 2 cores, where
        its tasks that ran used 1), so it counts only until a record that ran comes."""
        self.concurrent = concurrent
        """How many of the category's attempts run now."""
        self.queued = queued
        """How many tasks of the workflow wait for room, the one sized among them (None: the
        executor does not tell)."""
        self.busy = busy
        """How many attempts of the workflow, of every category, run now (None: the executor
        does not tell)."""

    def few(self, n: int) -> bool:
        """Whether ``n`` records are too few for the quantile: its largest is grown instead."""
        return n * (1.0 - self.level) < 1.0

    def first(self, task: TaskFeatures) -> dict[Resource, float]:
        """The quantile per resource with records; the others are left to the prior."""
        declared = task.declared
        censored = self.outlasting(self.longest) if self.outlasting and self.records else 0
        out = {
            r: self.quantile(r, censored, task.requested.get(r))
            for r in self.resources
            if self.peaks[r].n and r not in declared
        }
        if self.shift is not None:
            for r in self.shift.base:
                if r in out:
                    out[r] = max(out[r], self.shift.floor(r))
        if "cores" in out and self.worker is not None:
            out["cores"] = self.cores(out, self.worker, task.requested.get("cores"))
        return out

    def cores(
        self, sized: dict[Resource, float], worker: Resources, requested: float | None = None
    ) -> float:
        """The share of ``worker`` the task's ``sized`` memory and disk take, in cores, or the
        :data:`SLOWED` quantile of the use where that is more; never more than the quantile
        of the use the killers get. Where the executor tells that no other task waits for
        room, that quantile (a task slowed then leaves cores no task takes), or the cores
        ``requested`` where fewer (the user chose that pace).

        Cores below the use are worth only the tasks they let fit beside: with ``k`` of the
        category's tasks on a worker at those cores, where its memory and disk leave room
        for one more, ``cores / (k + 1)`` of the worker, if that slows no more than
        :data:`PACKING_SLOWED` of the category's tasks; where they do not, and the category's
        tasks alone run on the workers while others wait, ``cores / k`` up to the cores
        ``requested``: the cores a task would leave below that fit no task waiting (the
        next is its like), and slowing it only ends it later."""
        queued = self.queued() if self.queued is not None else None
        if queued is not None and queued <= 1:
            return min(sized["cores"], requested or math.inf)
        killers = [r for r in PACKED if r in sized and r not in SLOWING]
        share = max((sized[r] / worker[r] for r in killers), default=0.0)
        uses = self.peaks["cores"]
        cores = min(sized["cores"], max(share * worker.cores, _at(uses, 1.0 - SLOWED)))
        if cores <= 0:
            return cores
        room = min((_fitting(worker[r], sized[r]) for r in killers), default=math.inf)
        fit = max(1, min(room, _fitting(worker.cores, cores)))
        if room > fit:
            packed = worker.cores / (fit + 1)
            if uses.n - uses.below(packed + 1e-9) <= PACKING_SLOWED * uses.n:
                return packed
        if requested and self._alone():
            return max(cores, min(requested, worker.cores / fit))
        return cores

    def _alone(self) -> bool:
        """Whether the category's attempts are the only ones the executor runs now."""
        if self.busy is None or self.concurrent is None:
            return False
        busy = self.busy()
        return busy > 0 and self.concurrent() >= busy

    def quantile(
        self, resource: Resource, censored: int = 0, requested: float | None = None
    ) -> float:
        """The smallest value at or above the level's share of the records, both of every
        record and weighted to the newest (the larger of the two).

        ``censored`` attempts of the category have run as long as every record or longer:
        they count as records above all the others, and where the quantile of the ``n +
        censored`` lies among them, a first attempt gets the larger of the ``requested``
        size and the largest record grown by ``1 / n`` (nothing has shown what they need).
        Fewer of them leave the quantile as it was: raising its level by their share lowered
        the synthetic exponential workflow's tasks per worker-hour from 18.0 to 14.2.

        The first records of a category come from its quickest tasks, often its smallest:
        the weighted quantile alone, led by them, sizes the many tasks that start before
        any is killed too small. With too few records for the quantile, their largest,
        grown by ``1 / n`` where a task is killed for it (the next of ``n`` tasks exceeds
        the largest of the ``n`` with a chance of ``1 / (n + 1)``, more than the budget).
        The level is :attr:`level`, raised while the category's kills exceed the budget of
        its records: the share above it shrinks by the share the kills overspent.
        """
        points = self.peaks[resource]
        n = points.n
        top = points.top
        level = self.level
        if censored and resource not in SLOWING and level * (n + censored) >= n:
            return max(top * (1.0 + 1.0 / n), requested or 0.0)
        if self.killed > self.budget:
            return top
        if self.few(n):
            return top if resource in SLOWING else top * (1.0 + 1.0 / n)
        if self.kills > self.budget * self.records:
            level = 1.0 - (1.0 - level) * self.budget * self.records / self.kills
        recent = points.weighted(level * points.total)
        return max(recent, _at(points, level))

    def retry(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> float:
        """From the records at or above what the killed attempt reached; in a shift, from the
        successes since (the values killed attempts reached are no bound of this task's
        need), never below the shift's floor."""
        points, floor = self.peaks[resource], 0.0
        if self.shift is not None and resource in self.shift.base:
            points = self.shift.succeeded.get(resource) or Points()
            floor = self.shift.floor(resource)
        as_much = points.n - points.below(measured)
        if not as_much:
            return max(floor, 2 * measured)
        top = points.top
        return max(floor, top, min(2 * measured, top * (1.0 + 1.0 / as_much)))

    def alongside(self, resource: Resource, measured: float, grown: float) -> dict[Resource, float]:
        """The other killing resources of a retry whose ``resource`` grew to ``grown``: in a
        shift, the same multiple of their base as ``grown`` is of its own, for those that
        move with it; else none (the others keep what they had)."""
        shift = self.shift
        if shift is None or resource not in shift.base or shift.base[resource] <= 0:
            return {}
        scale = grown / shift.base[resource]
        return {
            r: base * scale
            for r, base in shift.base.items()
            if r != resource and shift.follows(r, resource)
        }

    def outside(self, resource: Resource, measured: float) -> bool:
        """Whether a killed attempt reached beyond the largest success by more than that lies
        beyond the median: what a tail of the same tasks does not do (the trimodal workflow's
        phase change, 1.3 to 2.1 times its largest success; the iid workflows' kills, at most
        1.18 times theirs)."""
        return not self.few(self.successes[resource].n) and measured > self._fence(resource)

    def _fence(self, resource: Resource) -> float:
        points = self.successes[resource]
        return 2 * points.top - _at(points, 0.5)

    def _span(self) -> int:
        """Attempts the moving kill share spans now: :data:`RECENT`, or those running at once."""
        return max(RECENT, self.concurrent() if self.concurrent else 0)

    def observe(self, record: Record) -> None:
        self.killed -= self.killed / self._span()
        self.records += 1
        if math.isfinite(record.peak.wall):
            self.longest = max(self.longest, record.peak.wall)
        timed = record.peak.wall > 0
        if timed and not self.timed:
            for r in SLOWING.intersection(self.resources):
                self.peaks[r], self.successes[r] = Points(), Points()
        self.timed += timed
        for r in self.resources:
            value = record.peak[r]
            if r in SLOWING and not timed:
                if self.timed:
                    continue
                value = min(value, UNTIMED_CORES)
            if value >= 0 and math.isfinite(value):
                self.peaks[r].add(value)
                self.successes[r].add(value)
                if self.shift is not None:
                    self.shift.add(r, value, success=True)
        if self.shift is not None:
            self.shift.learn(record.peak)
        self._settle()

    def exhausted(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> None:
        self.killed += (1.0 - self.killed) / self._span()
        self.kills += 1
        if self.shift is None and self.outside(resource, measured):
            known = [r for r in self.killers if self.successes[r].n]
            self.shift = Shift(
                {r: _at(self.successes[r], self.level) for r in known},
                {r: self._fence(r) for r in known},
            )
        if self.peaks[resource].n:  # before the first record, the cold start learns it
            self.peaks[resource].add(measured)
            if self.shift is not None:
                self.shift.add(resource, measured, success=False)

    def _settle(self) -> None:
        """End a shift once every resource has enough successes of its own since: their
        records replace the category's where their quantile lies beyond the fence (the new
        level); without that for every resource, only once kills are back within budget
        (the successes since may be tasks started before the shift, still of the old level)."""
        shift = self.shift
        if shift is None or any(self.few(shift.successes(r)) for r in shift.base):
            return
        risen = [r for r in shift.base if _at(shift.succeeded[r], self.level) > shift.fence[r]]
        if len(risen) < len(shift.base) and self.killed > self.budget:
            return
        for r in risen:
            self.peaks[r] = shift.since[r]
            self.successes[r] = shift.succeeded[r]
        self.shift = None
