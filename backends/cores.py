"""The CPUs of one machine, handed out least loaded first: to a local pilot's workers (as a
Slurm cpuset would be) and, within a worker's, to its tasks."""

from __future__ import annotations

import math
from collections.abc import Iterable


class CoreSet:
    """Which CPUs a claim of ``c`` cores is pinned to: the least loaded ones.

    A claim of ``c`` cores gets ``ceil(c)`` CPUs, each loaded by ``c / ceil(c)``; with
    whole-core claims within the CPUs there are, every claim has CPUs of its own.
    """

    def __init__(self, cpus: Iterable[int]) -> None:
        self.load = dict.fromkeys(sorted(cpus), 0.0)

    def take(self, cores: float) -> frozenset[int] | None:
        """The CPUs of a claim of ``cores`` (None: none to give)."""
        if cores <= 0 or not self.load:
            return None
        count = min(len(self.load), max(1, math.ceil(cores - 1e-9)))
        chosen = sorted(self.load, key=lambda cpu: (self.load[cpu], cpu))[:count]
        for cpu in chosen:
            self.load[cpu] += cores / count
        return frozenset(chosen)

    def give(self, cpus: frozenset[int] | None, cores: float) -> None:
        """The claim of ``cores`` that :meth:`take` gave ``cpus`` is over."""
        for cpu in cpus or ():
            self.load[cpu] -= cores / len(cpus)
