"""Witt et al.'s LR baseline (HPCS 2019), as the k-Segments and Ponder authors run it.

Their code: dos-group/k-Segments.

Peak memory is regressed on input size (OLS) and the intercept raised by an
offset from the training residuals: ``mean`` (the standard error,
sqrt(sum (f - y)^2 / (n - 1))), ``under`` (the same over under-predictions
only) or ``max`` (the largest under-prediction). Predictions are truncated to
whole MB; a prediction <= 0 becomes 100 MB; a retry doubles.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from learners.sizing.base import Record, TaskFeatures
from learners.sizing.growing import Growing
from learners.sizing.linear import Line, ols
from learners.sizing.refit import Refits

Offset = Literal["mean", "under", "max"]

FALLBACK = 100.0
"""MB given when the line predicts nothing positive (the reference's ``d``)."""


def witt_line(x: np.ndarray, y: np.ndarray, offset: Offset) -> Line:
    """The OLS line of ``y`` on ``x`` with its intercept raised by ``offset``."""
    line = ols(x, y)
    f = line(x)
    if offset == "mean":
        shift = math.sqrt(float(np.sum((f - y) ** 2)) / (len(y) - 1))
    elif offset == "under":
        under = f < y
        count = max(int(np.count_nonzero(under)), 2)
        shift = math.sqrt(float(np.sum((f[under] - y[under]) ** 2)) / (count - 1))
    else:
        shift = abs(min(float(np.min(y - f)), 0.0))
    return line.shifted(shift)


def witt_predict(line: Line, x: float) -> float:
    """The reference's ``predict``: truncated to an integer, 100 MB when not positive."""
    value = math.trunc(line(x))
    return float(value) if value > 0 else FALLBACK


class Witt:
    """Memory of one category by Witt's LR; before two records, the request or a whole worker."""

    def __init__(self, capacity: float, offset: Offset = "mean", *, min_records: int = 2) -> None:
        self.capacity = capacity
        self.offset: Offset = offset
        self.min_records = max(2, min_records)
        self.x = Growing()
        self.y = Growing()
        self._line: Line | None = None
        self._refits = Refits()

    @property
    def line(self) -> Line | None:
        """The line of every record, fit again as :class:`Refits` schedules."""
        n = len(self.y)
        if n < self.min_records:
            return None
        if self._refits.due(n):
            self._line = witt_line(self.x.values, self.y.values, self.offset)
            self._refits.fit(n)
        return self._line

    def first(self, task: TaskFeatures) -> float:
        line = self.line
        if line is None:
            return task.requested.get("memory", self.capacity)
        return witt_predict(line, task.input_size or 0.0)

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        return 2 * allocated

    def observe(self, value: float, record: Record) -> None:
        self.x.append(record.task.input_size or 0.0)
        self.y.append(value)

    def exhausted(self, allocated: float, measured: float) -> None:
        """Exhaustions are not training data."""
