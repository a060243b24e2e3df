"""A run of the store replayed through the sizers: ``leadtime bench sizing --run RUN``."""

import json

import pytest

from learners.resources import Resources
from orchestrator.runrecord import RunRecord
from orchestrator.runtrace import run_trace
from workflows.spec import example
from workflows.traces import TraceError

WORKFLOW = """
name = "two"
[[stage]]
name = "a"
allocation = { cores = 4, time = "1h" }
[stage.tasks]
command = "work {index}"
count = 2
cores = 2
memory = "3G"
[[stage]]
name = "b"
after = ["a"]
allocation = { cores = 1, time = "1h" }
[stage.tasks]
command = "sum"
category = "summing"
"""


def attempt(task: str, n: int, outcome: str, start: float, **peak: float) -> dict:
    used = {"cores": 1.0, "memory": 100.0, "disk": 5.0, "wall": 10.0, **peak}
    return {"task_id": task, "attempt": n, "outcome": outcome, "start_t": start, "peak": used}


def record(text: str | None = WORKFLOW, attempts: tuple = ()) -> RunRecord:
    run = {"run_id": "r1", "workflow": "two", "workflow_text": text, "source": None, "scale": None}
    stages = [{"stage": "a", "ready_t": 0.0}, {"stage": "b", "ready_t": 42.0}]
    tasks = [
        {"task_id": "a.0", "category": "a"},
        {"task_id": "a.1", "category": "a"},
        {"task_id": "b.0", "category": "summing"},
    ]
    return RunRecord(run, stages, [], tasks, list(attempts), [])


def test_the_tasks_that_succeeded_with_their_peaks_submitted_when_their_stage_was_ready():
    trace, unknown = run_trace(
        record(
            attempts=(
                attempt("a.1", 1, "memory", 0.0, memory=3000.0, wall=1.0),
                attempt("a.0", 1, "success", 0.5, cores=1.5, memory=2100.0, wall=30.0),
                attempt("a.1", 2, "success", 1.0, memory=3500.0),
                attempt("b.0", 1, "failed", 50.0),
            )
        )
    )
    assert unknown is None
    assert trace.name == "run r1 of two"
    assert [t.peak for t in trace.tasks] == [
        Resources(1.5, 2100.0, 5.0, 30.0),
        Resources(1.0, 3500.0, 5.0, 10.0),
    ]  # the killed attempt tells nothing the successful one does not; b.0 never succeeded
    assert {t.category for t in trace.tasks} == {"a"}
    assert all(t.requested == {"cores": 2.0, "memory": 3000.0} for t in trace.tasks)
    assert [t.submit for t in trace.tasks] == [0.0, 0.0]
    summing = run_trace(record(attempts=(attempt("b.0", 1, "success", 50.0),)))[0].tasks[0]
    assert (summing.category, summing.submit, summing.requested) == ("summing", 42.0, {})


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "the run kept no workflow file"),
        ("name = 'two'\n[[stage]", "its workflow no longer reads as it ran"),
    ],
)
def test_a_run_whose_workflow_does_not_read_is_replayed_without_requests(text, why):
    trace, unknown = run_trace(record(text, (attempt("a.0", 1, "success", 0.0),)))
    assert unknown.startswith(why)
    assert trace.tasks[0].requested == {}


def test_a_run_with_no_task_that_succeeded_has_nothing_to_replay():
    with pytest.raises(TraceError, match="run r1 has no task that succeeded"):
        run_trace(record(attempts=(attempt("a.0", 1, "failed", 0.0),)))


def test_the_command_replays_a_run_of_the_store(cli):
    ran = cli("run", str(example("blast")), "--strategy", "per-stage", "--json")
    assert ran.exit_code == 0, ran.output
    run_id = json.loads(ran.output)["run_id"]
    done = cli("bench", "sizing", "--run", run_id, "--sizer", "user,select")
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"run {run_id} of blast: 449 tasks on 20 workers of 16 cores")
    rows = json.loads(cli("bench", "sizing", "--run", run_id, "--json").output)
    user = {r["resource"]: r["awe"] for r in rows if r["sizer"] == "user"}
    assert 0.2 < user["memory"] < 0.5  # the search's 4G declared against its ~1.4G peaks
    assert {r["sizer"] for r in rows} == {"select", "user"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give a task trace (--trace FILE) or a run of the store (--run RUN), one of them"),
        (["--run", "r1", "--trace", "t.csv"], "give a task trace (--trace FILE) or a run"),
        (["--run", "nope"], "no run nope"),
    ],
)
def test_the_command_wants_a_trace_or_a_run(cli, args, message):
    cli("run", str(example("blast")), "--strategy", "per-stage", "--quiet")
    done = cli("bench", "sizing", *args)
    assert done.exit_code == 2
    assert message in " ".join(done.output.split())
    assert "Traceback" not in done.output


def test_the_command_takes_worker_sizes_as_a_workflow_file_writes_them(cli):
    ran = cli("run", str(example("blast")), "--strategy", "per-stage", "--json")
    run_id = json.loads(ran.output)["run_id"]
    sized = ("--worker-memory", "32G", "--worker-disk", "500000")
    done = cli("bench", "sizing", "--run", run_id, "--sizer", "user", *sized)
    assert done.exit_code == 0, done.output
    assert "on 20 workers of 16 cores, 32 GB of memory and 500 GB of disk" in done.output
    for args, message in (
        (("--worker-memory", "lots"), "--worker-memory: expected a size such as 64G, 500M or "
                                      "64000 (MB), got 'lots'"),
        (("--worker-disk", "0"), "--worker-disk 0: expected a positive size"),
        (("--worker-cores", "0"), "--worker-cores 0: expected a positive number of cores"),
    ):  # fmt: skip
        done = cli("bench", "sizing", "--run", run_id, *args)
        assert done.exit_code == 2
        assert message in " ".join(done.output.split())


def test_a_worker_size_left_unsaid_grows_until_the_largest_task_fits(cli, tmp_path):
    trace = tmp_path / "big.csv"
    rows = [
        "category,cores,memory,disk,cpu_time,wall_time",
        "a,2,100000,10,20,10",
        "a,1,500,10,5,5",
    ]
    trace.write_text("\n".join(rows) + "\n")
    done = cli("bench", "sizing", "--trace", str(trace), "--sizer", "user")
    assert done.exit_code == 0, done.output
    assert "2 tasks on 20 workers of 16 cores, 128 GB of memory and 64 GB of disk" in done.output
    given = cli(
        "bench", "sizing", "--trace", str(trace), "--sizer", "user", "--worker-memory", "64G"
    )
    assert "of 16 cores, 64 GB of memory" in given.output  # as asked: the big task is unfit
    unfit = json.loads(
        cli("bench", "sizing", "--trace", str(trace), "--worker-memory", "64G", "--json").output
    )
    assert {r["unfit"] for r in unfit} == {1}
