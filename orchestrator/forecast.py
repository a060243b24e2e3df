"""When will a running stage end? A forecast from its progress.

The stage's queued tasks are list-scheduled onto its slots behind the running
ones. With equal expected durations that schedule has a closed form: slot
``i`` (ordered by when it frees up) takes every ``S``-th queued task, so the
stage ends at ``max_i free_i + n_i * mean``. A running task's remaining time
is the empirical mean residual life of the durations seen so far, so a task
that has already run long is expected to run longer, not to end at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.planner import Phase

if TYPE_CHECKING:
    from orchestrator.runstate import StageRun


class Durations:
    """The latest successful task durations of one stage (``window`` of them), for its mean
    and residual-life queries.

    A stage adds one duration per task and its planner asks at most once a pass, so an
    addition only writes over the oldest duration in a ring and keeps their total; the
    sorted values and their suffix sums, which a residual-life query reads by binary
    search, are made when a query comes after additions. The window bounds that work for a
    stage of a million tasks, and follows durations that drift as a stage goes on.
    """

    def __init__(self, prior: float | None = None, window: int = 4096) -> None:
        self.prior = prior
        """Expected duration before any task has finished (e.g. from earlier runs)."""
        self.window = window
        self._ring = np.empty(min(window, 16))
        """The durations in the window, the oldest at ``_added % window`` once it is full."""
        self._added = 0
        self._total = 0.0
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        """The window's durations, shortest first, and ``suffix[i]``, the total of the
        ``i``-th shortest onward (0 past the end), as of the last query; None after an
        addition."""

    def add(self, duration: float) -> None:
        at = self._added % self.window
        if self._added >= self.window:
            self._total -= float(self._ring[at])
        elif at == len(self._ring):
            self._ring = np.concatenate([self._ring, np.empty(min(at, self.window - at))])
        self._ring[at] = duration
        self._added += 1
        self._total += duration
        if self._added % self.window == 0:  # summed afresh once a window: no drift
            self._total = float(self._ring.sum())
        self._sorted = None

    def __len__(self) -> int:
        return min(self._added, self.window)

    def values(self) -> tuple[float, ...]:
        """The durations in the window, shortest first."""
        return tuple(self._by_length()[0].tolist())

    @property
    def mean(self) -> float | None:
        if self._added:
            return self._total / len(self)
        return self.prior

    def remaining(self, elapsed: ArrayLike) -> np.ndarray | None:
        """Expected time left for tasks that have run ``elapsed`` seconds (one or many at once:
        a stage asks for all its running tasks on every pass)."""
        elapsed = np.asarray(elapsed, dtype=float)
        n = len(self)
        if not n:
            return None if self.prior is None else np.maximum(self.prior - elapsed, 0.0)
        values, suffix = self._by_length()
        i = values.searchsorted(elapsed, side="right")
        longer = n - i
        return np.where(longer > 0, suffix[i] / np.maximum(longer, 1) - elapsed, 0.0)

    def _by_length(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None:
            n = len(self)
            values = np.sort(self._ring[:n])
            suffix = np.zeros(n + 1)
            suffix[:n] = np.cumsum(values[::-1])[::-1]
            self._sorted = values, suffix
        return self._sorted


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


def stage_ends(
    stages: Mapping[str, StageRun], now: float, progress_end: Callable[[StageRun], float]
) -> dict[str, float]:
    """Forecast end (run time) of every open stage that an open stage waits for: the
    planner asks no other, and a forecast costs a pass as many steps as tasks run.

    A running stage ends when ``progress_end`` says; a later one starts when
    the stages it waits for are forecast to end and lasts as long as its
    tasks take on its own allocation, by the durations seen (in this run
    or earlier ones), or its time limit while nothing is known.
    """
    ends: dict[str, float] = {}

    def end(name: str) -> float:
        if name not in ends:
            stage = stages[name]
            if not stage.phase.open:
                ends[name] = stage.end_t if stage.end_t is not None else now
            elif stage.phase == Phase.RUNNING:
                ends[name] = progress_end(stage)
            else:
                start = max([now, *(end(a) for a in stage.spec.after)])
                ends[name] = start + expected_length(stage)
        return ends[name]

    for stage in stages.values():
        if stage.phase.open:
            for name in stage.spec.after:
                end(name)
    return {name: t for name, t in ends.items() if stages[name].phase.open}


def progress_end(stage: StageRun, now: float, slots: int) -> float | None:
    """A running stage's end from its progress on ``slots`` (None while nothing is known);
    attempts that wait on a worker are still to run, as the queue's tasks are."""
    elapsed = now - np.fromiter(stage.running.values(), float, len(stage.running))
    return forecast_end(now, stage.durations, elapsed, len(stage.queue) + len(stage.waiting), slots)


def expected_length(stage: StageRun) -> float:
    """How long a stage not yet started should take on its own allocation."""
    cores = stage.tasks[0].task.declared.get("cores", 1.0) if stage.tasks else 1.0
    slots = max(1, int(stage.spec.allocation.cores // max(cores, 1e-9)))
    remaining = len(stage.tasks) - stage.done
    end = forecast_end(0.0, stage.durations, [], remaining, slots)
    return stage.spec.allocation.time_limit_s if end is None else end
