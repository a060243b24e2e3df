"""What the engine hears: one type per kind of event, handled with ``match``.

The batch system reports its jobs, worker sources report the workers that join
and leave, and every attempt's end comes back from its worker. Each reaches the
engine through :meth:`~orchestrator.engine.Engine.post`, whatever task saw it,
and the engine applies them to the run's state in the order they came, each
batch after a :class:`Tick` that gives the time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.base import JobInfo
from orchestrator.agent.attempt import AttemptResult, AttemptSpec
from orchestrator.pool import Worker


@dataclass(frozen=True, slots=True)
class Tick:
    """The loop's clock reads ``t``: the time of what follows, until the next tick."""

    t: float


@dataclass(frozen=True, slots=True)
class JobChanged:
    """A pilot's job changed state (as the backend's poller saw it)."""

    info: JobInfo


@dataclass(frozen=True, slots=True)
class WorkerJoined:
    """A worker of one of the run's pilots is ready for tasks."""

    worker: Worker


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """A worker left or went silent; its source has answered its running attempts LOST."""

    worker_id: str


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """An attempt's result, from the worker that ran it."""

    worker: Worker
    spec: AttemptSpec
    result: AttemptResult


Event = Tick | JobChanged | WorkerJoined | WorkerLost | AttemptEnded
Post = Callable[[Event], None]
"""How an event reaches the engine."""
