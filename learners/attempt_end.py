"""How an attempt of a task ends within an allocation: the one rule the simulated workers and
the sizing replay share.

Cores are not a limit a task is killed for (leadtime pins a task to its cores): given fewer
cores than it uses on average, a task runs slower in proportion, memory series included.
Memory, disk and wall time are limits. With a memory series, memory fails at the first
sample above the allocation (or above its step function), and the monitor reports that
sample. Without one, a :class:`Kills` model says when the kill comes and what was seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from learners.kill_times import CALIBRATED, KillTimes
from learners.resources import Resource, Resources
from learners.sizing.base import Exhaustion
from learners.sizing.ksegments import Steps, first_failure

EPSILON = 1e-9
"""Allocations within this of a need are enough (float sums of sizes)."""


@dataclass(frozen=True, slots=True)
class MemorySeries:
    """Memory samples of one task: seconds since its first sample, MB."""

    times: np.ndarray
    mb: np.ndarray

    @property
    def interval(self) -> float:
        """The typical time between samples (the monitor's interval)."""
        return float(np.median(np.diff(self.times))) if len(self.times) > 1 else 1.0


Peaks = Literal["calibrated", "slow", "fast"]
PEAKS: tuple[Peaks, ...] = ("calibrated", "slow", "fast")


@dataclass
class Kills:
    """When an attempt without a memory series is killed, and what the monitor reports.

    ``calibrated`` draws both from the bucketing paper's real runs
    (:mod:`learners.kill_times`); ``slow`` kills at the end of the run, reporting only the
    allocation (the slow-peaks model of Tovar et al., TPDS 2018: the worst case); ``fast``
    kills at the start, reporting the true peak (failures cost nothing and tell all).
    """

    peaks: Peaks = "slow"
    rng: np.random.Generator | None = None
    table: KillTimes = CALIBRATED

    def __post_init__(self) -> None:
        if self.peaks not in PEAKS:
            raise ValueError(f"peaks must be one of {', '.join(PEAKS)}, not {self.peaks!r}")
        if self.peaks == "calibrated" and self.rng is None:
            raise ValueError("calibrated kills need a random generator")

    def __call__(
        self, resource: Resource, allocation: float, peak: float, duration: float
    ) -> tuple[float, float]:
        """(seconds into the run of the kill, value the monitor reports)."""
        if self.peaks == "fast":
            return 0.0, peak
        if self.peaks == "slow":
            return duration, allocation
        assert self.rng is not None
        fraction, reported = self.table.draw(resource, allocation, peak, self.rng)
        return fraction * duration, reported


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """When an attempt ends (seconds after its start) and what, if anything, it exhausted."""

    end: float
    exhausted: tuple[Exhaustion, ...]
    """Every limit exceeded at ``end``, memory first; empty for a success."""
    stretch: float
    """How much slower than on enough cores it ran (1 or more)."""
    failed_at: int | None = None
    """The memory sample it was killed at (a series' memory kill only)."""


def attempt_end(
    peak: Resources,
    allocation: Resources,
    kills: Kills,
    *,
    use: float | None = None,
    series: MemorySeries | None = None,
    steps: Steps | None = None,
    limits: Sequence[Resource] = ("cores", "memory", "disk", "wall"),
) -> AttemptEnd:
    """How an attempt of a task needing ``peak`` (``peak.wall`` on enough cores) ends.

    ``use`` is the cores it uses on average (its peak where unknown); ``series`` its memory
    over time (``series.times`` stretched like the run), which decides a memory kill in
    place of ``peak.memory``; ``steps`` a memory allocation over time (k-Segments) in place
    of ``allocation.memory``; ``limits`` the resources enforced, "cores" among them meaning
    only that fewer cores stretch the run.
    """
    cores = peak.cores if use is None else use
    slower = "cores" in limits and allocation.cores > 0
    stretch = max(1.0, cores / allocation.cores) if slower else 1.0
    duration = peak.wall * stretch
    failures: list[tuple[float, Exhaustion]] = []
    failed_at = None
    if series is not None and "memory" in limits:
        memory = steps or Steps(np.array([allocation.memory]), ((0, 0),))
        failed_at = first_failure(series.mb, memory)
        if failed_at is not None:
            at = float(series.times[failed_at]) * stretch
            failures.append((at, Exhaustion("memory", float(series.mb[failed_at]))))
    for resource in ("memory", "disk"):
        if resource not in limits or (resource == "memory" and series is not None):
            continue
        if peak[resource] > allocation[resource] + EPSILON:
            at, reported = kills(resource, allocation[resource], peak[resource], duration)
            failures.append((at, Exhaustion(resource, reported)))
    if "wall" in limits and duration > allocation.wall + EPSILON:
        failures.append((allocation.wall, Exhaustion("wall", allocation.wall)))
    end = min((at for at, _ in failures), default=duration)
    exhausted = tuple(ex for at, ex in failures if at == end)
    memory_killed = any(ex.resource == "memory" for ex in exhausted)
    return AttemptEnd(end, exhausted, stretch, failed_at if memory_killed else None)
