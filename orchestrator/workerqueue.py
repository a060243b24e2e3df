"""The manager's copy of a worker agent's queue: which attempts sent to it run, which wait.

A worker agent starts the attempts it is sent in the order they came, while the first fits
what is free (:func:`~orchestrator.agent.attempt.first_come`). It does not say when an
attempt sent ahead starts: a message per task is what sending ahead saves. The manager
replays the same rule, the same function, on what it sends and on the results it hears,
which the worker's one connection carries in the order they happened, and so knows which
attempts run. It hears of room later than the worker has
it, so it may hold an attempt waiting that has just started, until the result that made the
room arrives; it never holds one running that still waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from learners.resources import Resources
from orchestrator.agent.attempt import first_come

Key = tuple[str, int]
"""An attempt: (task id, attempt number)."""


@dataclass
class WorkerQueue:
    """The attempts on one worker agent of ``capacity``, as the manager can tell them."""

    capacity: Resources
    free: Resources = field(init=False)
    running: dict[Key, Resources] = field(default_factory=dict)
    waiting: dict[Key, Resources] = field(default_factory=dict)
    """In the order they were sent."""

    def __post_init__(self) -> None:
        self.free = self.capacity

    def running_already(self, key: Key, allocation: Resources) -> None:
        """``key`` runs on the worker already (a resumed run's, known from the store)."""
        self.running[key] = allocation
        self.free = self.free.minus(allocation)

    def sent(self, key: Key, allocation: Resources) -> bool:
        """``key`` was sent; whether the worker starts it at once."""
        self.waiting[key] = allocation
        return key in self._start()

    def ended(self, key: Key) -> list[Key]:
        """``key`` ended, or left the worker unstarted (lost, cancelled): the attempts that
        start in the room it leaves, in order. A key this queue does not hold changes
        nothing."""
        if self.waiting.pop(key, None) is None:
            allocation = self.running.pop(key, None)
            if allocation is None:
                return []
            self.free = self.free.plus(allocation)
        return self._start()

    def _start(self) -> list[Key]:
        started, self.free = first_come(self.waiting.items(), self.free)
        for key in started:
            self.running[key] = self.waiting.pop(key)
        return started
