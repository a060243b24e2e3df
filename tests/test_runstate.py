"""The run's state driven event by event, with no loop, backend or clock: what each event
changes and what it asks of the world outside."""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from nodes import NODE, Node

from backends.base import JobInfo, JobState
from learners.resources import Resources
from learners.sizing import DEFAULT_SIZER, make_sizer
from learners.sizing.base import Exhaustion, TaskFeatures
from learners.sizing.composite import PROBES
from orchestrator import runstate
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Outcome
from orchestrator.events import AttemptEnded, JobChanged, Tick, WorkerJoined, WorkerLost
from orchestrator.planner import Cancel, PerStage, Phase, Planner, Release, Submit, make_planner
from orchestrator.pool import AHEAD_DEPTH, Pool
from orchestrator.recorder import Recorder, request_json
from orchestrator.runs import RunState as Status
from orchestrator.runs import SavedRun
from orchestrator.runstate import (
    CancelJob,
    Launch,
    PilotRun,
    RunState,
    TaskState,
    WorkersDue,
    WorkersGone,
)
from orchestrator.store import TABLES
from workflows.spec import loads


class Rows:
    """A store that keeps what it is asked to write, by table, and what its recorder has
    queued for the next write (stage rows)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, tuple], dict] = {}
        self.recorder: Recorder | None = None

    def written(self) -> dict[tuple[str, tuple], dict]:
        """The rows as the engine's next write leaves them."""
        if self.recorder is not None:
            self.recorder.stage_rows()
        return self.rows

    def stage(self, table: str, key: dict, **fields) -> None:
        as_read = {k: v.as_dict() if hasattr(v, "as_dict") else v for k, v in fields.items()}
        self.rows.setdefault((table, tuple(key.values())), {}).update(as_read)  # as stored

    def table(self, name: str) -> list[dict]:
        return [fields for (table, _), fields in self.written().items() if table == name]

    def saved(self, *pilots: PilotRun) -> SavedRun:
        """The run as a store holding these rows would give it back to a resuming manager,
        with ``pilots`` (the engine records their requests, not the state)."""
        for pilot in pilots:
            self.stage(
                "pilots",
                {"run_id": "r1", "pilot_id": pilot.pilot_id},
                stage=",".join(pilot.stages),
                request=request_json(pilot.request),
                job_id=pilot.job_id,
                submit_t=pilot.submit_t,
            )

        def rows(name: str) -> list[dict]:
            keys, columns = TABLES[name]
            return [
                dict.fromkeys(columns) | dict(zip(keys, key, strict=True)) | fields
                for (table, key), fields in self.rows.items()
                if table == name
            ]

        self.written()
        run = next(iter(rows("runs")), {"status": "running"})  # the engine writes its row
        kept = [row for row in rows("pilots") if row["request"] is not None]
        return SavedRun(run, *map(rows, ("stages", "tasks", "attempts")), kept, [])


def new_state(
    text: str,
    planner: Planner | None = None,
    worker: Resources | None = None,
    share: dict[str, float] | None = None,
) -> tuple[RunState, Rows]:
    """A run of ``text`` that started when the loop's clock read 100 (``worker`` and ``share``:
    the largest worker a stage's pilot brings and a task's share of it, as its tasks'
    features say)."""
    workflow = loads(text)
    rows = Rows()
    recorder = rows.recorder = Recorder(rows, "r1", simulated=True)  # type: ignore[arg-type]
    state = RunState(
        workflow,
        "r1",
        recorder,
        planner=planner or make_planner("per-stage"),
        sizer=make_sizer(DEFAULT_SIZER, worker=worker or NODE),
        pool=Pool(),
        learner=None,
        workdir=Path("/nonexistent/work"),
        run_dir=Path("/nonexistent/work/.leadtime/r1"),
        features=lambda t: TaskFeatures(
            t.category, declared=t.declared, worker=worker, share=share or {}
        ),
    )
    state.apply(Tick(100.0))
    state.t0 = 100.0
    return state, rows


TWO_STAGES = """
name = "two"
[[stage]]
name = "a"
allocation = { cores = 2, time = "1h" }
tasks = { command = "true", count = 3, cores = 1, memory = "100M", disk = "10M" }
[[stage]]
name = "b"
after = ["a"]
allocation = { cores = 2, time = "1h" }
tasks = { command = "true", count = 1, cores = 1, memory = "100M", disk = "10M" }
"""


def success(launch: Launch) -> AttemptEnded:
    spec = launch.spec
    used = Resources(cores=1, memory=50, disk=1, wall=5)
    return AttemptEnded(
        launch.worker, spec, AttemptResult(spec.task_id, spec.attempt, Outcome.SUCCESS, used)
    )


def started_pilot(state: RunState, stage: str, job_id: str) -> list:
    (submit,) = [a for a in state.plan().actions if isinstance(a, Submit) and a.stages == (stage,)]
    pilot = state.submitting(submit)
    state.submitted(pilot, job_id)
    info = JobInfo(job_id, JobState.RUNNING, submit_time=100, eligible_time=100, start_time=110)
    return state.apply(JobChanged(info))


def test_a_run_goes_from_event_to_event_to_its_end():
    state, rows = new_state(TWO_STAGES)
    state.start()
    assert state.stages["a"].phase is Phase.READY and state.stages["b"].phase is Phase.WAITING
    assert state.place() == []  # no worker yet

    (due,) = started_pilot(state, "a", "7")
    assert isinstance(due, WorkersDue) and due.pilot.job_id == "7"
    assert state.apply(WorkerJoined(Node("n1", "7"))) == []
    state.apply(Tick(120.0))
    launches = state.place()
    assert [launch.spec.task_id for launch in launches] == ["a.0", "a.1"]  # two cores
    assert state.stages["a"].phase is Phase.RUNNING and state.stages["a"].start_t == 20.0

    state.apply(Tick(130.0))
    for launch in launches:
        state.apply(success(launch))
    assert rows.written()["stages", ("r1", "a")]["tasks_done"] == 2  # as they end, for a status
    (third,) = state.place()
    assert third.spec.task_id == "a.2"
    state.apply(success(third))
    state.advance()
    assert state.stages["a"].phase is Phase.DONE and state.stages["b"].phase is Phase.READY
    assert all(t.state is TaskState.DONE for t in state.stages["a"].tasks)
    assert {r["state"] for r in rows.table("tasks")} == {"done"}
    assert [r["outcome"] for r in rows.table("attempts")] == ["success"] * 3

    started_pilot(state, "b", "8")
    state.apply(WorkerJoined(Node("n2", "8")))
    (last,) = state.place()
    state.apply(success(last))
    state.advance()
    assert state.status is Status.DONE and state.end_t == 30.0


def test_the_planner_hears_at_once_of_all_but_successes_which_wait_at_most_its_period():
    state, _ = new_state(TWO_STAGES)
    state.start()
    assert state.plan_due == state.now  # never planned
    started_pilot(state, "a", "7")
    assert state.plan_due == state.now  # a pilot submitted and started since that plan
    state.plan()
    state.apply(WorkerJoined(Node("n1", "7")))
    assert state.plan_due == state.now
    first, second = state.place()
    assert state.plan_due == state.now  # the stage runs
    state.plan()
    planned = state.now
    assert state.plan_due == planned + runstate.PLAN_PERIOD_S  # per-stage asks no wake here

    state.apply(Tick(100.5))
    state.apply(success(first))
    (third,) = state.place()  # a.2 takes the core a.0 left
    assert state.plan_due == planned + runstate.PLAN_PERIOD_S
    state.apply(Tick(100 + planned + runstate.PLAN_PERIOD_S))
    assert state.plan_due == state.now  # its period is over

    state.plan()
    failed = AttemptResult("a.1", 1, Outcome.FAILED, Resources(wall=1), exit_code=1)
    state.apply(AttemptEnded(second.worker, second.spec, failed))
    assert state.plan_due == state.now  # a failure is heard at once
    state.plan()
    (again,) = state.place()  # a.1 again
    state.plan()
    state.apply(success(third))
    assert state.place() == [] and state.plan_due > state.now  # a.1 still runs on the pilot
    state.apply(success(again))
    assert state.place() == [] and state.plan_due == state.now  # the pilot left idle: at once
    state.plan()
    state.apply(WorkerLost("n1"))
    assert state.plan_due == state.now


def one_done_one_running() -> tuple[RunState, Rows, Launch, Launch]:
    """Stage a on pilot 7's worker n1: a.0 succeeded (first), a.1 runs (second)."""
    state, rows = new_state(TWO_STAGES)
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7")))
    first, second = state.place()
    state.apply(success(first))
    return state, rows, first, second


def test_a_result_counts_once_and_a_lost_attempt_runs_again():
    state, rows, first, second = one_done_one_running()
    state.apply(success(first))  # told twice
    assert state.stages["a"].done == 1

    state.apply(WorkerLost("n1"))  # the source answers the second attempt LOST
    lost = AttemptResult("a.1", 1, Outcome.LOST, Resources())
    state.apply(AttemptEnded(second.worker, second.spec, lost))
    task = state.task("a.1")
    assert task.state is TaskState.QUEUED and task.lost == {1}
    state.apply(success(second))  # the lost attempt's result, late: recorded, not counted
    assert state.stages["a"].done == 1
    assert {r["outcome"] for r in rows.table("attempts")} >= {"late success"}

    state.apply(WorkerJoined(Node("n2", "7")))
    again = [launch.spec for launch in state.place()]
    assert ("a.1", 2) in [(s.task_id, s.attempt) for s in again]


def lost_with(
    launch: Launch, *, vanished: bool, beside: frozenset[str] = frozenset()
) -> AttemptEnded:
    spec = launch.spec
    why = "[leadtime] worker left: disconnected" if vanished else "[leadtime] worker left: SIGTERM"
    result = AttemptResult(
        spec.task_id,
        spec.attempt,
        Outcome.LOST,
        Resources(),
        output_tail=why,
        vanished=vanished,
        beside=beside,
    )
    return AttemptEnded(launch.worker, spec, result)


def test_a_task_whose_worker_vanishes_under_it_max_attempts_times_fails_and_no_other_loss_counts():
    """A worker that vanishes without a word (a node crash, the OOM killer, a task that kills
    it) counts against each task it was running; its pilot's end, a cancellation or a worker
    leaving with a word counts against none, nor does an attempt only sent ahead to it."""
    text = MANY.replace('memory = "100M", disk', 'memory = "100M", max_attempts = 2, disk', 1)
    state, rows = new_state(text)
    state.start()
    started_pilot(state, "a", "7")
    for n in range(5):  # lost with a worker that said why: run again, however often
        state.apply(WorkerJoined(Node(f"left{n}", "7")))
        launches = state.place()
        state.apply(WorkerLost(f"left{n}"))
        for launch in launches:
            state.apply(lost_with(launch, vanished=False))
    assert state.status is Status.RUNNING and state.task("a.0").crashes == 0

    state.apply(WorkerJoined(Node("n1", "7", queues=True)))
    first = state.place()
    state.apply(ended(first[1], 0.01))  # done, and short: the next are sent ahead
    running, *ahead = state.place()
    assert ahead and state.stages["a"].waiting == {launch.spec.key for launch in ahead}
    state.apply(WorkerLost("n1"))  # the source tells it first, then answers its attempts
    for launch in (first[0], running, *ahead):
        state.apply(lost_with(launch, vanished=True))
    crashed = [state.task(launch.spec.task_id) for launch in (first[0], running)]
    assert [task.crashes for task in crashed] == [1, 1]
    assert all(state.task(launch.spec.task_id).crashes == 0 for launch in ahead)
    resumed, _ = new_state(text)
    resumed.restore(rows.saved())
    assert [resumed.task(task.task.id).crashes for task in crashed] == [1, 1]

    state.apply(WorkerJoined(Node("n2", "7")))
    again = None
    for _ in range(12):  # run the others until one that crashed is placed
        for launch in state.place():
            if state.task(launch.spec.task_id).crashes:
                again = launch
            else:
                state.apply(ended(launch, 1.0))
    assert again is not None
    state.apply(WorkerLost("n2"))
    state.apply(lost_with(again, vanished=True))
    assert state.status is Status.FAILED
    assert state.error == (
        f"task {again.spec.task_id}: its worker vanished while running it, 2 times (last: "
        "worker left: disconnected); a task that takes its worker down runs at most "
        "max_attempts (2) times"
    )


def test_a_resumed_run_holds_a_pilot_whose_worker_it_awaits_until_its_attempt_ends():
    """After its manager died, a pilot whose worker has not come back yet still runs that
    worker's attempt: it is busy (a planner releases only an idle pilot, and that release
    would kill the attempt) until the attempt ends, whether its worker comes back or not."""
    state, rows, _, second = one_done_one_running()
    (pilot,) = state.pilots.values()
    for comes_back in (True, False):
        resumed, _ = new_state(TWO_STAGES)
        (taken,) = resumed.restore(rows.saved(pilot))
        resumed.taken_over(taken, "7")
        resumed.apply(JobChanged(JobInfo("7", JobState.RUNNING, start_time=110)))
        assert resumed.expected_on == {second.spec.key: pilot.pilot_id}
        (view,) = resumed.pilot_views()
        assert view.busy  # nothing of it in the pool yet
        if comes_back:
            resumed.apply(WorkerJoined(Node("n1", "7")))
            assert resumed.pilot_views()[0].busy
        worker = Node("n1", "7") if comes_back else Node("n1", "")
        resumed.apply(success(Launch(worker, second.spec)))
        assert resumed.expected_on == {}
        assert not resumed.pilot_views()[0].busy


def test_attempts_a_failed_run_stops_are_recorded_stopped_and_run_again_by_its_resume():
    """A task that fails for good ends the run, whose end stops the attempts still running:
    their workers answer them lost, but no worker went wrong, so they are recorded as stopped
    with the run, counted as no loss, and the run's resume runs them again."""
    text = TWO_STAGES.replace(
        'command = "true", count = 3,', 'command = "true", count = 3, max_attempts = 1,'
    )
    state, rows = new_state(text)
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7")))
    first, second = state.place()
    spec = first.spec
    failed = AttemptResult(
        spec.task_id, spec.attempt, Outcome.FAILED, Resources(wall=1), exit_code=3
    )
    state.apply(AttemptEnded(first.worker, spec, failed))
    assert state.status is Status.FAILED

    state.apply(lost_with(second, vanished=False))  # the worker's word as the release stops it
    attempts = {(r["outcome"], r["cause"]) for r in rows.table("attempts")}
    assert ("stopped", "stopped with the run (failed)") in attempts
    assert state.stages["a"].causes == {"failed": 1}
    assert state.task(second.spec.task_id).crashes == 0

    rows.stage("runs", {"run_id": "r1"}, status="failed")
    resumed, _ = new_state(text)
    resumed.restore(rows.saved())
    stopped = resumed.task(second.spec.task_id)
    assert stopped.state is not TaskState.DONE and stopped.lost == {second.spec.attempt}
    started_pilot(resumed, "a", "8")
    resumed.apply(WorkerJoined(Node("n2", "8")))
    again = {launch.spec.key for launch in resumed.place()}
    assert (second.spec.task_id, second.spec.attempt + 1) in again


def test_a_task_at_the_limit_names_the_tasks_its_workers_held_each_time_they_vanished():
    """Every task a vanished worker was running counts the loss (HyperQueue's crash limit
    does the same), so one that ran beside the culprit each time may reach the limit first:
    the run's error names the tasks that were beside it every time, and no other."""
    text = MANY.replace('memory = "100M", disk', 'memory = "100M", max_attempts = 2, disk', 1)
    state, rows = new_state(text)
    state.start()
    started_pilot(state, "a", "7")
    for n, others in enumerate([{"a.1", "a.2"}, {"a.1", "a.5"}]):
        state.apply(WorkerJoined(Node(f"n{n}", "7")))
        (launch,) = [x for x in state.place() if x.spec.task_id == "a.0"]
        state.apply(WorkerLost(f"n{n}"))
        state.apply(lost_with(launch, vanished=True, beside=frozenset(others)))
        if n == 0:
            assert state.task("a.0").beside == {"a.1", "a.2"}
            resumed, _ = new_state(text)
            resumed.restore(rows.saved())
            assert resumed.task("a.0").beside == {"a.1", "a.2"}
    assert state.status is Status.FAILED
    assert state.error == (
        "task a.0: its worker vanished while running it, 2 times (last: worker left: "
        "disconnected), and a.1 was beside it each time: either may be what took its workers "
        "down; a task that takes its worker down runs at most max_attempts (2) times"
    )


@pytest.mark.parametrize(
    ("beside", "told"),
    [
        (["b.10", "b.9", "a.2"], "a.2, b.9 and b.10 were beside it each time: any"),
        ([f"a.{i}" for i in range(8)], "a.0, a.1, a.2, a.3, a.4 and 3 more were beside it"),
    ],
)
def test_the_tasks_beside_are_named_in_task_order_and_at_most_five(beside, told):
    assert told in runstate._suspects(frozenset(beside))


def test_a_failed_dependency_cancels_the_pilots_after_it_and_sends_workers_home():
    state, _ = new_state(TWO_STAGES)
    state.start()
    started_pilot(state, "a", "7")
    b = state.submitting(Submit(("b",), state.stages["b"].spec.allocation, after=("a-0",)))
    assert b.request.dependency is not None and b.request.dependency.job_ids == ("7",)
    state.submitted(b, "8")
    state.apply(WorkerJoined(Node("n1", "7")))
    ended = JobInfo("7", JobState.FAILED, reason="NodeFail", start_time=110, end_time=130)
    effects = state.apply(JobChanged(ended))
    gone = [e for e in effects if isinstance(e, WorkersGone)]
    assert [w.id for w in gone[0].workers] == ["n1"]
    assert CancelJob("8") in effects and b.released

    stranger = Node("x", "999")
    assert state.apply(WorkerJoined(stranger)) == [WorkersGone(None, [stranger])]


def test_a_task_that_fits_no_worker_fails_the_run_with_why():
    state, _ = new_state(TWO_STAGES.replace('memory = "100M"', 'memory = "9G"', 1))
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7")))
    assert state.place() == []
    assert state.status is Status.FAILED and "a.0" in (state.error or "")
    assert state.stages["a"].phase is Phase.FAILED


def ended(launch: Launch, wall: float) -> AttemptEnded:
    spec = launch.spec
    used = Resources(cores=1, memory=50, disk=1, wall=wall)
    return AttemptEnded(
        launch.worker, spec, AttemptResult(spec.task_id, spec.attempt, Outcome.SUCCESS, used)
    )


MANY = TWO_STAGES.replace("count = 3", "count = 12")
LONG = TWO_STAGES.replace("count = 3", f"count = {3 * AHEAD_DEPTH}")  # more than sent ahead


def test_short_tasks_are_sent_ahead_to_full_workers_that_queue_and_long_ones_are_not():
    """Once a stage's tasks are known to be short, a full worker agent is sent up to
    AHEAD_DEPTH capacities' worth more, which it starts as room frees; never a simulated
    worker, never long tasks."""
    for queues, wall, ahead in ((True, 0.001, 2 * AHEAD_DEPTH), (True, 5.0, 0), (False, 0.001, 0)):
        state, _ = new_state(LONG)
        state.start()
        started_pilot(state, "a", "7")
        state.apply(WorkerJoined(Node("n1", "7", queues=queues)))
        first = state.place()
        assert len(first) == 2  # nothing is known of the stage's tasks yet: no more than room
        assert not state.sent_ahead
        state.apply(ended(first[0], wall))
        assert len(state.place()) == 1 + ahead
        assert state.sent_ahead == (ahead > 0)


def test_attempts_sent_ahead_are_recorded_waiting_until_their_worker_has_room():
    """The record calls running only what the worker runs: an attempt sent ahead waits, with
    no start, until a result frees its room, and starts then."""
    state, rows = new_state(LONG)
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7", queues=True)))
    first = state.place()
    state.apply(Tick(110.0))
    state.apply(ended(first[0], 0.001))
    sent = state.place()  # one into the room, the others ahead
    attempts = {key[1][1]: fields for key, fields in rows.written().items() if key[0] == "attempts"}
    record = [attempts[launch.spec.task_id] for launch in sent]
    assert [a["outcome"] for a in record] == ["running"] + ["waiting"] * 2 * AHEAD_DEPTH
    assert record[0]["start_t"] == 10.0 and all("start_t" not in a for a in record[1:])
    stage = state.stages["a"]
    assert len(stage.running) == 2 and len(stage.waiting) == 2 * AHEAD_DEPTH
    assert state.sizer.running.count("a") == 2 + 2 * AHEAD_DEPTH  # the sizer counts both

    state.apply(Tick(112.0))
    state.apply(ended(first[1], 0.001))  # a core frees: the first sent ahead starts
    rows.written()
    assert (record[1]["outcome"], record[1]["start_t"]) == ("running", 12.0)
    assert [a["outcome"] for a in record[2:]] == ["waiting"] * (2 * AHEAD_DEPTH - 1)
    assert len(stage.running) == 2 and len(stage.waiting) == 2 * AHEAD_DEPTH - 1
    assert state.sizer.running.count("a") == 1 + 2 * AHEAD_DEPTH


def test_pilots_let_go_for_one_reason_in_one_pass_are_noted_once():
    state, _ = new_state(TWO_STAGES)
    seven = [Release(f"p-{i}", "no stage needs it again: released") for i in range(7)]
    state.note_let_go([*seven, Cancel("q-0", "pending, and no stage needs it: cancelled")])
    assert [text for _, text in state.notes] == [
        "7 pilots (p-0, p-1, p-2, p-3, p-4 and 2 more), each: no stage needs it again: released",
        "pilot q-0: pending, and no stage needs it: cancelled",
    ]


def test_pilots_that_end_on_their_own_between_passes_are_noted_once_per_way():
    """Units of one task reach their time limit together: one note for them at the next
    pass, not one each."""
    state, _ = new_state(TWO_STAGES)
    state.start()
    for job in ("7", "8", "9"):
        pilot = state.submitting(Submit(("a",), state.stages["a"].spec.allocation))
        state.submitted(pilot, job)
    for job, how in (("7", JobState.TIMEOUT), ("8", JobState.TIMEOUT), ("9", JobState.FAILED)):
        state.apply(JobChanged(JobInfo(job, how, start_time=110, end_time=3710)))
    state.advance()
    assert [text for _, text in state.notes][-2:] == [
        "2 pilots (a-0 and a-1), each: ended TIMEOUT",
        "pilot a-2: ended FAILED",
    ]


def test_the_sizer_is_told_which_attempts_of_a_category_run_and_since_when():
    """What lets a sizer count the attempts that outlast every record (censored records):
    each attempt from its start on its worker to its result."""
    state, _ = new_state(TWO_STAGES)
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7")))
    first, second = state.place()  # as the run starts
    running = state.sizer.running
    state.apply(Tick(170.0))
    state.place()
    assert running.now == 70.0
    assert running.outlasting("a", 70.0) == 2 and running.outlasting("a", 71.0) == 0
    state.apply(success(first))
    assert running.outlasting("a", 0.0) == 1
    state.apply(success(second))
    assert running.outlasting("a", 0.0) == 0


def test_the_sizer_is_told_the_tasks_submitted_as_their_stage_becomes_ready():
    """What select shares a workflow's retry room over: each stage's tasks as it becomes
    ready, and on resume only those still to run."""
    state, rows = new_state(TWO_STAGES)
    state.start()
    running = state.sizer.running
    assert (running.submitted("a"), running.submitted("b")) == (3, 0)
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7")))
    for launch in state.place():
        state.apply(success(launch))
    assert running.submitted() == 3  # a result submits nothing
    resumed, _ = new_state(TWO_STAGES)
    resumed.restore(rows.saved())
    assert resumed.sizer.running.submitted("a") == 1  # a.0 and a.1 are done
    (third,) = state.place()
    state.apply(success(third))
    state.advance()
    assert state.stages["b"].phase is Phase.READY
    assert (running.submitted("a"), running.submitted("b")) == (3, 1)


def test_the_sizer_is_told_how_many_tasks_wait_for_room_as_it_sizes_each():
    """What tells a sizer whether a task it slows leaves cores another would take."""
    state, _ = new_state(TWO_STAGES)
    state.start()
    assert state.sizer.running.queued is None  # nothing sized yet
    seen: list[int | None] = []
    allocate = state.sizer.allocate

    def spy(task, previous=None, exhaustion=None):
        seen.append(state.sizer.running.queued)
        return allocate(task, previous, exhaustion)

    state.sizer.allocate = spy  # type: ignore[method-assign]
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7")))
    first, second = state.place()
    assert seen == [3, 2, 1]  # the third waits for room, sized the last of them
    for launch in (first, second):
        state.apply(success(launch))
    (third,) = state.place()
    state.apply(success(third))
    state.advance()
    state.place()
    assert seen == [3, 2, 1, 1]  # stage b's one task, alone


UNSIZED = """
name = "unsized"
[[stage]]
name = "a"
allocation = { cores = 2, time = "1h" }
tasks = { command = "true", count = 20 }
"""


def test_a_category_nothing_tells_the_size_of_starts_with_probes_and_more_per_record():
    """No size declared and no stage share (this state's tasks carry none): the sizer's
    first PROBES attempts take whole workers while the others wait for their records, asked
    again at every placement, PROBES more under way per record (issue 16)."""
    state, _ = new_state(UNSIZED)
    state.start()
    started_pilot(state, "a", "7")
    for i in range(12):
        state.apply(WorkerJoined(Node(f"n{i}", "7")))
    first = state.place()
    assert len(first) == PROBES
    assert all(launch.spec.allocation.cores == NODE.cores for launch in first)
    assert state.place() == []  # still no record: the rest wait, though workers are free
    state.apply(success(first[0]))
    assert len(state.place()) == PROBES + 1  # 2 x PROBES under way for one record
    assert state.place() == []


def test_a_starved_attempt_teaches_the_sizer_the_cores_it_was_given_not_the_share_it_got():
    """On crowded CPUs an attempt uses what it gets: sized from that, the next attempts would
    get fewer cores, crowd the CPUs more, and use less still."""
    state, _, _, second = one_done_one_running()
    seen = []
    observe = state.sizer.observe
    state.sizer.observe = lambda record: (seen.append(record), observe(record))
    spec = second.spec
    got = Resources(cores=0.2, memory=50, disk=1, wall=5)
    starved = AttemptResult(spec.task_id, spec.attempt, Outcome.SUCCESS, got, starved=True)
    state.apply(AttemptEnded(second.worker, spec, starved))
    assert seen[0].peak == got.with_("cores", spec.allocation.cores) and spec.allocation.cores == 1
    assert starved.sizing_peak(spec.allocation.with_("cores", 0.1)) == got  # it used more
    assert replace(starved, starved=False).sizing_peak(spec.allocation) == got


SHORT_PILOTS = TWO_STAGES.replace('time = "1h"', 'time = "1m"', 1)


def cut_by_time_limit(launch: Launch) -> AttemptEnded:
    """The attempt's worker left as its pilot's time was up."""
    spec = launch.spec
    result = AttemptResult(
        spec.task_id,
        spec.attempt,
        Outcome.LOST,
        Resources(),
        output_tail="[leadtime] stopped: worker shut down: the pilot's time is up",
    )
    return AttemptEnded(launch.worker, spec, result)


def test_a_task_longer_than_its_pilots_time_limit_fails_at_once_naming_the_allocation_time():
    """Its attempt had the pilot's whole minute and did not finish: another pilot of the same
    minute cannot finish it either (it was retried for ever)."""
    state, _ = new_state(SHORT_PILOTS)
    state.start()
    started_pilot(state, "a", "7")  # started at 110, a minute's time limit
    state.apply(WorkerJoined(Node("n1", "7", end_time=170.0)))
    state.apply(Tick(111.0))
    first, *_ = state.place()
    state.apply(Tick(170.2))
    state.apply(cut_by_time_limit(first))
    assert state.status is Status.FAILED
    assert state.error == (
        f"task {first.spec.task_id}: it ran 59 s until its pilot's time limit ended it, the "
        "whole 1 min its pilots get: give stage a a longer allocation time"
    )


def test_a_task_its_pilots_end_cut_short_runs_again_only_where_it_gets_longer():
    """Started late on its pilot, it had less than the pilot's time: it runs again, on a
    worker whose pilot leaves it more time than it had."""
    state, _ = new_state(SHORT_PILOTS)
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7", end_time=170.0)))
    state.apply(Tick(150.0))
    launches = state.place()
    state.apply(Tick(170.1))
    for launch in launches:
        state.apply(cut_by_time_limit(launch))
    assert state.status is Status.RUNNING
    task = state.task(launches[0].spec.task_id)
    assert task.outlasted == pytest.approx(20.1) and task.cut == 0
    state.apply(WorkerJoined(Node("n2", "7", end_time=185.0)))  # 15 s left: too little
    assert state.place() == []
    state.apply(WorkerJoined(Node("n3", "7", end_time=230.0)))
    placed = {launch.spec.task_id: launch.worker.id for launch in state.place()}
    cut = {launch.spec.task_id for launch in launches}
    assert {placed[t] for t in cut} == {"n3"} and "n2" in placed.values()  # a task never cut


def test_a_task_cut_on_whole_pilots_shorter_than_its_stage_may_get_fails_at_max_attempts():
    """An automatic allocation may get longer pilots (up to its max_time): a task that had
    the whole of one and did not finish runs again, at most max_attempts times."""
    text = SHORT_PILOTS.replace(
        'allocation = { cores = 2, time = "1m" }', 'allocation = { max_time = "1h" }', 1
    ).replace('memory = "100M", disk', 'memory = "100M", max_attempts = 2, disk', 1)
    state, _ = new_state(text)
    state.start()
    for n in range(2):
        started_pilot(state, "a", str(n))
        (pilot,) = [p for p in state.pilots.values() if p.job_id == str(n)]
        pilot.request = replace(pilot.request, time_limit_s=60.0)
        start = 110.0 + 60.0 * n
        state.apply(JobChanged(JobInfo(str(n), JobState.RUNNING, start_time=start)))
        state.apply(WorkerJoined(Node(f"n{n}", str(n), end_time=start + 60.0)))
        state.apply(Tick(start + 1.0))
        (launch,) = [x for x in state.place() if x.spec.task_id == "a.0"]
        end = start + 60.0
        state.apply(Tick(end))
        state.apply(cut_by_time_limit(launch))
        state.apply(WorkerLost(f"n{n}"))
        state.apply(JobChanged(JobInfo(str(n), JobState.TIMEOUT, start_time=start, end_time=end)))
        assert state.task("a.0").cut == n + 1
        assert state.status is (Status.RUNNING if n == 0 else Status.FAILED)
    assert state.error == (
        "task a.0: it ran 59 s until its pilot's time limit ended it, 2 times on a whole pilot: "
        "give stage a a longer allocation max_time"
    )


def one_worker(text: str, capacity: Resources, *args: Any, **kwargs: Any) -> RunState:
    """A run of ``text`` (:func:`new_state` of it with ``args`` and ``kwargs``) whose stage
    a's pilot started, with one worker of ``capacity``."""
    state, _ = new_state(text, *args, **kwargs)
    state.start()
    started_pilot(state, "a", "7")
    state.apply(WorkerJoined(Node("n1", "7", capacity=capacity)))
    return state


def killed_at(state: RunState, resource: str, amount: float) -> AttemptSpec:
    """The first task placed, killed for ``resource`` at ``amount``."""
    first, *_ = state.place()
    spec = first.spec
    used = Resources(cores=1, memory=50, disk=1, wall=1).with_(resource, amount)
    result = AttemptResult(
        spec.task_id, spec.attempt, Outcome.EXHAUSTED, used, exhaustion=Exhaustion(resource, amount)
    )
    state.apply(AttemptEnded(first.worker, spec, result))
    return spec


@dataclass
class SizedToTasks(PerStage):
    """A stage's pilot as per-stage submits it, taken as sized to the tasks it holds (as
    elastic's units are): the run's state waits for one that holds a grown task."""

    sized_to_tasks = True


def test_a_task_grown_beyond_the_workers_there_are_waits_for_a_pilot_sized_to_it():
    """Where pilots are sized to their tasks, a task killed at all of its 1 GB worker is not
    cut down to it nor failed: it waits, and its stage's tasks now take its new size (what the
    planner sizes the next pilots by), up to its stage's share of a node (4 GB)."""
    text = TWO_STAGES.replace('memory = "100M", disk = "10M" }', 'disk = "10M" }', 1)
    own, share = Resources(cores=2, memory=4000, disk=4000), {"cores": 1.0, "memory": 500.0}
    state = one_worker(text, Resources(2, 1000, 4000), SizedToTasks(), own, share)
    spec = killed_at(state, "memory", 1000.0)
    assert state.place() == []
    assert state.status is Status.RUNNING
    grown = state.stages["a"].last_allocation
    assert grown is not None and 1000 < grown.memory <= 4000
    assert state.stages["a"].outgrown and state.stage_views()["a"].outgrown  # the planner is told
    assert state.plan_again  # at once: in virtual time no other event may come for an hour
    state.plan()
    assert not state.plan_again
    assert state.place() == [] and not state.plan_again  # seen: no pass after pass
    assert state.task(spec.task_id).allocation == grown
    # A worker that holds it comes: the task runs there.
    state.apply(WorkerJoined(Node("n2", "7", capacity=Resources(2, 4000, 4000))))
    (again,) = [launch for launch in state.place() if launch.spec.task_id == spec.task_id]
    assert again.worker.id == "n2" and again.spec.allocation == grown
    assert not state.stages["a"].outgrown


@pytest.mark.parametrize(
    ("planner", "worker", "largest"),
    [(None, Resources(2, 1000, 4000), "1 GB"), (SizedToTasks(), Resources(2, 4000, 4000), "4 GB")],
    ids=["per-stage", "sized to tasks"],
)
def test_a_task_killed_at_all_the_largest_worker_it_may_get_has_fails_saying_what_to_raise(
    planner, worker, largest
):
    """The workers that came are smaller than the sizer's guess (4 GB): a task killed at the
    whole 1 GB one has cannot be cut down to fit it again; where pilots are sized to their
    tasks, at all of its stage's share of a node (4 GB). The run says so in a user's terms
    (it printed the raw allocation)."""
    text = TWO_STAGES.replace('memory = "100M", disk = "10M" }', 'disk = "10M" }', 1)
    own = worker if planner else None
    state = one_worker(text, worker, planner, own)
    spec = killed_at(state, "memory", worker.memory)
    state.place()
    assert state.status is Status.FAILED
    assert state.error == (
        f"task {spec.task_id}: needs more memory than a whole worker has, {largest} (it "
        f"reached {largest}): give its stage's allocation more memory"
    )


def test_a_task_grown_beyond_the_disk_of_every_worker_fails_as_no_pilot_asks_for_disk():
    """A pilot asks for cores and memory, never disk (its workers have their node's): a task
    killed at all of its worker's disk would wait for ever for a larger one."""
    text = TWO_STAGES.replace('memory = "100M", disk = "10M" }', 'memory = "100M" }', 1)
    own = Resources(cores=2, memory=4000, disk=8000)
    state = one_worker(text, Resources(2, 4000, 4000), SizedToTasks(), own)
    spec = killed_at(state, "disk", 4000.0)
    assert spec.allocation.disk == 4000  # cut to the worker there is
    state.place()
    assert state.status is Status.FAILED
    assert "needs more disk than a whole worker has, 4 GB" in (state.error or "")
