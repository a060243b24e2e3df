"""Tovar et al.'s job sizing (TPDS 2018), exact to cctools ``category.c`` and ``histogram.c``.

A category keeps, per resource, a histogram of successful peaks (bucket keys
``ceil(v / size) * size``, each with a count and a wall-time sum) and the
largest value seen on any attempt. Every 25 successful completions it
recomputes a first allocation per resource:

- min waste: the key minimising ``a * tau + a_m * A(a)``, tau the mean wall
  time and A(a) the mean wall time spent by tasks above ``a``;
- max throughput: the key maximising ``(C(a) * a_m / a + N - C(a)) / (tau + A(a))``;
- max seen (cctools' ``max`` mode, the naive baseline of Phung & Thain, IPDPS 2024): the largest
  peak plus a third of a bucket, rounded up to its bucket.

Until the category is steady (25 completions since the last new maximum) a task
gets the category's explicit maximum or a whole worker. A retry gets ``a_m``
(the largest value seen, cctools' two-step policy) or, in the doubling variant
later papers use, twice what failed; max seen retries on a whole worker.
cctools works on whole units here: ``a_m`` is truncated to an integer, and so
is every key.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from learners.resources import Resource, Resources
from learners.sizing.base import Record, TaskFeatures

BUCKET_SIZES: dict[Resource, float] = {"cores": 1.0, "memory": 250.0, "disk": 250.0, "wall": 10.0}
"""cctools' histogram buckets (wall time is ours: Tovar et al. use 10 s partitions)."""

EVERY = 25
"""cctools ``first_allocation_every_n_tasks``."""

Mode = Literal["min-waste", "max-throughput", "max-seen"]
Retry = Literal["max", "double"]


@dataclass
class Histogram:
    """cctools ``histogram``: buckets (start, end] keyed by their end, with wall-time sums."""

    size: float
    counts: dict[float, int] = field(default_factory=dict)
    times: dict[float, float] = field(default_factory=dict)
    max_value: float = 0.0

    def round_up(self, value: float) -> float:
        return abs(math.ceil(value / self.size)) * self.size * (1.0 if value >= 0 else -1.0)

    def insert(self, value: float, wall: float) -> None:
        if value < 0 or wall < 0:
            return
        key = self.round_up(value)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.times[key] = self.times.get(key, 0.0) + wall
        self.max_value = max(self.max_value, value)

    def __len__(self) -> int:
        return len(self.counts)

    def accumulated(self) -> tuple[list[float], list[float], list[float], float]:
        """(keys ascending, counts up to each key, mean time above each key, mean time).

        cctools ``category_first_allocation_accum_times``: A_i = sum_{j>i} T_j / N.
        """
        keys = sorted(self.counts)
        n = len(keys)
        total = float(sum(self.counts.values()))
        counts_accum, running = [], 0.0
        for key in keys:
            running += self.counts[key]
            counts_accum.append(running)
        above = [0.0] * n
        for i in range(n - 2, -1, -1):
            above[i] = above[i + 1] + self.times[keys[i + 1]] / total
        tau = above[0] + self.times[keys[0]] / total
        return keys, counts_accum, above, tau


def min_waste(h: Histogram, top: float) -> float:
    """cctools ``category_first_allocation_min_waste``; -1 without records."""
    if top < 0 or len(h) < 1:
        return -1
    keys, _, above, tau = h.accumulated()
    a_m = math.trunc(top)
    best, best_cost = a_m, sys.float_info.max
    for key, a_above in zip(keys, above, strict=True):
        a = math.trunc(key)
        if a < 1:
            continue
        cost = a * tau + a_m * a_above
        if cost < best_cost:
            best, best_cost = a, cost
    return h.round_up(min(best, a_m))


def max_throughput(h: Histogram, top: float) -> float:
    """cctools ``category_first_allocation_max_throughput``; -1 without records."""
    if top < 0 or len(h) < 1:
        return -1
    keys, counts_accum, above, tau = h.accumulated()
    a_m = math.trunc(top)
    n = counts_accum[-1]
    best, best_rate = a_m, 0.0
    for key, before, a_above in zip(keys, counts_accum, above, strict=True):
        a = math.trunc(key)
        if a < 1:
            continue
        rate = _ieee_div((before * a_m) / a + (n - before), tau + a_above)
        if rate > best_rate:
            best, best_rate = a, rate
    return h.round_up(min(best, a_m))


def _ieee_div(num: float, den: float) -> float:
    """C's double division: a zero denominator (wall times of 0 s) gives inf, or NaN for 0/0."""
    if den:
        return num / den
    return math.copysign(math.inf, num) if num else math.nan


def max_seen(h: Histogram, top: float, worker: float, explicit: float) -> float:
    """cctools ``category_first_allocation_max_seen``: a third of a bucket above the top peak."""
    if top < 0 or len(h) < 1:
        return -1
    rounded = h.round_up(h.max_value + math.floor(h.size / 3))
    bounds = [b for b in (explicit, worker) if b > -1]
    return min(rounded, min(bounds)) if bounds else rounded


class TovarCategory:
    """One category under cctools' min-waste, max-throughput or max-seen allocation.

    The category is one state across its resources, as in cctools: a new
    maximum of any resource before the steady state restarts the count of
    completions for all of them.
    """

    def __init__(
        self,
        mode: Mode,
        resources: tuple[Resource, ...],
        worker: Resources,
        *,
        retry: Retry = "max",
        maximum: Mapping[str, float] | None = None,
        bucket_sizes: Mapping[str, float] | None = None,
        every: int = EVERY,
    ) -> None:
        sizes = {**BUCKET_SIZES, **(bucket_sizes or {})}
        self.mode = mode
        self.resources = resources
        self.worker = worker
        self.retry_mode = retry
        self.maximum = dict(maximum or {})
        """The category's explicit maximum per resource (cctools ``max_allocation``)."""
        self.every = every
        self.histograms = {r: Histogram(sizes[r]) for r in resources}
        self.seen: dict[Resource, float] = {r: -1.0 for r in resources}
        """Largest value on any attempt (cctools ``max_resources_seen``)."""
        self.first_allocation: dict[Resource, float] | None = None
        self.completions = 0
        """Successful completions since the last new maximum."""
        self.successes = 0
        self.steady = False

    def _whole(self, r: Resource) -> float:
        return self.maximum.get(r, self.worker[r])

    def first(self, task: TaskFeatures) -> dict[Resource, float]:
        fa = self.first_allocation if self.steady else None
        return {r: fa[r] if fa and fa[r] > -1 else self._whole(r) for r in self.resources}

    def retry(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> float:
        if self.retry_mode == "double":
            return 2 * allocated
        if self.mode == "max-seen" or not self.steady or resource in self.maximum:
            return self._whole(resource)
        fa = self.first_allocation or {}
        return max(self.seen[resource], fa.get(resource, -1.0))

    def observe(self, record: Record) -> None:
        self._accumulate({r: record.peak[r] for r in self.resources}, record.peak.wall, True)

    def exhausted(
        self, task: TaskFeatures, resource: Resource, allocated: float, measured: float
    ) -> None:
        self._accumulate({resource: measured}, 0.0, False)

    def _accumulate(self, measured: Mapping[Resource, float], wall: float, success: bool) -> None:
        """cctools ``category_accumulate_summary``."""
        if not self.steady and any(
            r not in self.maximum and v > self.histograms[r].round_up(self.histograms[r].max_value)
            for r, v in measured.items()
        ):
            self.first_allocation = None
            self.completions = 0
        self.steady = self.completions >= self.every
        for r, v in measured.items():
            self.seen[r] = max(self.seen[r], v)
        if not success:
            return
        for r, v in measured.items():
            self.histograms[r].insert(v, wall if math.isfinite(wall) else 0.0)
        self.completions += 1
        if self.completions % self.every == 0 and self.successes >= 1:
            self._update_first_allocation()
        self.successes += 1

    def _update_first_allocation(self) -> None:
        """cctools ``category_update_first_allocation``.

        a_m is the explicit maximum, else the largest value seen, else the worker.
        """
        out: dict[Resource, float] = {}
        for r in self.resources:
            top = self.maximum.get(r, self.seen[r] if self.seen[r] > -1 else self.worker[r])
            h = self.histograms[r]
            if self.mode == "min-waste":
                out[r] = min_waste(h, top)
            elif self.mode == "max-throughput":
                out[r] = max_throughput(h, top)
            else:
                worker = math.trunc(self.worker[r])
                out[r] = max_seen(h, top, worker, math.trunc(self.maximum.get(r, -1)))
        self.first_allocation = out
