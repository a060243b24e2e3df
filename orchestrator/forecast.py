"""When will a running stage end? A forecast from its progress.

The stage's queued tasks are list-scheduled onto its slots behind the running
ones. With equal expected durations that schedule has a closed form: slot
``i`` (ordered by when it frees up) takes every ``S``-th queued task, so the
stage ends at ``max_i free_i + n_i * mean``. A running task's remaining time
is the empirical mean residual life of the durations seen so far, so a task
that has already run long is expected to run longer, not to end at once.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Durations:
    """Successful task durations of one stage, kept sorted for residual-life queries."""

    prior: float | None = None
    """Expected duration before any task has finished (e.g. from earlier runs)."""
    _sorted: list[float] = field(default_factory=list)
    _suffix: np.ndarray | None = None

    def add(self, duration: float) -> None:
        insort(self._sorted, duration)
        self._suffix = None

    def __len__(self) -> int:
        return len(self._sorted)

    @property
    def mean(self) -> float | None:
        if self._sorted:
            return self._sums()[0] / len(self._sorted)
        return self.prior

    def remaining(self, elapsed: float) -> float | None:
        """Expected time left for a task that has run ``elapsed`` seconds."""
        if not self._sorted:
            return None if self.prior is None else max(self.prior - elapsed, 0.0)
        i = bisect_right(self._sorted, elapsed)
        longer = len(self._sorted) - i
        return self._sums()[i] / longer - elapsed if longer else 0.0

    def _sums(self) -> np.ndarray:
        """Suffix sums: ``_sums()[i]`` is the total of the ``i``-th shortest onward."""
        if self._suffix is None:
            self._suffix = np.append(np.cumsum(self._sorted[::-1])[::-1], 0.0)
        return self._suffix


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
    free += [0.0] * (slots - len(free))
    base, extra = divmod(queued, slots)
    end = max(f + (base + (1 if i < extra else 0)) * mean for i, f in enumerate(free))
    return now + end
