"""When will a running stage end? A forecast from its progress.

The stage's queued tasks are list-scheduled onto its slots behind the running
ones. With equal expected durations that schedule has a closed form: slot
``i`` (ordered by when it frees up) takes every ``S``-th queued task, so the
stage ends at ``max_i free_i + n_i * mean``. A running task's remaining time
is the empirical mean residual life of the durations seen so far, so a task
that has already run long is expected to run longer, not to end at once.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import ArrayLike


class Durations:
    """The latest successful task durations of one stage (``window`` of them), kept sorted for
    residual-life queries.

    A stage adds one duration per task and is asked for forecasts on every
    pass of the engine, so both are cheap: an addition shifts two arrays
    (sorted values and their suffix sums) in place, a query is a binary search.
    The window bounds that shift for a stage of a million tasks, and follows
    durations that drift as a stage goes on.
    """

    def __init__(self, prior: float | None = None, window: int = 4096) -> None:
        self.prior = prior
        """Expected duration before any task has finished (e.g. from earlier runs)."""
        self.window = window
        self._n = 0
        self._values = np.empty(16)
        self._suffix = np.zeros(17)
        """``_suffix[i]`` is the total of the ``i``-th shortest onward (0 past the end)."""
        self._arrivals: deque[float] = deque()
        """The durations in the window, oldest first."""
        self._dropped = 0

    def add(self, duration: float) -> None:
        if self._n == self.window:
            self._drop(self._arrivals.popleft())
        self._arrivals.append(duration)
        n = self._n
        if n == len(self._values):
            self._grow()
        values, suffix = self._values, self._suffix
        at = int(values[:n].searchsorted(duration, side="right"))
        values[at + 1 : n + 1] = values[at:n]
        values[at] = duration
        suffix[at + 1 : n + 2] = suffix[at : n + 1]
        suffix[: at + 1] += duration
        self._n = n + 1

    def _drop(self, duration: float) -> None:
        """Forget the oldest duration; the suffix sums are summed afresh once per window, so
        that subtractions leave no drift."""
        n = self._n
        values, suffix = self._values, self._suffix
        at = int(values[:n].searchsorted(duration, side="left"))
        values[at : n - 1] = values[at + 1 : n]
        suffix[: at + 1] -= duration
        suffix[at + 1 : n] = suffix[at + 2 : n + 1]
        self._n = n - 1
        self._dropped += 1
        if self._dropped % self.window == 0:
            suffix[: n - 1] = np.cumsum(values[: n - 1][::-1])[::-1]

    def _grow(self) -> None:
        n = self._n
        values, suffix = np.empty(2 * n), np.zeros(2 * n + 1)
        values[:n], suffix[: n + 1] = self._values[:n], self._suffix[: n + 1]
        self._values, self._suffix = values, suffix

    def __len__(self) -> int:
        return self._n

    def values(self) -> tuple[float, ...]:
        """The durations added, shortest first."""
        return tuple(self._values[: self._n].tolist())

    @property
    def mean(self) -> float | None:
        if self._n:
            return float(self._suffix[0]) / self._n
        return self.prior

    def remaining(self, elapsed: ArrayLike) -> np.ndarray | None:
        """Expected time left for tasks that have run ``elapsed`` seconds (one or many at once:
        a stage asks for all its running tasks on every pass)."""
        elapsed = np.asarray(elapsed, dtype=float)
        n = self._n
        if not n:
            return None if self.prior is None else np.maximum(self.prior - elapsed, 0.0)
        i = self._values[:n].searchsorted(elapsed, side="right")
        longer = n - i
        return np.where(longer > 0, self._suffix[i] / np.maximum(longer, 1) - elapsed, 0.0)


def forecast_end(
    now: float,
    durations: Durations,
    running_elapsed: ArrayLike,
    queued: int,
    slots: int,
) -> float | None:
    """Forecast end time of a stage, or ``None`` while nothing is known of its durations.

    ``slots`` is how many of the stage's tasks can run at once on the
    workers it has now (at least the number running).
    """
    mean = durations.mean
    if mean is None:
        return None
    if queued == 0 and np.size(running_elapsed) == 0:
        return now
    left = durations.remaining(running_elapsed)
    assert left is not None  # a mean is known
    slots = max(slots, len(left), 1 if queued else 0)
    free = np.zeros(slots)  # idle slots first, then the running ones in order of freeing up
    free[slots - len(left) :] = np.sort(left)
    base, extra = divmod(queued, slots)
    return now + float(np.max(free + (base + (np.arange(slots) < extra)) * mean))
