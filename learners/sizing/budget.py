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
whose tasks outgrow their allocations stops allocating what kills them. While the
share of the category's recent attempts that were killed is above the budget (a
moving average over about :data:`RECENT` attempts), first attempts get the largest
value seen instead: the budget is a limit, not a target.

Cores are not a limit: a task given fewer cores than it uses runs slower and holds
them longer, so it wastes none of them; cores above its use are waste. A task's cores
are the share of a worker its memory and disk already take (cores beyond that share
would find no task to serve beside it), or where that is more the use that only
:data:`SLOWED` of the category's tasks exceed, never more than the quantile of the use.

A retry gets the largest value seen, grown toward twice what the killed attempt reached
(a monitor reports the first sample above the limit, often just above it) by the chance
``1 / k`` that the task exceeds the ``k`` records above what it reached; with no record
above, twice what it reached.
"""

from __future__ import annotations

import math

import numpy as np

from learners.resources import PACKED, Resource, Resources
from learners.sizing.base import Record, TaskFeatures
from learners.sizing.bucketing import Points

BUDGET = 0.05
"""Share of tasks whose first attempt may be killed: half the 10% a default may retry,
the rest left to the cold start and to second retries."""
RECENT = 20
"""Attempts the moving kill share of a category spans, about."""
SLOWING: frozenset[str] = frozenset({"cores"})
"""Resources a task is not killed for: fewer of them make it slower."""
SLOWED = 0.1
"""Share of a category's tasks that may get fewer cores than they use, beyond the worker
share their memory and disk take: a task slowed down ends the run later when it is among
the last, and a run whose workers are not full gains nothing from it (the median use, which
slowed half the tasks, cut the k-Segments sarek trace's tasks per worker-hour from 99.7 to 35.4)."""


class BudgetCategory:
    """One category's resources under the retry budget; records are successful peaks."""

    def __init__(
        self,
        resources: tuple[Resource, ...],
        *,
        budget: float = BUDGET,
        worker: Resources | None = None,
    ) -> None:
        if not 0 < budget < 1:
            raise ValueError(f"the retry budget is a share of tasks in (0, 1), not {budget}")
        self.resources = resources
        self.worker = worker
        """The worker whose share of memory and disk sets a task's cores (none: the quantile)."""
        killers = [r for r in resources if r not in SLOWING]
        self.level = 1.0 - budget / max(1, len(killers))
        """The quantile of the peaks a first attempt gets."""
        self.budget = budget
        self.peaks = {r: Points() for r in resources}
        self.killed = 0.0
        """Moving share of the category's ended attempts that were killed."""

    def first(self, task: TaskFeatures) -> dict[Resource, float]:
        """The quantile per resource with records; the others are left to the prior."""
        declared = task.declared
        out = {r: self.quantile(r) for r in self.resources if self.peaks[r].n and r not in declared}
        if "cores" in out and self.worker is not None:
            out["cores"] = self.cores(out, self.worker)
        return out

    def cores(self, sized: dict[Resource, float], worker: Resources) -> float:
        """The share of ``worker`` the task's ``sized`` memory and disk take, in cores, or the
        :data:`SLOWED` quantile of the use where that is more; never more than the quantile
        of the use the killers get."""
        share = max(
            (sized[r] / worker[r] for r in PACKED if r in sized and r not in SLOWING),
            default=0.0,
        )
        points = self.peaks["cores"]
        slowed = float(points.values[max(0, math.ceil((1.0 - SLOWED) * points.n) - 1)])
        return min(sized["cores"], max(share * worker.cores, slowed))

    def quantile(self, resource: Resource) -> float:
        """The smallest value at or above the ``level`` share of the records, both of every
        record and weighted to the newest (the larger of the two).

        The first records of a category come from its quickest tasks, often its smallest:
        the weighted quantile alone, led by them, sizes the many tasks that start before
        any is killed too small. With too few records for the quantile, their largest,
        grown by ``1 / n`` where a task is killed for it (the next of ``n`` tasks exceeds
        the largest of the ``n`` with a chance of ``1 / (n + 1)``, more than the budget).
        """
        points = self.peaks[resource]
        n = points.n
        top = float(points.values[-1])
        if self.killed > self.budget:
            return top
        if n * (1.0 - self.level) < 1.0:
            return top if resource in SLOWING else top * (1.0 + 1.0 / n)
        weights = points.csig
        at = int(np.searchsorted(weights, self.level * weights[-1], side="left"))
        recent = points.values[min(max(at - 1, 0), n - 1)]
        every = points.values[math.ceil(self.level * n) - 1]
        return float(max(recent, every))

    def retry(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> float:
        points = self.peaks[resource]
        above = points.n - int(np.searchsorted(points.values, measured, side="right"))
        if not above:
            return 2 * measured
        top = float(points.values[-1])
        return max(top, min(2 * measured, top * (1.0 + 1.0 / above)))

    def observe(self, record: Record) -> None:
        self.killed -= self.killed / RECENT
        for r in self.resources:
            value = record.peak[r]
            if value >= 0 and math.isfinite(value):
                self.peaks[r].add(value)

    def exhausted(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> None:
        self.killed += (1.0 - self.killed) / RECENT
        if self.peaks[resource].n:  # before the first record, the cold start learns it
            self.peaks[resource].add(measured)
