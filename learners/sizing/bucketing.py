"""Greedy and Exhaustive Bucketing (Phung & Thain, IPDPS 2024), exact to cctools ``bucketing*.c``.

One resource of one category keeps its successful records sorted by value, each
with a significance (1, 2, 3, ... in completion order), and running prefix sums of
significance and value x significance. A record is one sorted insertion plus one
shifted add on each prefix array; every statistic of a contiguous range of
records (its weight, its weighted mean) is then a difference of two prefix sums,
so a re-bucketing costs a few numpy passes instead of the C code's list walks.

Before :data:`SAMPLING` records, the sampling phase: a task gets the default, doubled
(from the default) past every value it exhausted. From the 10th record on, the
buckets are recomputed from all records when a prediction needs them (cctools
recomputes inside every add; the result is the same): Exhaustive Bucketing's at
every record, as its state is kept as records come and its fit costs the same at any
count; Greedy Bucketing's, which walks every record, as :class:`~learners.sizing.refit.Refits`
schedules (at every record for a category's first records, then as they grow by a share).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from learners.resources import Resource
from learners.sizing.growing import Growing
from learners.sizing.refit import Refits

DEFAULTS: dict[Resource, float] = {"cores": 1.0, "memory": 1000.0, "disk": 1000.0, "wall": 60.0}
"""cctools' defaults for the sampling phase (wall time is ours: cctools does not size it)."""
SAMPLING = 10
"""Records of a resource's sampling phase: cctools buckets from the 10th on."""


@dataclass(frozen=True, slots=True)
class Buckets:
    """Bucket tops, ascending, and their probabilities."""

    values: list[float]
    probs: list[float]

    def pairs(self) -> list[tuple[float, float]]:
        return list(zip(self.values, self.probs, strict=True))


NO_BUCKETS = Buckets([], [])


class Points:
    """Records of one resource sorted by value, with prefix sums of their significance.

    A new record goes before equal values, as in cctools, and gets the next
    significance. ``csig[i]`` and ``cval[i]`` are the sums of significance and of
    value x significance over the ``i`` smallest records (the significances
    themselves are never needed apart).

    Records sit in sorted blocks of at most ``BLOCK``: adding one moves a block's worth,
    not every record (a run of a million tasks adds millions), and the arrays are
    built when first asked for after a change. Each block's count and sum of
    significance are kept as records come, so that an order statistic (:meth:`kth`,
    :meth:`weighted`, :meth:`below`) reads the blocks' sums and one block, not every
    record: the retry budget asks for them at every first attempt. Significances are
    whole numbers, whose sums a float holds exactly, so a weighted statistic read from
    the blocks is the one read from ``csig``.
    """

    BLOCK = 1024

    def __init__(self) -> None:
        self._values: list[array[float]] = []
        self._sigs: list[array[float]] = []
        self._tops: list[float] = []
        """Each block's largest value, to find where a record goes."""
        self._counts = np.zeros(0, dtype=np.int64)
        self._weights = np.zeros(0)
        """Each block's count of records and sum of their significance."""
        self.n = 0
        self.next_sig = 1
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, value: float) -> None:
        sig = float(self.next_sig)
        self.n += 1
        self.next_sig += 1
        self._arrays = None
        if not self._values:
            self._values.append(array("d", [value]))
            self._sigs.append(array("d", [sig]))
            self._tops.append(value)
            self._counts = np.ones(1, dtype=np.int64)
            self._weights = np.full(1, sig)
            return
        k = min(bisect_left(self._tops, value), len(self._tops) - 1)
        values, sigs = self._values[k], self._sigs[k]
        at = bisect_left(values, value)
        values.insert(at, value)
        sigs.insert(at, sig)
        self._tops[k] = values[-1]
        self._counts[k] += 1
        self._weights[k] += sig
        if len(values) > self.BLOCK:
            half = len(values) // 2
            self._values.insert(k + 1, values[half:])
            self._sigs.insert(k + 1, sigs[half:])
            del values[half:], sigs[half:]
            self._tops[k : k + 1] = [values[-1], self._values[k + 1][-1]]
            moved = self._sigs[k + 1]
            self._counts[k] = len(values)
            self._counts = np.insert(self._counts, k + 1, len(moved))
            self._weights[k] = sum(sigs)
            self._weights = np.insert(self._weights, k + 1, sum(moved))

    @property
    def top(self) -> float:
        """The largest record."""
        return self._tops[-1]

    @property
    def total(self) -> float:
        """The sum of the records' significances (1 + 2 + ... + n)."""
        return self.n * (self.n + 1) / 2

    def kth(self, i: int) -> float:
        """The ``i``-th smallest record (0 the smallest)."""
        if i == self.n - 1:
            return self._tops[-1]
        ends = np.cumsum(self._counts)
        k = int(np.searchsorted(ends, i, side="right"))
        return self._values[k][i - int(ends[k - 1]) if k else i]

    def below(self, value: float) -> int:
        """How many records are smaller than ``value``."""
        k = bisect_left(self._tops, value)
        if k == len(self._tops):
            return self.n
        return int(self._counts[:k].sum()) + bisect_left(self._values[k], value)

    def weighted(self, target: float) -> float:
        """The smallest record at which the significance of the records up to it reaches
        ``target`` (the largest where none does): ``values[searchsorted(csig, target) - 1]``."""
        ends = np.cumsum(self._weights)
        k = int(np.searchsorted(ends, target, side="left"))
        if k == len(ends):
            return self._tops[-1]
        inner = np.cumsum(np.frombuffer(self._sigs[k]))
        if k:
            inner += ends[k - 1]
        j = int(np.searchsorted(inner, target, side="left"))
        return self._values[k][j]

    def _built(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            values = np.concatenate([np.frombuffer(b) for b in self._values] or [np.empty(0)])
            sigs = np.concatenate([np.frombuffer(b) for b in self._sigs] or [np.empty(0)])
            self._arrays = (
                values,
                np.concatenate(([0.0], np.cumsum(sigs))),
                np.concatenate(([0.0], np.cumsum(values * sigs))),
            )
        return self._arrays

    @property
    def values(self) -> np.ndarray:
        return self._built()[0]

    @property
    def csig(self) -> np.ndarray:
        return self._built()[1]

    @property
    def cval(self) -> np.ndarray:
        return self._built()[2]


def doubling(prev: float, default: float, rate: float = 2.0) -> float:
    """The smallest ``default * rate**k`` above ``prev`` (cctools' exploration step)."""
    if prev <= 0:
        return default
    exp = math.floor(math.log(prev / default) / math.log(rate)) + 1
    return default * rate**exp


def predict(
    buckets: Buckets,
    prev: float,
    r: float,
    default: float,
    rate: float = 2.0,
    deterministic: bool = False,
) -> float:
    """cctools ``bucketing_predict`` outside the sampling phase.

    ``prev`` is -1 on a first attempt, else the value the task exhausted. Buckets
    at or below ``prev`` are skipped and their probability taken out; the
    probabilistic walk returns the first bucket whose rescaled cumulative
    probability exceeds ``r``; the deterministic one the first bucket above
    ``prev``. Past the top bucket, the task doubles from the default.
    """
    values = buckets.values
    if not values:
        raise ValueError("no buckets to predict from")
    *lower, top = values
    total = 1.0
    cum = 0.0
    for value, prob in zip(lower, buckets.probs, strict=False):
        if value <= prev:
            total -= prob
        elif deterministic:
            return value
        else:
            cum += prob
            if cum / total > r:
                return value
    return top if top > prev else doubling(prev, default, rate)


def _probabilities(points: Points, break_values: np.ndarray) -> Buckets:
    """Buckets ending at ``break_values`` (ascending): each takes the records above the previous."""
    ends = np.searchsorted(points.values, break_values, side="right")
    weights = np.diff(points.csig[ends], prepend=0.0)
    probs = weights / points.csig[-1]
    return Buckets(break_values.tolist(), probs.tolist())


def greedy_split_costs(points: Points, lo: int, hi: int) -> np.ndarray:
    """Expected cost of breaking the sorted range ``lo..hi`` after each of its indices.

    The two-bucket cost of the paper (cctools ``bucketing_greedy_policy``): p1, p2
    are the significance shares below/above the break, E_lo, E_hi their weighted
    means, vb the break value and vmax the range's largest value.
    """
    cs, cv, v = points.csig, points.cval, points.values
    total = cs[hi + 1] - cs[lo]
    lo_sig = cs[lo + 1 : hi + 2] - cs[lo]
    hi_sig = total - lo_sig
    p1 = lo_sig / total
    p2 = hi_sig / total
    e_lo = (cv[lo + 1 : hi + 2] - cv[lo]) / lo_sig
    has_hi = hi_sig > 0
    e_hi = np.where(has_hi, (cv[hi + 1] - cv[lo + 1 : hi + 2]) / np.where(has_hi, hi_sig, 1.0), 0.0)
    vb = v[lo : hi + 1]
    vmax = v[hi]
    return (
        p1 * (p1 * (vb - e_lo))
        + p1 * (p2 * (vmax - e_lo))
        + p2 * (p1 * (vb + vmax - e_hi))
        + p2 * (p2 * (vmax - e_hi))
    )


def greedy_buckets(points: Points) -> Buckets:
    """Greedy Bucketing: split ranges in two at their cheapest break until no split pays.

    Ties go to the later index (cctools compares with ``<=``); a break at a
    range's top ends that range; ranges are processed first in, first out.
    """
    top = points.n - 1
    breaks = [top]
    ranges = deque([(0, top)])
    while ranges:
        lo, hi = ranges.popleft()
        costs = greedy_split_costs(points, lo, hi)
        b = hi - int(np.argmin(costs[::-1]))
        if b == hi:
            continue
        breaks.append(b)
        if b + 1 != hi:
            ranges.append((b + 1, hi))
        if b != lo:
            ranges.append((lo, b))
    breaks.sort()
    return _probabilities(points, points.values[breaks])


@lru_cache(maxsize=64)
def candidate_tops(vmax: float, max_buckets: int = 10) -> np.ndarray:
    """Candidate bucket tops, one column per n = 1..max_buckets (cctools ``get_buckets``).

    Column n: powers of two 1, 2, ..., 2^(steps-1) with steps = floor(log2(vmax / n)),
    then vmax * i / n for i = 1..n-1, then vmax. Candidates run down the rows so
    that prefix sums scan axis 0, numpy's fast way; shorter columns are padded
    on top with -inf (candidates no record joins).
    """
    columns = []
    for n in range(1, max_buckets + 1):
        ratio = vmax / n  # below 1 (or a denormal vmax that divides to 0): no powers of two
        steps = math.floor(math.log(ratio) / math.log(2)) if ratio > 1 else 0
        powers = [2.0**i for i in range(steps)]
        columns.append(powers + [vmax * i / n for i in range(1, n)] + [vmax])
    out = np.full((max(len(c) for c in columns), max_buckets), -np.inf)
    for n, column in enumerate(columns):
        out[len(out) - len(column) :, n] = column
    out.flags.writeable = False
    return out


class Candidates:
    """Exhaustive Bucketing's state: what every candidate bucket of every n holds.

    A record joins, in each column, the first candidate at or above it: that
    cell's weight grows by the record's significance and its top (the largest
    record it holds) may rise. The candidates depend only on the largest record,
    so a new largest record rebuilds the cells from all records (rare: the
    maximum of n records changes about log n times); any other record updates
    one cell per column.
    """

    def __init__(self, max_buckets: int = 10) -> None:
        self.max_buckets = max_buckets
        self._records = Growing()
        self.total = 0.0
        """Sum of significances."""
        self.weighted = 0.0
        """Sum of value x significance."""
        self.vmax = -math.inf
        self.weight = np.zeros((0, max_buckets))
        self.top = np.zeros((0, max_buckets))
        self._columns = np.arange(max_buckets)
        self._candidates = candidate_tops(0.0, max_buckets)

    @property
    def n(self) -> int:
        return len(self._records)

    @property
    def records(self) -> np.ndarray:
        """Every record, in arrival order (significance = position + 1)."""
        return self._records.values

    def add(self, value: float) -> None:
        self._records.append(value)
        sig = float(self.n)
        self.total += sig
        self.weighted += value * sig
        if value > self.vmax:
            self._rebuild()
            return
        cells = (self._candidates < value).sum(axis=0) * self.max_buckets + self._columns
        weight, top = self.weight.ravel(), self.top.ravel()
        weight[cells] = weight[cells] + sig
        top[cells] = np.maximum(top[cells], value)

    def _rebuild(self) -> None:
        values = self.records
        order = np.argsort(values, kind="stable")
        values = values[order]
        below = np.concatenate(([0.0], np.cumsum(order + 1.0)))
        self.vmax = float(values[-1])
        self._candidates = candidate_tops(self.vmax, self.max_buckets)
        ends = np.searchsorted(values, self._candidates, side="right")
        starts = np.vstack((np.zeros((1, self.max_buckets), dtype=ends.dtype), ends[:-1]))
        self.weight = below[ends] - below[starts]
        self.top = np.where(self.weight > 0, values[ends - 1], 0.0)


def exhaustive_costs(state: Candidates) -> np.ndarray:
    """Expected cost of the candidate bucketing for each n = 1..max_buckets, all at once.

    cctools fills a table C[i][j] (a task of bucket i first given bucket j: a
    miss costs v_j and retries among the buckets above j in proportion to their
    probabilities) and sums p_i p_j C[i][j]. Summed over j, that walk visits a
    bucket m below i with probability p_m / T_m (T_m: the probability of the
    buckets from m up) and ends on a bucket k >= i with probability p_k / T_i, so
    a task of bucket i costs sum_{m<i} p_m v_m / T_m + sum_{k>=i} p_k v_k / T_i - E_i.
    Weighted by p_i, the terms of m regroup, leaving
    cost = sum_i p_i v_i + sum_i p_i (sum_{k>i} p_k v_k) / T_i - mean:
    two prefix sums per bucketing instead of the C code's O(buckets^3) table.
    Empty candidates weigh nothing, as if dropped.
    """
    weight, total = state.weight, state.total
    weighted_top = weight * state.top
    tail = weight + total
    tail -= np.add.accumulate(weight, axis=0)
    np.maximum(tail, 1e-300, out=tail)  # 0 only past the last record (all records 0)
    below_top = np.add.accumulate(weighted_top, axis=0)
    all_top = below_top[-1]
    above = all_top - below_top
    above *= weight
    above /= tail
    return (above.sum(axis=0) + all_top - state.weighted) / total


def exhaustive_buckets(state: Candidates) -> Buckets:
    """Exhaustive Bucketing: the cheapest candidate bucketing (ties to fewer buckets)."""
    n = int(exhaustive_costs(state).argmin())
    total = state.total
    cells = zip(state.top[:, n].tolist(), state.weight[:, n].tolist(), strict=True)
    full = [(top, weight / total) for top, weight in cells if weight > 0]
    return Buckets([top for top, _ in full], [prob for _, prob in full])


Mode = Literal["greedy", "exhaustive"]


class Bucketing:
    """One resource of one category under Greedy or Exhaustive Bucketing."""

    def __init__(
        self,
        mode: Mode,
        default: float,
        rng: np.random.Generator,
        *,
        deterministic: bool = False,
        sampling: int = SAMPLING,
        rate: float = 2.0,
        max_buckets: int = 10,
    ) -> None:
        self.mode = mode
        self.default = default
        self.deterministic = deterministic
        self.sampling = sampling
        self.rate = rate
        self.state: Points | Candidates = Points() if mode == "greedy" else Candidates(max_buckets)
        self._rng = rng
        self._buckets = NO_BUCKETS
        self._refits = Refits()

    def add(self, value: float) -> None:
        self.state.add(value)

    @property
    def sampling_phase(self) -> bool:
        return self.state.n < self.sampling

    @property
    def buckets(self) -> Buckets:
        """The current buckets (none in the sampling phase)."""
        if self.sampling_phase:
            return NO_BUCKETS
        state = self.state
        if isinstance(state, Points):
            if self._refits.due(state.n):
                self._buckets = greedy_buckets(state)
                self._refits.fit(state.n)
        elif self._refits.fitted != state.n:
            self._buckets = exhaustive_buckets(state)
            self._refits.fit(state.n)
        return self._buckets

    def predict(self, prev: float = -1.0, r: float | None = None) -> float:
        """The next allocation given the exhausted value ``prev`` (-1 on a first attempt).

        ``r`` fixes the uniform draw (tests); by default it comes from the sizer's generator.
        """
        if self.sampling_phase:
            return doubling(prev, self.default, self.rate)
        if r is None:
            r = 0.0 if self.deterministic else float(self._rng.random())
        return predict(self.buckets, prev, r, self.default, self.rate, self.deterministic)

    # ResourceLearner
    def first(self, task: object) -> float:
        return self.predict(-1.0)

    def retry(self, task: object, allocated: float, measured: float) -> float:
        return self.predict(measured)

    def observe(self, value: float, record: object) -> None:
        self.add(value)

    def exhausted(self, allocated: float, measured: float) -> None:
        """Exhaustions add no record: only successful attempts are points."""
