"""k-Segments (Bader et al., BigData 2023), exact to github dos-group/k-Segments.

Per category (the abstract task), from finished tasks' input sizes x and
memory series y (MB, one sample per monitoring interval):

- runtime model: OLS of the number of samples on x, lowered by the most
  negative residual (memory steps come early rather than late);
- memory model: the series cut into k equal segments (the last takes the
  rest), one OLS of the segment peaks on x per segment, each raised by its
  largest residual.

A prediction is a step function: p_t = max(1, int(runtime) // k) samples per
segment, each segment at least the previous one, a value <= 0 replaced by 100
MB; past its end the last value holds. A task fails at its first sample above
the allocation; a retry doubles the failing run of equal steps (``selective``)
or it and every later one (``partial``). Waste is the trapezoid integral of the
allocation (minus usage on success), as in the reference simulation.

Where no executor can change a running task's limit, k-Segments is a peak
sizer: the maximum of its step function, doubled on failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from learners.sizing.base import Record, TaskFeatures
from learners.sizing.growing import Growing
from learners.sizing.linear import Line, ols
from learners.sizing.refit import Refits

RetryMode = Literal["selective", "partial"]

FALLBACK = 100.0
"""MB a segment gets when its line predicts nothing positive (the reference's ``default_value``)."""


def trapezoid(y: np.ndarray, x: np.ndarray | None = None) -> float:
    """``numpy.trapz``: unit spacing without ``x``."""
    if len(y) < 2:
        return 0.0
    heights = (y[1:] + y[:-1]) / 2
    return float(np.sum(heights if x is None else heights * np.diff(x)))


@dataclass(frozen=True, slots=True)
class Steps:
    """A memory allocation per sample (the last value holds past the end) and its runs.

    ``runs`` are the (first, last) sample indices of equal consecutive values in
    the *first* prediction; retries keep them (the reference computes them once).
    """

    values: np.ndarray
    runs: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, values: np.ndarray) -> Steps:
        values = np.asarray(values, dtype=float)
        change = np.flatnonzero(values[1:] != values[:-1]) + 1
        starts = np.concatenate(([0], change))
        ends = np.concatenate((change - 1, [len(values) - 1]))
        return cls(values, tuple(zip(starts.tolist(), ends.tolist(), strict=True)))

    @property
    def peak(self) -> float:
        return float(self.values.max())

    def over(self, length: int) -> np.ndarray:
        """The allocation at samples 0..length-1."""
        v = self.values
        if length <= len(v):
            return v[:length]
        return np.concatenate((v, np.full(length - len(v), v[-1])))

    def clipped(self, low: float, high: float) -> Steps:
        return Steps(np.clip(self.values, low, high), self.runs)


def first_failure(usage: np.ndarray, steps: Steps) -> int | None:
    """The first sample whose usage is above the allocation, if any."""
    above = np.flatnonzero(usage > steps.over(len(usage)))
    return int(above[0]) if len(above) else None


def attempt_waste(
    usage: np.ndarray, steps: Steps, times: np.ndarray | None = None
) -> tuple[int | None, float]:
    """(failing sample or None, waste): the allocation's integral up to and including the
    failing sample, or on success the allocation's integral minus the usage's."""
    failed_at = first_failure(usage, steps)
    alloc = steps.over(len(usage))
    if failed_at is not None:
        end = failed_at + 1
        return failed_at, trapezoid(alloc[:end], None if times is None else times[:end])
    return None, trapezoid(alloc, times) - trapezoid(usage, times)


def retry_steps(steps: Steps, failed_at: int, mode: RetryMode, factor: float = 2.0) -> Steps:
    """The reference's ``selective_retry`` / ``partial_retry``."""
    values = steps.values.copy()
    runs = steps.runs
    if failed_at > runs[-1][1]:
        first, last = runs[-1]
        values[first : last + 1] *= factor if mode == "selective" else 2.0
        return Steps(values, runs)
    for first, last in runs:
        if mode == "selective" and first <= failed_at <= last:
            values[first : last + 1] *= factor
            break
        if mode == "partial" and last >= failed_at:
            values[first : last + 1] *= factor
    return Steps(values, runs)


@dataclass(frozen=True, slots=True)
class Outcome:
    waste: float
    retries: int
    runtime: int
    """Samples run over all attempts, counted as the reference does (each attempt adds its
    failing sample + 1, or its length + 1 on success)."""


def simulate(usage: np.ndarray, steps: Steps, mode: RetryMode, factor: float = 2.0) -> Outcome:
    """The reference's ``Simulation.execute`` for one task: attempts until success."""
    waste, runtime, attempts = 0.0, 0, 0
    while True:
        attempts += 1
        failed_at, w = attempt_waste(usage, steps)
        waste += w
        if failed_at is None:
            return Outcome(waste, attempts - 1, runtime + len(usage) + 1)
        runtime += failed_at + 1
        steps = retry_steps(steps, failed_at, mode, factor)


@dataclass(frozen=True, slots=True)
class Model:
    runtime: Line
    segments: tuple[Line, ...]
    longest: float
    """Samples of the longest series trained on."""

    def predict(self, x: float, k: int) -> np.ndarray:
        """The reference's ``predict``: the step function for input size ``x``.

        The predicted length is cut to twice the longest series seen: past its end a step
        function holds its last value anyway, and a steep runtime line extrapolated to a large
        input once asked for billions of samples (a MemoryError on sarek).
        """
        per_segment = max(1, int(min(self.runtime(x), 2 * self.longest)) // k)
        out: list[float] = []
        previous = None
        for line in self.segments:
            value = float(line(x))
            if previous is not None and value < previous:
                value = previous
            if value <= 0:
                value = FALLBACK
            out.extend([value] * per_segment)
            previous = value
        return np.array(out)


def _fitted(x: np.ndarray, y: np.ndarray, offset: str) -> Line:
    """OLS with the intercept moved by the largest (``max``) or most negative (``min``) residual."""
    line = ols(x, y)
    residuals = y - line(x)
    if offset == "max":
        return line.shifted(max(0.0, float(residuals.max())))
    return line.shifted(min(0.0, float(residuals.min())))


def segment_peaks(series: np.ndarray, k: int) -> np.ndarray:
    """Peaks of the k segments: i = len // k samples each, the last to the end.

    A series shorter than k samples is first stretched (each sample repeated)
    so that no segment is empty.
    """
    if len(series) < k:
        series = np.repeat(series, -(-k // len(series)))
    i = len(series) // k
    cuts = [series[(j - 1) * i : j * i] for j in range(1, k)] + [series[(k - 1) * i :]]
    return np.array([c.max() for c in cuts])


def fit(x: np.ndarray, lengths: np.ndarray, peaks: np.ndarray) -> Model:
    """The reference's ``train_model`` from each record's sample count and segment peaks."""
    return Model(
        runtime=_fitted(x, lengths, "min"),
        segments=tuple(_fitted(x, peaks[:, j], "max") for j in range(peaks.shape[1])),
        longest=float(lengths.max()),
    )


def train(x: np.ndarray, series: list[np.ndarray], k: int) -> Model:
    """The reference's ``train_model`` from the series themselves."""
    lengths = np.array([float(len(s)) for s in series])
    return fit(x, lengths, np.array([segment_peaks(s, k) for s in series]))


class KSegments:
    """Memory of one category by k-Segments; before two records, the request or a whole worker."""

    def __init__(
        self,
        capacity: float,
        *,
        k: int = 4,
        retry: RetryMode = "selective",
        min_records: int = 2,
    ) -> None:
        self.capacity = capacity
        self.k = k
        self.retry_mode: RetryMode = retry
        self.min_records = max(1, min_records)
        self.x = Growing()
        self.lengths = Growing()
        self.peaks = Growing(k)
        self._model: Model | None = None
        self._refits = Refits()

    @property
    def model(self) -> Model | None:
        """The model of every record, fit again as :class:`Refits` schedules."""
        n = len(self.x)
        if n < self.min_records:
            return None
        if self._refits.due(n):
            self._model = fit(self.x.values, self.lengths.values, self.peaks.values)
            self._refits.fit(n)
        return self._model

    def steps(self, task: TaskFeatures) -> Steps | None:
        """The step function for the task, or None before the model exists."""
        model = self.model
        if model is None:
            return None
        return Steps.of(model.predict(task.input_size or 0.0, self.k))

    def first(self, task: TaskFeatures) -> float:
        steps = self.steps(task)
        if steps is None:
            return task.requested.get("memory", self.capacity)
        return steps.peak

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        return 2 * allocated

    def retry_steps(self, steps: Steps, failed_at: int) -> Steps:
        return retry_steps(steps, failed_at, self.retry_mode)

    def observe(self, value: float, record: Record) -> None:
        series = np.array(record.memory_series or (value,), dtype=float)
        self.x.append(record.task.input_size or 0.0)
        self.lengths.append(float(len(series)))
        self.peaks.append(segment_peaks(series, self.k))

    def exhausted(self, allocated: float, measured: float) -> None:
        """Exhaustions are not training data."""
