"""When will a running stage end? A forecast from its progress.

The stage's queued tasks are list-scheduled onto its slots behind the running
ones. With equal expected durations that schedule has a closed form: slot
``i`` (ordered by when it frees up) takes every ``S``-th queued task, so the
stage ends at ``max_i free_i + n_i * mean``. A running task's remaining time
is the empirical mean residual life of the durations seen so far, so a task
that has already run long is expected to run longer, not to end at once.
"""

from __future__ import annotations

import numpy as np


class Durations:
    """Successful task durations of one stage, kept sorted for residual-life queries.

    A stage adds one duration per task and is asked for forecasts on every
    pass of the engine, so both are cheap: an addition shifts two arrays
    (sorted values and their suffix sums) in place, a query is a binary search.
    """

    def __init__(self, prior: float | None = None) -> None:
        self.prior = prior
        """Expected duration before any task has finished (e.g. from earlier runs)."""
        self._n = 0
        self._values = np.empty(16)
        self._suffix = np.zeros(17)
        """``_suffix[i]`` is the total of the ``i``-th shortest onward (0 past the end)."""

    def add(self, duration: float) -> None:
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

    def remaining(self, elapsed: float) -> float | None:
        """Expected time left for a task that has run ``elapsed`` seconds."""
        n = self._n
        if not n:
            return None if self.prior is None else max(self.prior - elapsed, 0.0)
        i = int(self._values[:n].searchsorted(elapsed, side="right"))
        longer = n - i
        return float(self._suffix[i]) / longer - elapsed if longer else 0.0


def forecast_end(
    now: float,
    durations: Durations,
    running_elapsed: list[float],
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
    if queued == 0 and not running_elapsed:
        return now
    free = sorted(durations.remaining(e) or 0.0 for e in running_elapsed)
    slots = max(slots, len(free), 1 if queued else 0)
    free = [0.0] * (slots - len(free)) + free  # idle slots first: in order of freeing up
    base, extra = divmod(queued, slots)
    end = max(f + (base + (1 if i < extra else 0)) * mean for i, f in enumerate(free))
    return now + end
