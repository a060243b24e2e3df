"""The run store: every state change is written here before it is acted on.

One SQLite file (WAL, mode 0600) holds runs, stages, pilots,
tasks, attempts, their output, observed queue waits and learner state. Learner state is
keyed by name and shared by every run that uses the same file, so what one
workflow learns about the queue serves the next.

SQLite works in a thread of the store's own, one function per call: a flush of
many statements and its commit cost the event loop a single hand-off (one per
statement, as aiosqlite does it, was a third of the manager's CPU per task). A
virtual-time loop stands still while an executor works
(:meth:`backends.clock.VirtualTimeLoop.run_in_executor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Any, TypeVar

from backends import clock

T = TypeVar("T")

SCHEMA_VERSION = 2
APPLICATION_ID = 0x4C54494D
"""SQLite's ``application_id`` of a leadtime store ("LTIM"): how a store tells itself apart
from another program's database before writing anything to it."""
SQLITE_MAGIC = b"SQLite format 3\x00"

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
            "workflow_text",
            "run_dir",
            "cluster",
            "manager",
            "heartbeat",
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
            "fit",
        ),
    ),
    "tasks": (
        ("run_id", "task_id"),
        ("stage", "category", "state", "attempts", "crashes", "beside"),
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
            "result_t",
            "output_tail",
            "cause",
            "starved",
            "node",
        ),
    ),
    "outputs": (  # apart from attempts: what reads every attempt reads none of their output
        ("run_id", "task_id", "attempt"),
        ("stdout", "stderr", "node", "sandbox"),  # node: an earlier version's (now in attempts)
    ),
    "waits": (
        ("run_id", "pilot_id"),
        ("geometry", "predicted", "observed", "hit", "t"),
    ),
    "learners": (("name",), ("state", "updated")),
}

_JSON = {
    "beside",
    "options",
    "summary",
    "request",
    "allocation",
    "peak",
    "state",
    "manager",
    "stdout",
    "stderr",
}


def default_path() -> Path:
    """``$XDG_DATA_HOME/leadtime/leadtime.db`` (``~/.local/share`` by default)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "leadtime" / "leadtime.db"


class StoreError(Exception):
    """A path that cannot be a store: ``str(e)`` names the path and what is wrong with it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


class _Connection:
    """A SQLite connection living in a thread of its own: :meth:`call` runs a function of
    the connection there and awaits it."""

    def __init__(self, thread: ThreadPoolExecutor, db: sqlite3.Connection) -> None:
        self._thread = thread
        self._db = db

    @classmethod
    async def open(cls, target: str, uri: bool) -> _Connection:
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leadtime-store")
        loop = asyncio.get_running_loop()
        try:
            connect = partial(sqlite3.connect, target, uri=uri)
            db = await loop.run_in_executor(thread, connect)
        except BaseException:
            thread.shutdown(wait=False)
            raise
        return cls(thread, db)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, fn, self._db)

    async def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        values = tuple(params)
        return await self.call(lambda db: db.execute(sql, values).fetchall())

    async def close(self) -> None:
        try:
            await self.call(sqlite3.Connection.close)
        finally:
            self._thread.shutdown(wait=False)


class Store:
    """An open store. Use :meth:`open`; close with :meth:`close` or ``async with``."""

    def __init__(self, db: _Connection, path: Path | None) -> None:
        self._db = db
        self.path = path
        self._pending: dict[tuple[str, tuple[Any, ...]], dict[str, Any]] = {}
        """Changes not yet written: each row's fields (encoded), by table and key."""
        self._absent: set[str] = set()
        """Tables a store of an earlier version lacks, opened read-only: they have no rows."""

    @classmethod
    async def open(cls, path: str | Path | None = None, *, readonly: bool = False) -> Store:
        """Open the store at ``path`` (``":memory:"`` for scratch), creating it with mode 0600.

        Before anything is written, the path must be a leadtime store, an empty file, or
        nothing: a directory, a file of other data, another application's database or a file
        leadtime may not write is refused with :class:`StoreError`, and left as it was.
        ``readonly`` opens an existing store for reading only.
        """
        if path == ":memory:":
            store = cls(await _Connection.open(":memory:", uri=False), None)
            await store._setup()
            return store
        target = Path(path) if path is not None else default_path()
        created = _vet(target, readonly)
        uri = f"file:{target.absolute()}" + ("?mode=ro" if readonly else "")
        store = cls(await _Connection.open(uri, uri=True), target)
        try:
            if readonly:
                found = await store._db.query("SELECT name FROM sqlite_master WHERE type='table'")
                store._absent = set(TABLES) - {r[0] for r in found}
            else:
                await store._setup()
        except BaseException:
            await store.close()
            if created:
                target.unlink(missing_ok=True)
            raise
        return store

    async def _setup(self) -> None:
        await self._db.call(_setup)

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stage(self, table: str, key: Mapping[str, Any], **fields: Any) -> None:
        """Queue an upsert of one row; :meth:`flush` writes the queue in one transaction.

        Changes to one row merge (the later value of a field wins), so a row changed on
        every pass is written once per flush, and rows of one shape go in one statement.
        """
        in_order, as_json = _shape(table, tuple(key), tuple(fields))
        values = tuple(key.values()) if in_order else tuple(key[k] for k in TABLES[table][0])
        for name in as_json:
            if (value := fields[name]) is not None:
                fields[name] = _json_of(value)
        row = (table, values)
        queued = self._pending.get(row)
        if queued is None:
            self._pending[row] = fields  # a dict of this call's own
        else:
            queued.update(fields)

    async def flush(self) -> None:
        """Write every queued change in one transaction: the write-ahead step before acting."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        statements: dict[str, list[tuple[Any, ...]]] = {}
        for (table, key), fields in pending.items():
            sql = _upsert_sql(table, TABLES[table][0], tuple(fields))
            statements.setdefault(sql, []).append((*key, *fields.values()))

        def write(db: sqlite3.Connection) -> None:
            with db:  # one transaction: committed, or rolled back if a statement fails
                for sql, rows in statements.items():
                    db.executemany(sql, rows)

        # Shielded: a flush cancelled (Ctrl-C) while its write waits for the thread still
        # writes the rows it took from the queue; a write that fails puts them back.
        try:
            await asyncio.shield(self._db.call(write))
        except asyncio.CancelledError:
            raise
        except BaseException:
            for row, fields in self._pending.items():  # changed since: the later value wins
                pending.setdefault(row, {}).update(fields)
            self._pending = pending
            raise

    async def put(self, table: str, key: Mapping[str, Any], **fields: Any) -> None:
        """Write one row now (with anything already queued)."""
        self.stage(table, key, **fields)
        await self.flush()

    async def rows(
        self,
        table: str,
        where: Mapping[str, Any] | None = None,
        order: str | None = None,
        since: Mapping[str, float] | None = None,
    ) -> list[dict[str, Any]]:
        """Rows of ``table`` matching ``where`` (equality) and ``since`` (column >= value),
        decoded, ordered by the column ``order`` (``"rowid"``: as each row was first written)."""
        keys, cols = TABLES[table]
        where = where or {}
        since = since or {}
        if not {*where, *since} <= {*keys, *cols}:
            raise ValueError(f"bad columns for {table}: {sorted({*where, *since})}")
        sql = f"SELECT * FROM {table}"
        tests = [f"{k}=?" for k in where] + [f"{k}>=?" for k in since]
        if tests:
            sql += " WHERE " + " AND ".join(tests)
        if order:
            if order.removesuffix(" DESC") not in ("rowid", *keys, *cols):
                raise ValueError(f"bad order column for {table}: {order}")
            sql += f" ORDER BY {order}"
        if table in self._absent:
            return []
        params = (*where.values(), *since.values())

        def select(db: sqlite3.Connection) -> tuple[list[str], list[tuple[Any, ...]]]:
            cursor = db.execute(sql, params)
            return [d[0] for d in cursor.description], cursor.fetchall()

        names, found = await self._db.call(select)
        return [{n: _decode(n, v) for n, v in zip(names, row, strict=True)} for row in found]

    async def task_durations(self, workflow: str, backend: str) -> dict[str, float]:
        """Mean wall time of successful attempts per stage, over earlier runs of ``workflow``."""
        found = await self._db.query(
            "SELECT t.stage, AVG(a.end_t - a.start_t) FROM attempts a "
            "JOIN tasks t ON t.run_id = a.run_id AND t.task_id = a.task_id "
            "JOIN runs r ON r.run_id = a.run_id "
            "WHERE r.workflow = ? AND r.backend = ? AND a.outcome = 'success' "
            "GROUP BY t.stage",
            (workflow, backend),
        )
        return dict(found)

    async def task_runs(
        self, workflow: str, backend: str, latest: int
    ) -> dict[str, list[tuple[float, float | None]]]:
        """Run time and allocated cores of the ``latest`` successful attempts per stage, over
        earlier runs of ``workflow``: what an automatic allocation sizes its pilot by."""
        rows = await self._db.query(
            "SELECT t.stage, a.end_t - a.start_t, a.allocation "
            "FROM attempts a "
            "JOIN tasks t ON t.run_id = a.run_id AND t.task_id = a.task_id "
            "JOIN runs r ON r.run_id = a.run_id "
            "WHERE r.workflow = ? AND r.backend = ? AND a.outcome = 'success' "
            "ORDER BY r.created, a.end_t",
            (workflow, backend),
        )
        found: dict[str, list[tuple[float, float | None]]] = {}
        for stage, wall, allocation in rows:
            cores = (_decode("allocation", allocation) or {}).get("cores")
            found.setdefault(stage, []).append((float(wall), cores))
        return {stage: runs[-latest:] for stage, runs in found.items()}

    async def load_learner(self, name: str) -> dict[str, Any] | None:
        found = await self.rows("learners", {"name": name})
        return found[0]["state"] if found else None

    async def save_learner(self, name: str, state: Mapping[str, Any]) -> None:
        await self.put("learners", {"name": name}, state=dict(state), updated=clock.wall())

    async def update_learner(
        self, name: str, update: Callable[[dict[str, Any] | None], dict[str, Any]]
    ) -> dict[str, Any]:
        """Replace learner ``name``'s state by ``update(state)`` in one transaction, so that
        two runs sharing the store never lose each other's updates; the new state.

        ``update`` runs in the store's thread, inside the transaction, while the event loop
        goes on: it may read and change only what no other task changes meanwhile (the queue-
        wait learner's state, which only the engine's own task, awaiting this, changes)."""
        await self.flush()

        def transact(db: sqlite3.Connection) -> dict[str, Any]:
            db.execute("BEGIN IMMEDIATE")
            with db:
                row = db.execute("SELECT state FROM learners WHERE name = ?", (name,)).fetchone()
                state = update(None if row is None else _decode("state", row[0]))
                db.execute(
                    _upsert_sql("learners", ("name",), ("state", "updated")),
                    (name, _encode("state", state), clock.wall()),
                )
            return state

        return await self._db.call(transact)

    async def learners(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every learner state whose name starts with ``prefix``, by name."""
        found = await self._db.query(
            "SELECT name, state FROM learners WHERE substr(name, 1, ?) = ? ORDER BY name",
            (len(prefix), prefix),
        )
        return {name: _decode("state", state) for name, state in found}


def _setup(db: sqlite3.Connection) -> None:
    """Make ``db`` a store of this version: its identity, pragmas and tables, and the
    columns an earlier version's tables lack."""
    if db.execute("PRAGMA application_id").fetchone() != (APPLICATION_ID,):
        db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=5000")
    for table, (keys, cols) in TABLES.items():
        columns = ", ".join((*keys, *cols))
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {table} ({columns}, PRIMARY KEY ({', '.join(keys)}))"
        )
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column in cols:  # a store made by an earlier version lacks the newer columns
            if column not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    if db.execute("PRAGMA user_version").fetchone() != (SCHEMA_VERSION,):  # an open writes nothing
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    db.commit()


@cache
def _shape(
    table: str, key: tuple[str, ...], fields: tuple[str, ...]
) -> tuple[bool, tuple[str, ...]]:
    """Whether ``key`` names the table's key columns in their order, and which of ``fields``
    are stored as JSON; checks the columns, once per shape of row (not at the flush)."""
    _upsert_sql(table, key, fields)
    return key == TABLES[table][0], tuple(f for f in fields if f in _JSON)


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


def _vet(target: Path, readonly: bool) -> bool:
    """Refuse a path that cannot be a store, writing nothing; whether it was created (empty)."""
    if target.is_dir():
        raise StoreError(target, "is a directory, not a store file")
    if not target.exists():
        if readonly:
            raise StoreError(target, "no store there")
        for parent in target.parents:
            if parent.exists() and not parent.is_dir():
                raise StoreError(target, f"cannot be created: {parent} is not a directory")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        except OSError as e:
            raise StoreError(target, f"cannot be created: {e.strerror or e}") from None
        return True
    if not target.is_file():
        raise StoreError(target, "is not a regular file")
    try:
        with open(target, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise StoreError(target, f"cannot be read: {e.strerror or e}") from None
    writable = os.access(target, os.W_OK) and target.stat().st_mode & 0o222
    if not readonly and not writable:  # a file marked read-only is so even for root
        raise StoreError(target, "is read-only: leadtime cannot record runs there")
    if not head:
        return False  # an empty file: a new store
    if head != SQLITE_MAGIC:
        raise StoreError(target, "is not a SQLite database: not a leadtime store")
    _check_identity(target)
    return False


def _check_identity(target: Path) -> None:
    """The database at ``target`` is a leadtime store (this version's or an earlier one)."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{target.absolute()}?mode=ro", uri=True, timeout=1.0)
        ) as db:
            app = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            columns = {
                t: {row[1] for row in db.execute(f"PRAGMA table_info({t})")}
                for t in tables & set(TABLES)
            }
    except sqlite3.Error as e:
        raise StoreError(target, f"cannot be read as a SQLite database: {e}") from None
    legacy = tables <= set(TABLES) and all(  # a store of leadtime before application_id
        found <= {*TABLES[t][0], *TABLES[t][1]} for t, found in columns.items()
    )
    ours = app == APPLICATION_ID or (app == 0 and legacy)
    if not ours:
        shown = ", ".join(sorted(tables)[:6]) + (" ..." if len(tables) > 6 else "")
        raise StoreError(
            target, f"is another application's SQLite database (tables: {shown or 'none'})"
        )
    if version > SCHEMA_VERSION:
        raise StoreError(target, f"was written by a newer leadtime (store schema {version})")


def _json_encoder() -> Callable[[Any], str]:
    """Compact JSON text of a value; a value that is not JSON's own gives its ``as_dict()``.
    ``JSONEncoder.encode`` builds its C encoder anew on every call, half the cost of a field
    as small as an allocation; this one is built once."""
    python = json.JSONEncoder(separators=(",", ":"), default=_as_dict)
    make = json.encoder.c_make_encoder
    if make is None:  # an interpreter without the C accelerator
        return python.encode
    # (markers, default, encoder, indent, key and item separators, sort_keys, skipkeys, allow_nan)
    ascii_ = json.encoder.encode_basestring_ascii
    c = make(None, python.default, ascii_, None, ":", ",", False, False, True)
    return lambda value: "".join(c(value, 0))


def _as_dict(value: Any) -> dict[str, Any]:
    if callable(as_dict := getattr(value, "as_dict", None)):
        return as_dict()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_to_json = _json_encoder()


@lru_cache(maxsize=4096, typed=True)
def _json_once(value: Hashable) -> str:
    return _to_json(value)


def _json_of(value: Any) -> str:
    """JSON text of a value; one that repeats and can be a key (an attempt's allocation, a
    state) is encoded once: a float's text is the dearest part of a row to make."""
    if type(value) is dict or type(value) is list:
        return _to_json(value)
    try:
        return _json_once(value)
    except TypeError:  # unhashable, or not JSON: encoded to say which
        return _to_json(value)


def _encode(name: str, value: Any) -> Any:
    if name in _JSON and value is not None:
        return _json_of(value)
    return value


def _decode(name: str, value: Any) -> Any:
    return json.loads(value) if name in _JSON and value is not None else value
