"""Quantized bucketing (Phung et al., 2021), the bucketing paper's earlier peer.

Buckets close at quantiles of the sorted records (cctools
``bucketing_quantized.c``); a first attempt draws a bucket by its share of
records, a retry climbs to the next bucket above what the task reached, and
past the top bucket (or before 10 records) a task gets a whole worker.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort

import numpy as np

from learners.sizing.base import Record, TaskFeatures
from learners.sizing.bucketing import Buckets, predict


def quantized_buckets(sorted_values: list[float], k: int) -> Buckets:
    """cctools ``bucketing_quantized_update_buckets``: point i closes a bucket once i >= q."""
    n = len(sorted_values)
    values: list[float] = []
    probs: list[float] = []
    j = 0
    count = 0.0
    q = math.floor(1.0 * n / k)
    for i, value in enumerate(sorted_values, start=1):
        count += 1
        if i >= q:
            values.append(value)
            probs.append(count / n)
            j += 1
            count = 0.0
            q = math.floor((1.0 + j) / k * n)
    return Buckets(values, probs)


class Quantized:
    """One resource of one category under quantized bucketing."""

    def __init__(
        self, capacity: float, rng: np.random.Generator, *, k: int = 3, sampling: int = 10
    ) -> None:
        self.capacity = capacity
        self.k = k
        self.sampling = sampling
        self.values: list[float] = []
        self._rng = rng
        self._buckets: Buckets | None = None

    @property
    def buckets(self) -> Buckets | None:
        """The current buckets, or None while fewer than ``sampling`` records arrived."""
        if len(self.values) < self.sampling:
            return None
        if self._buckets is None:
            self._buckets = quantized_buckets(self.values, self.k)
        return self._buckets

    def predict(self, r: float | None = None) -> float:
        buckets = self.buckets
        if buckets is None:
            return self.capacity
        if r is None:
            r = float(self._rng.random())
        return predict(buckets, -1.0, r, self.capacity)

    def first(self, task: TaskFeatures) -> float:
        return self.predict()

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        buckets = self.buckets
        if buckets is None:
            return self.capacity
        above = bisect_right(buckets.values, max(allocated, measured))
        return buckets.values[above] if above < len(buckets.values) else self.capacity

    def observe(self, value: float, record: Record) -> None:
        insort(self.values, value)
        self._buckets = None

    def exhausted(self, allocated: float, measured: float) -> None:
        """Exhaustions add no record."""
