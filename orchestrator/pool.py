"""The unified worker view: the workers of every running pilot form one pool.

The pool knows each worker's capacity, what is allocated on it, the stages
its pilot serves and whether the pilot still takes work. It places a sized
task on a worker with room, preferring the pilot of the task's stage, and
never on a worker whose pilot ends before the task would. Asked to, it also
places a task *ahead* on a full worker agent, which holds it until it has room:
at most :data:`AHEAD_DEPTH` capacities' worth more than the worker runs; the slot's
:class:`~orchestrator.workerqueue.WorkerQueue` tells which of its attempts run and which wait.

Workers are kept by the stages their pilot serves, each group ordered by free cores, so
that a placement looks only at workers with enough cores free, from the fullest up, and
stops at the first with room: its cost does not grow with the number of full workers.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Protocol

from learners.resources import PACKED, Resources
from orchestrator.agent.attempt import AttemptResult, AttemptSpec
from orchestrator.workerqueue import Key, WorkerQueue

AHEAD_DEPTH = 64
"""A worker that queues holds at most this many capacities' worth of attempts ahead (a stage
asks for less when its tasks are longer, ``runstate.AHEAD_S``): enough that it has work
while the manager gathers a pass's results (``engine.GATHER_S``) and the worker's results
linger for company (``worker.RESULT_LINGER_S``), for tasks of a few milliseconds. A worker
turns an attempt of ``true`` over in about 2 ms, so the manager, which hears of room that
late, must send it 64 ahead to gather 40 ms (16 ahead and 20 ms: the workers idled, 930
tasks/s on two workers; 32 and 20 ms: 1,400 to 1,500; 32 and 40 ms: 1,120)."""


Told = Callable[[AttemptResult], None]
"""Where a worker tells how an attempt ended: a call, not a future, as the engine takes every
result in as an event (a future and its three callbacks per attempt were an eighth of the
manager's function calls per task)."""


class Worker(Protocol):
    """A simulated worker or a remote worker agent."""

    id: str
    pilot_id: str
    """Its pilot as the worker knows it: the engine's id, the job's name or its job id."""
    capacity: Resources
    end_time: float
    """When its pilot's allocation ends, on the loop clock."""

    queues: bool
    """Takes attempts ahead of room and starts them, in the order they came, as room frees (a
    worker agent); a simulated worker runs what it is given at once."""

    @property
    def accepting(self) -> bool:
        """Takes new attempts (a worker stops a while before its pilot ends)."""
        ...

    def start(self, spec: AttemptSpec, told: Told) -> None:
        """Run ``spec``; ``told`` its result once (LOST if the worker goes first)."""
        ...

    def stop(self, key: Key) -> None:
        """Nobody waits for attempt ``key`` any more: it is stopped, and told of to nobody."""
        ...


@dataclass
class Slot:
    """A worker in the pool, the pilot it belongs to, and what is allocated on it."""

    worker: Worker
    pilot_id: str
    stages: frozenset[str]
    joined: int
    """Its place in the order workers joined: the first of equally good workers wins."""
    used: Resources = field(default_factory=Resources)
    running: int = 0
    key: tuple[float, int, Slot] | None = None
    """Its entry in its group's order (free cores, joined, itself); None while it takes no
    work."""
    ahead_key: tuple[float, int, Slot] | None = None
    """Its entry in its group's order of room ahead (free cores plus :data:`AHEAD_DEPTH` times
    its capacity's, joined, itself); None while it takes no work, or for a worker that does not
    queue."""
    queue: WorkerQueue | None = None
    """Which of its attempts run and which wait, for a worker that queues."""

    @property
    def free_cores(self) -> float:
        return self.worker.capacity.cores - self.used.cores

    @property
    def holds_ahead(self) -> bool:
        """Its worker holds attempts it has no room for yet."""
        return not self.used.fits_in(self.worker.capacity)

    def takes(self, until: float) -> bool:
        """Whether its worker takes new attempts that run until ``until``."""
        return self.worker.end_time >= until and self.worker.accepting

    def has_room(self, allocation: Resources, ahead: int = 0) -> bool:
        """Whether ``allocation`` fits in what is free or, given ``ahead``, in that many
        capacities more (and in the worker)."""
        capacity, used = self.worker.capacity, self.used
        if ahead and not allocation.fits_in(capacity):
            return False
        k = 1 + ahead
        return (
            allocation.cores <= k * capacity.cores - used.cores + 1e-9
            and allocation.memory <= k * capacity.memory - used.memory + 1e-9
            and allocation.disk <= k * capacity.disk - used.disk + 1e-9
        )


class Pool:
    """Workers of all pilots; ``share`` lets a task use pilots of other stages."""

    def __init__(self, share: bool = True) -> None:
        self.share = share
        self._slots: dict[str, Slot] = {}
        self._draining: set[str] = set()
        self._running: Counter[str] = Counter()
        """Attempts running per pilot: asked of every live pilot on every pass."""
        self._emptied: set[str] = set()
        """Pilots whose last running attempt ended since :meth:`newly_idle` was asked."""
        self._groups: dict[frozenset[str], list[tuple[float, int, Slot]]] = {}
        """Per set of stages served, the workers taking work by (free cores, joined); a set's
        list stays, empty, once its last worker left (the sets are few: the pilots' stages)."""
        self._ahead: dict[frozenset[str], list[tuple[float, int, Slot]]] = {}
        """The same for workers that queue, by room ahead (see :attr:`Slot.ahead_key`)."""
        self._moved: dict[str, Slot] = {}
        """Slots whose room grew since their entries in those orders were made: they are placed
        again there before the next placement looks (a pass takes in many results of a worker,
        and places once)."""
        self._splits: dict[tuple[bool, str], tuple[list[frozenset[str]], list[frozenset[str]]]] = {}
        """What :meth:`_split` found, per order and stage."""
        self._joined = count()
        self._largest: dict[str, Resources | None] = {}
        """What :meth:`largest_for` found, until a worker joins or leaves."""

    def join(self, worker: Worker, pilot_id: str, stages: frozenset[str]) -> None:
        """``worker`` of pilot ``pilot_id`` (the engine's id) serves ``stages`` first (a worker
        that joins again starts afresh)."""
        self.leave(worker.id)
        self._largest.clear()
        slot = self._slots[worker.id] = Slot(worker, pilot_id, stages, next(self._joined))
        if worker.queues:
            slot.queue = WorkerQueue(worker.capacity)
        if pilot_id not in self._draining:
            self._enter(slot)

    def leave(self, worker_id: str) -> Slot | None:
        """Forget a worker; its slot, if it was in the pool."""
        slot = self._slots.pop(worker_id, None)
        if slot is not None:
            self._running[slot.pilot_id] -= slot.running
            self._exit(slot)
            self._largest.clear()
        return slot

    def drain(self, pilot_id: str) -> None:
        """The pilot takes no new work (its stages are done, or it is being released)."""
        if pilot_id in self._draining:
            return
        self._draining.add(pilot_id)
        for slot in self._slots.values():
            if slot.pilot_id == pilot_id:
                self._exit(slot)

    def workers(self, pilot_id: str | None = None) -> Iterator[Worker]:
        for slot in self._slots.values():
            if pilot_id is None or slot.pilot_id == pilot_id:
                yield slot.worker

    def busy(self, pilot_id: str) -> bool:
        return self._running[pilot_id] > 0

    def newly_idle(self) -> list[str]:
        """The pilots whose attempts all ended since this was last asked and that run none."""
        idle = [p for p in self._emptied if not self._running[p]]
        self._emptied.clear()
        return idle

    def place(
        self,
        stage: str,
        allocation: Resources,
        until: float,
        ahead: bool = False,
        depth: int = AHEAD_DEPTH,
    ) -> Slot | None:
        """Reserve ``allocation`` on the best worker for a task of ``stage`` running ``until``;
        ``ahead``: on a full worker that queues, if none has room, within ``depth`` (at most
        :data:`AHEAD_DEPTH`) capacities' worth more than it runs.

        Workers of the stage's own pilot come first; among equals, the one the
        task fills most (best fit), to keep room for larger tasks elsewhere.
        """
        self._reorder()
        slot = self._best(self._groups, stage, allocation, until, ahead=0)
        if slot is None and ahead:
            slot = self._best(self._ahead, stage, allocation, until, ahead=min(depth, AHEAD_DEPTH))
        if slot is not None:
            self._take(slot, allocation)
        return slot

    def _best(
        self,
        orders: dict[frozenset[str], list[tuple[float, int, Slot]]],
        stage: str,
        allocation: Resources,
        until: float,
        ahead: int,
    ) -> Slot | None:
        own, others = self._split(orders, stage)
        slot = self._first_fit(orders, own, allocation, until, ahead)
        if slot is None and self.share:
            slot = self._first_fit(orders, others, allocation, until, ahead)
        return slot

    def _split(
        self, orders: dict[frozenset[str], list[tuple[float, int, Slot]]], stage: str
    ) -> tuple[list[frozenset[str]], list[frozenset[str]]]:
        """The groups of ``orders`` that serve ``stage``, and the others (found again only
        once a group is added: a group stays, emptied, when its last worker leaves it)."""
        key = (orders is self._ahead, stage)
        found = self._splits.get(key)
        if found is None:
            found = self._splits[key] = (
                [g for g in orders if stage in g],
                [g for g in orders if stage not in g],
            )
        return found

    @staticmethod
    def _first_fit(
        orders: dict[frozenset[str], list[tuple[float, int, Slot]]],
        groups: list[frozenset[str]],
        allocation: Resources,
        until: float,
        ahead: int,
    ) -> Slot | None:
        """Of the workers in ``groups`` with room for ``allocation`` until ``until`` (and
        ``ahead`` capacities more), the one with the fewest cores free (the first to join
        among equals); the order of room ahead is that of :data:`AHEAD_DEPTH`, so a shallower
        ``ahead`` passes over the workers full to it."""
        best: tuple[float, int, Slot] | None = None
        for group in groups:
            order = orders[group]
            for i in range(bisect_left(order, (allocation.cores - 1e-9,)), len(order)):
                entry = order[i]
                if best is not None and best < entry:
                    break
                slot = entry[2]
                if slot.takes(until) and slot.has_room(allocation, ahead):
                    best = entry
                    break
        return None if best is None else best[2]

    def _enter(self, slot: Slot) -> None:
        slot.key = (slot.free_cores, slot.joined, slot)
        insort(self._order(self._groups, slot.stages), slot.key)
        if slot.worker.queues:
            room = slot.free_cores + AHEAD_DEPTH * slot.worker.capacity.cores
            slot.ahead_key = (room, slot.joined, slot)
            insort(self._order(self._ahead, slot.stages), slot.ahead_key)

    def _order(
        self, orders: dict[frozenset[str], list[tuple[float, int, Slot]]], stages: frozenset[str]
    ) -> list[tuple[float, int, Slot]]:
        """The order of the workers serving ``stages`` in ``orders``, made if it is new."""
        order = orders.get(stages)
        if order is None:
            order = orders[stages] = []
            self._splits.clear()
        return order

    def _exit(self, slot: Slot) -> None:
        for orders, key in ((self._groups, slot.key), (self._ahead, slot.ahead_key)):
            if key is not None:
                order = orders[slot.stages]
                del order[bisect_left(order, key)]
        slot.key = slot.ahead_key = None

    def largest_for(self, stage: str) -> Resources | None:
        """The capacity of the largest worker the stage may use, draining or not (a pilot that
        replaces a draining one brings workers of the same size)."""
        if stage not in self._largest:
            caps = [
                s.worker.capacity for s in self._slots.values() if self.share or stage in s.stages
            ]
            self._largest[stage] = max(
                caps, key=lambda c: (c.cores, c.memory, c.disk), default=None
            )
        return self._largest[stage]

    def sent(self, slot: Slot, key: Key, allocation: Resources) -> bool:
        """Attempt ``key``, placed on ``slot``, was sent; whether it starts at once (a worker
        that does not queue runs what it is given)."""
        return slot.queue is None or slot.queue.sent(key, allocation)

    def occupy(self, worker_id: str, key: Key, allocation: Resources, started: bool) -> list[Key]:
        """Count attempt ``key``, already on a worker that (re)joined the pool: ``started``, or
        waiting there; the attempts that start now (those waiting that it has room for)."""
        slot = self._slots.get(worker_id)
        if slot is None:
            return []
        self._take(slot, allocation)
        if slot.queue is None:
            return []
        if started:
            slot.queue.running_already(key, allocation)
            return []
        return [key] if slot.queue.sent(key, allocation) else []

    def release(self, worker_id: str, key: Key, allocation: Resources) -> list[Key]:
        """Give back what attempt ``key`` held; the attempts that start in its room (nothing
        if the worker already left)."""
        slot = self._slots.get(worker_id)
        if slot is None:
            return []
        slot.used = slot.used.minus(allocation)
        self._count(slot, -1)
        if slot.key is not None:
            self._moved[worker_id] = slot
        return [] if slot.queue is None else slot.queue.ended(key)

    def _take(self, slot: Slot, allocation: Resources) -> None:
        taking = slot.key is not None
        self._exit(slot)
        slot.used = slot.used.plus(allocation)
        self._count(slot, 1)
        if taking:
            self._enter(slot)

    def _count(self, slot: Slot, attempts: int) -> None:
        slot.running += attempts
        self._running[slot.pilot_id] += attempts
        if not self._running[slot.pilot_id]:
            self._emptied.add(slot.pilot_id)

    def _reorder(self) -> None:
        """Give the slots whose room grew their place in the orders by room."""
        for slot in self._moved.values():
            if slot.key is not None:  # else it left, or drains, since
                self._exit(slot)
                self._enter(slot)
        self._moved.clear()

    def slots_for(self, stage: str, allocation: Resources, until: float) -> int:
        """How many tasks of this size the stage could run at once on the workers it may use."""
        rooms: dict[Resources, int] = {}
        total = 0
        for group, order in self._groups.items():
            if not self.share and stage not in group:
                continue
            for _, _, slot in order:
                if not slot.takes(until):
                    continue
                capacity = slot.worker.capacity
                room = rooms.get(capacity)
                if room is None:
                    room = rooms[capacity] = _room(capacity, allocation)
                total += room
        return total


def _room(capacity: Resources, allocation: Resources) -> int:
    """How many of ``allocation`` a worker of ``capacity`` holds (a million at most)."""
    room = min(capacity[r] // allocation[r] if allocation[r] > 0 else float("inf") for r in PACKED)
    return int(min(room, 1e6))
