"""A task's output from the command line: what a worker captures of every attempt's stdout and
stderr (bounded: head, bytes cut, tail), what the store keeps, and what ``leadtime logs`` shows
of a real local run, finished or still going."""

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from backends import clock
from backends.local import LocalOptions
from learners.resources import Resources
from orchestrator import tasklogs
from orchestrator.agent import protocol
from orchestrator.agent.attempt import AttemptSpec, Outcome
from orchestrator.agent.monitor import Monitor, MonitorConfig
from orchestrator.agent.taskrun import STDERR, STDOUT, Runner, RunnerConfig, capture
from orchestrator.cli import app
from orchestrator.recorder import Recorder
from orchestrator.runs import Manager, RunState
from orchestrator.session import RunConfig, execute
from orchestrator.store import TABLES, Store
from workflows.spec import loads

LINES = 100_000
"""Lines the talkative task prints: far more than a result carries."""


def numbered(count: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(count))


# --- what a worker captures ------------------------------------------------------------------


def test_a_small_output_is_kept_whole(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(numbered(3))
    captured = capture(path)
    assert (captured.head + captured.tail, captured.cut) == ("line 0\nline 1\nline 2\n", 0)
    assert not capture(tmp_path / "absent")


def test_a_large_output_keeps_whole_lines_of_its_head_and_tail_and_counts_the_rest(tmp_path):
    path = tmp_path / "out"
    data = numbered(LINES)
    path.write_bytes(data)
    c = capture(path)
    assert c.head.startswith("line 0\n") and c.head.endswith("\n")
    assert c.tail.endswith(f"line {LINES - 1}\n") and c.tail.startswith("line ")
    assert len(c.head) <= protocol.OUTPUT_HEAD and len(c.tail) <= protocol.OUTPUT_TAIL
    assert len(c.head) > protocol.OUTPUT_HEAD - 20 and len(c.tail) > protocol.OUTPUT_TAIL - 20
    assert len(c.head) + c.cut + len(c.tail) == len(data)
    assert data.decode().startswith(c.head) and data.decode().endswith(c.tail)


def test_a_cut_without_line_breaks_falls_on_whole_characters(tmp_path):
    path = tmp_path / "out"
    data = "é€".encode() * 20_000  # 2- and 3-byte characters, no line break
    path.write_bytes(data)
    c = capture(path, head=1001, tail=1001)
    assert "\ufffd" not in c.head + c.tail
    assert len(c.head.encode()) + c.cut + len(c.tail.encode()) == len(data)
    assert data.startswith(c.head.encode()) and data.endswith(c.tail.encode())


@pytest.fixture
def runner(tmp_path):
    monitor = Monitor(MonitorConfig(interval_s=0.2, first_sample_s=0.05))
    return Runner(RunnerConfig(root=tmp_path / "sb", node="node7"), monitor)


async def test_every_attempt_brings_back_its_stdout_and_stderr(runner):
    command = f"seq 0 {LINES - 1}; echo warning >&2"
    spec = AttemptSpec("talk.0", 1, command, Resources(1, 200, 50))
    result = await runner.run(spec)
    assert result.outcome is Outcome.SUCCESS
    assert result.stdout.head.startswith("0\n1\n") and result.stdout.tail.endswith(f"{LINES - 1}\n")
    assert result.stdout.cut > 0
    assert (result.stderr.head + result.stderr.tail, result.stderr.cut) == ("warning\n", 0)
    assert (result.node, result.sandbox) == ("node7", "")  # removed after a success
    assert result.output() is not None and result.output()["sandbox"] is None


async def test_a_quiet_attempt_keeps_no_output_row_and_logs_say_where_it_ran(runner, tmp_path):
    """Most attempts print nothing: the store keeps their node in their attempt's row and
    writes no output row for them (a row per attempt was a quarter of a run's writes)."""
    spec = AttemptSpec("quiet.0", 1, "true", Resources(1, 200, 50))
    result = await runner.run(spec)
    assert (result.outcome, result.node, result.output()) == (Outcome.SUCCESS, "node7", None)
    async with await Store.open(tmp_path / "store.db") as store:
        Recorder(store, "r", simulated=False).attempt_ended(spec, result, None, 2.0, (2.0, 1.0))
        await store.flush()
        (row,) = await store.rows("attempts", {"run_id": "r"})
        assert await store.rows("outputs", {"run_id": "r"}) == []
    text = viewed(row, None, "local")
    assert "node node7" in text and "stdout: empty" in text and "stderr: empty" in text
    assert "no output came back" not in text
    earlier = {**row, "node": None}  # a store of an earlier version kept the node with output
    assert "node n3" in viewed(earlier, {"node": "n3"}, "local")
    unheard = {**row, "node": None, "outcome": "lost"}
    assert "no output came back: its worker went away" in viewed(unheard, None, "local")


async def test_a_failed_attempt_says_where_its_scratch_directory_was_kept(runner):
    spec = AttemptSpec("bad.0", 2, "echo working; echo oops >&2; exit 3", Resources(1, 200, 50))
    result = await runner.run(spec)
    assert result.outcome is Outcome.FAILED
    assert result.sandbox == str(runner.sandbox(spec))
    assert (runner.sandbox(spec) / STDERR).read_text() == "oops\n"
    assert (result.stdout.head, result.stderr.head) == ("working\n", "oops\n")


# --- the store -------------------------------------------------------------------------------


def test_a_store_of_an_earlier_version_gets_the_outputs_table_and_reads_as_empty(tmp_path):
    db = tmp_path / "old.db"

    async def main():
        async with await Store.open(db) as store:
            await store.put("runs", {"run_id": "r"}, workflow="w", status="done")
        with sqlite3.connect(db) as raw:
            raw.execute("DROP TABLE outputs")
        async with await Store.open(db, readonly=True) as store:
            before = await store.rows("outputs", {"run_id": "r"})
        async with await Store.open(db) as store:
            await store.put("outputs", {"run_id": "r", "task_id": "a.0", "attempt": 1}, node="n")
            after = await store.rows("outputs", {"run_id": "r"})
        return before, after

    before, after = clock.run(main(), virtual=False)
    assert before == []
    assert [(r["task_id"], r["node"]) for r in after] == [("a.0", "n")]
    assert "outputs" in TABLES


# --- leadtime logs ---------------------------------------------------------------------------


def viewed(row: dict, output: dict | None, backend: str, width: int = 200) -> str:
    """What ``leadtime logs`` prints of one attempt's stored row (and output row)."""
    console = Console(width=width, record=True)
    console.print(tasklogs.attempt_view(tasklogs.AttemptLog(row, output), backend))
    return console.export_text()


TALK = f"""
import os, sys
for i in range({LINES}):
    print("line", i)
print("warning", file=sys.stderr)
sys.exit(sys.argv[1] == "1" and os.environ["LEADTIME_ATTEMPT"] == "1")
"""
HOG = """
import sys, time
print("allocating", flush=True)
held = bytearray(250_000_000 if sys.argv[1:] != ["small"] else 1_000_000)
time.sleep(0.8)
print("held")
"""


def workflow(root):
    (root / "talk.py").write_text(TALK)
    (root / "hog.py").write_text(HOG)
    return loads(
        textwrap.dedent(
            f"""
            name = "chatty"
            [[stage]]
            name = "talk"
            allocation = {{ cores = 2, time = "5m" }}
            [stage.tasks]
            command = "{sys.executable} talk.py {{index}}"
            count = 2
            cores = 1
            memory = "200M"
            disk = "10M"
            max_attempts = 2
            [[stage]]
            name = "probe"
            allocation = {{ cores = 1, time = "5m" }}
            tasks = {{ command = "{sys.executable} hog.py small", count = 1, category = "hog" }}
            [[stage]]
            name = "hog"
            after = ["probe"]
            allocation = {{ cores = 1, time = "5m" }}
            tasks = {{ command = "{sys.executable} hog.py", count = 1, cores = 1, disk = "10M" }}
            """
        )
    )


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The workflow above, run for real on this machine: the store's path and the run id."""
    root = tmp_path_factory.mktemp("logs")
    config = RunConfig(
        strategy="per-stage",
        backend=LocalOptions(worker_args=("--sample-interval", "0.1", "--first-sample", "0.05")),
        workdir=root,
    )

    async def main():
        async with await Store.open(root / "store.db") as store:
            return await execute(workflow(root), config, store)

    summary = clock.run(main(), virtual=False)
    assert summary.status == "done", summary.error
    return root / "store.db", summary.run_id


def logs(db, *args):
    return CliRunner().invoke(app, ["logs", *args, "--db", str(db)], terminal_width=120)


def test_logs_lists_every_attempt_with_its_outcome_and_cause(local_run):
    db, run_id = local_run
    done = logs(db, run_id)
    assert done.exit_code == 0, done.output
    rows = [line.split() for line in done.output.splitlines()]
    listed = {tuple(r[:3]) for r in rows if r and r[0] in ("talk.0", "talk.1", "hog.0")}
    assert ("talk.1", "1", "failed") in listed and ("talk.1", "2", "success") in listed
    assert ("hog.0", "1", "exhausted") in listed
    assert "exit code 1" in done.output and "memory" in done.output


def test_logs_without_a_run_list_the_newest_run_s_attempts(local_run, empty_store):
    db, run_id = local_run
    assert logs(db).output == logs(db, run_id).output
    done = logs(empty_store)
    assert done.exit_code == 2
    assert f"{empty_store}: no run yet" in " ".join(done.output.split())


def test_a_task_named_alone_is_one_of_the_newest_run(local_run):
    db, run_id = local_run
    alone = logs(db, "talk.1")
    assert alone.exit_code == 0 and alone.output == logs(db, run_id, "talk.1").output
    second = logs(db, "talk.1", "--attempt", "2")
    assert second.exit_code == 0, second.output
    assert second.output == logs(db, run_id, "talk.1", "--attempt", "2").output
    assert "talk.1 · attempt 2" in second.output and "attempt 1" not in second.output
    assert "--attempt needs a TASK" in logs(db, "--attempt", "1").output
    unknown = logs(db, "talk.7")
    assert unknown.exit_code == 2
    said = " ".join(unknown.output.split())
    assert f"no run talk.7, nor a task of the newest run: no task talk.7 in run {run_id}" in said
    assert "(its tasks: hog.0, probe.0, talk.0 to .1) (`leadtime status` lists the runs)" in said


def test_logs_of_a_task_show_the_head_the_bytes_cut_and_the_tail_of_its_output(local_run):
    db, run_id = local_run
    done = logs(db, run_id, "talk.1", "--attempt", "1")
    assert done.exit_code == 0, done.output
    text = done.output
    assert "talk.1 · attempt 1 · failed" in text and "why: exit code 1" in text
    lines = text.splitlines()
    assert "line 0" in lines and f"line {LINES - 1}" in lines
    assert "line 50000" not in lines  # cut from the middle
    cut = next(line for line in lines if line.startswith("[... "))
    stdout_bytes = sum(len(f"line {i}\n") for i in range(LINES))
    shown = [line for line in lines if line.startswith("line ")]
    assert int(cut.split()[1].replace(",", "")) == stdout_bytes - sum(len(s) + 1 for s in shown)
    assert "stderr:" in text and "warning" in lines
    kept = next(line for line in lines if "scratch directory kept: " in line)
    path = kept.split(": ", 1)[1]
    assert (Path(path) / STDOUT).read_text().count("\n") == LINES  # kept whole there
    assert "talk.1 · attempt 2" not in text  # --attempt 1 only


def test_logs_of_a_killed_attempt_give_the_kill_with_its_peak_against_its_allocation(local_run):
    db, run_id = local_run
    done = logs(db, run_id, "hog.0")
    assert done.exit_code == 0, done.output
    text = done.output
    assert "hog.0 · attempt 1 · exhausted" in text
    assert "killed: memory reached" in text and "over its allocation of" in text
    killed = next(line for line in text.splitlines() if "← killed" in line)
    assert killed.split()[0] == "memory"
    assert "allocating" in text and text.count("held") == 1  # only the attempt that succeeded
    assert "success" in text


def test_a_kill_that_saw_no_more_than_the_allocation_says_it_reached_it():
    mb = 1068.52174
    row = {"task_id": "a.0", "attempt": 1, "outcome": "exhausted", "start_t": 0.0, "end_t": 5.0,
           "exhausted": "memory", "measured": mb, "allocation": {"memory": mb},
           "peak": {"memory": mb}}  # fmt: skip
    assert "killed: memory reached its allocation of 1.07 GB" in viewed(row, None, "mock")


def test_an_attempt_found_over_as_it_ended_is_not_said_to_be_killed():
    row = {"task_id": "a.0", "attempt": 1, "outcome": "exhausted", "start_t": 0.0, "end_t": 0.1,
           "exhausted": "disk", "measured": 28.6, "allocation": {"disk": 10.0},
           "peak": {"disk": 28.6}, "output_tail":
           "[leadtime] over its allocation as it ended: disk reached 28.6 MB (allocation 10 MB)"
           }  # fmt: skip
    text = viewed(row, None, "mock")
    assert "disk reached 29 MB, over its allocation of 10 MB, found as it ended" in text
    assert "killed" not in text and "← over" in text
    assert "the worker:" not in text  # said once


def test_a_starved_attempt_says_what_it_got_of_what_it_was_given():
    row = {"task_id": "a.0", "attempt": 1, "outcome": "success", "start_t": 0.0, "end_t": 2.0,
           "allocation": {"cores": 1.0}, "peak": {"cores": 0.23}, "starved": 1}  # fmt: skip
    assert (
        "starved: its CPUs were busy through most of its run and it used 0.23 of the 1 core it"
        in viewed(row, None, "mock", width=300)
    )


def test_an_attempt_sent_ahead_to_a_busy_worker_shows_as_waiting_not_running():
    waiting = {"task_id": "a.3", "attempt": 1, "outcome": "waiting", "worker": "w1",
               "pilot_id": "a-0", "start_t": None, "end_t": None}  # fmt: skip
    running = {**waiting, "task_id": "a.1", "outcome": "running", "start_t": 1.0}
    text = viewed(waiting, None, "local")
    assert "a.3 · attempt 1 · waiting" in text and "started -" in text
    assert "which is busy and starts it once it has room" in text and "running:" not in text
    assert tasklogs.running_note([waiting]) == (
        "a.3 attempt 1 is waiting for room on worker w1: its output shows here when it ends"
    )
    note = tasklogs.running_note([running, waiting, {**running, "task_id": "a.2"}])
    assert note is not None and note.startswith(
        "3 attempts are on their workers (2 running, 1 waiting for room): "
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope.3",), "no task nope.3 in run"),
        (("talk.7",), "no task talk.7 in run"),
        (("talk.1", "--attempt", "9"), "task talk.1 has no attempt 9 (it has 2)"),
        (("--attempt", "1"), "--attempt needs a TASK"),
    ],
)
def test_logs_of_what_is_not_there_is_a_one_line_error(local_run, args, message):
    db, run_id = local_run
    done = logs(db, run_id, *args)
    assert done.exit_code == 2
    assert message in " ".join(done.output.split())


def test_logs_of_a_simulated_run_say_its_tasks_wrote_nothing(cli):
    run = cli("run", "workflows/examples/pipeline.toml", "--json")
    run_id = next(line for line in run.output.splitlines() if '"run_id"' in line).split('"')[3]
    done = cli("logs", run_id, "merge.0")
    assert done.exit_code == 0, done.output
    assert "no output: tasks on the simulated cluster run no command" in done.output
    assert cli("logs", "nosuchrun").exit_code == 2


# --- --follow --------------------------------------------------------------------------------


@pytest.mark.parametrize("whole_run", [False, True], ids=["since the start", "from now on"])
def test_follow_prints_each_attempt_once_as_it_ends_and_stops_with_the_run(tmp_path, whole_run):
    """A run still going (its manager is this process): attempts end while follow polls; a
    whole run's attempts are followed from now on, those that ended before left out."""
    db = tmp_path / "store.db"
    shown: list[tuple[str, int]] = []
    key = {"run_id": "r"}

    def attempt(store, task_id, n, t, outcome="success", ended=None):
        """Its result comes at ``t``; it ended then, or at ``ended`` (held by its worker)."""
        row = {"run_id": "r", "task_id": task_id, "attempt": n}
        end = t if ended is None else ended
        store.stage("attempts", row, outcome=outcome, start_t=end - 1, end_t=end, result_t=t)
        store.stage("outputs", row, stdout={"head": f"{task_id}/{n}\n", "tail": "", "cut": 0})

    async def main():
        async with await Store.open(db) as store:
            manager = Manager.this().as_json()
            await store.put("runs", key, workflow="w", backend="local", status="running",
                            manager=manager, created=clock.wall())  # fmt: skip
            attempt(store, "a.0", 1, 1.0)
            store.stage("attempts", {**key, "task_id": "a.1", "attempt": 1}, outcome="running",
                        start_t=1.0)  # fmt: skip
            await store.flush()
            async with await Store.open(db, readonly=True) as reader:
                before = await tasklogs.attempts(reader, "r")
                seen = [r for r in before if r["outcome"] != "running"] if whole_run else []
                following = asyncio.ensure_future(
                    tasklogs.follow(
                        reader, "r", None, lambda log: shown.append(log.key), 0.01, seen
                    )
                )
                await asyncio.sleep(0.1)
                assert shown == ([] if whole_run else [("a.0", 1)])
                attempt(store, "a.1", 1, 2.0, outcome="failed")
                attempt(store, "a.1", 2, 2.0)  # ends at the same moment
                await store.flush()
                await asyncio.sleep(0.1)
                attempt(store, "a.2", 1, 3.0)
                await store.flush()
                await asyncio.sleep(0.1)
                attempt(store, "a.3", 1, 4.0, ended=1.5)  # before those shown: kept by its worker
                await store.put("runs", key, status="done")
                return await asyncio.wait_for(following, 5)

    final = clock.run(main(), virtual=False)
    assert final is RunState.DONE
    followed = [("a.1", 1), ("a.1", 2), ("a.2", 1), ("a.3", 1)]
    assert shown == [("a.0", 1)] * (not whole_run) + followed


def test_follow_of_a_run_that_is_over_prints_what_it_did_and_says_so(local_run):
    db, run_id = local_run
    done = logs(db, run_id, "talk.0", "--follow")
    assert done.exit_code == 0, done.output
    assert "is not going (done): nothing to follow" in done.output
    assert "talk.0 · attempt 1 · success" in done.output


def test_follow_a_local_run_prints_its_attempts_as_they_end_until_it_ends(tmp_path):
    """`leadtime logs RUN TASK --follow` and `logs RUN --follow` beside a real run."""
    (tmp_path / "wf.toml").write_text(
        textwrap.dedent(
            """
            name = "slow"
            [[stage]]
            name = "a"
            allocation = { cores = 1, time = "5m" }
            [stage.tasks]
            command = "sleep 1.5; echo finished {index}"
            count = 3
            cores = 1
            memory = "50M"
            disk = "10M"
            """
        )
    )
    db = str(tmp_path / "store.db")
    leadtime = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
    run = subprocess.Popen(
        [*leadtime, "run", str(tmp_path / "wf.toml"), "--backend", "local", "--db", db, "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_id = None
        for _ in range(200):
            listed = subprocess.run([*leadtime, "status", "--json", "--db", db],
                                    capture_output=True, text=True, check=False)  # fmt: skip
            if listed.returncode == 0 and (found := json.loads(listed.stdout)):
                run_id = found[0]["run_id"]
                break
            time.sleep(0.05)
        assert run_id is not None
        follows = [
            subprocess.Popen([*leadtime, "logs", run_id, *task, "--follow", "--db", db],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for task in (["a.2"], [])
        ]  # fmt: skip
        (task_out, task_err), (run_out, run_err) = (f.communicate(timeout=60) for f in follows)
        assert run.wait(timeout=60) == 0
    finally:
        run.kill()
    assert [f.returncode for f in follows] == [0, 0]
    assert task_out.count("finished") == 1 and "finished 2" in task_out
    assert "a.2 · attempt 1 · success" in task_out
    assert f"run {run_id} done" in task_err and f"run {run_id} done" in run_err
    said = ("has not started yet: its attempts show here as they end", "a.2 attempt 1 is running")
    assert any(note in task_err for note in said)  # which, depends on when it started
    for i in range(3):  # those that ended before it started are left out, each other once
        assert run_out.count(f"finished {i}\n") <= 1
    assert run_out.count("finished 2\n") == 1
