"""A run's life in the store: who manages it, whether that manager still lives, and all the
store holds of a run a new manager takes over (``leadtime resume``).

A manager records its host, process and start, and refreshes a heartbeat while it runs. A run
still marked running is *live* when its manager is: on this host, when that process still
exists (and started when it said); on another host, when its heartbeat is recent. Otherwise
its manager is gone: the run can be resumed, or cancelled.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psutil

from backends import clock
from orchestrator.store import Store

HEARTBEAT_S = 10.0
"""How often a real run's manager says it is alive."""
SILENT_S = 3 * HEARTBEAT_S
"""A manager on another host silent this long is gone."""


class RunState(StrEnum):
    """What ``status`` says of a run."""

    RUNNING = "running"
    MANAGER_GONE = "manager gone"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"


class OnWorker(StrEnum):
    """An attempt's outcome in the store while it is on its worker (then how it ended)."""

    WAITING = "waiting"
    """Sent ahead to a busy worker, which starts it once it has room."""
    RUNNING = "running"


ON_WORKER = tuple(OnWorker)

STOPPED = "stopped"
"""An attempt's outcome in the store when the run's end stopped it (the run failed or was
interrupted): its worker called it lost, but nothing went wrong with its worker. ``resume``
runs it again, as it does a lost one; ``status`` counts it apart."""


@dataclass(frozen=True, slots=True)
class Manager:
    """The process managing a run."""

    host: str
    pid: int
    started: float
    """Its start, Unix time (with the pid, its identity)."""

    @classmethod
    def this(cls) -> Manager:
        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time())

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started}

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> Manager | None:
        if not data:
            return None
        return cls(str(data["host"]), int(data["pid"]), float(data["started"]))

    def alive(self, heartbeat: float | None) -> bool:
        """Whether this manager still runs (see the module's rule)."""
        if self.host == socket.gethostname():
            try:
                process = psutil.Process(self.pid)
                same = abs(process.create_time() - self.started) < 1.0
                return same and process.status() != psutil.STATUS_ZOMBIE  # ended, not reaped
            except psutil.Error:
                return False
        return heartbeat is not None and clock.wall() - heartbeat < SILENT_S


def state(run: dict[str, Any]) -> RunState:
    """What a run's row says of it, its manager's liveness included."""
    if run["status"] != "running":
        return RunState(run["status"])
    manager = Manager.of(run.get("manager"))
    if manager is not None and not manager.alive(run.get("heartbeat")):
        return RunState.MANAGER_GONE
    return RunState.RUNNING


def last_seen(run: dict[str, Any]) -> float | None:
    """When a run's manager was last heard of (Unix time)."""
    return run.get("heartbeat") or run.get("created")


@dataclass(frozen=True)
class SavedRun:
    """Everything the store holds of one run, for a manager that takes it over."""

    run: dict[str, Any]
    stages: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    pilots: list[dict[str, Any]]
    waits: list[dict[str, Any]]
    again: frozenset[str] = frozenset()
    """Stages whose tasks changed in the workflow since the run recorded it: they run again
    from their beginning (see :func:`orchestrator.session.resume`)."""

    @classmethod
    async def load(cls, store: Store, run_id: str) -> SavedRun | None:
        where = {"run_id": run_id}
        runs = await store.rows("runs", where)
        if not runs:
            return None
        return cls(
            runs[0],
            await store.rows("stages", where),
            await store.rows("tasks", where),
            await store.rows("attempts", where, order="rowid"),  # as sent: a worker's order
            await store.rows("pilots", where, order="submit_t"),
            await store.rows("waits", where),
        )
