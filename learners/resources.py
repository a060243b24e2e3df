"""The resource vocabulary shared by workflows, sizers, the pool and workers.

Units: cores as floats, memory and disk in MB (1 GB = 1000 MB, as cctools),
wall time in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

Resource = Literal["cores", "memory", "disk", "wall"]
RESOURCES: tuple[Resource, ...] = ("cores", "memory", "disk", "wall")
PACKED: tuple[Resource, ...] = ("cores", "memory", "disk")
"""Resources a worker has a fixed amount of; wall time is bounded by the pilot's end instead."""


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of each resource; ``wall`` is unbounded unless given."""

    cores: float = 0.0
    memory: float = 0.0
    disk: float = 0.0
    wall: float = math.inf

    def __getitem__(self, resource: Resource) -> float:
        return getattr(self, resource)

    def with_(self, resource: Resource, value: float) -> Resources:
        return replace(self, **{resource: value})

    def fits_in(self, capacity: Resources) -> bool:
        """True when every packed resource is within ``capacity``."""
        return (
            self.cores <= capacity.cores + 1e-9
            and self.memory <= capacity.memory + 1e-9
            and self.disk <= capacity.disk + 1e-9
        )

    def exceeded_by(self, usage: Resources) -> Resource | None:
        """The first resource whose ``usage`` is above this allocation, if any."""
        for r in RESOURCES:
            if usage[r] > self[r] + 1e-9:
                return r
        return None

    # Spelt out: the pool and the workers call these for every attempt.
    def plus(self, other: Resources) -> Resources:
        """Sum of the packed resources; wall time is kept from ``self``."""
        return Resources(
            self.cores + other.cores, self.memory + other.memory, self.disk + other.disk, self.wall
        )

    def minus(self, other: Resources) -> Resources:
        """Difference of the packed resources; wall time is kept from ``self``."""
        return Resources(
            self.cores - other.cores, self.memory - other.memory, self.disk - other.disk, self.wall
        )

    def as_dict(self) -> dict[str, float]:
        """Its amounts as floats, whatever numbers it was made of: equal amounts read the same
        (the store writes the text of equal allocations once)."""
        return {
            "cores": float(self.cores),
            "memory": float(self.memory),
            "disk": float(self.disk),
            "wall": float(self.wall),
        }


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """An attempt was killed because ``resource`` reached ``measured`` (above its allocation):
    what a worker's monitor reports and a sizer learns from (here, where the worker can import
    it without the sizers)."""

    resource: Resource
    measured: float
