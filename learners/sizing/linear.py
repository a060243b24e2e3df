"""Ordinary least squares on one feature, as scikit-learn's ``LinearRegression`` fits it.

Witt's and k-Segments' reference code fit every model this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Line:
    slope: float
    intercept: float

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return x * self.slope + self.intercept

    def shifted(self, offset: float) -> Line:
        return Line(self.slope, self.intercept + offset)


def ols(x: np.ndarray, y: np.ndarray) -> Line:
    """The least-squares line; slope 0 when every x is the same (lstsq's minimum-norm answer)."""
    x_mean, y_mean = float(np.mean(x)), float(np.mean(y))
    dx = x - x_mean
    spread = float(dx @ dx)
    slope = float(dx @ (y - y_mean)) / spread if spread > 0 else 0.0
    return Line(slope, y_mean - slope * x_mean)
