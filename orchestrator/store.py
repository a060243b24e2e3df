"""The run store: every state change is written here before it is acted on.

One SQLite file (aiosqlite, WAL, mode 0600) holds runs, stages, pilots,
tasks, attempts, observed queue waits and learner state. Learner state is
keyed by name and shared by every run that uses the same file, so what one
workflow learns about the queue serves the next.

Every call runs inside :func:`orchestrator.clock.held`, so simulated time
stands still while SQLite works in its thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from functools import cache
from itertools import groupby
from pathlib import Path
from typing import Any

import aiosqlite

from orchestrator import clock

SCHEMA_VERSION = 1

# table -> (key columns, other columns)
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "runs": (
        ("run_id",),
        (
            "workflow",
            "source",
            "backend",
            "strategy",
            "sizer",
            "seed",
            "scale",
            "options",
            "status",
            "error",
            "created",
            "ended",
            "summary",
        ),
    ),
    "stages": (
        ("run_id", "stage"),
        ("state", "tasks_total", "tasks_done", "ready_t", "start_t", "end_t"),
    ),
    "pilots": (
        ("run_id", "pilot_id"),
        (
            "stage",
            "job_id",
            "state",
            "reason",
            "request",
            "predicted_wait",
            "submit_t",
            "eligible_t",
            "start_t",
            "end_t",
        ),
    ),
    "tasks": (
        ("run_id", "task_id"),
        ("stage", "category", "state", "attempts"),
    ),
    "attempts": (
        ("run_id", "task_id", "attempt"),
        (
            "worker",
            "pilot_id",
            "allocation",
            "outcome",
            "peak",
            "exit_code",
            "exhausted",
            "measured",
            "start_t",
            "end_t",
            "output_tail",
        ),
    ),
    "waits": (
        ("run_id", "pilot_id"),
        ("geometry", "predicted", "observed", "hit", "t"),
    ),
    "learners": (("name",), ("state", "updated")),
}

_JSON = {"options", "summary", "request", "allocation", "peak", "state"}


def default_path() -> Path:
    """``$XDG_DATA_HOME/leadtime/leadtime.db`` (``~/.local/share`` by default)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "leadtime" / "leadtime.db"


class Store:
    """An open store. Use :meth:`open`; close with :meth:`close` or ``async with``."""

    def __init__(self, db: aiosqlite.Connection, path: Path | None) -> None:
        self._db = db
        self.path = path
        self._pending: list[tuple[str, tuple[Any, ...]]] = []

    @classmethod
    async def open(cls, path: str | Path | None = None) -> Store:
        """Open the store at ``path``, creating it with mode 0600; ``":memory:"`` for scratch."""
        if path == ":memory:":
            target: Path | None = None
        else:
            target = Path(path) if path is not None else default_path()
            target.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(target, os.O_CREAT | os.O_RDWR, 0o600))
            os.chmod(target, 0o600)
        db = await clock.held(aiosqlite.connect(":memory:" if target is None else str(target)))
        store = cls(db, target)
        await store._setup()
        return store

    async def _setup(self) -> None:
        await self._exec("PRAGMA journal_mode=WAL")
        await self._exec("PRAGMA synchronous=NORMAL")
        await self._exec("PRAGMA busy_timeout=5000")
        for table, (keys, cols) in TABLES.items():
            columns = ", ".join((*keys, *cols))
            await self._exec(
                f"CREATE TABLE IF NOT EXISTS {table} ({columns}, PRIMARY KEY ({', '.join(keys)}))"
            )
        cursor = await self._exec("PRAGMA user_version")
        if (await clock.held(cursor.fetchone())) != (SCHEMA_VERSION,):  # an open writes nothing
            await self._exec(f"PRAGMA user_version={SCHEMA_VERSION}")
        await self._commit()

    async def close(self) -> None:
        await clock.held(self._db.close())

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _exec(self, sql: str, params: Iterable[Any] = ()) -> aiosqlite.Cursor:
        return await clock.held(self._db.execute(sql, tuple(params)))

    async def _commit(self) -> None:
        await clock.held(self._db.commit())

    def stage(self, table: str, key: Mapping[str, Any], **fields: Any) -> None:
        """Queue an upsert of one row; :meth:`flush` writes the queue in one transaction."""
        sql = _upsert_sql(table, tuple(key), tuple(fields))
        values = (*(key[k] for k in TABLES[table][0]), *(_encode(n, v) for n, v in fields.items()))
        self._pending.append((sql, values))

    async def flush(self) -> None:
        """Write every queued change in one transaction: the write-ahead step before acting."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        async with clock.hold():
            for sql, group in groupby(pending, key=lambda p: p[0]):
                await self._db.executemany(sql, [values for _, values in group])
            await self._db.commit()

    async def put(self, table: str, key: Mapping[str, Any], **fields: Any) -> None:
        """Write one row now (with anything already queued)."""
        self.stage(table, key, **fields)
        await self.flush()

    async def rows(
        self, table: str, where: Mapping[str, Any] | None = None, order: str | None = None
    ) -> list[dict[str, Any]]:
        """Rows of ``table`` matching ``where`` (equality), decoded."""
        keys, cols = TABLES[table]
        where = where or {}
        if not set(where) <= {*keys, *cols}:
            raise ValueError(f"bad columns for {table}: {sorted(where)}")
        sql = f"SELECT * FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(f"{k}=?" for k in where)
        if order:
            if order.removesuffix(" DESC") not in (*keys, *cols):
                raise ValueError(f"bad order column for {table}: {order}")
            sql += f" ORDER BY {order}"
        cursor = await self._exec(sql, where.values())
        names = [d[0] for d in cursor.description]
        found = await clock.held(cursor.fetchall())
        return [{n: _decode(n, v) for n, v in zip(names, row, strict=True)} for row in found]

    async def task_durations(self, workflow: str, backend: str) -> dict[str, float]:
        """Mean wall time of successful attempts per stage, over earlier runs of ``workflow``."""
        cursor = await self._exec(
            "SELECT t.stage, AVG(a.end_t - a.start_t) FROM attempts a "
            "JOIN tasks t ON t.run_id = a.run_id AND t.task_id = a.task_id "
            "JOIN runs r ON r.run_id = a.run_id "
            "WHERE r.workflow = ? AND r.backend = ? AND a.outcome = 'success' "
            "GROUP BY t.stage",
            (workflow, backend),
        )
        return dict(await clock.held(cursor.fetchall()))

    async def load_learner(self, name: str) -> dict[str, Any] | None:
        found = await self.rows("learners", {"name": name})
        return found[0]["state"] if found else None

    async def save_learner(self, name: str, state: Mapping[str, Any]) -> None:
        await self.put("learners", {"name": name}, state=dict(state), updated=clock.wall())


@cache
def _upsert_sql(table: str, key: tuple[str, ...], fields: tuple[str, ...]) -> str:
    """The upsert of ``fields`` into ``table`` (checked once per shape of row)."""
    keys, cols = TABLES[table]
    if set(key) != set(keys) or not set(fields) <= set(cols):
        raise ValueError(f"bad columns for {table}: {sorted(key)} {sorted(fields)}")
    names = (*keys, *fields)
    updates = ", ".join(f"{n}=excluded.{n}" for n in fields)
    conflict = f"DO UPDATE SET {updates}" if fields else "DO NOTHING"
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
        f"ON CONFLICT ({', '.join(keys)}) {conflict}"
    )


def _encode(name: str, value: Any) -> Any:
    if name in _JSON and value is not None:
        return json.dumps(value, separators=(",", ":"))
    return value


def _decode(name: str, value: Any) -> Any:
    return json.loads(value) if name in _JSON and value is not None else value
