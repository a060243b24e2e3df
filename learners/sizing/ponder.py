"""Ponder (Bader et al., "Ponder: Online Prediction of Task Memory Requirements for Scientific
Workflows"), exact to CommonWorkflowScheduler ``PonderPredictor.java``.

One predictor per category (the abstract task) learns from tasks with a
positive peak: x = input size, y = peak memory. With fewer than 5 records it
only answers when an earlier task had a strictly larger input (max seen + 128
MiB); otherwise the task keeps its request. With Pearson r > 0.3 it predicts a
line fitted with an unequal loss (under-predictions cost 50 times more than
over-predictions), clamped into the seen range, plus max(128 MiB, 2 sqrt(WV))
with WV the input-weighted variance of the line's residuals; else max seen +
128 MiB. The scheduler then clamps the prediction to the configured bounds and
the request and rounds it up to a whole MiB; a retry gets the request.

Memory is in MB of 2^20 bytes (so 128 MiB = 128), input sizes in bytes; the
line is fitted in GiB of both, as the Java code does. The fit reproduces
commons-math 3.6.1: ``SimpleRegression`` for the start and r, and its
``SimplexOptimizer`` with a ``NelderMeadSimplex`` (unit steps, relative and
absolute thresholds 1e-30 and 1e-50) for the unequal loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from learners.sizing.base import Record, TaskFeatures
from learners.sizing.growing import Growing
from learners.sizing.refit import Refits

CONDITIONED = 1e-6
"""Weights summing to less than this share of ``a`` per record leave the weighted variance to
a pass over every record (:class:`Residuals`): its sums would keep too few digits."""
GIB_IN_MB = 1024.0
"""Memory is fitted in GiB: MB (MiB) / 1024; input sizes in GiB: bytes / 2^30."""
BYTES_IN_GIB = float(2**30)


class SimpleRegression:
    """commons-math ``SimpleRegression`` (with intercept): updating sums, as the Java class."""

    def __init__(self) -> None:
        self.n = 0
        self.sum_x = self.sum_y = 0.0
        self.sum_xx = self.sum_yy = self.sum_xy = 0.0
        self.x_bar = self.y_bar = 0.0

    def add(self, x: float, y: float) -> None:
        if self.n == 0:
            self.x_bar, self.y_bar = x, y
        else:
            fact1 = 1.0 + self.n
            fact2 = self.n / (1.0 + self.n)
            dx, dy = x - self.x_bar, y - self.y_bar
            self.sum_xx += dx * dx * fact2
            self.sum_yy += dy * dy * fact2
            self.sum_xy += dx * dy * fact2
            self.x_bar += dx / fact1
            self.y_bar += dy / fact1
        self.sum_x += x
        self.sum_y += y
        self.n += 1

    @property
    def slope(self) -> float:
        if self.n < 2 or abs(self.sum_xx) < 10 * 4.9e-324:
            return math.nan
        return self.sum_xy / self.sum_xx

    @property
    def intercept(self) -> float:
        return (self.sum_y - self.slope * self.sum_x) / self.n

    @property
    def r(self) -> float:
        """Pearson's r (NaN when undefined: fewer than 2 points, constant x or y)."""
        if self.n < 2 or self.sum_xx == 0 or self.sum_yy == 0:
            return math.nan
        sse = max(0.0, self.sum_yy - self.sum_xy * self.sum_xy / self.sum_xx)
        r = math.sqrt((self.sum_yy - sse) / self.sum_yy)
        return -r if self.slope < 0 else r


def nelder_mead(
    f: Callable[[np.ndarray], float], start: np.ndarray, max_iterations: int = 100_000
) -> np.ndarray:
    """commons-math ``SimplexOptimizer(1e-30, 1e-50)`` with ``NelderMeadSimplex(n)``.

    Unit simplex built by cumulative steps; reflection 1, expansion 2,
    contraction 0.5, shrink 0.5; stops when no vertex's value changed (by the
    thresholds) in an iteration. ``max_iterations`` only guards against a
    simplex that never settles.
    """
    n = len(start)
    steps = np.tril(np.ones((n, n)))
    points = [start.astype(float)] + [start + step for step in steps]
    simplex = sorted(((f(p), p) for p in points), key=lambda vp: vp[0])
    previous = simplex

    def replace_worst(new: tuple[float, np.ndarray]) -> None:
        for i in range(n):
            if simplex[i][0] > new[0]:
                simplex[i], new = new, simplex[i]
        simplex[n] = new

    def converged(before: list[tuple[float, np.ndarray]]) -> bool:
        for (p, _), (c, _) in zip(before, simplex, strict=True):
            diff = abs(p - c)
            if not (diff <= max(abs(p), abs(c)) * 1e-30 or diff <= 1e-50):
                return False
        return True

    for iteration in range(max_iterations):
        if iteration > 0 and converged(previous):
            break
        previous = list(simplex)
        best, second, worst = simplex[0], simplex[n - 1], simplex[n]
        centroid = sum(p for _, p in simplex[:n]) / n
        xr = centroid + (centroid - worst[1])
        reflected = (f(xr), xr)
        if best[0] <= reflected[0] < second[0]:
            replace_worst(reflected)
        elif reflected[0] < best[0]:
            xe = centroid + 2.0 * (xr - centroid)
            expanded = (f(xe), xe)
            replace_worst(expanded if expanded[0] < reflected[0] else reflected)
        else:
            if reflected[0] < worst[0]:
                xc = centroid + 0.5 * (xr - centroid)
                contracted = (f(xc), xc)
                if contracted[0] <= reflected[0]:
                    replace_worst(contracted)
                    continue
            else:
                xc = centroid - 0.5 * (centroid - worst[1])
                contracted = (f(xc), xc)
                if contracted[0] < worst[0]:
                    replace_worst(contracted)
                    continue
            low = simplex[0][1]
            shrunk = [low + 0.5 * (p - low) for _, p in simplex[1:]]
            simplex[:] = sorted([simplex[0], *((f(p), p) for p in shrunk)], key=lambda vp: vp[0])
    return simplex[0][1]


def unequal_loss(x: np.ndarray, y: np.ndarray, over_weight: float) -> Callable[[np.ndarray], float]:
    """Sum of squared errors, over-predictions weighted by ``over_weight`` (Ponder's 0.02)."""

    def loss(params: np.ndarray) -> float:
        error = y - (params[0] + x * params[1])
        squared = error * error
        return float(np.sum(np.where(error > 0, squared, over_weight * squared)))

    return loss


class PonderPredictor:
    """The Java ``PonderPredictor`` over a ``LinearPredictorCustomLoss``, in MB and bytes."""

    def __init__(
        self,
        first_tasks: int = 5,
        *,
        r_threshold: float = 0.3,
        offset: float = 128.0,
        over_weight: float = 0.02,
    ) -> None:
        self.first_tasks = first_tasks
        self.r_threshold = r_threshold
        self.offset = offset
        self.over_weight = over_weight
        self.x = Growing()
        self.y = Growing()
        self.regression = SimpleRegression()
        self.max_y = 0.0
        self.min_y = math.inf
        self.max_x = 0.0
        self.min_x = math.inf
        self._params: np.ndarray | None = None
        self._residuals: Residuals | None = None
        self._refits = Refits()

    def add(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)
        self.max_y = max(self.max_y, y)
        self.min_y = min(self.min_y, y)
        self.max_x = max(self.max_x, x)
        self.min_x = min(self.min_x, x)
        self.regression.add(x / BYTES_IN_GIB, y / GIB_IN_MB)

    @property
    def params(self) -> np.ndarray | None:
        """(intercept, slope) in GiB of the unequal-loss line, fit again as :class:`Refits`
        schedules; None while it cannot train."""
        xs = self.x.values
        if len(xs) < 2 or self.max_x == self.min_x:
            return None
        if self._refits.due(len(xs)):
            x = xs / BYTES_IN_GIB
            y = self.y.values / GIB_IN_MB
            start = np.array([self.regression.intercept, self.regression.slope])
            params = nelder_mead(unequal_loss(x, y, self.over_weight), start)
            self._params = params
            self._residuals = Residuals.of(xs, self.y.values - _line(params, xs))
            self._refits.fit(len(xs))
        return self._params

    def line(self, x: float | np.ndarray) -> float | np.ndarray:
        params = self.params
        assert params is not None
        return _line(params, x)

    def predict(self, x: float) -> float | None:
        """MB for a task of input ``x`` bytes, or None: keep the request."""
        n = len(self.x)
        if n < self.first_tasks:
            if any(earlier > x for earlier in self.x.values):
                return self.max_y + self.offset
            return None
        if self.regression.r > self.r_threshold:
            if self.params is None:
                return None
            p = float(self.line(x))
            if p < self.min_y:
                p = self.min_y
            elif (p > self.max_y and x < self.max_x) or (x >= self.max_x and p < self.max_y):
                p = self.max_y
            return p + max(self.offset, 2 * math.sqrt(self.weighted_variance(x)))
        return self.max_y + self.offset

    def weighted_variance(self, x: float) -> float:
        """Java ``WeightedVarianceOffset`` over the records the line was fit on."""
        assert self._residuals is not None
        return self._residuals.variance(x)


@dataclass(frozen=True)
class Residuals:
    """A line's residuals over the records it was fit on, sorted by input, with prefix sums:
    the Java ``WeightedVarianceOffset`` at any input from a few of them, not a pass over every
    record for every task (a category of 40,000 tasks spent 0.8 ms a task there).

    The weight of a record of input ``x_i`` for a task of input ``x`` is ``a - b |x_i - x|``
    (``a = 1 + max(1 - n / 10, 0) / 100``, ``b`` one over the largest distance: nearer inputs
    weigh more; 1 for all where every input is ``x``), so each weighted sum splits at ``x``
    into sums over the records below and above it. Where the weights are tiny beside ``a``
    (a task whose input lies far from every record's, all of them near one end), those
    differences of sums lose the digits the weights have: the pass over every record is
    taken then. Inputs are taken from their mean, in GiB.
    """

    inputs: np.ndarray
    """Inputs, sorted, in bytes."""
    d: np.ndarray
    """The residuals, in the inputs' order."""
    x: np.ndarray
    """The inputs from their mean, in GiB."""
    below: np.ndarray
    """Row ``k``: over the ``k`` smallest inputs, the sums of 1, x, d, d x, d^2, d^2 x."""
    x2: float
    """The sum of x^2."""
    mean: float
    """The inputs' mean, in bytes."""

    @classmethod
    def of(cls, xs: np.ndarray, d: np.ndarray) -> Residuals:
        mean = float(xs.mean())
        order = np.argsort(xs, kind="stable")
        inputs, d = xs[order], d[order]
        x = (inputs - mean) / BYTES_IN_GIB
        columns = np.column_stack((np.ones_like(x), x, d, d * x, d * d, d * d * x))
        below = np.vstack((np.zeros((1, 6)), np.cumsum(columns, axis=0)))
        return cls(inputs, d, x, below, float(x @ x), mean)

    def variance(self, at: float) -> float:
        x = self.x
        n = len(x)
        if n <= 1:
            return 0.0
        t = (at - self.mean) / BYTES_IN_GIB
        farthest = max(t - float(x[0]), float(x[-1]) - t)
        a, b = (1.0 + max(1 - n / 10.0, 0) / 100, 1.0 / farthest) if farthest > 0 else (1.0, 0.0)
        k = int(np.searchsorted(x, t, side="right"))
        left, total = self.below[k], self.below[-1]
        right = total - left
        _, sx, sd, _, sd2, _ = total.tolist()
        nl, sxl, sdl, sdxl, sd2l, sd2xl = left.tolist()
        nr, sxr, sdr, sdxr, sd2r, sd2xr = right.tolist()
        dist = t * nl - sxl + sxr - t * nr  # the sums of |x_i - x|, weighted by 1, d, d^2
        d_dist = t * sdl - sdxl + sdxr - t * sdr
        d2_dist = t * sd2l - sd2xl + sd2xr - t * sd2r
        square = self.x2 - 2 * t * sx + n * t * t  # the sum of (x_i - x)^2
        v1 = a * n - b * dist
        v2 = a * a * n - 2 * a * b * dist + b * b * square
        if not (v1 > CONDITIONED * a * n and v2 > CONDITIONED * a * a * n):
            return weighted_variance(self.inputs, self.d, at)
        dw = a * sd - b * d_dist
        d2w = a * sd2 - b * d2_dist
        spread = v1 - v2 / v1
        if not spread > 0:  # one record carries all the weight (Java divides by 0 here)
            return 0.0
        return max(0.0, d2w - dw * dw / v1) / spread


def weighted_variance(xs: np.ndarray, d: np.ndarray, x: float) -> float:
    """Java ``WeightedVarianceOffset``: the variance of the residuals ``d`` of the records of
    inputs ``xs`` (bytes), those of inputs nearer ``x`` weighing more; a pass over every
    record. 0 where no record weighs anything or one carries all the weight (Java divides by
    0 there)."""
    n = len(d)
    if n <= 1:
        return 0.0
    dist = np.abs(xs - x)
    farthest = float(dist.max())
    # inputs far from x weigh less; below 10 records none weighs 0
    w = np.ones(n) if farthest == 0 else 1 - dist / farthest + max(1 - n / 10.0, 0) / 100
    v1, v2 = float(w.sum()), float((w * w).sum())
    if not v1 > 0:
        return 0.0
    mean = float((d * w).sum()) / v1
    spread = v1 - v2 / v1
    if spread <= 0:
        return 0.0
    return float(((d - mean) ** 2 * w).sum()) / spread


def _line(params: np.ndarray, x: float | np.ndarray) -> float | np.ndarray:
    """MB at input ``x`` bytes of the line of ``params`` (intercept, slope in GiB)."""
    return (params[0] + (x / BYTES_IN_GIB) * params[1]) * GIB_IN_MB


def round_up_mib(mb: float) -> float:
    """The scheduler's ``roundUpToFullMB`` of the prediction's ``longValue`` in bytes."""
    return float(math.ceil(math.floor(mb * 2**20) / 2**20))


class Ponder:
    """Memory of one category by Ponder, clamped and rounded as the Kubernetes scheduler does."""

    def __init__(
        self,
        capacity: float,
        *,
        min_memory: float | None = None,
        max_memory: float | None = None,
        first_tasks: int = 5,
    ) -> None:
        self.capacity = capacity
        self.min_memory = min_memory
        self.max_memory = max_memory
        self.predictor = PonderPredictor(first_tasks)

    def _request(self, task: TaskFeatures) -> float:
        return task.requested.get("memory", self.capacity)

    def first(self, task: TaskFeatures) -> float:
        request = self._request(task)
        p = self.predictor.predict(task.input_size or 0.0)
        if p is None:
            return request
        if self.min_memory is not None and p < self.min_memory:
            p = self.min_memory
        elif self.max_memory is not None and p > self.max_memory:
            p = self.max_memory
        elif p > request:
            p = request
        return round_up_mib(p)

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        """The paper's retry: the task's request (doubling when the request already failed)."""
        request = self._request(task)
        return request if request > allocated else 2 * allocated

    def observe(self, value: float, record: Record) -> None:
        if value > 0 and record.peak.wall >= 0:
            self.predictor.add(record.task.input_size or 0.0, value)

    def exhausted(self, allocated: float, measured: float) -> None:
        """Exhaustions are not training data."""
