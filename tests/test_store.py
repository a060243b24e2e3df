"""The store writes what was staged, as staged: changes to one row merge (the later value of a
field wins), rows of every table and shape land in one flush, nothing before it."""

import asyncio
import json
import math
import sqlite3
import time

import pytest

from backends import clock
from learners.resources import Resources
from orchestrator.store import Store


def test_a_flush_writes_each_row_as_its_changes_left_it():
    async def main():
        async with await Store.open(":memory:") as store:
            store.stage("stages", {"run_id": "r", "stage": "a"}, state="ready", tasks_total=3)
            store.stage("stages", {"stage": "b", "run_id": "r"}, state="ready")
            store.stage("stages", {"run_id": "r", "stage": "a"}, state="running", start_t=5.0)
            store.stage("runs", {"run_id": "r"}, status="running", summary={"tasks": [1, 2]})
            store.stage("stages", {"run_id": "r", "stage": "a"}, state="done")
            before = await store.rows("stages")
            await store.flush()
            return before, await store.rows("stages", order="stage"), await store.rows("runs")

    before, stages, runs = clock.run(main(), virtual=False)
    assert before == []  # nothing is written before the flush
    a, b = ((s["stage"], s["state"], s["tasks_total"], s["start_t"]) for s in stages)
    assert a == ("a", "done", 3, 5.0) and b == ("b", "ready", None, None)
    assert runs[0]["status"] == "running" and runs[0]["summary"] == {"tasks": [1, 2]}


def test_a_change_to_a_column_a_table_lacks_is_refused_when_staged():
    async def main():
        async with await Store.open(":memory:") as store:
            with pytest.raises(ValueError, match="bad columns for stages"):
                store.stage("stages", {"run_id": "r", "stage": "a"}, colour="blue")
            with pytest.raises(ValueError, match="bad columns for stages"):
                store.stage("stages", {"run_id": "r"}, state="ready")

    clock.run(main(), virtual=False)


def test_a_staged_value_is_the_one_at_staging_time():
    async def main():
        async with await Store.open(":memory:") as store:
            summary = {"tasks": 1}
            store.stage("runs", {"run_id": "r"}, summary=summary)
            summary["tasks"] = 2  # changed after staging, not staged again
            await store.flush()
            return await store.rows("runs")

    assert clock.run(main(), virtual=False)[0]["summary"] == {"tasks": 1}


def test_a_json_field_is_written_as_json_dumps_writes_it():
    """The store's encoder, built once, writes what ``json.dumps`` would, infinity included
    (an allocation's unbounded wall time)."""
    values = [
        {"cores": 1.0, "memory": 2e3, "disk": 0.5, "wall": math.inf},
        ["", 'tail \u00e9\n"quoted"', 0],
        {"nested": [1, None, True, {"x": -math.inf}]},
        "text",
    ]

    async def main():
        async with await Store.open(":memory:") as store:
            for i, value in enumerate(values):
                store.stage("runs", {"run_id": str(i)}, summary=value)
            await store.flush()
            return await store._db.query("SELECT summary FROM runs ORDER BY run_id")

    written = [text for (text,) in clock.run(main(), virtual=False)]
    assert written == [json.dumps(v, separators=(",", ":")) for v in values]


def test_a_value_given_whole_is_written_as_its_dict_and_equal_values_of_other_types_apart():
    """An allocation is staged as it is (its JSON made once per value, as most attempts share
    theirs) and read back as the dict it gives, its amounts the same text whatever numbers
    it was made of; a value equal to one already written but of another type (``True``
    after ``1``) is written as its own."""
    allocation = Resources(cores=2.0, memory=1e3, disk=0.0)
    made_of_ints = Resources(cores=3, memory=777, disk=0)  # first: before its float twin
    values = [allocation, allocation, 1, True, 1.0, made_of_ints, Resources(3.0, 777.0, 0.0)]

    async def main():
        async with await Store.open(":memory:") as store:
            for i, value in enumerate(values):
                store.stage("runs", {"run_id": str(i)}, summary=value)
            await store.flush()
            texts = await store._db.query("SELECT summary FROM runs ORDER BY run_id")
            return [text for (text,) in texts], await store.rows("runs", order="run_id")

    texts, rows = clock.run(main(), virtual=False)
    as_dict = json.dumps(allocation.as_dict(), separators=(",", ":"))
    floats = json.dumps(
        {"cores": 3.0, "memory": 777.0, "disk": 0.0, "wall": math.inf}, separators=(",", ":")
    )
    assert texts == [as_dict, as_dict, "1", "true", "1.0", floats, floats]
    assert rows[0]["summary"] == allocation.as_dict()
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        Store(None, None).stage("runs", {"run_id": "x"}, summary={1, 2})  # type: ignore[arg-type]


def test_a_flush_cancelled_while_its_write_waits_still_writes_it():
    """A manager interrupted (Ctrl-C) while a flush waits for the store's thread: the rows it
    took from the queue are written all the same, not dropped (an attempt's end with them)."""

    async def main():
        async with await Store.open(":memory:") as store:
            busy = asyncio.ensure_future(store._db.call(lambda db: time.sleep(0.3)))
            store.stage("stages", {"run_id": "r", "stage": "a"}, state="done")
            flush = asyncio.ensure_future(store.flush())
            await asyncio.sleep(0.05)  # the flush has taken the queue and waits for the thread
            flush.cancel()
            with pytest.raises(asyncio.CancelledError):
                await flush
            await busy
            store.stage("stages", {"run_id": "r", "stage": "b"}, state="ready")
            await store.flush()
            return await store.rows("stages", order="stage")

    stages = clock.run(main(), virtual=False)
    assert [(s["stage"], s["state"]) for s in stages] == [("a", "done"), ("b", "ready")]


def test_a_flush_that_fails_keeps_its_rows_for_the_next():
    async def main():
        async with await Store.open(":memory:") as store:
            store.stage("stages", {"run_id": "r", "stage": "a"}, state="done", tasks_total=2)

            def fail(db):
                raise sqlite3.OperationalError("database is locked")

            real = store._db.call
            store._db.call = lambda fn: real(fail)
            with pytest.raises(sqlite3.OperationalError):
                await store.flush()
            store._db.call = real
            store.stage("stages", {"run_id": "r", "stage": "a"}, state="running")
            await store.flush()
            return await store.rows("stages")

    (a,) = clock.run(main(), virtual=False)
    assert (a["state"], a["tasks_total"]) == ("running", 2)  # the later change wins
