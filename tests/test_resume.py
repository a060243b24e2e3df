"""A run whose manager is killed is resumed where it stopped, on the local backend: nothing
that finished runs again, live pilots and their running tasks are taken over, nothing of the
run is left behind. The same on Slurm is in test_e2e_slurm.py; bench/resume_sweep.py kills at
twenty points of each."""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest
from crash import LEADTIME, Crash

from backends import clock
from orchestrator.store import Store

POINTS = {  # when the manager is killed, and whether a pilot is then surely running
    "in the first stage": (lambda c: c.done("a") >= 2, True),
    "at the stage boundary": (lambda c: c.done("a") == c.tasks, False),
    "in the second stage": (lambda c: c.done("b") >= 3, True),
}


def pilot_states(db) -> dict[str, str]:
    """Each pilot's last state in the store."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT pilot_id, state FROM pilots").fetchall()
    return {pilot: json.loads(state) for pilot, state in rows}


def done_tasks(db) -> set[str]:
    """The tasks the store records as done, as the ids they write."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT task_id, state FROM tasks").fetchall()
    return {task.replace(".", "") for task, state in rows if json.loads(state) == "done"}


def attempts(db, outcome: str) -> list[tuple[str, int]]:
    """The attempts whose outcome in the store is ``outcome`` (none while the manager has not
    made its store yet)."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        try:
            rows = con.execute("SELECT task_id, attempt, outcome FROM attempts").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
            return []
    return [(task, attempt) for task, attempt, said in rows if said == outcome]


def output_tails(db) -> dict[tuple[str, int], str | None]:
    """Each attempt's output tail, where the worker or manager says why it ended."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT task_id, attempt, output_tail FROM attempts").fetchall()
    return {(task, attempt): tail for task, attempt, tail in rows}


def live_pilots(db) -> set[str]:
    return {p for p, state in pilot_states(db).items() if state in ("PENDING", "RUNNING")}


@pytest.mark.parametrize("point", POINTS)
def test_a_killed_managers_run_resumes_and_completes_every_task_once(tmp_path, point):
    crash = Crash(tmp_path, "local")
    crash.start()
    moment, running = POINTS[point]
    assert crash.wait_for(moment), crash.manager.stderr.read()
    crash.kill()
    assert "manager gone" in crash.status()
    alive = live_pilots(crash.db)
    time.sleep(0.5)  # the workers notice their manager is gone, and keep their tasks
    summary = crash.resume()
    assert summary["status"] == "done", summary["error"]
    assert sorted(crash.ids()) == crash.expected_ids()  # each task completed exactly once
    assert (tmp_path / "total").read_text().strip() == str(2 * crash.tasks)
    states = pilot_states(crash.db)
    taken_over = [p for p in alive if states[p] == "COMPLETED"]  # then released
    assert taken_over or not running
    assert "done" in crash.status()
    assert crash.leftovers() == []
    assert not (tmp_path / ".leadtime" / crash.run_id / "secret").exists()


def test_a_run_killed_while_attempts_wait_on_busy_workers_resumes_and_completes_each_once(
    tmp_path,
):
    """Short tasks are sent ahead to busy workers, where they wait for room: the store says so,
    and a resumed run takes them up, running or waiting, with each task completed once."""
    crash = Crash(tmp_path, "local", tasks=150, naps=("0.0$(( {index} % 4 ))",) * 2)
    crash.start()
    waiting = crash.wait_for(lambda c: len(attempts(c.db, "waiting")) >= 2)
    assert waiting, crash.manager.stderr.read()
    crash.kill()
    time.sleep(0.5)  # the workers notice their manager is gone, and keep their tasks
    summary = crash.resume()
    assert summary["status"] == "done", summary["error"]
    assert sorted(crash.ids()) == crash.expected_ids()
    assert (tmp_path / "total").read_text().strip() == str(2 * crash.tasks)
    assert attempts(crash.db, "waiting") == attempts(crash.db, "running") == []
    with contextlib.closing(sqlite3.connect(crash.db)) as con:
        times = con.execute("SELECT start_t, end_t FROM attempts WHERE outcome='success'")
        assert all(start is not None and start <= end for start, end in times)
    assert crash.leftovers() == []


def test_an_attempt_that_ended_while_the_run_had_no_manager_ended_when_its_run_did(tmp_path):
    """A worker keeps the result of an attempt that ends while there is no manager and gives it
    to the one that takes the run up: the attempt ran its own seconds (status, logs, the
    report's timeline), not until the run was resumed."""
    crash = Crash(tmp_path, "local", tasks=2, naps=("1", "0"))
    crash.start()
    assert crash.wait_for(lambda c: len(attempts(c.db, "running")) == 2), (
        crash.manager.stderr.read()
    )
    crash.kill()
    held = attempts(crash.db, "running")
    deadline = time.monotonic() + 60
    while crash.done("a") < 2 and time.monotonic() < deadline:  # no manager hears them end
        time.sleep(0.05)
    time.sleep(2)
    summary = crash.resume()
    assert summary["status"] == "done", summary["error"]
    with contextlib.closing(sqlite3.connect(crash.db)) as con:
        rows = con.execute("SELECT task_id, attempt, end_t - start_t, peak FROM attempts")
        took = {(task, n): (span, json.loads(peak)["wall"]) for task, n, span, peak in rows}
    for key in held:
        span, wall = took[key]
        assert wall >= 1 and span == pytest.approx(wall), (key, span, wall)


def test_the_attempts_of_a_pilot_that_ended_while_the_run_had_no_manager_run_again_at_once(
    tmp_path,
):
    """The pilot's job ended (time limit, scancel) while no manager ran: its workers cannot
    come back, so resume does not wait for them (``reattach_s``) to run its attempts again."""
    crash = Crash(tmp_path, "local")
    crash.start()
    assert crash.wait_for(lambda c: c.done("a") >= 2 and attempts(c.db, "running"))
    crash.kill()
    running = attempts(crash.db, "running")
    for record in (tmp_path / ".leadtime" / crash.run_id).glob("*.pilot"):
        for pid, _ in json.loads(record.read_text())["workers"]:
            os.kill(pid, signal.SIGKILL)  # the job's end: its tasks go with their worker
    summary = crash.resume()
    assert summary["status"] == "done", summary["error"]
    assert sorted(set(crash.ids())) == crash.expected_ids()
    tails = output_tails(crash.db)
    assert running and all(
        tails[key] == "[leadtime] its pilot ended while the run had no manager" for key in running
    )
    assert crash.leftovers() == []


def test_the_attempts_of_a_pilot_that_ends_before_its_workers_come_back_run_again_at_once(
    tmp_path,
):
    """Resumed, the run awaits the workers that were running its attempts; a pilot whose job
    ends before they come back (stopped, then killed) has its attempts run again at once, not
    after the wait for a worker to come back (``reattach_s``)."""
    crash = Crash(tmp_path, "local")
    crash.start()
    assert crash.wait_for(lambda c: c.done("a") >= 2 and attempts(c.db, "running"))
    crash.kill()
    running = attempts(crash.db, "running")
    records = (tmp_path / ".leadtime" / crash.run_id).glob("*.pilot")
    workers = [pid for r in records for pid, _ in json.loads(r.read_text())["workers"]]
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)  # alive, but cannot come back
    resumed = subprocess.Popen(
        crash.command("resume", crash.run_id),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert resumed.stdout is not None
    told = []
    for line in resumed.stdout:
        told.append(line)
        if "taken over" in line:  # every pilot is, before the first pass tells it
            break
    for pid in workers:  # the pilots end: their workers never come back
        os.kill(pid, signal.SIGKILL)
    told += resumed.stdout.readlines()
    assert resumed.wait(timeout=120) == 0, "".join(told)
    assert sorted(set(crash.ids())) == crash.expected_ids()
    tails = output_tails(crash.db)
    assert running and all(
        tails[key] == "[leadtime] its pilot ended before its worker came back" for key in running
    ), tails
    assert crash.leftovers() == []


def test_a_done_task_whose_output_is_gone_runs_again_on_resume(tmp_path):
    crash = Crash(tmp_path, "local")
    crash.start()
    assert crash.wait_for(lambda c: c.done("b") >= 3), crash.manager.stderr.read()
    crash.kill()
    done = sorted(t for t in done_tasks(crash.db) if t[0] == "b")
    (tmp_path / "out" / done[0]).unlink()  # say, removed by hand while nobody ran the run
    summary = crash.resume()
    assert summary["status"] == "done", summary["error"]
    ids = crash.ids()
    assert ids.count(done[0]) == 2 and sorted(set(ids)) == crash.expected_ids()
    assert all(ids.count(i) == 1 for i in set(ids) - {done[0]})
    assert (tmp_path / "total").read_text().strip() == str(2 * crash.tasks)


def test_an_interrupted_run_resumes_without_redoing_what_finished(tmp_path):
    crash = Crash(tmp_path, "local")
    crash.start()
    assert crash.wait_for(lambda c: c.done("a") >= 3), crash.manager.stderr.read()
    crash.interrupt()
    assert crash.manager.returncode == 130
    said = crash.manager.stderr.read()
    assert f"run {crash.run_id} interrupted" in said
    assert f"leadtime resume {crash.run_id} takes it up" in said
    assert "interrupted" in crash.status()
    assert live_pilots(crash.db) == set()  # Ctrl-C released them
    assert attempts(crash.db, "running") == []  # each recorded as it ended: resume waits for none
    assert not (tmp_path / ".leadtime" / crash.run_id / "secret").exists()
    finished = done_tasks(crash.db)
    assert finished
    summary = crash.resume(named=False)  # with new pilots and a new secret
    assert summary["status"] == "done", summary["error"]
    ids = crash.ids()
    assert sorted(set(ids)) == crash.expected_ids()
    assert all(ids.count(i) == 1 for i in finished)  # none of them again
    # Ctrl-C killed the running tasks: one killed after it wrote its id runs again, rightly
    assert crash.leftovers() == []


def test_cancel_ends_a_running_run_for_good(tmp_path):
    """Its manager stops and releases the pilots, and the run is cancelled: not interrupted,
    which resume would take up."""
    crash = Crash(tmp_path, "local")
    crash.start()
    assert crash.wait_for(lambda c: c.run_id is not None and c.done("a") >= 1)
    cancel = subprocess.run(
        crash.command("cancel", crash.run_id), capture_output=True, text=True, timeout=60
    )
    assert cancel.returncode == 0, cancel.stderr
    assert crash.manager.wait(timeout=60) == 128 + signal.SIGTERM  # as `cancel` stops it
    said = crash.manager.stderr.read()  # its own terminal: cancelled, not to be resumed
    assert f"run {crash.run_id} cancelled (leadtime cancel): its pilots were released" in said
    assert "resume" not in said and not list(tmp_path.glob("**/.leadtime/*/cancelling"))
    assert live_pilots(crash.db) == set() and crash.leftovers() == []
    with sqlite3.connect(crash.db) as con:
        status, error = con.execute("SELECT status, error FROM runs").fetchone()
    assert (status, error) == ("cancelled", "cancelled (leadtime cancel)")
    resumed = subprocess.run(
        crash.command("resume", crash.run_id), capture_output=True, text=True, timeout=60
    )
    assert resumed.returncode == 2
    assert f"run {crash.run_id} is cancelled: nothing to resume" in resumed.stderr
    again = subprocess.run(
        crash.command("cancel", crash.run_id), capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 2
    assert f"run {crash.run_id} has ended (cancelled): nothing to cancel" in again.stderr


def test_resume_refuses_a_run_whose_manager_is_alive(tmp_path):
    crash = Crash(tmp_path, "local")
    crash.start()
    try:
        assert crash.wait_for(lambda c: c.run_id is not None and c.done("a") >= 1)
        refused = crash.command("resume", crash.run_id)
        done = subprocess.run(refused, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 2
        assert f"run {crash.run_id} is running: its manager (pid {crash.manager.pid}" in done.stderr
    finally:
        crash.kill()
        for pid in crash.leftovers():  # its workers, which would wait 10 min for a manager
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_run_recorded_with_options_this_version_cannot_read_is_refused(tmp_path, cli):
    async def record() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            store.stage(
                "runs",
                {"run_id": "old"},
                workflow="w",
                backend="local",
                status="interrupted",
                created=0.0,
                workflow_text='name = "w"',
                options={"backend": "local", "local": {"oversubscribe": False}},  # as before
            )
            await store.flush()

    clock.run(record(), virtual=False)
    for command in ("resume", "cancel"):
        done = cli(command, "old")
        assert done.exit_code == 2, done.output
        assert "run old was recorded by another version of leadtime" in done.output
        assert "Traceback" not in done.output


def test_resume_without_a_run_id_wants_exactly_one_run_to_resume(tmp_path, cli):
    """Without RUN_ID, resume takes the store's one run that can be resumed (the test above
    resumes one so); none, or several, is a clear refusal naming them, nothing started."""

    async def record(run_id: str, status: str, created: float) -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.put("runs", {"run_id": run_id}, workflow=f"wf-{run_id}",
                            backend="local", status=status, created=created)  # fmt: skip

    clock.run(record("finished", "done", 0.0), virtual=False)
    done = cli("resume")
    assert done.exit_code == 2, done.output
    assert "no run to resume (none lost its manager or was interrupted)" in done.output
    for run_id, created in (("first", 100.0), ("second", 200.0)):
        clock.run(record(run_id, "interrupted", created), virtual=False)
    done = cli("resume")
    assert done.exit_code == 2, done.output
    assert "2 runs can be resumed: name one (leadtime resume RUN_ID)" in done.output
    assert done.output.index("second  wf-second") < done.output.index("first  wf-first")
    assert "Traceback" not in done.output


def test_resume_tells_what_to_do_with_a_run_that_ended(tmp_path, cli):
    async def record() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            for run_id, status in (("over", "done"), ("ended", "cancelled")):
                await store.put("runs", {"run_id": run_id}, workflow="w", backend="local",
                                status=status, source="wf.toml", created=0.0)  # fmt: skip

    clock.run(record(), virtual=False)
    done = {run_id: cli("resume", run_id) for run_id in ("over", "ended")}
    assert {d.exit_code for d in done.values()} == {2}
    assert all(d.stdout == "" for d in done.values())  # no dashboard opened, no blank line
    said = {run_id: " ".join(d.output.split()) for run_id, d in done.items()}
    assert said["over"].endswith(
        "run over is done: nothing to resume (resume takes up a run whose manager died, was "
        "interrupted or failed)"
    )
    assert said["ended"].endswith("interrupted or failed); run wf.toml again")


FLAKY = """
name = "flaky"
[[stage]]
name = "a"
allocation = { cores = 2, time = "5m" }
[stage.tasks]
command = '''if [ {index} = 2 ] && [ ! -e fixed ]; then exit 3; fi
echo a{index} >> ran; echo {index} > a{index}.txt'''
count = 4
max_attempts = 1
outputs = ["a{index}.txt"]
[[stage]]
name = "b"
allocation = { cores = 1, time = "5m" }
[stage.tasks]
command = "echo b >> ran; cat a*.txt | wc -l > total"
outputs = ["total"]
max_attempts = 1
"""


def leadtime(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LEADTIME, *args, "--db", str(tmp_path / "db")],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip


def failed_run(tmp_path, workflow: str) -> str:
    """The id of a run of ``workflow`` (wf.toml in ``tmp_path``), which failed."""
    (tmp_path / "wf.toml").write_text(workflow)
    first = leadtime(tmp_path, "run", "wf.toml", "--backend", "local", "--json")
    assert first.returncode == 1, first.stderr
    summary = json.loads(first.stdout)
    assert summary["status"] == "failed"
    return summary["run_id"]


def resumed_with(tmp_path, edited: str) -> str:
    """What ``leadtime run wf.toml --resume`` says, with wf.toml now ``edited``; it succeeds."""
    (tmp_path / "wf.toml").write_text(edited)
    again = leadtime(tmp_path, "run", "wf.toml", "--backend", "local", "--resume")
    assert again.returncode == 0, again.stderr
    return " ".join((again.stderr + again.stdout).split())


def ran(tmp_path) -> list[str]:
    return sorted((tmp_path / "ran").read_text().split())


def test_a_failed_run_taken_up_after_a_fix_runs_only_what_did_not_finish(tmp_path):
    """Fixed outside the workflow (an input made): resume takes the run up as recorded, and
    the task that failed gets its attempts anew; what finished does not run again."""
    run_id = failed_run(tmp_path, FLAKY)
    assert ran(tmp_path) == ["a0", "a1", "a3"]
    status = " ".join(leadtime(tmp_path, "status", run_id).stdout.split())
    assert f"failed: once its cause is fixed, `leadtime resume {run_id}` takes it up" in status
    unnamed = leadtime(tmp_path, "resume")  # a failed run is taken up when named
    assert unnamed.returncode == 2
    assert (
        f"the last run, {run_id} (flaky), failed: once its cause is fixed, `leadtime resume "
        f"{run_id}` takes it up" in " ".join(unnamed.stderr.split())
    )
    (tmp_path / "fixed").touch()
    again = leadtime(tmp_path, "resume", run_id, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["status"] == "done"
    assert ran(tmp_path) == ["a0", "a1", "a2", "a3", "b"]
    assert (tmp_path / "total").read_text().strip() == "4"
    assert "done" in leadtime(tmp_path, "status", run_id).stdout


def test_run_resume_takes_up_a_failed_run_with_its_file_as_edited(tmp_path):
    """A mistake in a command, fixed in the file: `run --resume` takes the run up with the
    file as it is now, and runs again the stage whose tasks changed; the stages before it
    keep what they finished."""
    run_id = failed_run(tmp_path, FLAKY.replace("[ ! -e fixed ]", "false").replace(
        "> total", "> totl"))  # fmt: skip
    assert ran(tmp_path) == ["a0", "a1", "a2", "a3", "b"]
    said = resumed_with(tmp_path, FLAKY.replace("[ ! -e fixed ]", "false"))
    assert f"resuming run {run_id}, which failed, of wf.toml" in said
    assert "stage b runs again from the beginning: the workflow's file changed what runs" in said
    assert ran(tmp_path) == ["a0", "a1", "a2", "a3", "b", "b"]
    assert (tmp_path / "total").read_text().strip() == "4"


def test_an_edit_runs_again_the_stage_it_changed_and_the_stages_after_it(tmp_path):
    run_id = failed_run(tmp_path, FLAKY)
    said = resumed_with(tmp_path, FLAKY.replace("[ ! -e fixed ]", "false"))
    assert f"resuming run {run_id}, which failed" in said
    assert "stages a and b run again from the beginning" in said
    assert ran(tmp_path) == ["a0", "a0", "a1", "a1", "a2", "a3", "a3", "b"]


def test_a_declared_size_raised_in_the_file_retries_the_task_that_exceeded_it(tmp_path):
    """Killed for exceeding its declared wall time, the run failed (a declared size is fixed);
    the file, edited to declare more, takes the run up: the task runs again with it."""
    slow = FLAKY.replace("&& [ ! -e fixed ]; then exit 3", "; then sleep 3").replace(
        "count = 4", 'count = 4\nwall = "1s"')  # fmt: skip
    run_id = failed_run(tmp_path, slow)
    said = resumed_with(tmp_path, slow.replace('wall = "1s"', 'wall = "1m"'))
    assert f"resuming run {run_id}, which failed" in said
    assert ran(tmp_path) == ["a0", "a1", "a2", "a3", "b"]
    assert (tmp_path / "total").read_text().strip() == "4"


def test_run_resume_with_nothing_to_take_up_says_so_and_starts_a_new_run(tmp_path):
    (tmp_path / "fixed").touch()
    said = resumed_with(tmp_path, FLAKY)
    assert "no run of wf.toml in the store to resume: starting a new run" in said
    first = leadtime(tmp_path, "status", "--json")
    (run_id,) = [run["run_id"] for run in json.loads(first.stdout)]
    said = resumed_with(tmp_path, FLAKY)
    assert (
        f"nothing of wf.toml to resume (its last run, {run_id}, is done): starting a new run"
        in said
    )
    assert ran(tmp_path) == ["a0", "a0", "a1", "a1", "a2", "a2", "a3", "a3", "b", "b"]


def test_an_edit_of_the_workflows_shape_is_refused_and_runs_nothing(tmp_path):
    run_id = failed_run(tmp_path, FLAKY)
    (tmp_path / "wf.toml").write_text(FLAKY.replace("count = 4", "count = 5"))
    again = leadtime(tmp_path, "run", "wf.toml", "--backend", "local", "--resume")
    assert again.returncode == 2, again.stderr
    assert (
        f"wf.toml changed since run {run_id} recorded it: stage a has 5 tasks, the run's had 4; "
        "resume needs the same stages and tasks (run wf.toml without --resume to start afresh)"
    ) in " ".join(again.stderr.split())
    assert ran(tmp_path) == ["a0", "a1", "a3"]
    assert "failed" in leadtime(tmp_path, "status", run_id).stdout


def test_a_run_on_the_simulated_cluster_is_not_resumed(tmp_path, cli):
    async def record() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.put("runs", {"run_id": "sim"}, workflow="w", backend="mock",
                            status="interrupted", created=0.0)  # fmt: skip

    clock.run(record(), virtual=False)
    done = cli("resume", "sim")
    assert done.exit_code == 2, done.output
    assert "run sim ran on the simulated cluster, which lived in its manager" in done.output


def test_a_resumed_run_reads_a_workers_attempts_in_the_order_they_were_sent():
    """The worker starts what waits first come, first served: the resumed manager's copy of
    its queue must hold the same order, which is not the order of the task ids."""
    from learners.resources import Resources
    from orchestrator.agent.attempt import AttemptSpec
    from orchestrator.recorder import Recorder
    from orchestrator.runs import SavedRun

    def spec(task_id: str, attempt: int = 1) -> AttemptSpec:
        return AttemptSpec(task_id, attempt, "true", Resources(1, 10, 10, 60))

    async def main():
        async with await Store.open(":memory:") as store:
            store.stage("runs", {"run_id": "r"}, status="running")
            recorder = Recorder(store, "r", simulated=False)
            recorder.attempt_sent(spec("t-9"), "w", "p")
            recorder.attempt_started(("t-9", 1), 5.0)
            recorder.attempt_sent(spec("t-2", 2), "w", "p")
            await recorder.flush()
            for task_id in ("t-10", "t-11", "t-1"):
                recorder.attempt_sent(spec(task_id), "w", "p")  # ahead: waiting
            recorder.attempt_started(("t-2", 2), 6.0)  # a later change keeps a row's place
            await recorder.flush()
            return await SavedRun.load(store, "r")

    saved = clock.run(main(), virtual=False)
    sent = ["t-9", "t-2", "t-10", "t-11", "t-1"]
    assert [a["task_id"] for a in saved.attempts] == sent
    assert [a["outcome"] for a in saved.attempts] == ["running"] * 2 + ["waiting"] * 3
