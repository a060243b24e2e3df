"""Whole runs on the real Slurm of ``scripts/slurm-local up``: pilots are batch jobs whose
workers connect back to the test's manager.

Every run gets a fresh run id, so its jobs are named ``lt-<run id>-...``; the background jobs
a test submits carry the same prefix, and whatever is left of it is cancelled at the end, pass
or fail. The node declares 16 CPUs: a background job of 16 CPUs makes pilots queue.
"""

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from crash import Crash, slow_sbatch
from missing import missing
from programs import HOG, hog_value
from typer.testing import CliRunner

from backends import clock
from backends.slurm import SlurmOptions
from orchestrator import runstate, session
from orchestrator.cli import app
from orchestrator.manager import Manager
from orchestrator.planner import Phase
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from orchestrator.waits import QueueWaits, geometry
from workflows.spec import Workflow, example, load, loads

pytestmark = pytest.mark.slurm

NODE_CPUS = 16
HOST = os.uname().nodename.split(".")[0]
"""The local Slurm's first node; its second is ``HOST-2`` (partition ``multi``)."""
LEADTIME = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
FAST_SAMPLES = ("--sample-interval", "0.25", "--first-sample", "0.05")


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


class Cluster:
    """One test's view of the cluster: its run id, its background jobs, its cleanup."""

    def __init__(self) -> None:
        self.run_id = f"t{uuid.uuid4().hex[:10]}"
        self.prefix = f"lt-{self.run_id}"

    def background(self, seconds: int, cpus: int = NODE_CPUS) -> str:
        """A plain ``sbatch --wrap`` job holding ``cpus`` CPUs for ``seconds``."""
        out = sh(
            "sbatch", "--parsable", f"--job-name={self.prefix}-load", "--output=/dev/null",
            f"--ntasks={cpus}", "--mem-per-cpu=100", f"--wrap=sleep {seconds}",
        )  # fmt: skip
        return out.strip()

    def jobs(self, states: str = "all") -> list[dict[str, str]]:
        """This test's jobs slurmctld remembers: id, name, state, reason."""
        lines = sh("squeue", "--noheader", f"--states={states}", "--format=%i|%j|%T|%r")
        jobs = [
            dict(zip(("id", "name", "state", "reason"), line.split("|"), strict=True))
            for line in lines.splitlines()
        ]
        return [j for j in jobs if j["name"].startswith(self.prefix)]

    def queued(self) -> list[dict[str, str]]:
        """This test's jobs still pending, running or completing."""
        return self.jobs("PENDING,RUNNING,COMPLETING")

    def pilots(self) -> list[dict[str, str]]:
        return [j for j in self.jobs() if not j["name"].endswith("-load")]

    def clean(self) -> None:
        ids = [j["id"] for j in self.queued()]
        if ids:
            subprocess.run(["scancel", *ids], check=False, timeout=60)


@pytest.fixture
def cluster():
    cluster = Cluster()
    yield cluster
    cluster.clean()


def hogs(root: Path, gen: str, square: str) -> Workflow:
    """gen (4 tasks) -> square (6 tasks, reading gen) -> sum (1 task): real programs holding
    memory for a second or so."""
    (root / "hog.py").write_text(HOG)
    command = f"{sys.executable} {root / 'hog.py'} {{stage}} {{index}} {{item}} {root}"
    tasks = f'command = "{command}", cores = 1, disk = "20M"'
    return loads(
        textwrap.dedent(
            f"""
            name = "hogs"
            [[stage]]
            name = "gen"
            allocation = {{ cores = 2, memory = "2G", time = "5m" }}
            tasks = {{ {tasks}, items = {json.dumps([gen] * 4)} }}
            [[stage]]
            name = "square"
            after = ["gen"]
            allocation = {{ cores = 2, memory = "2G", time = "5m" }}
            tasks = {{ {tasks}, items = {json.dumps([square] * 6)} }}
            [[stage]]
            name = "sum"
            after = ["square"]
            allocation = {{ cores = 1, memory = "1G", time = "5m" }}
            tasks = {{ {tasks}, items = ["30:0.5"] }}
            """
        )
    )


def slurm_config(tmp_path: Path, strategy: str) -> RunConfig:
    options = SlurmOptions(
        bind="127.0.0.1",
        worker_args=FAST_SAMPLES,
        heartbeat_s=0.5,
        poll_interval_s=0.5,
    )
    return RunConfig(strategy=strategy, backend=options, workdir=tmp_path)


async def run(workflow, config, store, cluster, observer=None):
    summary = await execute(workflow, config, store, run_id=cluster.run_id, observer=observer)
    rows = {
        table: await store.rows(table, {"run_id": summary.run_id})
        for table in ("runs", "pilots", "tasks", "attempts", "waits")
    }
    return summary, rows


def run_on_slurm(workflow, tmp_path, cluster, strategy="per-stage", observer=None):
    """A run of ``workflow`` on the local Slurm (an in-memory store): its summary and rows."""

    async def main():
        async with await Store.open(":memory:") as store:
            config = slurm_config(tmp_path, strategy)
            return await run(workflow, config, store, cluster, observer)

    return clock.run(main(), virtual=False)


def check_outputs(root: Path) -> None:
    values = {
        stage: {p.name: hog_value(p.read_text()) for p in (root / stage).iterdir()}
        for stage in ("gen", "square", "sum")
    }
    assert values["gen"] == {str(i): i + 1 for i in range(4)}
    assert values["square"] == {str(i): (i % 4 + 1) ** 2 for i in range(6)}
    assert values["sum"] == {"0": sum(values["square"].values())}


@pytest.mark.parametrize("strategy", ["per-stage", "asa"])
def test_three_stages_behind_background_load(tmp_path, cluster, strategy):
    """Pilots queue behind a full node; ASA chains them with dependencies; the learner
    learns the waits; tasks get sized allocations; nothing of the run is left queued."""
    workflow = hogs(tmp_path, gen="60:1.5", square="80:1")
    seen: dict[str, str] = {}
    time_left: dict[str, float] = {}
    capacity: dict[str, tuple[float, float]] = {}

    def observer(engine):
        """What each worker said of itself when it joined, and, while gen runs, what squeue
        says of the pilot of the stage after it."""
        for worker in engine.source.manager.workers.values():
            time_left.setdefault(worker.id, worker.end_time - clock.now())
            capacity[worker.pilot_id] = (worker.capacity.cores, worker.capacity.memory)
        if seen or engine.state.stages["gen"].phase is not Phase.RUNNING:
            return
        square = [p for p in engine.state.pilots.values() if "square" in p.stages and p.job_id]
        if square:
            state = sh("squeue", "--noheader", "-j", square[0].job_id, "--format=%T %r")
            seen["square"] = state.strip()

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            summary, rows = await run(
                workflow, slurm_config(tmp_path, strategy), store, cluster, observer
            )
            # The learner is kept under the cluster's name, as slurmctld gives it.
            assert [r["cluster"] for r in rows["runs"]] == ["slurm:leadtime"]
            learner = (await QueueWaits.load(store, "slurm:leadtime")).learner
            return summary, rows, learner

    cluster.background(seconds=6)
    summary, rows, learner = clock.run(main(), virtual=False)

    assert summary.status == "done", summary.error
    check_outputs(tmp_path)
    assert cluster.queued() == []
    pilots = {p["pilot_id"]: p for p in rows["pilots"]}
    assert [p.state for p in summary.pilots] == ["COMPLETED"] * 3
    assert {j["name"] for j in cluster.pilots()} == {p["request"]["name"] for p in pilots.values()}
    if strategy == "asa":
        assert seen["square"] == "PENDING Dependency"
        assert pilots["square-1"]["request"]["dependency"] == f"afterok:{pilots['gen-0']['job_id']}"
    else:
        assert "square" not in seen  # submitted only once gen is done
        assert all(p["request"]["dependency"] is None for p in pilots.values())

    # Every worker knew its share of the node and when its pilot ends (5 minutes after it
    # started) from Slurm's environment.
    assert len(time_left) == 3 and all(280 < t <= 300 for t in time_left.values()), time_left
    sizes = {
        p["job_id"]: (p["request"]["cores"], p["request"]["memory_mb"]) for p in rows["pilots"]
    }
    assert capacity == sizes

    # The first pilot queued behind the background job; every wait was learned.
    waits = {w["pilot_id"]: w["observed"] for w in rows["waits"]}
    assert set(waits) == set(pilots)
    assert waits["gen-0"] >= 3
    for stage in workflow.stages:
        stats = learner.stats(geometry(stage.allocation))
        assert stats.observations >= 1 and stats.last_wait is not None

    # Tasks ran with sized allocations: a stage's first tasks from their share of its pilot
    # (all side by side, never one whole worker each), within it always.
    attempts = sorted(rows["attempts"], key=lambda a: a["start_t"])
    assert len([a for a in attempts if a["outcome"] == "success"]) == len(rows["tasks"]) == 11
    for stage in workflow.stages:
        worker = stage.allocation.memory_mb
        mine = [a for a in attempts if a["task_id"].startswith(f"{stage.name}.")]
        assert all(a["allocation"]["cores"] == 1 for a in mine)
        assert all(a["peak"]["memory"] <= a["allocation"]["memory"] for a in mine
                   if a["outcome"] == "success")  # fmt: skip
        assert all(a["allocation"]["memory"] <= worker for a in mine)
        if len(stage.expand()) > 1:
            assert all(a["allocation"]["memory"] < worker for a in mine if a["attempt"] == 1)


def test_the_waits_a_short_run_saw_after_its_last_plan_are_learned(tmp_path, cluster):
    """A run shorter than the manager's poll of squeue sees its pilots' starts only in their
    final states, after its last plan: their waits are saved with the run's end, for the next
    run to plan by, not lost with it."""
    stage = """
        [[stage]]
        name = "s{i}"
        allocation = {{ cores = 2, time = "5m" }}
        tasks = {{ command = "true", count = 2, cores = 1, memory = "50M", disk = "1M" }}
        """
    workflow = loads(
        'name = "short"\n' + textwrap.dedent("".join(stage.format(i=i) for i in range(3)))
    )

    config = slurm_config(tmp_path, "elastic")  # squeue asked every 5 s: after the tasks end
    config = replace(config, backend=replace(config.backend, poll_interval_s=5.0))

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            summary, rows = await run(workflow, config, store, cluster)
            learner = (await QueueWaits.load(store, "slurm:leadtime")).learner
            return summary, rows, learner

    summary, rows, learner = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    assert rows["waits"]
    learned = sum(learner.stats(g).observations for g in learner.geometries())
    assert learned == len(rows["waits"])
    assert cluster.queued() == []


def gen_square(root: Path, gens: int, item: str, squares: int = 0) -> Workflow:
    """Stage gen of ``gens`` tasks holding memory as ``item`` says, then (with ``squares``)
    stage square of that many tasks reading gen's outputs."""
    (root / "hog.py").write_text(HOG)
    command = f"{sys.executable} {root / 'hog.py'} {{stage}} {{index}} {item} {root}"
    text = """
        name = "gen-square"
        [[stage]]
        name = "gen"
        allocation = { cores = 2, memory = "2G", time = "5m" }
        [stage.tasks]
        command = "COMMAND"
        count = GENS
        cores = 1
        memory = "200M"
        disk = "20M"
        """
    if squares:
        text += """
        [[stage]]
        name = "square"
        after = ["gen"]
        allocation = { cores = 1, memory = "1G", time = "5m" }
        tasks = { command = "COMMAND", count = SQUARES, cores = 1, memory = "200M", disk = "20M" }
        """
    text = text.replace("COMMAND", command).replace("GENS", str(gens))
    return loads(textwrap.dedent(text.replace("SQUARES", str(squares))))


def test_a_pilot_cancelled_mid_stage_is_replaced_and_its_tasks_complete(tmp_path, cluster):
    workflow = gen_square(tmp_path, gens=6, item="30:1.5")
    cancelled: list[str] = []

    def observer(engine):
        running = [p for p in engine.state.pilots.values() if engine.state.pool.busy(p.pilot_id)]
        if not cancelled and running:
            cancelled.append(running[0].job_id)
            sh("scancel", running[0].job_id)

    summary, rows = run_on_slurm(workflow, tmp_path, cluster, observer=observer)

    assert summary.status == "done", summary.error
    assert [p.state for p in summary.pilots] == ["CANCELLED", "COMPLETED"]
    pilots = {p["job_id"]: p["pilot_id"] for p in rows["pilots"]}
    assert cancelled[0] in pilots and len(pilots) == 2
    replacement = next(p for j, p in pilots.items() if j != cancelled[0])
    assert {t["state"] for t in rows["tasks"]} == {"done"} and len(rows["tasks"]) == 6
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == [str(i) for i in range(6)]
    for task in rows["tasks"]:
        tries = [a for a in rows["attempts"] if a["task_id"] == task["task_id"]]
        last = max(tries, key=lambda a: a["attempt"])
        assert last["outcome"] == "success"
        for earlier in tries[:-1]:  # cut short by the cancel: not the task's fault
            assert earlier["outcome"] == "lost" and last["pilot_id"] == replacement
    assert any(a["outcome"] == "lost" for a in rows["attempts"])
    assert cluster.queued() == []


def leadtime_run(
    tmp_path: Path, workflow: str, *options: str, path: str | None = None
) -> subprocess.Popen:
    (tmp_path / "wf.toml").write_text(textwrap.dedent(workflow))
    command = [*LEADTIME, "run", str(tmp_path / "wf.toml"), "--backend", "slurm"]
    command += ["--bind", "127.0.0.1", "--workdir", str(tmp_path / "work")]
    command += ["--db", str(tmp_path / "db"), "--quiet", *options]
    env = {**os.environ, "COLUMNS": "300"}  # rich wraps error messages to the terminal's width
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def run_jobs(tmp_path: Path) -> Cluster:
    """The jobs of the one run started in ``tmp_path`` by the command line (its id as the lock
    of its workflow's working directory has it: a run that never began leaves no directory)."""
    cluster = Cluster()
    (lock,) = (tmp_path / "work" / ".leadtime").glob("*.lock")
    run_id = json.loads(lock.read_text())["run_id"]
    cluster.run_id, cluster.prefix = run_id, f"lt-{run_id}"
    return cluster


def test_invalid_partition_stops_the_run_before_anything_is_queued(tmp_path):
    run = leadtime_run(
        tmp_path,
        """
        name = "bad"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = "5m" }
        tasks = { command = "true", count = 1 }
        [[stage]]
        name = "b"
        after = ["a"]
        allocation = { cores = 1, time = "5m", partition = "no-such-partition" }
        tasks = { command = "true", count = 1 }
        """,
    )
    _, err = run.communicate(timeout=60)
    jobs = run_jobs(tmp_path)
    try:
        assert run.returncode == 2, err
        assert "the batch system refused a pilot" in err
        assert "invalid partition" in err.lower() and "(--partition)" in err
        assert "Traceback" not in err
        assert jobs.jobs() == []  # not even the valid first stage's pilot
        assert not (tmp_path / "work" / ".leadtime" / jobs.run_id).exists()  # nor its secret
    finally:
        jobs.clean()


def test_an_unknown_sbatch_option_is_named_before_anything_is_queued(tmp_path):
    run = leadtime_run(
        tmp_path,
        """
        name = "tiny"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = "5m" }
        tasks = { command = "true", count = 1 }
        """,
        "--sbatch-option=--frobnicate=3",
    )
    _, err = run.communicate(timeout=60)
    jobs = run_jobs(tmp_path)
    try:
        assert run.returncode == 2, err
        assert "unrecognized option '--frobnicate=3'" in err and "(--frobnicate)" in err
        assert jobs.jobs() == []
    finally:
        jobs.clean()


def test_ctrl_c_while_the_batch_system_checks_the_pilots_leaves_nothing(tmp_path):
    """Ctrl-C while ``sbatch --test-only`` checks the run's pilots, before anything was
    submitted or recorded: the run says so (there is nothing to resume), and leaves no job,
    no store it made and no run directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    checking = tmp_path / "checking"
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\ncase " $* " in *" --test-only "*) touch {checking}; sleep 2;; esac\n'
        f'exec {shutil.which("sbatch")} "$@"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    run = leadtime_run(tmp_path, TWO_STAGES.replace("SLEEP", "true"), path=str(bin_dir))
    try:
        for _ in range(600):
            if checking.exists() or run.poll() is not None:
                break
            time.sleep(0.05)
        assert checking.exists()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    jobs = run_jobs(tmp_path)
    try:
        assert run.returncode == 130, err
        assert (
            f"error: run {jobs.run_id} interrupted before it started: nothing was submitted" in err
        )
        assert "resume" not in err and "Traceback" not in err, err
        assert jobs.jobs() == []
        assert not (tmp_path / "db").exists()
        assert not (tmp_path / "work" / ".leadtime" / jobs.run_id).exists()
    finally:
        jobs.clean()


TWO_STAGES = """
    name = "long"
    [[stage]]
    name = "a"
    allocation = { cores = 1, time = "5m" }
    tasks = { command = "SLEEP", count = 1, cores = 1, memory = "50M", disk = "1M" }
    [[stage]]
    name = "b"
    after = ["a"]
    allocation = { cores = 1, time = "5m" }
    tasks = { command = "true", count = 1, cores = 1, memory = "50M", disk = "1M" }
    """


def slow_scancel(directory: Path) -> str:
    """A directory whose scancel takes two seconds: a release long enough to interrupt."""
    directory.mkdir()
    script = directory / "scancel"
    script.write_text(f'#!/bin/sh\nsleep 2\nexec {shutil.which("scancel")} "$@"\n')
    script.chmod(0o755)
    return str(directory)


@contextlib.contextmanager
def two_stage_run(tmp_path: Path, *, slow_release: bool = False) -> Iterator[tuple]:
    """A run (``asa``) of ``TWO_STAGES`` once its first task runs and the second stage's pilot
    waits: the run, its jobs, its task's command; nothing of it is left after."""
    sleep = f"sleep 120.{uuid.uuid4().int % 10**6:06d}"  # this run's, and no other's
    path = slow_scancel(tmp_path / "bin") if slow_release else None
    run = leadtime_run(tmp_path, TWO_STAGES.replace("SLEEP", sleep), "--strategy", "asa", path=path)
    jobs = None
    try:
        for _ in range(300):  # the task starts within seconds
            runs = tmp_path / "work" / ".leadtime"
            if (
                jobs is None
                and runs.exists()
                and any(p.stat().st_size for p in runs.glob("*.lock"))
            ):
                jobs = run_jobs(tmp_path)
            if jobs and subprocess.run(["pgrep", "-fx", sleep], check=False).returncode == 0:
                break
            time.sleep(0.1)
        assert jobs is not None
        states = {j["name"].rsplit("-", 2)[1]: j["state"] for j in jobs.queued()}
        assert states == {"a": "RUNNING", "b": "PENDING"}
        yield run, jobs, sleep
    finally:
        run.kill()
        if jobs is not None:
            jobs.clean()


def test_sigterm_ends_a_slurm_run_with_no_pilot_left(tmp_path):
    with two_stage_run(tmp_path) as (run, jobs, sleep):
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err
        assert jobs.queued() == []
        final = {j["name"].rsplit("-", 2)[1]: j["state"] for j in jobs.jobs()}
        assert final == {"a": "COMPLETED", "b": "CANCELLED"}
        assert subprocess.run(["pgrep", "-fx", sleep], check=False).returncode == 1
        with sqlite3.connect(tmp_path / "db") as con:  # what a resume would wait for: none
            (outcome,) = con.execute("SELECT outcome FROM attempts").fetchone()
        assert outcome == "stopped"


def test_a_second_ctrl_c_leaves_at_once_naming_the_jobs_left(tmp_path):
    """Ctrl-C twice: the release the first began is cut short, and the run says which jobs
    may be left (not that its pilots were released); ``leadtime cancel`` then ends them."""
    with two_stage_run(tmp_path, slow_release=True) as (run, jobs, sleep):
        left = {j["id"] for j in jobs.queued()}
        run.send_signal(signal.SIGINT)
        time.sleep(0.5)  # releasing: its first scancel takes 2 s
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 130, err
        assert "its pilots were released" not in err and "Traceback" not in err, err
        assert "may still be queued or running" in err, err
        named = err.split(" may still")[0].split(": jobs ")[1].split(", ")
        assert set(named) == left and {j["id"] for j in jobs.queued()} <= left
        cancel = subprocess.run(
            [*LEADTIME, "cancel", jobs.run_id, "--db", str(tmp_path / "db")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cancel.returncode == 0, cancel.stderr
        for _ in range(300):  # cancelled, then completing for a moment
            if not jobs.queued():
                break
            time.sleep(0.1)
        assert jobs.queued() == []
        assert subprocess.run(["pgrep", "-fx", sleep], check=False).returncode == 1


def test_a_second_sigterm_does_not_cut_the_release_short(tmp_path):
    with two_stage_run(tmp_path, slow_release=True) as (run, jobs, sleep):
        run.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 143 and "its pilots were released" in err, err
        assert jobs.queued() == []
        assert subprocess.run(["pgrep", "-fx", sleep], check=False).returncode == 1


@pytest.mark.slow
def test_a_controller_outage_mid_run_is_waited_out_without_duplicate_pilots(
    tmp_path, cluster, slurm_local, caplog
):
    """slurmctld stops for 30 s while the first stage runs: its tasks go on (workers talk to
    the manager, not to Slurm); the next stage's pilot, due during the outage, is submitted
    once when the controller is back."""
    workflow = gen_square(tmp_path, gens=4, item="30:2", squares=1)
    outage: list[threading.Thread] = []

    def stop_for_30_s() -> None:
        sh(slurm_local, "stop-ctld")
        try:
            time.sleep(30)
        finally:
            sh(slurm_local, "start-ctld")

    def observer(engine):
        if not outage and engine.state.stages["gen"].phase is Phase.RUNNING:
            outage.append(threading.Thread(target=stop_for_30_s))
            outage[0].start()

    caplog.set_level(logging.WARNING, logger="backends.slurm.backend")
    try:
        summary, rows = run_on_slurm(workflow, tmp_path, cluster, observer=observer)
    finally:
        for thread in outage:
            thread.join()

    assert summary.status == "done", summary.error
    assert "Unable to contact slurm controller" in caplog.text
    gen_end = max(a["end_t"] for a in rows["attempts"] if a["task_id"].startswith("gen."))
    pilots = {p["pilot_id"]: p for p in rows["pilots"]}
    assert set(pilots) == {"gen-0", "square-1"}
    assert pilots["square-1"]["submit_t"] < gen_end + 1 < pilots["square-1"]["start_t"] - 20
    names = sorted(j["name"] for j in cluster.pilots())
    assert names == sorted(p["request"]["name"] for p in pilots.values())  # each job once
    assert [p.state for p in summary.pilots] == ["COMPLETED", "COMPLETED"]
    assert {t["state"] for t in rows["tasks"]} == {"done"} and len(rows["tasks"]) == 5
    assert cluster.queued() == []


def test_the_secret_reaches_workers_only_through_a_private_file(tmp_path, cluster):
    workflow = gen_square(tmp_path, gens=2, item="20:1")
    secret_file = tmp_path / ".leadtime" / cluster.run_id / "secret"
    looked: dict[str, object] = {}

    def observer(engine):
        workers = list(engine.source.manager.workers.values())
        if looked or not workers:
            return
        secret = engine.source.manager.secret.hex()
        (pilot,) = engine.state.pilots.values()
        looked["mode"] = secret_file.stat().st_mode & 0o777
        looked["file"] = secret_file.read_text().strip() == secret
        looked["script"] = sh("scontrol", "write", "batch_script", pilot.job_id, "-")
        looked["comment"] = sh("squeue", "--noheader", "-j", pilot.job_id, "--format=%j|%k")
        proc = Path(f"/proc/{workers[0].pid}")
        looked["worker"] = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        looked["secret"] = secret

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            config = slurm_config(tmp_path, "per-stage")
            return await run(workflow, config, store, cluster, observer)

    summary, _ = clock.run(main(), virtual=False)

    assert summary.status == "done", summary.error
    assert looked["mode"] == 0o600 and looked["file"]
    assert f"--secret-file {secret_file}" in looked["script"]
    assert looked["secret"] not in looked["script"]
    assert looked["secret"].encode() not in looked["worker"]
    run_id = cluster.run_id
    assert looked["comment"].strip() == f"lt-{run_id}-gen-0|leadtime run={run_id} pilot=gen-0"
    assert not secret_file.exists()  # removed with the run


def test_three_stages_pass_files_through_the_working_directory(tmp_path, cluster):
    """The pipeline example on Slurm: each stage's pilot runs its tasks in the workflow's
    directory (shared with the nodes), where the next stage finds their outputs."""
    (tmp_path / "wf.toml").write_text(example("pipeline").read_text())
    workflow = load(tmp_path / "wf.toml")

    summary, _ = run_on_slurm(workflow, tmp_path, cluster, "asa")
    assert summary.status == "done", summary.error
    assert (tmp_path / "squares.txt").read_text().split() == ["0", "1", "4", "9", "16", "25"]
    assert (tmp_path / "results" / "total.txt").read_text() == "55\n"
    assert cluster.queued() == []


NO_MPIRUN = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="no mpirun here (Debian: apt-get install openmpi-bin)"
)


@pytest.mark.parametrize(
    "launch",
    [
        "srun bash -c 'echo $SLURM_PROCID; sleep 3'",
        pytest.param(
            "mpirun --allow-run-as-root -n 2 bash -c 'echo $OMPI_COMM_WORLD_RANK; sleep 3'",
            marks=NO_MPIRUN,
        ),
    ],
    ids=["srun", "mpirun"],
)
def test_tasks_run_srun_or_mpirun_side_by_side_each_on_its_share(tmp_path, cluster, launch):
    """A task's own srun starts a step in its pilot. It waited for the CPUs and memory the
    worker's step holds (the task hung until the pilot's time limit), and it took that step's
    shape (one task per node); Open MPI's mpirun counted its slots from that shape too ("not
    enough slots" for `-n 2` in a task of 2 cores). Two tasks of 2 cores each run 2 ranks, as
    in a job of their own, both at once, not one after the other."""
    workflow = loads(
        textwrap.dedent(
            f"""
            name = "ranks"
            [[stage]]
            name = "mpi"
            allocation = {{ cores = 4, time = "5m" }}
            [stage.tasks]
            command = "{launch} > out/ranks{{index}}.txt"
            count = 2
            cores = 2
            memory = "300M"
            outputs = ["out/ranks{{index}}.txt"]
            """
        ),
        source=tmp_path / "wf.toml",
    )

    summary, rows = run_on_slurm(workflow, tmp_path, cluster)
    assert summary.status == "done", summary.error
    for index in range(2):
        assert sorted((tmp_path / "out" / f"ranks{index}.txt").read_text().split()) == ["0", "1"]
    attempts = rows["attempts"]
    assert [a["outcome"] for a in attempts] == ["success", "success"]
    assert max(a["start_t"] for a in attempts) < min(a["end_t"] for a in attempts)
    assert all(a["end_t"] - a["start_t"] < 5.5 for a in attempts)  # one after the other: 6 s
    assert cluster.queued() == []


def two_nodes() -> str:
    """The address of this host's node as the local Slurm's second node reaches it (its
    partition ``multi``), for a manager its workers on both nodes can reach."""
    nodes = dict(
        line.split() for line in sh("sinfo", "-h", "-N", "-p", "multi", "-o", "%N %o").splitlines()
    )
    if len(nodes) < 2 or HOST not in nodes:
        missing(
            "a second node of the local Slurm (scripts/slurm-local up makes one in a network "
            "namespace where this machine can)"
        )
    return nodes[HOST]


def on_two_nodes(tmp_path: Path, name: str, command: str) -> tuple[Workflow, RunConfig]:
    """A stage of 4 tasks of 2 cores running ``command``, each writing ``out/{index}.txt``, one
    pilot of two nodes for it in partition ``multi``, and a run's configuration for it."""
    workflow = loads(
        textwrap.dedent(
            f"""
            name = "{name}"
            [[stage]]
            name = "work"
            allocation = {{ cores = 8, nodes = 2, memory = "2G", time = "5m", partition = "multi" }}
            [stage.tasks]
            command = "{command} > out/{{index}}.txt"
            count = 4
            cores = 2
            memory = "300M"
            outputs = ["out/{{index}}.txt"]
            """
        ),
        source=tmp_path / "wf.toml",
    )
    config = slurm_config(tmp_path, "per-stage")
    return workflow, replace(config, backend=replace(config.backend, bind=two_nodes()))


@NO_MPIRUN
def test_a_tasks_srun_and_mpirun_stay_on_its_node_in_a_pilot_of_two_nodes(tmp_path, cluster):
    """In a pilot of two nodes, a task on the second node that ran `srun` or `mpirun` started
    its ranks on the first: srun placed the step on the job's first node, and Open MPI read
    the pilot's node list. Every task's ranks now run on its own node, in its share of it."""
    launches = "hostname; srun hostname; mpirun --allow-run-as-root hostname; srun -n1 -c2 hostname"
    workflow, config = on_two_nodes(tmp_path, "twonodes", f"sleep 3; ({launches}) 2>&1")

    async def main():
        async with await Store.open(":memory:") as store:
            return await run(workflow, config, store, cluster)

    summary, rows = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    nodes = set()
    for index in range(4):
        node, *ranks = (tmp_path / "out" / f"{index}.txt").read_text().split()
        assert ranks == [node] * 5, (index, ranks)  # srun's 2, mpirun's 2, then 1
        nodes.add(node)
    assert len(nodes) == 2, nodes  # the tasks ran on both nodes
    assert len({a["pilot_id"] for a in rows["attempts"]}) == 1
    assert cluster.queued() == []


def worker_roots(node: str) -> set[Path]:
    """The scratch roots of the workers that ran on ``node`` (the local Slurm's nodes share
    this machine's temporary directory)."""
    return set(Path(tempfile.gettempdir()).glob(f"leadtime-{node}-*"))


def crash_second_node() -> int:
    """Kill (SIGKILL) every process of the local Slurm's second node, its slurmd among them,
    as a node that loses power: nothing it runs says goodbye. How many there were."""
    netns = os.stat(f"/run/netns/leadtime-{HOST}-2").st_ino
    victims = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and os.stat(entry / "ns" / "net").st_ino == netns:
                victims.append(int(entry.name))
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(victims)


def test_a_pilot_whose_node_died_is_cancelled_once_its_workers_left(
    tmp_path, cluster, slurm_local, monkeypatch
):
    """A node of a pilot of two dies while its tasks run. Its tasks ran again on the other node,
    once each; but when the run released the pilot, the worker's step on the dead node never
    ended, nor the job with it: the run waited 5 minutes for Slurm's release timeout (while
    the job held both nodes). The job is cancelled once its workers have all left and it has
    not ended EMPTY_RELEASE_S later, and the run ends then. (Here a worker that disconnects
    is given up after 5 s instead of 60, and the release 5 s instead of 60.)"""
    monkeypatch.setattr(runstate, "EMPTY_RELEASE_S", 5.0)
    monkeypatch.setattr(session, "Manager", functools.partial(Manager, reattach_s=5.0))
    workflow, config = on_two_nodes(tmp_path, "nodeloss", "sleep 6; hostname")
    crashed, engines = [], []

    def observer(engine):
        engines[:] = [engine]
        joined = len(engine.source.manager.workers)
        if not crashed and joined == 2 and engine.state.stages["work"].running:
            crashed.append((crash_second_node(), clock.now()))

    async def main():
        async with await Store.open(":memory:") as store:
            summary, rows = await run(workflow, config, store, cluster, observer)
            return summary, rows, clock.now()

    scratch = worker_roots(f"{HOST}-2")
    try:
        summary, rows, ended = clock.run(main(), virtual=False)
    finally:  # the node back: down (Slurm forgets what ran there), its slurmd started again,
        # and its scratch wiped of what its killed worker left there, as a rebooted node's is
        sh("scontrol", "update", f"nodename={HOST}-2", "state=down", "reason=test crash")
        subprocess.run([slurm_local, "up"], check=True, capture_output=True, timeout=120)
        for root in worker_roots(f"{HOST}-2") - scratch:
            shutil.rmtree(root, ignore_errors=True)
    assert crashed and crashed[0][0] > 0
    assert summary.status == "done", summary.error
    attempts = rows["attempts"]
    assert sorted(a["task_id"] for a in attempts if a["outcome"] == "success") == [
        f"work.{i}" for i in range(4)
    ]
    outputs = {(tmp_path / "out" / f"{i}.txt").read_text().strip() for i in range(4)}
    assert outputs == {HOST}  # those of the dead node ran again on the other
    assert any(a["outcome"] == "lost" for a in attempts)
    (pilot,) = rows["pilots"]
    assert pilot["state"] == "CANCELLED"
    assert ended - crashed[0][1] < 60, ended - crashed[0][1]  # not Slurm's 5 minutes
    notes = [text for _, text in engines[0].state.notes]
    assert any("did not end 5 s after its workers left on its release" in n for n in notes), notes
    assert cluster.queued() == []


def test_an_srun_a_task_leaves_running_ends_its_step_with_the_task(tmp_path, cluster):
    """An `srun` a task left running when it exited was killed outright, and its step ran on
    until the pilot's end. It gets SIGTERM first now, and ends its step: a task of the next
    stage, in the same pilot, sees no step but the worker's."""
    workflow = loads(
        textwrap.dedent(
            """
            name = "leftstep"
            [[stage]]
            name = "start"
            allocation = { cores = 2, time = "5m" }
            tasks = { command = "srun sleep 300 & sleep 3", cores = 1, memory = "200M" }
            [[stage]]
            name = "look"
            allocation = { cores = 2, time = "5m" }
            [stage.tasks]
            command = "squeue --steps --jobs $SLURM_JOB_ID --noheader --format '%j' > steps.txt"
            cores = 1
            memory = "200M"
            outputs = ["steps.txt"]
            """
        ),
        source=tmp_path / "wf.toml",
    )

    summary, rows = run_on_slurm(workflow, tmp_path, cluster, strategy="bigjob")
    assert summary.status == "done", summary.error
    assert len({a["pilot_id"] for a in rows["attempts"]}) == 1
    steps = (tmp_path / "steps.txt").read_text().split()
    assert "sleep" not in steps and "batch" in steps, steps  # the pilot, without the step
    assert cluster.queued() == []


def test_a_first_stage_runs_side_by_side_on_nodes_whose_disk_slurm_does_not_know(tmp_path, cluster):
    """The local Slurm is not told its node's disk (TmpDisk 0), and the tasks declare none:
    each first task gets 1 GB of disk, not a share of a made-up disk size, so the stage's 8
    tasks start at once on its 8 cores instead of one at a time."""
    workflow = loads(
        textwrap.dedent(
            """
            name = "nodisk"
            [[stage]]
            name = "wide"
            allocation = { cores = 8, time = "10m" }
            tasks = { command = "sleep 2", count = 8, cores = 1, memory = "100M" }
            """
        ),
        source=tmp_path / "wf.toml",
    )

    summary, rows = run_on_slurm(workflow, tmp_path, cluster)
    assert summary.status == "done", summary.error
    attempts = rows["attempts"]
    assert len(attempts) == 8
    assert {a["allocation"]["disk"] for a in attempts} == {1024.0}
    starts = [a["start_t"] for a in attempts]
    assert max(starts) - min(starts) < 1.5  # one wave, not eight


def test_a_pilot_of_a_minute_runs_its_tasks_instead_of_draining_from_its_start(tmp_path, cluster):
    """A worker stops taking tasks a minute before its job's end, or a tenth of its time if
    less: with the whole minute, a pilot of `time = "1m"` took none, and each task sent to it
    came back at once and went out again (324,628 attempts in 5 minutes)."""
    workflow = loads(
        textwrap.dedent(
            """
            name = "minute"
            [[stage]]
            name = "short"
            allocation = { cores = 2, time = "1m" }
            tasks = { command = "sleep 1", count = 2, cores = 1, memory = "100M", disk = "10M" }
            """
        ),
        source=tmp_path / "wf.toml",
    )

    summary, rows = run_on_slurm(workflow, tmp_path, cluster)
    assert summary.status == "done", summary.error
    assert [a["outcome"] for a in rows["attempts"]] == ["success", "success"]
    assert len(rows["pilots"]) == 1


def test_five_pilot_cancels_lose_no_task_and_complete_none_twice(tmp_path, cluster):
    """100 tasks each append their id to one file and write one output; five running pilots
    are scancelled while their tasks sleep. Every task completes once; each loss is recorded
    with its cause and shown by ``status``."""
    tasks, cancels = 100, 5
    command = "sleep 2.$(( {index} % 5 )) && echo {index} >> shared.txt"
    command += " && echo ok > out/{index}.txt"
    (tmp_path / "out").mkdir()
    workflow = loads(
        textwrap.dedent(
            f"""
            name = "chaos"
            [[stage]]
            name = "work"
            allocation = {{ cores = 4, memory = "1G", time = "10m" }}
            [stage.tasks]
            command = "{command}"
            count = {tasks}
            cores = 1
            memory = "50M"
            disk = "10M"
            outputs = ["out/{{index}}.txt"]
            """
        )
    )
    cancelled: list[str] = []
    last = [0.0]

    def observer(engine):
        if not last[0]:
            last[0] = clock.now()
            asyncio.get_running_loop().call_soon(cancel_one, engine)

    def cancel_one(engine):
        """Cancel a running pilot whose tasks all have at least 1.3 s of their sleep (2 s or
        more) ahead, one every two seconds at most: a cancel after a task's append would run it
        again by design, and scancel takes a while on a loaded machine. Tasks start
        staggered, so the window must be wider than one start."""
        now = clock.now()
        if now - last[0] >= 2:
            for pilot in engine.state.pilots.values():
                starts = [s for w in pilot.workers for s in w.attempts.values()]
                if pilot.live and starts and all(0.05 < now - s < 0.7 for s in starts):
                    cancelled.append(pilot.job_id)
                    last[0] = now
                    sh("scancel", pilot.job_id)
                    break
        if len(cancelled) < cancels:
            asyncio.get_running_loop().call_later(0.02, cancel_one, engine)

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            config = slurm_config(tmp_path, "per-stage")
            return await run(workflow, config, store, cluster, observer)

    summary, rows = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    assert len(cancelled) == cancels
    ids = (tmp_path / "shared.txt").read_text().split()
    assert sorted(map(int, ids)) == list(range(tasks))  # each task completed once
    assert sorted(int(p.stem) for p in (tmp_path / "out").iterdir()) == list(range(tasks))
    # A cancelled pilot's running tasks are lost with its worker (also those Slurm's signal
    # reached first); one sent as it stopped, not yet started, it may refuse while draining:
    # each is recorded with its cause and retried.
    by_pilot = {p["pilot_id"]: p["job_id"] for p in rows["pilots"]}
    missed = [a for a in rows["attempts"] if a["outcome"] != "success"]
    assert {by_pilot[a["pilot_id"]] for a in missed} == set(cancelled)
    assert all(a["cause"] for a in missed)
    assert sum(1 for a in rows["attempts"] if a["outcome"] == "success") == tasks
    assert cluster.queued() == []
    status = CliRunner().invoke(app, ["status", summary.run_id, "--db", str(tmp_path / "store.db")])
    assert status.exit_code == 0
    lost = sum(a["outcome"] == "lost" for a in missed)
    assert f"{lost} lost" in status.output or not lost
    for cause in {a["cause"].split(":")[0] for a in missed}:  # its words before the details
        assert cause in status.output, cause


def slurm_crash(tmp_path: Path, env: dict[str, str] | None = None, *extra: str) -> Crash:
    options = ("--bind", "127.0.0.1", "--strategy", "asa", *extra)
    return Crash(tmp_path, "slurm", extra=options, env=env)


def queued_of(crash: Crash) -> list[dict[str, str]]:
    cluster = Cluster()
    cluster.prefix = f"lt-{crash.run_id}"
    return cluster.queued()


@pytest.mark.parametrize("point", ["in the first stage", "during a pilot's submission"])
def test_a_killed_managers_slurm_run_resumes_and_completes_every_task_once(tmp_path, point):
    """SIGKILL of the manager: its pilots live on (the running one's workers keep their
    tasks, the dependent one keeps its place in the queue), ``leadtime resume`` takes them
    over and finishes the run; no task runs twice and no job of the run is left queued."""
    env, submitting = slow_sbatch(tmp_path / "bin")
    during = point == "during a pilot's submission"  # the 2nd pilot: a's, then b's
    crash = slurm_crash(tmp_path / "run", env if during else None)
    crash.start()
    try:
        ready = crash.wait_for(lambda c: submitting(2) if during else c.done("a") >= 2, timeout=180)
        assert ready, crash.manager.stderr.read()
        crash.kill()
        assert "manager gone" in crash.status()
        alive = [j["name"] for j in queued_of(crash)]
        assert alive  # its pilots outlived it
        summary = crash.resume()
        assert summary["status"] == "done", summary["error"]
        assert sorted(crash.ids()) == crash.expected_ids()
        assert (crash.root / "total").read_text().strip() == str(2 * crash.tasks)
        assert queued_of(crash) == []
        assert crash.leftovers() == []
        with sqlite3.connect(crash.db) as con:  # waits of pilots started while it was down too
            pilots = con.execute("SELECT pilot_id, start_t FROM pilots").fetchall()
            learned = {p for (p,) in con.execute("SELECT pilot_id FROM waits")}
        assert {p for p, start in pilots if start is not None} == learned
    finally:
        crash.kill()
        for job in queued_of(crash) if crash.run_id else []:
            subprocess.run(["scancel", job["id"]], check=False)


def test_ctrl_c_while_sbatch_tells_the_job_id_leaves_no_job_queued(tmp_path, cluster):
    """Ctrl-C after Slurm queued a pilot, before sbatch told its id: the run's end finds the
    job by its name and cancels it, instead of leaving it to start with no manager."""
    cluster.background(120)  # the node is busy: the pilot stays queued
    env, submitting = slow_sbatch(tmp_path / "bin", answer_late=True)
    crash = slurm_crash(tmp_path / "run", env)  # its first pilot, a's
    crash.start()
    try:
        assert crash.wait_for(lambda c: submitting(1), timeout=180), crash.manager.stderr.read()
        assert queued_of(crash)  # queued, its id not yet told
        crash.interrupt()
        assert crash.manager.returncode == 130
        assert queued_of(crash) == []
        assert "Traceback" not in crash.manager.stderr.read()
    finally:
        crash.kill()
        for job in queued_of(crash) if crash.run_id else []:
            subprocess.run(["scancel", job["id"]], check=False)


def test_the_pilots_of_a_run_nobody_resumes_end_by_themselves(tmp_path):
    """The running pilot's workers wait --manager-grace for a manager, then end with their
    tasks and their pilot; the dependent pilot's dependency then fails, and Slurm removes it
    (--kill-on-invalid-dep)."""
    crash = slurm_crash(tmp_path, None, "--manager-grace", "4")
    crash.start()
    try:
        assert crash.wait_for(lambda c: c.done("a") >= 1, timeout=180)
        crash.kill()
        assert len(queued_of(crash)) == 3  # a running, b and c waiting on it
        for _ in range(300):
            if not queued_of(crash):
                break
            time.sleep(0.2)
        assert queued_of(crash) == []
        assert crash.leftovers() == []
    finally:
        crash.kill()
        for job in queued_of(crash) if crash.run_id else []:
            subprocess.run(["scancel", job["id"]], check=False)


def test_cancel_releases_the_pilots_of_a_run_whose_manager_died(tmp_path):
    crash = slurm_crash(tmp_path)
    crash.start()
    try:
        assert crash.wait_for(lambda c: c.done("a") >= 1, timeout=180)
        crash.kill()
        assert queued_of(crash)
        done = subprocess.run(
            crash.command("cancel", crash.run_id), capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert f"run {crash.run_id} cancelled: " in done.stdout
        for _ in range(100):
            if not queued_of(crash):
                break
            time.sleep(0.2)
        assert queued_of(crash) == []
        assert "cancelled" in crash.status()
        assert not (tmp_path / ".leadtime" / crash.run_id / "secret").exists()
    finally:
        crash.kill()
