"""Whole runs on the local backend: real workflows of real processes, end to end."""

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter

import psutil
import pytest
from programs import HOG, hog_value
from strangers import intrude
from typer.testing import CliRunner

from backends import clock
from backends.local import LocalOptions
from learners.sizing.composite import PRIOR_FLOOR, SMALLEST
from orchestrator.agent import protocol
from orchestrator.cli import app
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from workflows.spec import example, loads

LEADTIME = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
FAST_SAMPLES = ("--sample-interval", "0.25", "--first-sample", "0.05")

SQUARES = {"40:0.5": 40, "45:0.5": 45, "120:0.6": 120, "160:0.6": 160, "250:0.6": 250}


def three_stages(root) -> str:
    command = f"{sys.executable} {root / 'hog.py'} {{stage}} {{index}} {{item}} {root}"
    squares = [*SQUARES, "40:0.5"]
    return textwrap.dedent(
        f"""
        name = "hogs"
        [[stage]]
        name = "gen"
        allocation = {{ cores = 2, time = "5m" }}
        [stage.tasks]
        command = "{command}"
        items = ["30:0.3", "30:0.3", "30:0.3", "30:0.3"]
        cores = 1
        disk = "50M"
        [[stage]]
        name = "square"
        after = ["gen"]
        allocation = {{ cores = 2, time = "5m" }}
        tasks = {{ command = "{command}", items = {json.dumps(squares)}, cores = 1, disk = "50M" }}
        [[stage]]
        name = "sum"
        after = ["square"]
        allocation = {{ cores = 1, memory = "2G", time = "5m" }}
        tasks = {{ command = "{command}", items = ["30:0.2"], cores = 1, disk = "50M" }}
        """
    )


def local_config(tmp_path, strategy="asa", **kw) -> RunConfig:
    options = LocalOptions(worker_args=FAST_SAMPLES, heartbeat_s=0.5)
    return RunConfig(strategy=strategy, backend=options, workdir=tmp_path, **kw)


def run_local(workflow, tmp_path) -> tuple[RunSummary, list[dict]]:
    """A run of ``workflow`` on the local backend, and its attempts as they started."""

    async def main():
        async with await Store.open(":memory:") as store:
            summary = await execute(workflow, local_config(tmp_path), store)
            attempts = await store.rows("attempts", {"run_id": summary.run_id}, order="start_t")
            return summary, attempts

    return clock.run(main(), virtual=False)


def test_three_stages_of_real_programs_sized_killed_retried_and_done(tmp_path):
    """Tasks over their learned memory are killed and retried larger; strangers are refused."""
    (tmp_path / "hog.py").write_text(HOG)
    workflow = loads(three_stages(tmp_path))
    managers, intrusions = [], []

    def observer(engine):
        if not managers and engine.source.manager.workers:
            managers.append(engine.source.manager)
            intrusions.append(asyncio.ensure_future(intrude(engine.source.manager.address)))

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            summary = await execute(workflow, local_config(tmp_path), store, observer=observer)
            await intrusions[0]
            rows = {t: await store.rows(t, {"run_id": summary.run_id}) for t in ("attempts",)}
            rows["pilots"] = await store.rows("pilots", {"run_id": summary.run_id})
            rows["tasks"] = await store.rows("tasks", {"run_id": summary.run_id})
            return summary, rows

    summary, rows = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    assert managers[0].rejected == 3 and not managers[0].workers

    # The outputs: each stage read the one before.
    values = {
        stage: {p.name: hog_value(p.read_text()) for p in (tmp_path / stage).iterdir()}
        for stage in ("gen", "square", "sum")
    }
    assert values["gen"] == {str(i): i + 1 for i in range(4)}
    assert values["square"] == {str(i): (i % 4 + 1) ** 2 for i in range(6)}
    assert values["sum"] == {"0": sum(values["square"].values())}

    # Tasks above what the sizer learned were killed for memory and retried larger.
    attempts = rows["attempts"]
    killed = [a for a in attempts if a["outcome"] == "exhausted"]
    assert {a["exhausted"] for a in killed} == {"memory"}
    assert len({a["task_id"] for a in killed}) >= 2
    for a in killed:
        assert a["measured"] > a["allocation"]["memory"]
        retry = next(
            b for b in attempts if b["task_id"] == a["task_id"] and b["attempt"] == a["attempt"] + 1
        )
        assert retry["allocation"]["memory"] > a["allocation"]["memory"]
        assert {k: retry["allocation"][k] for k in ("cores", "disk")} == {"cores": 1, "disk": 50}
    assert {t["state"] for t in rows["tasks"]} == {"done"} and len(rows["tasks"]) == 11
    assert {p["state"] for p in rows["pilots"]} == {"COMPLETED"}

    # The store's records match what the programs measured of themselves.
    for a in attempts:
        if a["outcome"] != "success":
            continue
        stage, index = a["task_id"].split(".")
        own_peak = float((tmp_path / stage / index).read_text().split()[1])
        assert a["peak"]["memory"] == pytest.approx(own_peak, rel=0.1)
        assert a["peak"]["memory"] <= a["allocation"]["memory"]
        assert a["peak"]["wall"] >= 0.2
    held = {
        int(a["task_id"].split(".")[1]): a["peak"]["memory"]
        for a in attempts
        if a["task_id"].startswith("square.") and a["outcome"] == "success"
    }
    for index, mb in enumerate(SQUARES.values()):
        assert mb < held[index] < mb * 1.1 + 15  # what it held, plus the interpreter


def test_a_worker_killed_mid_task_loses_it_and_the_task_completes_elsewhere(tmp_path):
    (tmp_path / "hog.py").write_text(HOG)
    command = f"{sys.executable} {tmp_path / 'hog.py'} gen {{index}} 20:1.5 {tmp_path}"
    workflow = loads(
        textwrap.dedent(
            f"""
            name = "fragile"
            [[stage]]
            name = "gen"
            allocation = {{ cores = 2, time = "5m" }}
            [stage.tasks]
            command = "{command}"
            count = 4
            cores = 1
            memory = "200M"
            disk = "50M"
            """
        )
    )
    killed: list[int] = []

    def observer(engine):
        if not killed and any(s.running for s in engine.state.stages.values()):
            killed.append(0)
            asyncio.get_running_loop().call_later(0.4, kill_a_worker)

    def kill_a_worker():
        workers = [
            p for p in psutil.Process().children() if "orchestrator.agent.worker" in p.cmdline()
        ]
        killed[0] = workers[0].pid
        os.kill(workers[0].pid, signal.SIGKILL)

    async def main():
        async with await Store.open(":memory:") as store:
            config = local_config(tmp_path, strategy="per-stage")
            summary = await execute(workflow, config, store, observer=observer)
            attempts = await store.rows("attempts", {"run_id": summary.run_id}, order="start_t")
            tasks = await store.rows("tasks", {"run_id": summary.run_id})
            return summary, attempts, tasks

    summary, attempts, tasks = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    assert killed[0] > 0
    lost = [a for a in attempts if a["outcome"] == "lost"]
    assert len(lost) == 2  # both tasks that were running on it
    for a in lost:
        task = [b for b in attempts if b["task_id"] == a["task_id"]]
        after = [b for b in task if b["attempt"] > a["attempt"]]
        assert [b["outcome"] for b in after] == ["success"]
        assert after[0]["pilot_id"] != a["pilot_id"]  # on the pilot that replaced the dead one
        assert after[0]["allocation"] == a["allocation"]  # a loss is not a resource failure
    assert [p.state for p in summary.pilots] == ["FAILED", "COMPLETED"]
    assert {t["state"] for t in tasks} == {"done"}
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["0", "1", "2", "3"]


def one_stage(
    name: str, command: str, count: int, *, cores: int = 2, time="10m", workdir=None, **fields
):
    """A workflow of ``count`` one-core tasks of ``command`` on one pilot of ``cores`` cores
    and ``time``; ``fields``, TOML values, are the tasks' other fields."""
    lines = "".join(f"\n{key} = {value}" for key, value in fields.items())
    return loads(
        (f'workdir = "{workdir}"\n' if workdir else "")
        + f"""name = "{name}"
[[stage]]
name = "work"
allocation = {{ cores = {cores}, time = "{time}" }}
[stage.tasks]
command = "{command}"
count = {count}
cores = 1
memory = "50M"
disk = "10M"{lines}
"""
    )


def test_a_failing_task_fails_its_stage_after_max_attempts(tmp_path):
    command = "echo working; echo oops >&2; exit 3"
    workflow = one_stage("broken", command, 1, cores=1, max_attempts=2)

    summary, attempts = run_local(workflow, tmp_path)
    assert summary.status == "failed"
    assert "task work.0: failed 2 times (exit code 3)" in summary.error
    assert "oops" in summary.error and "working" in summary.error
    assert [(a["outcome"], a["exit_code"]) for a in attempts] == [("failed", 3)] * 2
    assert all(p.state == "COMPLETED" for p in summary.pilots)


def test_a_task_whose_stdout_outgrows_its_declared_disk_fails_saying_what_counts(tmp_path):
    """stdout goes to the attempt's scratch directory, on the node's disk, so it counts
    against a declared ``disk``; a declared size is fixed, so the run fails at once and says
    what counted and what to change."""
    workflow = one_stage("spew", "head -c 30000000 /dev/zero; sleep 2", 1, cores=1)  # 10 MB disk

    summary, attempts = run_local(workflow, tmp_path)
    assert summary.status == "failed"
    assert [(a["outcome"], a["exhausted"]) for a in attempts] == [("exhausted", "disk")]
    said = summary.error.removeprefix("task work.0: needs more disk than the 10 MB its ")
    assert said.startswith("workflow declares (it reached ")
    assert said.endswith(
        " MB; its scratch directory, where its stdout and stderr go, and its declared outputs "
        "count): a declared size is fixed; raise it, or leave it out to have leadtime size it"
    )


def test_a_task_that_takes_its_worker_down_fails_the_run_after_max_attempts(tmp_path):
    """A task that kills its worker, as one that crashes its node or wakes the OOM killer
    would, is not run again for ever: the worker vanishes without a word each time, and at
    the task's ``max_attempts`` such losses the run fails naming it. Nothing is left."""
    command = "if [ {index} = 3 ]; then sleep 1; kill -9 $PPID; fi; sleep 0.2"
    workflow = one_stage("crasher", command, 8, max_attempts=2)

    summary, attempts = run_local(workflow, tmp_path)
    assert summary.status == "failed"
    assert summary.error.startswith(
        "task work.3: its worker vanished while running it, 2 times (last: worker left: "
    ), summary.error
    assert [a["outcome"] for a in attempts if a["task_id"] == "work.3"] == ["lost", "lost"]
    assert not [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    assert not [p for p in tmp_path.glob(".leadtime/*/*") if p.is_dir()]  # no sandbox left


def test_a_task_longer_than_its_pilots_time_limit_fails_the_run_at_once(tmp_path):
    """A pilot of 10 s, a task of a minute: it had the pilot's whole time, so another pilot
    of the same 10 s cannot finish it either; the run fails naming the time to raise (it
    was run again on every new pilot, for ever). Nothing is left."""
    workflow = one_stage("longer", "sleep 60", 1, cores=1, time="10s")

    summary, attempts = run_local(workflow, tmp_path)
    assert summary.status == "failed"
    assert re.fullmatch(
        r"task work\.0: it ran \d+(\.\d)? s until its pilot's time limit ended it, the whole "
        r"10 s its pilots get: give stage work a longer allocation time",
        summary.error,
    ), summary.error
    assert [a["outcome"] for a in attempts] == ["lost"]
    assert not [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def test_a_failed_run_quotes_its_task_s_output_a_line_each_and_escaped(tmp_path):
    (tmp_path / "wf.toml").write_text(
        textwrap.dedent(
            r"""
            name = "broken"
            [[stage]]
            name = "bad"
            allocation = { cores = 1, time = "5m" }
            [stage.tasks]
            command = '''echo working; printf 'oops\033[2J\n' >&2; exit 3'''
            max_attempts = 1
            count = 1
            """
        )
    )
    done = subprocess.run(
        [*LEADTIME, "run", str(tmp_path / "wf.toml"), "--backend", "local", "--quiet",
         "--db", str(tmp_path / "db")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    *lines, hint = done.stderr.splitlines()[-5:]
    assert lines[0].startswith("error: run ") and lines[0].endswith(
        "failed: task bad.0: failed 1 time (exit code 3): [stdout]"
    )
    assert lines[1:] == ["  working", "  [stderr]", "  oops\\x1b[2J"]  # escaped: inert
    assert hint.startswith("once its cause is fixed, `leadtime resume ")


def test_leadtime_run_backend_local(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "wf.toml").write_text(
        textwrap.dedent(
            f"""
            name = "tiny"
            [[stage]]
            name = "a"
            allocation = {{ cores = 1, time = "5m" }}
            tasks = {{ command = "echo {{index}} > {out}-{{index}}", count = 3 }}
            [[stage]]
            name = "b"
            after = ["a"]
            allocation = {{ cores = 1, time = "5m" }}
            tasks = {{ command = "cat {out}-* > {out}", count = 1 }}
            """
        )
    )
    run = [*LEADTIME, "run", str(tmp_path / "wf.toml"), "--backend", "local"]
    run += ["--db", str(tmp_path / "db")]
    done = subprocess.run(
        [*run, "--workdir", str(tmp_path / "work"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "done"
    assert out.read_text().split() == ["0", "1", "2"]
    run_dir = tmp_path / "work" / ".leadtime" / summary["run_id"]
    pilots = len(summary["pilots"])  # elastic: one of one core, reused by stage b
    assert len(list(run_dir.glob("*.out"))) == pilots == 1  # one log per pilot
    with contextlib.closing(sqlite3.connect(tmp_path / "db")) as db:  # no queue: no wait to learn
        learned = db.execute("SELECT name FROM learners WHERE name LIKE 'queue_wait/%'")
        assert learned.fetchall() == []
        assert db.execute("SELECT predicted_wait FROM pilots").fetchall() == [(0.0,)] * pilots
    scoped = subprocess.run(
        [*run, "--workdir", str(tmp_path / "work"), "--learner-scope", "x", "--policy", "greedy"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert scoped.returncode == 0, scoped.stderr
    said = "--policy, --learner-scope: no queue here, so no wait is learned or used"
    assert said in scoped.stdout
    refused = subprocess.run(
        [*run, "--bind", "10.9.9.9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and "cannot listen on 10.9.9.9" in refused.stderr


def test_sigterm_ends_a_local_run_and_leaves_no_worker_behind(tmp_path):
    (tmp_path / "wf.toml").write_text(
        textwrap.dedent(
            """
            name = "long"
            [[stage]]
            name = "a"
            allocation = { cores = 1, time = "5m" }
            tasks = { command = "sleep 60", count = 2, cores = 1, memory = "50M", disk = "1M" }
            """
        )
    )
    args = [str(tmp_path / "wf.toml"), "--backend", "local", "--quiet"]
    args += ["--db", str(tmp_path / "db")]
    run = subprocess.Popen(
        [*LEADTIME, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    manager = psutil.Process(run.pid)
    for _ in range(200):  # the first task starts within a second or two
        if any(p.name() == "sleep" for p in manager.children(recursive=True)):
            break
        time.sleep(0.1)
    everything = manager.children(recursive=True)
    assert any(p.name() == "sleep" for p in everything)
    again = subprocess.run(
        [*LEADTIME, "run", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert again.returncode == 2  # the same workflow, the same directory: refused, and said why
    assert f"workflow long is already running in {tmp_path}: run " in again.stderr
    assert f" (its manager is pid {run.pid} on {socket.gethostname()}); two runs" in again.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "db")) as db:  # nothing of it recorded
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (1,)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err
    assert not psutil.wait_procs(everything, timeout=5)[1]  # workers and tasks are gone


def test_leadtime_worker_is_the_worker_agent():
    worker = [*LEADTIME, "worker"]
    usage = subprocess.run([*worker, "--help"], capture_output=True, text=True, check=False)
    assert usage.returncode == 0 and "--manager" in usage.stdout and "--secret-file" in usage.stdout
    env = {k: v for k, v in os.environ.items() if k != protocol.SECRET_ENV}
    refused = subprocess.run(
        [*worker, "--manager", "127.0.0.1:9"], capture_output=True, text=True, env=env, check=False
    )
    assert refused.returncode == 2 and "no secret" in refused.stderr


def run_attempts(workflow, tmp_path) -> list[dict]:
    """The attempts of a run of ``workflow`` on the local backend, which completed."""
    summary, attempts = run_local(workflow, tmp_path)
    assert summary.status == "done", summary.error
    return attempts


def successful_attempts(workflow, tmp_path) -> list[dict]:
    """The attempts of a run of ``workflow`` on the local backend, which all succeeded."""
    attempts = run_attempts(workflow, tmp_path)
    assert all(a["outcome"] == "success" for a in attempts)
    return attempts


@pytest.mark.parametrize("memory", ["", 'memory = "1G", '])
def test_a_stage_without_declared_sizes_starts_its_tasks_side_by_side(tmp_path, memory):
    """No cores, memory or disk declared: the first tasks start from their share of the
    stage's allocation (allocation / the tasks that run at once) and at least a core each,
    as many at once as that fits, not one per worker; with less than a gigabyte per core,
    the share, not the prior's gigabyte floor, which ran them one at a time."""
    workflow = loads(
        f"""
        name = "undeclared"
        [[stage]]
        name = "many"
        allocation = {{ cores = 2, {memory}time = "5m" }}
        tasks = {{ command = "sleep 2", count = 20 }}
        """
    )

    attempts = successful_attempts(workflow, tmp_path)
    first = attempts[0]["allocation"]
    fit = min(int(2 / first["cores"] + 1e-9), 20)  # tasks the prior fits on the stage's cores
    assert fit == 2  # one core each until the category has records
    first_wave = sorted(attempts, key=lambda a: a["start_t"])[:fit]
    assert max(a["start_t"] for a in first_wave) < min(a["end_t"] for a in first_wave)


def test_a_new_category_is_not_sized_by_another_categorys_tiny_peaks(tmp_path):
    """A stage of ``wc`` tasks measures a few MB and no CPU; the next stage's tasks of another
    category start from the prior (at least a core and the memory floor), and none is killed,
    neither these nor the ones sized from their records."""
    workflow = loads(
        """
        name = "tiny-then-new"
        [[stage]]
        name = "count"
        allocation = { cores = 2, time = "5m" }
        tasks = { command = "echo {index} | wc -c", count = 4 }
        [[stage]]
        name = "wait"
        after = ["count"]
        allocation = { cores = 2, time = "5m" }
        tasks = { command = "seq 100000 | wc -l && sleep 1", count = 10 }
        """
    )

    waits = [a for a in run_attempts(workflow, tmp_path) if a["task_id"].startswith("wait")]
    first = [a["allocation"] for a in waits[:2]]
    assert all(w["cores"] >= 1 and w["memory"] >= PRIOR_FLOOR["memory"] for w in first)
    # Later tasks are sized from the first ones' records, a few MB: never below the smallest
    # allocation, which a small process's measured peak does not vary across.
    assert all(a["allocation"]["memory"] >= SMALLEST["memory"] for a in waits)
    assert sorted(a["task_id"] for a in waits) == sorted(f"wait.{i}" for i in range(10))
    assert all(a["outcome"] == "success" for a in waits)  # none of them killed


def test_three_stages_pass_files_through_the_working_directory(tmp_path):
    """Relative outputs land in the workflow's directory, where the next stage reads them."""
    (tmp_path / "wf.toml").write_text(example("pipeline").read_text())
    run = [*LEADTIME, "run", str(tmp_path / "wf.toml"), "--backend", "local", "--json"]
    done = subprocess.run(
        [*run, "--db", str(tmp_path / "db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",  # the working directory is the workflow file's, not the caller's
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "squares.txt").read_text().split() == ["0", "1", "4", "9", "16", "25"]
    assert (tmp_path / "results" / "total.txt").read_text() == "55\n"
    summary = json.loads(done.stdout)
    assert (tmp_path / ".leadtime" / summary["run_id"]).is_dir()  # the run's own files


def one_stage_with_outputs(tmp_path, name: str, command: str, count: int):
    """A workflow of ``count`` one-core tasks, each declaring ``out/<index>.txt``, on one
    pilot of two cores."""
    (tmp_path / "out").mkdir()
    return one_stage(name, command, count, outputs='["out/{index}.txt"]', workdir=tmp_path)


def test_a_worker_killed_with_short_tasks_sent_ahead_loses_them_and_each_runs_once(tmp_path):
    """Short tasks are sent ahead to full workers; a worker SIGKILLed while it holds some
    loses them with what it ran, and they run elsewhere: every task succeeds exactly once."""
    tasks = 80
    command = "sleep 0.02 && echo ok > out/{index}.txt"
    workflow = one_stage_with_outputs(tmp_path, "ahead", command, tasks)
    killed: list[tuple[str, int]] = []

    def observer(engine):
        if killed or engine.state.stages["work"].done < 10:
            return
        for worker in engine.source.manager.workers.values():
            if worker.alive and worker.running > worker.capacity.cores:  # some wait there
                killed.append((worker.id, worker.running))
                os.kill(worker.pid, signal.SIGKILL)
                return

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            config = local_config(tmp_path, strategy="per-stage")
            summary = await execute(workflow, config, store, observer=observer)
            return summary, await store.rows("attempts", {"run_id": summary.run_id})

    summary, attempts = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    ((victim, held),) = killed
    assert held >= 2
    lost = [a for a in attempts if a["outcome"] == "lost"]
    assert len([a for a in lost if a["worker"] == victim]) >= held
    successes = Counter(a["task_id"] for a in attempts if a["outcome"] == "success")
    assert sorted(successes) == sorted(f"work.{i}" for i in range(tasks))
    assert set(successes.values()) == {1}
    assert len(list((tmp_path / "out").iterdir())) == tasks


CHAOS_TASKS = 100
CHAOS_KILLS = 10


def test_ten_worker_kills_lose_no_task_and_complete_none_twice(tmp_path):
    """Each task appends its id to one shared file and writes one output; ten workers are
    SIGKILLed while tasks run on them. Every task completes, none twice, every loss is
    recorded with its cause and shown by ``status``."""
    sleep = "0.$(( 3 + {index} % 4 ))"  # 0.3 to 0.6 s
    command = f"sleep {sleep} && echo {{index}} >> shared.txt && echo ok > out/{{index}}.txt"
    workflow = one_stage_with_outputs(tmp_path, "chaos", command, CHAOS_TASKS)
    rng = random.Random(7)
    kills: list[tuple[str, int]] = []
    progress = [0]  # the stage's tasks done at each kill

    def observer(engine):
        if not kills:
            kills.append(("", 0))  # started
            asyncio.get_running_loop().call_later(1.0, kill_one, engine)

    def kill_one(engine):
        """SIGKILL a worker whose attempts are all mid-way through their sleep: a kill in the
        last milliseconds of a task, after its append, would make it run again by design.
        Some task finishes between two kills: pilots killed before any could would stop the
        run by design (the circuit breaker), which a slow machine would otherwise provoke."""
        now = clock.now()
        done = engine.state.stages["work"].done
        ripe = [
            w
            for w in engine.source.manager.workers.values()
            if w.attempts and all(0.05 < now - start < 0.2 for start in w.attempts.values())
        ] if done > progress[-1] else []  # fmt: skip
        if ripe:
            victim = rng.choice(ripe)
            kills.append((victim.id, victim.running))
            progress.append(done)
            os.kill(victim.pid, signal.SIGKILL)
        if len(kills) <= CHAOS_KILLS:
            asyncio.get_running_loop().call_later(rng.uniform(0.3, 1.0) if ripe else 0.02,
                                                  kill_one, engine)  # fmt: skip

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            config = local_config(tmp_path, strategy="per-stage")
            summary = await execute(workflow, config, store, observer=observer)
            attempts = await store.rows("attempts", {"run_id": summary.run_id})
            return summary, attempts

    summary, attempts = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    assert len(kills) - 1 == CHAOS_KILLS
    ids = (tmp_path / "shared.txt").read_text().split()
    assert sorted(map(int, ids)) == list(range(CHAOS_TASKS))  # each once
    assert sorted(int(p.stem) for p in (tmp_path / "out").iterdir()) == list(range(CHAOS_TASKS))
    lost = [a for a in attempts if a["outcome"] == "lost"]
    assert len(lost) >= sum(running for _, running in kills[1:])  # more may have been sent
    assert {a["worker"] for a in lost} == {worker for worker, _ in kills[1:]}
    # A killed worker's pilot fails and its other worker drains: what it was sent meanwhile
    # it refuses, unrun.
    causes = ("worker left", "worker is draining")
    assert all(a["cause"].startswith(causes) for a in lost), [a["cause"] for a in lost]
    assert sum(1 for a in attempts if a["outcome"] == "success") == CHAOS_TASKS
    status = CliRunner().invoke(app, ["status", summary.run_id, "--db", str(tmp_path / "store.db")])
    assert status.exit_code == 0
    assert f"{len(lost)} lost" in status.output
    assert sum(status.output.count(c) for c in causes) == len(lost)
