"""Workers that connect by themselves: the manager as the engine's worker source.

A real pilot's workers start on its nodes and register with the run's
:class:`~orchestrator.manager.Manager`; the pilot's start brings none at
once. Each registration becomes a :class:`~orchestrator.events.WorkerJoined` event of the
engine, each worker that leaves (released, disconnected, silent past its heartbeats) a
:class:`~orchestrator.events.WorkerLost` one, whose running attempts the manager has already
answered LOST.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from backends.base import JobInfo
from orchestrator.events import Post, WorkerJoined, WorkerLost
from orchestrator.manager import Manager, RemoteWorker


class RemoteWorkers:
    """The workers registered with ``manager``, handed to the engine through ``attach``."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        manager.on_join = self._joined
        manager.on_leave = self._left
        self._post: Post | None = None
        self._closing: set[asyncio.Task[str]] = set()

    def attach(self, post: Post) -> None:
        """Send joins and losses to ``post`` (the engine's :meth:`~Engine.post`)."""
        self._post = post

    def started(self, pilot: Any, info: JobInfo) -> Sequence[RemoteWorker]:
        return ()

    def ended(self, pilot: Any, workers: Sequence[Any]) -> None:
        """The pilot's allocation ended: a worker still connected is told to leave now."""
        for worker in workers:
            if isinstance(worker, RemoteWorker) and worker.alive:
                task = asyncio.ensure_future(worker.shutdown("its pilot ended"))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def expect(self, worker_id: str) -> RemoteWorker:
        """Worker ``worker_id``, which ran attempts of a resumed run."""
        return self.manager.expect(worker_id)

    def _joined(self, worker: RemoteWorker) -> None:
        if self._post is None:
            raise RuntimeError(f"worker {worker.id} joined before the engine was attached")
        self._post(WorkerJoined(worker))

    def _left(self, worker: RemoteWorker, reason: str) -> None:
        if self._post is not None:
            self._post(WorkerLost(worker.id))
