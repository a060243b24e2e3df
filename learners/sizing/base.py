"""The one protocol every task sizer implements.

A sizer keeps independent state per (category, resource). The engine asks it
for the allocation of a task's next attempt and tells it how attempts ended:
a successful attempt gives a record of measured peaks; an attempt killed for
exceeding a resource only says "more than ``measured`` was needed".
"""

from __future__ import annotations

import bisect
import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from learners.resources import Exhaustion, Resources


@dataclass(frozen=True, slots=True)
class TaskFeatures:
    """What a sizer may know of a task before it runs."""

    category: str
    input_size: float | None = None
    """Total input size in bytes (Ponder, k-Segments, Witt)."""
    declared: Mapping[str, float] = field(default_factory=dict)
    """Sizes the user fixed (``Task.declared``): they always win over any sizer."""
    worker: Resources | None = None
    """The largest worker the task may run on, when smaller than the sizer's (its stage's nodes)."""
    requested: Mapping[str, float] = field(default_factory=dict)
    """Sizes the user asked for without fixing them (a trace's requested memory, say):
    what Ponder keeps while unsure and what the user-default baseline allocates."""
    share: Mapping[str, float] = field(default_factory=dict)
    """The task's share of its stage's allocation (the allocation divided by the stage's
    task count): a first guess that lets a stage's first tasks run side by side."""
    key: str | int | None = None
    """Which task of its run this is (the engine's task id, the replay's place in its
    trace): what matches a task's record to what was allocated at its start. None where
    unknown (records learnt again from an earlier run)."""


class Bound(enum.Enum):
    """Whose amount a task cannot exceed."""

    DECLARED = "the declared"
    """The size the user fixed for the task."""
    WORKER = "a whole worker's"
    """All a worker it may run on has."""


class Unfittable(ValueError):
    """The task needs more of a resource than it can ever get: more than a whole
    worker has, or more than the size the user fixed.

    ``needed`` is what an attempt reached before it was stopped or, with ``declares``,
    what the user fixed above a worker's; None where a step of memory failed."""

    def __init__(
        self,
        category: str,
        resource: str,
        bound: Bound,
        limit: float,
        needed: float | None = None,
        *,
        declares: bool = False,
    ) -> None:
        self.category, self.resource, self.bound = category, resource, bound
        self.limit, self.needed, self.declares = limit, needed, declares
        reached = "" if needed is None else f" (reached {needed:g})"
        if declares:
            told = f"declares {resource} = {needed:g}, more than {bound.value} {limit:g}"
        else:
            told = f"needs more {resource} than {bound.value} {limit:g}{reached}"
        super().__init__(f"task of category {category!r} {told}")


@dataclass(frozen=True, slots=True)
class Record:
    """A successful attempt: measured peaks (``peak.wall`` is the wall time)."""

    task: TaskFeatures
    peak: Resources
    memory_series: tuple[float, ...] | None = None
    """Memory samples in MB at the monitor's interval (k-Segments)."""
    sample_interval_s: float | None = None


class Running:
    """The attempts running now, per category, as the executor that starts them reports it.

    The records of a category whose tasks start together come from its quickest tasks
    first, and where a task's memory grows with its run time, from its smallest: an
    attempt that has outlasted every record may need more than any of them. ``budget``
    counts such attempts as records above the others (censored, as in survival analysis).
    An executor that reports nothing leaves every count at 0.
    """

    def __init__(self) -> None:
        self.now = 0.0
        """The executor's clock, in seconds."""
        self._starts: dict[str, list[float]] = {}
        """Per category, the start times of its running attempts, sorted."""
        self._waiting: dict[str, int] = {}
        """Per category, the attempts sent to a worker that have not started there yet."""
        self._submitted: Counter[str] = Counter()
        """Per category, the tasks the workflow has submitted so far."""
        self.queued: int | None = None
        """Tasks waiting for room to start an attempt, over the workflow, the task being sized
        among them, as the executor sets it before it sizes one (None: it does not tell)."""

    def start(self, category: str, at: float) -> None:
        bisect.insort(self._starts.setdefault(category, []), at)

    def end(self, category: str, started: float) -> None:
        starts = self._starts[category]
        del starts[bisect.bisect_left(starts, started)]

    def wait(self, category: str, more: int) -> None:
        """``more`` (or, below 0, fewer) attempts of ``category`` wait on their worker to
        start (an executor that sends work ahead of room)."""
        self._waiting[category] = self._waiting.get(category, 0) + more

    def submit(self, category: str, more: int = 1) -> None:
        """``more`` tasks of ``category`` were submitted (an executor that knows its
        workflow's tasks before they run)."""
        self._submitted[category] += more

    def submitted(self, category: str | None = None) -> int:
        """How many tasks of ``category`` (of every category: None) were submitted so far."""
        return self._submitted.total() if category is None else self._submitted[category]

    def count(self, category: str) -> int:
        """How many attempts of ``category`` run now, or wait on their worker to start."""
        return len(self._starts.get(category, ())) + self._waiting.get(category, 0)

    def busy(self) -> int:
        """How many attempts of every category run now, or wait on their worker to start."""
        return sum(map(len, self._starts.values())) + sum(self._waiting.values())

    def outlasting(self, category: str, wall: float) -> int:
        """How many attempts of ``category`` have run ``wall`` seconds or longer by now."""
        return bisect.bisect_right(self._starts.get(category, ()), self.now - wall)


class Sizer(Protocol):
    """Allocates attempts and learns from their outcomes."""

    name: str
    running: Running
    """Where the executor reports the attempts it runs (the engine and the replay do)."""

    def allocate(
        self,
        task: TaskFeatures,
        previous: Resources | None = None,
        exhaustion: Exhaustion | None = None,
    ) -> Resources:
        """The allocation of the task's next attempt.

        ``previous`` and ``exhaustion`` are ``None`` on a first attempt. On a
        retry, only the exhausted resource is re-predicted; the others keep at
        least what the previous attempt had. Sizes in ``task.declared`` are
        returned as given. Raises :class:`Unfittable` when the task cannot get
        enough of a resource (it exhausted a whole worker or a declared size).
        """
        ...

    def ready(self, task: TaskFeatures) -> bool:
        """Whether the task's first attempt may start now. False: nothing tells its size
        yet and enough attempts of its category run to find out; the executor starts other
        tasks meanwhile and asks again when an attempt of the category ends."""
        ...

    def observe(self, record: Record) -> None:
        """Learn from a successful attempt."""
        ...

    def observe_exhaustion(
        self, task: TaskFeatures, allocation: Resources, exhaustion: Exhaustion
    ) -> None:
        """Learn that an attempt with ``allocation`` was killed for ``exhaustion``."""
        ...
