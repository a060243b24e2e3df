"""``leadtime status RUN``: the run as a readable report, and all of it as JSON."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from backends import clock
from orchestrator.cli import DEMO_MOCK, app
from orchestrator.human import duration, offset
from orchestrator.report import headline
from orchestrator.runs import Manager
from orchestrator.session import RunConfig, run_simulated
from orchestrator.store import Store
from workflows.spec import example, load


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo by ASA on the demo's replay of HPC2N: the store, what `run --json` printed,
    and what `status --json` prints."""
    db = tmp_path_factory.mktemp("status") / "store.db"
    summary = run_simulated(load(example("demo")), RunConfig(strategy="asa", backend=DEMO_MOCK), db)
    done = status(db, summary.run_id, "--json")
    assert done.exit_code == 0, done.output
    return db, json.loads(json.dumps(summary.as_json())), json.loads(done.output)


def status(db, *args):
    return CliRunner().invoke(app, ["status", *args, "--db", str(db)], terminal_width=160)


def rows(db, table, run_id):
    async def main():
        async with await Store.open(db, readonly=True) as store:
            return await store.rows(table, {"run_id": run_id})

    return clock.run(main(), virtual=False)


def test_status_json_holds_the_run_s_figures_as_run_json_gave_them(demo):
    _, figures, shown = demo
    for key, value in figures.items():
        if key in ("stages", "pilots"):
            for mine, theirs in zip(shown[key], value, strict=True):
                assert {k: mine[k] for k in theirs} == theirs
        else:
            assert shown[key] == value, key
    assert shown["figures_recorded"] is True


def test_status_json_says_what_ran_where_and_how_it_stands(demo):
    db, _, shown = demo
    (run,) = rows(db, "runs", shown["run_id"])
    for key in ("workflow", "source", "backend", "cluster", "strategy", "sizer", "seed", "created"):
        assert shown[key] == run[key], key
    assert shown["state"] == "done" and shown["last_seen"] is None
    assert shown["ended"] >= shown["created"]
    assert shown["manager"]["pid"] == run["manager"]["pid"]


def test_status_json_counts_each_stage_s_tasks_and_attempts_by_outcome_and_cause(demo):
    db, _, shown = demo
    attempts = rows(db, "attempts", shown["run_id"])
    by_stage = Counter(a["task_id"].rsplit(".", 1)[0] for a in attempts)
    kinds = Counter(
        (a["task_id"].rsplit(".", 1)[0], a["exhausted"] or a["outcome"])
        for a in attempts
        if a["outcome"] not in ("success", "running")
    )
    assert kinds, "the demo's sizer learns memory by killing a few attempts"
    for s in shown["stages"]:
        assert s["done"] == s["tasks"] and s["failed"] == s["running"] == 0
        assert s["attempts"] == by_stage[s["name"]]
        assert s["did_not_succeed"] == {k: n for (st, k), n in kinds.items() if st == s["name"]}
        assert s["lost"] == kinds[s["name"], "lost"]
        assert s["pilot"] in s["pilots"]
        first = next(p for p in shown["pilots"] if p["pilot_id"] == s["pilot"])
        assert s["predicted_wait_s"] == first["predicted_wait"]
        assert s["pilot_wait_s"] == first["wait_s"]
    failed = [(a["task_id"], a["attempt"]) for a in shown["did_not_succeed"]]
    assert sorted(failed) == sorted(
        (a["task_id"], a["attempt"]) for a in attempts if a["outcome"] not in ("success", "running")
    )


def test_status_json_gives_each_pilot_s_job_request_and_waits(demo):
    db, _, shown = demo
    pilots = {p["pilot_id"]: p for p in rows(db, "pilots", shown["run_id"])}
    assert shown["pilots"]
    for p in shown["pilots"]:
        row = pilots[p["pilot_id"]]
        assert p["job_id"] == row["job_id"]
        assert p["request"]["cores"] == p["cores"] == row["request"]["cores"]
        assert p["request"]["time_limit_s"] == row["request"]["time_limit_s"]
        assert p["wait_s"] == p["start_t"] - p["eligible_t"]
    assert any(p["wait_s"] > 0 for p in shown["pilots"]), "the demo's pilots queue"


def test_status_json_gives_the_awe_of_each_resource_over_every_attempt(demo):
    db, _, shown = demo
    used = Counter()
    held = Counter()
    for a in rows(db, "attempts", shown["run_id"]):
        time = a["end_t"] - a["start_t"]
        for r in ("cores", "memory", "disk"):
            held[r] += a["allocation"][r] * time
            if a["outcome"] == "success":
                used[r] += a["peak"][r] * time
    assert shown["awe"] == pytest.approx({r: used[r] / held[r] for r in held})
    assert 0 < shown["idle_core_hours"] < shown["core_hours"]


def test_status_shows_the_run_its_stages_pilots_and_what_did_not_succeed(demo):
    db, figures, shown = demo
    done = status(db, shown["run_id"])
    assert done.exit_code == 0, done.output
    text = done.output
    assert f"run {shown['run_id']} · demo · asa · mock · done" in text
    for said in (
        f"makespan {duration(figures['makespan_s'])}",
        f"TWT {duration(figures['twt_s'])}",
        f"PWT {duration(figures['pwt_s'])}",
        f"{figures['core_hours']:,.2f} core-hours",
        f"hit ratio {figures['hit_ratio']:.0%}",
        f"memory {shown['awe']['memory']:.2f}",
        shown["cluster"],
    ):
        assert said in text, said
    lines = text.splitlines()
    for s in shown["stages"]:
        counts = next(line.split() for line in lines if line.split()[:2] == [s["name"], "done"])
        assert counts[2:9] == [str(s[k]) for k in ("tasks", "done", "failed", "running",
                                                    "waiting", "attempts", "lost")]  # fmt: skip
        assert offset(s["ready_s"]) in text
    for p in shown["pilots"]:
        row = next(line for line in lines if line.split()[:2] == [p["pilot_id"], p["job_id"]])
        assert duration(p["predicted_wait"]) in row and duration(p["wait_s"]) in row
    for a in shown["did_not_succeed"]:
        assert any(a["task_id"] in line and a["cause"] in line for line in lines)


def _gone_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


@pytest.mark.parametrize("alive", [True, False], ids=["running", "manager gone"])
def test_status_of_a_run_still_going_says_whether_its_manager_lives(tmp_path, alive):
    db = tmp_path / "store.db"
    manager = Manager.this() if alive else Manager(Manager.this().host, _gone_pid(), 1.0)
    created = clock.wall() - 3600

    async def main():
        async with await Store.open(db) as store:
            key = {"run_id": "r1"}
            await store.put("runs", key, workflow="w", backend="local", strategy="asa",
                            sizer="select", seed=0, status="running", created=created,
                            manager=manager.as_json(), heartbeat=created + 60)  # fmt: skip
            await store.put("stages", {**key, "stage": "a"}, state="running", tasks_total=3,
                            tasks_done=1, ready_t=0.0, start_t=5.0)  # fmt: skip
            await store.put("attempts", {**key, "task_id": "a.0", "attempt": 1},
                            outcome="running", start_t=5.0)  # fmt: skip
            await store.put("attempts", {**key, "task_id": "a.1", "attempt": 1},
                            outcome="waiting")  # sent ahead to a busy worker  # fmt: skip

    clock.run(main(), virtual=False)
    shown = json.loads(status(db, "r1", "--json").output)
    assert shown["state"] == ("running" if alive else "manager gone")
    assert shown["last_seen"] == created + 60 and not shown["figures_recorded"]
    assert shown["stages"][0]["running"] == shown["stages"][0]["waiting"] == 1
    text = " ".join(status(db, "r1").output.split())
    assert "a running 3 1 0 1 1 2 0" in text  # tasks, done, failed, running, waiting, attempts
    if alive:
        assert f"running (manager: process {os.getpid()} on {manager.host}" in text
    else:
        assert "manager gone (last seen 59 min" in text and "leadtime resume r1" in text
    assert "figures so far" in text


def test_status_lists_runs_with_one_line_each_and_as_json(demo):
    db, _, shown = demo
    listed = status(db)
    assert listed.exit_code == 0
    header, *lines = listed.output.splitlines()
    assert header.split() == ["run", "workflow", "backend", "strategy", "started", "state", "error"]
    assert [line.split()[0] for line in lines] == [shown["run_id"]]
    assert lines[0].index(" done") == header.index(" state")  # the columns line up
    (row,) = json.loads(status(db, "--json").output)
    assert (row["run_id"], row["state"], row["workflow"]) == (shown["run_id"], "done", "demo")


def test_status_of_a_store_with_no_runs_says_so(empty_store):
    db = empty_store
    listed = status(db)
    assert listed.exit_code == 0 and listed.output == f"no runs in {db}\n"


def test_status_of_no_such_run_is_a_one_line_error(demo):
    done = status(demo[0], "nope")
    assert done.exit_code == 2
    assert done.output.strip() == "error: no run nope (`leadtime status` lists the runs)"


def test_a_failed_run_s_error_shows_its_first_line_and_json_all_of_it(tmp_path):
    db = tmp_path / "store.db"
    error = "task a.0: failed 2 times (exit code 1): [stdout]\nline 1\nline 2\n[stderr]\noops"

    async def main():
        async with await Store.open(db) as store:
            await store.put("runs", {"run_id": "r2"}, workflow="w", backend="local",
                            strategy="asa", sizer="select", seed=0, status="failed",
                            created=clock.wall(), error=error)  # fmt: skip

    clock.run(main(), virtual=False)
    text = status(db, "r2").output
    assert "task a.0: failed 2 times (exit code 1): [stderr] oops (4 more lines in --json" in text
    assert "line 2" not in text
    listed = status(db).output.splitlines()
    assert listed[1].endswith("failed  task a.0: failed 2 times (exit code 1): [stderr] oops")
    assert json.loads(status(db, "r2", "--json").output)["error"] == error


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        ("pilot p ended: NODE_FAIL", "pilot p ended: NODE_FAIL"),
        (
            "task a.0: failed (exit code 2): [stdout]\nx\ny",
            "task a.0: failed (exit code 2): [stdout] y",
        ),
        (
            "t: failed: [stdout]\nx\n[stderr]\n  no such file \n\n",
            "t: failed: [stderr] no such file",
        ),
        ("t: failed: [stdout]\n\n", "t: failed: [stdout]"),
        ("t: killed: [leadtime] memory\n[stderr]\nz", "t: killed: [leadtime] memory"),
        ("", ""),
    ],
)
def test_an_errors_headline_ends_with_the_output_s_last_line_where_its_first_stops_at_a_label(
    error, shown
):
    assert headline(error) == shown
