"""--db must be a leadtime store, an empty file or nothing: anything else is refused with one
line naming the path and the problem, exit 2, within a second, and is left exactly as it was."""

import asyncio
import os
import re
import sqlite3
import stat
import time

import pytest
from typer.testing import CliRunner

from backends import clock, sim
from backends.local import LocalOptions
from backends.sim import MockOptions
from learners.queue_wait import GEOMETRY_FIELDS
from orchestrator.cli import app
from orchestrator.session import RunConfig, execute, run_simulated
from orchestrator.store import Store
from orchestrator.waits import QueueWaits, store_name
from workflows.spec import example, load, loads

BLAST = str(example("blast"))


def directory(tmp_path):
    path = tmp_path / "a-directory"
    path.mkdir()
    return path


def read_only(tmp_path):
    path = tmp_path / "read-only.db"
    CliRunner().invoke(app, ["run", BLAST, "--quiet", "--db", str(path)])  # a real store
    path.chmod(0o400)
    return path


def under_a_file(tmp_path):
    (tmp_path / "plain").write_text("not a directory\n")
    return tmp_path / "plain" / "store.db"


def random_bytes(tmp_path):
    path = tmp_path / "noise.db"
    path.write_bytes(os.urandom(4096))
    return path


def text(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n" * 100)
    path.chmod(0o644)
    return path


def another_application(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE contacts (name TEXT, phone TEXT)")
        db.execute("INSERT INTO contacts VALUES ('Ada', '555')")
    path.chmod(0o644)
    return path


CASES = {
    "a directory": (directory, "is a directory, not a store file"),
    "a read-only file": (read_only, "is read-only"),
    "a path under a file": (under_a_file, "is not a directory"),
    "random bytes": (random_bytes, "is not a SQLite database"),
    "a text file": (text, "is not a SQLite database"),
    "another application's database": (another_application, "another application's SQLite"),
}
COMMANDS = {
    "run": ["run", BLAST, "--quiet"],
    "status": ["status"],
    "status RUN": ["status", "r1"],
    "learner show": ["learner", "show"],
    "resume": ["resume", "r1"],
    "cancel": ["cancel", "r1"],
    "report": ["report", "r1"],
}


def snapshot(path):
    """Bytes and mode of ``path`` (and of what is beside it), to compare before and after."""
    if path.is_dir():
        return sorted(os.listdir(path)), stat.S_IMODE(path.stat().st_mode)
    if not path.exists():
        return None
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)


def listing(directory):
    return sorted(os.listdir(directory)) if directory.is_dir() else None


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_path_that_is_no_store_is_refused_and_left_as_it_was(tmp_path, case, command):
    make, problem = CASES[case]
    path = make(tmp_path)
    if command != "run" and case == "a read-only file":
        pytest.skip("reading a read-only store is fine")
    before, beside = snapshot(path), listing(path.parent)
    started = time.monotonic()
    done = CliRunner().invoke(app, [*COMMANDS[command], "--db", str(path)])
    assert time.monotonic() - started < 1.0
    assert done.exit_code == 2, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), done.output
    if command.startswith("run") or case != "a path under a file":
        assert problem in lines[0] or "no store there" in lines[0]
    assert "Traceback" not in done.output
    assert snapshot(path) == before
    assert listing(path.parent) == beside  # no -wal, -shm or journal left beside it


def test_an_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    done = CliRunner().invoke(app, ["run", BLAST, "--quiet", "--db", str(path)])
    assert done.exit_code == 0, done.output
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA application_id").fetchone()[0] == 0x4C54494D


def test_a_new_store_is_private_and_an_existing_ones_mode_is_kept(tmp_path):
    path = tmp_path / "new.db"
    CliRunner().invoke(app, ["run", BLAST, "--quiet", "--db", str(path)])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o640)  # the user shares it with a group: leadtime does not undo that
    CliRunner().invoke(app, ["run", BLAST, "--quiet", "--db", str(path)])
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


# --- learners shared by runs -----------------------------------------------------------------


def test_runs_sharing_a_store_at_once_lose_no_learner_update(tmp_path):
    """Two runs, each with its own connection to one store file, interleaved: every wait
    either observed reaches the learner (each saves by a read-modify-write transaction)."""
    path = tmp_path / "shared.db"
    config = RunConfig(strategy="asa", backend=MockOptions(load=0.9))
    workflow = load(example("statistics"))

    async def main():
        stores = [await Store.open(path), await Store.open(path)]
        try:
            await asyncio.gather(*(execute(workflow, config, s) for s in stores))
            waits = await stores[0].rows("waits")
            cluster = await sim.open(config.backend).cluster_name()
            learner = (await QueueWaits.load(stores[0], cluster)).learner
        finally:
            for s in stores:
                await s.close()
        return waits, learner

    waits, learner = clock.run(main(), virtual=True)
    observed = sum(learner.stats(g).observations for g in learner.geometries())
    assert len({w["run_id"] for w in waits}) == 2
    assert observed == len(waits) >= 8


def test_each_cluster_learns_its_own_waits_and_a_local_run_none(tmp_path):
    """Waits seen on one simulated cluster do not steer a run on another; a local run, where
    nothing queues, learns none."""
    db = tmp_path / "store.db"
    workflow = loads(
        'name = "tiny"\n[[stage]]\nname = "a"\nallocation = { cores = 1, time = "5m" }\n'
        'tasks = { command = "true", count = 1, cores = 1, memory = "20M", disk = "1M" }\n'
    )
    for busy in (0.9, 0.7):
        run_simulated(workflow, RunConfig(strategy="asa", backend=MockOptions(load=busy)), db)
    local = RunConfig(strategy="asa", backend=LocalOptions(), workdir=tmp_path)

    async def main():
        async with await Store.open(db) as store:
            await execute(workflow, local, store)
            names = list(await store.learners("queue_wait/"))
            runs = [(r["backend"], r["cluster"]) for r in await store.rows("runs")]
            simulated = [c for b, c in runs if b == "mock"]
            learners = [(await QueueWaits.load(store, c)).learner for c in simulated]
            return names, runs, simulated, learners

    names, runs, simulated, learners = clock.run(main(), virtual=False)
    assert len(set(simulated)) == 2 and all(c.startswith("simulated:") for c in simulated)
    assert [b for b, c in runs if c.startswith("local:")] == ["local"]
    assert sorted(names) == sorted(store_name(c, GEOMETRY_FIELDS) for c in simulated)
    for learner in learners:  # each its own run's one pilot wait
        assert sum(learner.stats(g).observations for g in learner.geometries()) == 1
    shown = CliRunner().invoke(app, ["learner", "show", "--db", str(db)])
    assert all(c in shown.output for c in simulated) and "local:" not in shown.output
    told = r"^1 wait observed, \d+ rounds?, hit rate \S+ over the last \d+ predictions?, last wait "
    assert len(re.findall(told, shown.output, re.M)) == 2  # one line each, under its table
