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
        return all(self[r] <= capacity[r] + 1e-9 for r in PACKED)

    def exceeded_by(self, usage: Resources) -> Resource | None:
        """The first resource whose ``usage`` is above this allocation, if any."""
        for r in RESOURCES:
            if usage[r] > self[r] + 1e-9:
                return r
        return None

    def plus(self, other: Resources) -> Resources:
        """Sum of the packed resources; wall time is kept from ``self``."""
        return replace(self, **{r: self[r] + other[r] for r in PACKED})

    def minus(self, other: Resources) -> Resources:
        """Difference of the packed resources; wall time is kept from ``self``."""
        return replace(self, **{r: self[r] - other[r] for r in PACKED})

    def as_dict(self) -> dict[str, float]:
        return {r: self[r] for r in RESOURCES}
