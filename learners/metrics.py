"""How well allocations fit use: Absolute Workflow Efficiency and its waste.

As Phung & Thain define them (IPDPS 2024).

For one resource, every attempt allocates ``a`` over its duration ``t``; a
successful attempt consumes ``c`` over ``t`` (``c`` its peak, or the integral of
a measured series). AWE = sum of c*t over successful attempts / sum of a*t over
all attempts. What is not consumed is waste, of two kinds: internal
fragmentation (a - c)*t of successful attempts, and failed allocations a*t of
attempts killed for exhausting a resource. AWE + the two wastes' shares = 1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Usage:
    """One resource's account over a run, in resource units x seconds."""

    consumed: float = 0.0
    """Sum of c*t over successful attempts."""
    allocated_ok: float = 0.0
    """Sum of a*t over successful attempts."""
    allocated_failed: float = 0.0
    """Sum of a*t over failed attempts."""

    def success(self, consumed: float, allocated: float) -> None:
        self.consumed += consumed
        self.allocated_ok += allocated

    def failure(self, allocated: float) -> None:
        self.allocated_failed += allocated

    @property
    def allocated(self) -> float:
        return self.allocated_ok + self.allocated_failed

    @property
    def awe(self) -> float:
        """Absolute Workflow Efficiency (NaN when nothing was allocated)."""
        return self.consumed / self.allocated if self.allocated > 0 else float("nan")

    @property
    def fragmentation(self) -> float:
        """Internal fragmentation: allocated but unused by successful attempts."""
        return self.allocated_ok - self.consumed

    @property
    def failed(self) -> float:
        """Failed allocations: everything attempts killed for exhaustion held."""
        return self.allocated_failed
