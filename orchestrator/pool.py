"""The unified worker view: the workers of every running pilot form one pool.

The pool knows each worker's capacity, what is allocated on it, the stages
its pilot serves and whether the pilot still takes work. It places a sized
task on a worker with room, preferring the pilot of the task's stage, and
never on a worker whose pilot ends before the task would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from learners.resources import PACKED, Resources
from orchestrator.attempt import AttemptResult, AttemptSpec


class Worker(Protocol):
    """A simulated worker or a remote worker agent."""

    id: str
    pilot_id: str
    capacity: Resources
    end_time: float
    """When its pilot's allocation ends, on the loop clock."""

    async def run(self, spec: AttemptSpec) -> AttemptResult: ...


@dataclass
class Slot:
    """A worker in the pool with what is allocated on it."""

    worker: Worker
    stages: frozenset[str]
    used: Resources = field(default_factory=Resources)
    running: int = 0

    @property
    def free(self) -> Resources:
        return self.worker.capacity.minus(self.used)


class Pool:
    """Workers of all pilots; ``share`` lets a task use pilots of other stages."""

    def __init__(self, share: bool = True) -> None:
        self.share = share
        self._slots: dict[str, Slot] = {}
        self._draining: set[str] = set()

    def join(self, worker: Worker, stages: frozenset[str]) -> None:
        self._slots[worker.id] = Slot(worker, stages)

    def leave(self, worker_id: str) -> Worker | None:
        slot = self._slots.pop(worker_id, None)
        return slot.worker if slot else None

    def drain(self, pilot_id: str) -> None:
        """The pilot takes no new work (its stages are done, or it is being released)."""
        self._draining.add(pilot_id)

    def workers(self, pilot_id: str | None = None) -> Iterator[Worker]:
        for slot in self._slots.values():
            if pilot_id is None or slot.worker.pilot_id == pilot_id:
                yield slot.worker

    def busy(self, pilot_id: str) -> bool:
        return any(s.running for s in self._slots.values() if s.worker.pilot_id == pilot_id)

    def largest(self) -> Resources | None:
        """The capacity of the largest worker in the pool (by cores, then memory)."""
        caps = [s.worker.capacity for s in self._slots.values()]
        return max(caps, key=lambda c: (c.cores, c.memory, c.disk), default=None)

    def place(self, stage: str, allocation: Resources, until: float) -> Worker | None:
        """Reserve ``allocation`` on the best worker for a task of ``stage`` running ``until``.

        Workers of the stage's own pilot come first; among equals, the one the
        task fills most (best fit), to keep room for larger tasks elsewhere.
        """
        best: tuple[tuple[bool, float], Slot] | None = None
        for slot in self._slots.values():
            if not self._eligible(slot, stage, until) or not allocation.fits_in(slot.free):
                continue
            rank = (stage not in slot.stages, slot.free.cores - allocation.cores)
            if best is None or rank < best[0]:
                best = (rank, slot)
        if best is None:
            return None
        slot = best[1]
        slot.used = slot.used.plus(allocation)
        slot.running += 1
        return slot.worker

    def largest_for(self, stage: str) -> Resources | None:
        """The capacity of the largest worker the stage may use (by cores, then memory)."""
        caps = [
            s.worker.capacity
            for s in self._slots.values()
            if self._eligible(s, stage, until=float("-inf"))
        ]
        return max(caps, key=lambda c: (c.cores, c.memory, c.disk), default=None)

    def release(self, worker_id: str, allocation: Resources) -> None:
        """Give back what an attempt held (no-op if the worker already left)."""
        slot = self._slots.get(worker_id)
        if slot is not None:
            slot.used = slot.used.minus(allocation)
            slot.running -= 1

    def slots_for(self, stage: str, allocation: Resources, until: float) -> int:
        """How many tasks of this size the stage could run at once on the workers it may use."""
        total = 0
        for slot in self._slots.values():
            if self._eligible(slot, stage, until):
                room = min(
                    slot.worker.capacity[r] // allocation[r] if allocation[r] > 0 else float("inf")
                    for r in PACKED
                )
                total += int(min(room, 1e6))
        return total

    def _eligible(self, slot: Slot, stage: str, until: float) -> bool:
        worker = slot.worker
        if worker.pilot_id in self._draining or worker.end_time < until:
            return False
        return self.share or stage in slot.stages
