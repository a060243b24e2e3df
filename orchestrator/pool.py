"""The unified worker view: the workers of every running pilot form one pool.

The pool knows each worker's capacity, what is allocated on it, the stages
its pilot serves and whether the pilot still takes work. It places a sized
task on a worker with room, preferring the pilot of the task's stage, and
never on a worker whose pilot ends before the task would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from learners.resources import PACKED, Resources
from orchestrator.agent.attempt import AttemptResult, AttemptSpec


class Worker(Protocol):
    """A simulated worker or a remote worker agent."""

    id: str
    pilot_id: str
    """Its pilot as the worker knows it: the engine's id, the job's name or its job id."""
    capacity: Resources
    end_time: float
    """When its pilot's allocation ends, on the loop clock."""

    @property
    def accepting(self) -> bool:
        """Takes new attempts (a worker stops a while before its pilot ends)."""
        ...

    async def run(self, spec: AttemptSpec) -> AttemptResult: ...


@dataclass
class Slot:
    """A worker in the pool, the pilot it belongs to, and what is allocated on it."""

    worker: Worker
    pilot_id: str
    stages: frozenset[str]
    used: Resources = field(default_factory=Resources)
    running: int = 0

    @property
    def free_cores(self) -> float:
        return self.worker.capacity.cores - self.used.cores

    def has_room(self, allocation: Resources) -> bool:
        """Whether ``allocation`` fits in what is free (asked of every slot per placement)."""
        capacity, used = self.worker.capacity, self.used
        return (
            allocation.cores <= capacity.cores - used.cores + 1e-9
            and allocation.memory <= capacity.memory - used.memory + 1e-9
            and allocation.disk <= capacity.disk - used.disk + 1e-9
        )


class Pool:
    """Workers of all pilots; ``share`` lets a task use pilots of other stages."""

    def __init__(self, share: bool = True) -> None:
        self.share = share
        self._slots: dict[str, Slot] = {}
        self._draining: set[str] = set()
        self._running: Counter[str] = Counter()
        """Attempts running per pilot: asked of every live pilot on every pass."""

    def join(self, worker: Worker, pilot_id: str, stages: frozenset[str]) -> None:
        """``worker`` of pilot ``pilot_id`` (the engine's id) serves ``stages`` first (a worker
        that joins again starts afresh)."""
        self.leave(worker.id)
        self._slots[worker.id] = Slot(worker, pilot_id, stages)

    def leave(self, worker_id: str) -> Slot | None:
        """Forget a worker; its slot, if it was in the pool."""
        slot = self._slots.pop(worker_id, None)
        if slot is not None:
            self._running[slot.pilot_id] -= slot.running
        return slot

    def drain(self, pilot_id: str) -> None:
        """The pilot takes no new work (its stages are done, or it is being released)."""
        self._draining.add(pilot_id)

    def workers(self, pilot_id: str | None = None) -> Iterator[Worker]:
        for slot in self._slots.values():
            if pilot_id is None or slot.pilot_id == pilot_id:
                yield slot.worker

    def busy(self, pilot_id: str) -> bool:
        return self._running[pilot_id] > 0

    def place(self, stage: str, allocation: Resources, until: float) -> Slot | None:
        """Reserve ``allocation`` on the best worker for a task of ``stage`` running ``until``.

        Workers of the stage's own pilot come first; among equals, the one the
        task fills most (best fit), to keep room for larger tasks elsewhere.
        """
        best: tuple[tuple[bool, float], Slot] | None = None
        for slot in self._slots.values():
            if not self._eligible(slot, stage, until) or not slot.has_room(allocation):
                continue
            rank = (stage not in slot.stages, slot.free_cores - allocation.cores)
            if best is None or rank < best[0]:
                best = (rank, slot)
        if best is None:
            return None
        slot = best[1]
        self._take(slot, allocation)
        return slot

    def largest_for(self, stage: str) -> Resources | None:
        """The capacity of the largest worker the stage may use, draining or not (a pilot that
        replaces a draining one brings workers of the same size)."""
        caps = [s.worker.capacity for s in self._slots.values() if self.share or stage in s.stages]
        return max(caps, key=lambda c: (c.cores, c.memory, c.disk), default=None)

    def occupy(self, worker_id: str, allocation: Resources) -> None:
        """Count an attempt already running on a worker that (re)joined the pool."""
        slot = self._slots.get(worker_id)
        if slot is not None:
            self._take(slot, allocation)

    def release(self, worker_id: str, allocation: Resources) -> None:
        """Give back what an attempt held (no-op if the worker already left)."""
        slot = self._slots.get(worker_id)
        if slot is not None:
            slot.used = slot.used.minus(allocation)
            slot.running -= 1
            self._running[slot.pilot_id] -= 1

    def _take(self, slot: Slot, allocation: Resources) -> None:
        slot.used = slot.used.plus(allocation)
        slot.running += 1
        self._running[slot.pilot_id] += 1

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
        if slot.pilot_id in self._draining or worker.end_time < until or not worker.accepting:
            return False
        return self.share or stage in slot.stages
