"""The state of one run, changed only by events: the engine's pure half.

:meth:`RunState.apply` takes one :mod:`~orchestrator.events` event and returns
what must be done outside (workers to start or send home, jobs to cancel);
:meth:`RunState.plan` and :meth:`RunState.place` say which pilots to submit,
cancel or release and which attempts to start. Nothing here awaits, reads a
clock (time comes as :class:`~orchestrator.events.Tick`) or talks to a backend;
every change is queued with the :class:`~orchestrator.recorder.Recorder`, which
the engine writes before it acts. So a run can be driven, and tested, event by
event.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, assert_never

from backends.base import Dependency, JobInfo, JobState, PilotRequest
from learners.resources import PACKED, Resources
from learners.sizing.base import Bound, Exhaustion, Record, Sizer, TaskFeatures, Unfittable
from orchestrator import autoalloc, forecast
from orchestrator.agent import footprint
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Outcome, cause, cause_kind
from orchestrator.breaker import Breaker
from orchestrator.events import AttemptEnded, Event, JobChanged, Tick, WorkerJoined, WorkerLost
from orchestrator.forecast import Durations
from orchestrator.human import count, duration, listing, per_pilot, unfittable
from orchestrator.planner import Cancel, Phase, PilotView, Plan, Planner, Release, StageView, Submit
from orchestrator.pool import AHEAD_DEPTH, Pool, Slot, Worker
from orchestrator.recorder import Recorder, request_of
from orchestrator.runs import ON_WORKER, STOPPED, OnWorker, SavedRun
from orchestrator.runs import RunState as Status
from orchestrator.summary import PilotFigures, RunSummary, StageFigures, summarize
from orchestrator.workerqueue import Key
from workflows.spec import Allocation, Stage, Task, Workflow

AHEAD_BELOW_S = 0.1
"""A stage whose tasks take less than this on average also sends them ahead, to full workers
that hold them until they have room: the manager's round trip then leaves no worker idle."""
AHEAD_S = 0.2
"""How much of such a stage's work a worker holds ahead, on average (at least a capacity's
worth, at most ``pool.AHEAD_DEPTH``): enough for the manager to gather many results into a
pass, and a stage's last tasks wait about this long at most behind others."""
TIME_UP_S = 1.0
"""An attempt lost this close to its worker's end (or later) was ended by its pilot's time."""
EMPTY_RELEASE_S = 60.0
"""A released pilot whose workers have all left, yet whose job has not ended this long after,
is cancelled: the worker's step on a node that died never ends, and the job with it, until
Slurm notices the node (5 minutes by default, ``SlurmdTimeout``). A release ends in seconds
once the workers are gone (they leave, then finish moving what they keep)."""
WHOLE_PILOT_S = 30.0
"""An attempt started within this much (or a twentieth of its pilot's time limit) of its
pilot's start had the pilot's whole time: the worker's start is all that came before."""
PLAN_PERIOD_S = 5.0
"""The longest the planner waits to hear of attempts that succeeded: a pass that took in
nothing else places tasks without planning while its last plan is younger than this (Parsl
consults its scaling strategy every 5 s by default, ``strategy_period``). A stage's width
shrinks one task at a time; anything else (a job's state, a worker, a stage's turn or end, an
attempt that failed, was killed or lost, a pilot left idle) has the planner consulted at once."""


class WaitLearner(Protocol):
    """The queue-wait learner as the run uses it (see learners.queue_wait)."""

    def observe_wait(
        self, allocation: Allocation, prediction: Any, wait: float, planned: float | None
    ) -> bool | None:
        """Learn an observed wait; return whether the planned wait hit (None without one)."""
        ...


class TaskState(StrEnum):
    """Where a task is in the run (``tasks.state`` in the store)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class TaskRun:
    task: Task
    features: TaskFeatures
    state: TaskState = TaskState.QUEUED
    attempts: int = 0
    running: int | None = None
    """The attempt in flight: the only one whose result counts."""
    failures: int = 0
    allocation: Resources | None = None
    previous: Resources | None = None
    exhaustion: Exhaustion | None = None
    lost: set[int] = field(default_factory=set)
    """Attempts given up on: a result of one of them comes late, and never counts."""
    crashes: int = 0
    """Times its worker vanished while running it: at ``max_attempts`` the task fails, as
    one that takes its worker down would otherwise run again for ever."""
    beside: frozenset[str] | None = None
    """The other tasks its worker held each of those times (None before the first): when
    the task reaches the limit, they may as well be what took its workers down."""
    outlasted: float = 0.0
    """The longest it ran before its pilot's time limit ended it: it needs more than that."""
    cut: int = 0
    """Times its pilot's time limit ended it after it had the pilot's whole time: at
    ``max_attempts`` it fails, as a task longer than its pilots would run again for ever."""


@dataclass
class StageRun:
    spec: Stage
    tasks: list[TaskRun]
    phase: Phase = Phase.WAITING
    queue: deque[TaskRun] = field(default_factory=deque)
    running: dict[Key, float] = field(default_factory=dict)
    """Its attempts that run, and when each started."""
    waiting: set[Key] = field(default_factory=set)
    """Its attempts sent ahead to a busy worker, not started yet."""
    durations: Durations = field(default_factory=Durations)
    done: int = 0
    attempts: int = 0
    ready_t: float | None = None
    start_t: float | None = None
    end_t: float | None = None
    last_allocation: Resources | None = None
    outgrown: bool = False
    """Its next task waits for a worker larger than any there is (as of the last placement)."""
    causes: Counter[str] = field(default_factory=Counter)
    """Attempts that did not succeed, by kind of cause (lost, memory, disk, wall, failed)."""
    earlier: list[tuple[float, float | None]] = field(default_factory=list)
    """Run times and cores of its tasks in earlier runs, for an automatic allocation."""


@dataclass
class PilotRun:
    pilot_id: str
    stages: tuple[str, ...]
    allocation: Allocation
    request: PilotRequest
    submit_t: float
    predicted_wait: float | None = None
    prediction: Any = None
    job_id: str | None = None
    info: JobInfo | None = None
    released: bool = False
    hit: bool | None = None
    workers: list[Worker] = field(default_factory=list)
    joined: int = 0
    """Workers that joined it, ever (``workers`` loses those lost)."""
    finished: int = 0
    """Tasks that finished on its workers."""
    emptied: bool = False
    """It was left released with no worker (and is cancelled ``EMPTY_RELEASE_S`` later if its
    job is still alive)."""

    @property
    def state(self) -> JobState | None:
        return None if self.info is None else self.info.state

    @property
    def live(self) -> bool:
        return self.info is None or not self.info.state.finished


# ---- what applying an event asks of the world outside ----------------------------


@dataclass(frozen=True, slots=True)
class WorkersDue:
    """The pilot started: its worker source brings the workers that come with it."""

    pilot: PilotRun
    info: JobInfo


@dataclass(frozen=True, slots=True)
class WorkersGone:
    """These workers' allocation ended (``pilot`` None: they belong to no pilot of the run)."""

    pilot: PilotRun | None
    workers: Sequence[Worker]


@dataclass(frozen=True, slots=True)
class CancelJob:
    """A pilot that can never start (its dependency failed), or whose job outlived its
    release, is cancelled."""

    job_id: str


@dataclass(frozen=True, slots=True)
class Launch:
    """Start an attempt on a worker (its slot is taken already)."""

    worker: Worker
    spec: AttemptSpec


Effect = WorkersDue | WorkersGone | CancelJob


class RunState:
    """Stages, tasks, pilots and the pool of one run of ``workflow``."""

    def __init__(
        self,
        workflow: Workflow,
        run_id: str,
        recorder: Recorder,
        *,
        planner: Planner,
        sizer: Sizer,
        pool: Pool,
        learner: WaitLearner | None,
        workdir: Path,
        run_dir: Path,
        features: Callable[[Task], TaskFeatures],
    ) -> None:
        self.workflow = workflow
        self.run_id = run_id
        self.recorder = recorder
        self.planner = planner
        self.sizer = sizer
        self.pool = pool
        self.learner = learner
        self.workdir = workdir
        self.stages: dict[str, StageRun] = {
            stage.name: StageRun(
                stage, [TaskRun(t, features(t)) for t in stage.expand(str(workdir), str(run_dir))]
            )
            for stage in workflow.stages
        }
        self.pilots: dict[str, PilotRun] = {}
        self.live: dict[str, PilotRun] = {}
        """The pilots whose job has not ended, in the order they came: what a pass looks at
        (a long elastic run has submitted many more pilots than it holds)."""
        self._views: dict[str, tuple[tuple[object, ...], PilotView]] = {}
        """Each live pilot's view for the planner, with what it was made from."""
        self.by_job: dict[str, PilotRun] = {}
        """Every submitted pilot by its job id: the pilot id its workers give."""
        self.notes: deque[tuple[float, str]] = deque(maxlen=50)
        self.notes_total = 0
        """Notes taken since the start (``notes`` keeps the last 50)."""
        self._standing: frozenset[str] = frozenset()
        """The planner's notes of the last plan: repeated ones are not noted again."""
        self._ended: dict[str, list[str]] = {}
        """Pilots that ended on their own since the last pass, by how: one note for each way
        (a stage's units reach their time limit together)."""
        self._emptied: dict[str, float] = {}
        """Released pilots whose workers have all left, until their job ends: by pilot id,
        the run's time when it is cancelled if it has not."""
        self.status = Status.RUNNING
        self.error: str | None = None
        self.end_t: float | None = None
        self.breaker = Breaker()
        self.t0 = 0.0
        """The loop's clock when the run started."""
        self.clock = 0.0
        """The loop's clock as of the last :class:`Tick`."""
        self.sent_ahead = False
        """The last :meth:`place` sent an attempt ahead: workers have work for a while."""
        self.expected: dict[str, list[AttemptSpec]] = {}
        """Attempts of a resumed run still on their workers, by worker id."""
        self.expected_on: dict[Key, str] = {}
        """The pilot each of those attempts ran on, while it is awaited: until its worker
        comes back, or its end is known."""
        self._planned_outgrown: dict[str, Resources | None] = {}
        """The stages waiting for a larger worker as the last plan saw them."""
        self._unheard = True
        """The run changed since the last plan otherwise than by attempts that succeeded."""
        self._idled = False
        """A placement since the last plan left a pilot whose attempts had ended idle."""
        self._plan_by = 0.0
        """The run's time by which the last plan is to be made again, whatever happens."""

    @property
    def now(self) -> float:
        """The run's time: seconds since it started, as of the last tick."""
        return self.clock - self.t0

    @property
    def running(self) -> bool:
        return self.status == Status.RUNNING

    # ---- events ---------------------------------------------------------------

    def apply(self, event: Event) -> list[Effect]:
        succeeded = isinstance(event, AttemptEnded) and event.result.outcome == Outcome.SUCCESS
        if not (succeeded or isinstance(event, Tick)):
            self._unheard = True  # what the planner is to hear of at once (PLAN_PERIOD_S)
        match event:
            case Tick(t):
                self.clock = t
                return self._stuck() if self._emptied else []
            case JobChanged(info):
                return self._on_job(info)
            case AttemptEnded(worker, spec, result):
                self._on_result(worker, spec, result)
                return []
            case WorkerJoined(worker):
                return self._on_join(worker)
            case WorkerLost(worker_id):
                self._on_lost_worker(worker_id)
                return []
            case _:
                assert_never(event)

    def start(self) -> None:
        """The stages that wait for none are ready."""
        for stage in self.stages.values():
            if not stage.spec.after:
                self._set_phase(stage, Phase.READY)

    def advance(self) -> None:
        """Stages whose turn came are ready, those all done are done; the run's status
        follows. The pilots that ended since the last pass are noted."""
        for line in per_pilot(self._ended):
            self.note(line)
        self._ended.clear()
        for stage in self.stages.values():
            if stage.phase == Phase.WAITING and all(
                self.stages[a].phase == Phase.DONE for a in stage.spec.after
            ):
                self._set_phase(stage, Phase.READY)
            if stage.phase.open and stage.done == len(stage.tasks):
                self._set_phase(stage, Phase.DONE)
        if any(s.phase == Phase.FAILED for s in self.stages.values()):
            self.status = Status.FAILED
        elif all(s.phase == Phase.DONE for s in self.stages.values()):
            self.status = Status.DONE
            self.end_t = self.now

    def stop(self, status: Status, error: str) -> None:
        """The run ends as ``status`` (the first reason given is kept)."""
        self.status = status
        self.error = self.error or error

    # ---- restoring a run whose manager died -----------------------------------

    def restore(self, saved: SavedRun) -> list[PilotRun]:
        """The run as the store left it: what is done stays done (unless a later stage still
        needs its outputs, which are gone, or its stage is one of ``saved.again``, whose
        tasks changed), attempts that were running are expected from their workers
        (:attr:`expected`); its pilots, to be taken over. A run that failed is taken up with
        its stages open again, and each task not done gets its ``max_attempts`` anew."""
        retried, again = saved.run["status"] == Status.FAILED, saved.again
        tasks = {row["task_id"]: row for row in saved.tasks}
        for row in saved.attempts:
            self._restore_attempt(row)
        phases = {row["stage"]: Phase(row["state"]) for row in saved.stages}
        for stage in self.stages.values():
            for task in stage.tasks:
                row = tasks.get(task.task.id, {})
                done = row.get("state") == TaskState.DONE and stage.spec.name not in again
                if not done and (retried or stage.spec.name in again):
                    task.failures = 0  # counted from the attempts; anew, as crashes are
                    continue
                task.crashes = row.get("crashes") or 0
                if (beside := row.get("beside")) is not None:
                    task.beside = frozenset(beside)
                if not done:
                    continue
                gone = phases[stage.spec.name].open and footprint.missing(
                    self.workdir, task.task.outputs
                )
                if gone:  # a later stage has not read them yet: they are made again
                    lost = ", ".join(gone)
                    self.note(f"task {task.task.id}: done, but {lost} is gone: run again")
                    continue
                task.state = TaskState.DONE
                task.running = None
                stage.done += 1
        for row in saved.stages:
            stage = self.stages[row["stage"]]
            if row["stage"] in again:  # from its beginning, once the stages before it are done
                continue
            stage.phase = Phase(row["state"])
            stage.ready_t, stage.start_t, stage.end_t = row["ready_t"], row["start_t"], row["end_t"]
            if stage.phase == Phase.FAILED:  # in a run that failed, taken up again
                stage.phase = Phase.READY if stage.start_t is None else Phase.RUNNING
                stage.end_t = None
            if stage.phase in (Phase.READY, Phase.RUNNING):
                self._enqueue(stage)
        if retried:
            self.note("taken up after it failed: the tasks not done get their attempts anew")
        if again:
            names = sorted(again)
            which = f"stage {names[0]} runs" if len(names) == 1 else f"stages {listing(names)} run"
            self.note(
                f"{which} again from the beginning: the workflow's file changed what runs "
                "there, or in a stage before"
            )
        hits = {row["pilot_id"]: row["hit"] for row in saved.waits}
        return [self._restore_pilot(row, hits.get(row["pilot_id"])) for row in saved.pilots]

    def _restore_attempt(self, row: dict[str, Any]) -> None:
        task = self.task(row["task_id"])
        stage = self.stages[task.task.stage]
        attempt, outcome = row["attempt"], row["outcome"]
        task.attempts = max(task.attempts, attempt)
        stage.attempts += 1
        allocation = Resources(**row["allocation"]) if row["allocation"] else None
        if outcome in ON_WORKER and allocation is not None and row["worker"]:
            task.state, task.running = TaskState.RUNNING, attempt
            if outcome == OnWorker.WAITING:
                self._waiting(stage, task, (task.task.id, attempt))
            else:
                self._running(task, (task.task.id, attempt), row["start_t"] or 0.0)
            spec = self._spec(task, attempt, allocation)
            self.expected.setdefault(row["worker"], []).append(spec)
            self.expected_on[(task.task.id, attempt)] = row["pilot_id"]
            return
        if outcome in ON_WORKER:  # sent to no worker: it never ran
            task.lost.add(attempt)
            return
        if outcome == Outcome.SUCCESS and row["peak"]:
            stage.durations.add(row["peak"]["wall"])
        elif outcome == Outcome.FAILED:
            task.failures += 1
        elif outcome == Outcome.EXHAUSTED and allocation is not None:
            task.previous = allocation
            task.exhaustion = Exhaustion(row["exhausted"], row["measured"])
        elif outcome in (Outcome.LOST, STOPPED):
            task.lost.add(attempt)

    def _restore_pilot(self, row: dict[str, Any], hit: bool | None) -> PilotRun:
        request = request_of(row["request"])
        info = JobInfo(
            job_id=row["job_id"] or "",
            state=JobState(row["state"]) if row["state"] != "SUBMITTING" else JobState.PENDING,
            reason=row["reason"] or "",
            submit_time=self._abs(row["submit_t"]),
            eligible_time=self._abs(row["eligible_t"]),
            start_time=self._abs(row["start_t"]),
            end_time=self._abs(row["end_t"]),
        )
        pilot = PilotRun(
            row["pilot_id"],
            tuple(row["stage"].split(",")),
            _allocation_of(request),
            request,
            row["submit_t"],
            row["predicted_wait"],
            job_id=row["job_id"],
            info=info,
            hit=hit,
        )
        self.pilots[pilot.pilot_id] = pilot
        self._track(pilot)
        if pilot.job_id:  # one whose submission was under way is found again when taken over
            self.by_job[pilot.job_id] = pilot
        return pilot

    def taken_over(self, pilot: PilotRun, job_id: str) -> None:
        pilot.job_id = job_id
        self.by_job[job_id] = pilot
        self.recorder.pilot_taken_over(pilot)
        self.note(f"pilot {pilot.pilot_id}: taken over (job {job_id})")

    def gone(self, pilot: PilotRun) -> list[Effect]:
        """A pilot of a resumed run that ended while the run had no manager."""
        assert pilot.info is not None
        info = pilot.info = replace(pilot.info, state=JobState.FAILED, reason="gone")
        self._track(pilot)
        self.recorder.pilot_gone(pilot)
        self.note(f"pilot {pilot.pilot_id}: gone while the run had no manager")
        return self._pilot_ended(pilot, info)

    # ---- planning -------------------------------------------------------------

    @property
    def plan_due(self) -> float:
        """When the planner is to be consulted again (the run's time): now if the run
        changed since its last plan otherwise than by attempts that succeeded, or if
        :attr:`plan_again`; else at the earlier of the time that plan asked for and
        :data:`PLAN_PERIOD_S` after it."""
        return self.now if self._unheard or self.plan_again else self._plan_by

    def plan(self) -> Plan:
        """What the planner decides now, and the release of every pilot whose stages are
        over and on which nothing runs; the planner's new notes are taken."""
        self.pool.newly_idle()  # seen idle by this plan
        self._idled = self._unheard = False
        plan = self.planner.decide(self.now, self.stage_views(), self.pilot_views())
        wake = math.inf if plan.wake_at is None else plan.wake_at
        self._plan_by = min(self.now + PLAN_PERIOD_S, wake)
        self._planned_outgrown = self._outgrown()
        for note in plan.notes:
            if note not in self._standing:
                self.note(note)
        self._standing = frozenset(plan.notes)
        decided = {a.pilot_id for a in plan.actions if not isinstance(a, Submit)}
        over = tuple(
            Release(p.pilot_id, "its stages are over: released")
            for p in self._finished()
            if p.pilot_id not in decided
        )
        return replace(plan, actions=plan.actions + over) if over else plan

    def _outgrown(self) -> dict[str, Resources | None]:
        """The stages whose next task waits for a larger worker, and its size."""
        return {n: s.last_allocation for n, s in self.stages.items() if s.outgrown}

    @property
    def plan_again(self) -> bool:
        """A placement since the last plan left a task waiting for a worker larger than any
        there is, or a pilot with nothing to run, which that plan did not see: the planner
        brings the one and lets the other go only once it does."""
        return self._idled or self._outgrown() != self._planned_outgrown

    def stage_views(self) -> dict[str, StageView]:
        """The stages as the planner sees them now (to be read before the state changes)."""
        ends = functools.cache(
            functools.partial(forecast.stage_ends, self.stages, self.now, self._progress_end)
        )
        return {
            name: StageView(
                name,
                s.spec.after,
                s.spec.allocation,
                s.phase,
                s.ready_t,
                functools.partial(_forecast_of, ends, name),
                functools.partial(self._demand, s) if s.spec.allocation.auto else None,
                min(s.spec.allocation.cores, wanted := self._wanted(s)),
                wanted,
                self._task(s),
                s.durations.mean or 0.0,
                s.outgrown,
            )
            for name, s in self.stages.items()
        }

    def first_views(self) -> list[StageView]:
        """The stages as the run starts, for the pilots it may submit."""
        return [
            StageView(
                s.spec.name, s.spec.after, s.spec.allocation, s.phase, s.ready_t, task=self._task(s)
            )
            for s in self.stages.values()
        ]

    @staticmethod
    def _task(stage: StageRun) -> Resources:
        """What one of the stage's tasks takes now: its latest attempt's allocation, or as
        declared (a resource sized by the sizer and not yet given: 0, and one core)."""
        if stage.last_allocation is not None:
            return stage.last_allocation
        declared = stage.spec.tasks.declared
        return Resources(
            cores=declared.get("cores", 1.0),
            memory=declared.get("memory", 0.0),
            disk=declared.get("disk", 0.0),
        )

    def _wanted(self, stage: StageRun) -> int:
        """The cores the stage's tasks not done yet could use at once: each as large as its
        latest attempt, or as declared."""
        return math.ceil((len(stage.tasks) - stage.done) * self._task(stage).cores)

    def _demand(self, stage: StageRun) -> autoalloc.Demand:
        left = len(stage.tasks) - stage.done
        values = stage.durations.values()
        return autoalloc.demand(left, stage.spec.tasks.declared, values, stage.earlier)

    def _progress_end(self, stage: StageRun) -> float:
        """A running stage's forecast end; its pilot's deadline while nothing is known."""
        size = stage.last_allocation or Resources(cores=1)
        slots = self.pool.slots_for(stage.spec.name, size, self.clock)
        end = forecast.progress_end(stage, self.now, slots)
        if end is not None:
            return end
        starts = [
            p.info.start_time - self.t0
            for p in self.pilots.values()
            if stage.spec.name in p.stages and p.info and p.info.start_time is not None
        ]
        return min(starts, default=self.now) + stage.spec.allocation.time_limit_s

    def pilot_views(self) -> list[PilotView]:
        """The live pilots not let go, as the planner sees them: a pilot's view is made again
        only when its job, its workers or whether it is busy changed."""
        busy = self._busy()
        views = []
        for p in self.live.values():
            if p.released:
                continue
            seen = (p.info, len(p.workers), p.joined, busy(p.pilot_id))
            known = self._views.get(p.pilot_id)
            if known is None or known[0] != seen:
                view = PilotView(
                    p.pilot_id,
                    p.stages,
                    p.state == JobState.RUNNING,
                    seen[3],
                    p.info.wait if p.info else None,
                    p.allocation,
                    self._ends(p),
                    p.submit_t,
                    max((w.capacity.memory for w in p.workers), default=None),
                )
                known = self._views[p.pilot_id] = (seen, view)
            views.append(known[1])
        return views

    def _ends(self, pilot: PilotRun) -> float | None:
        """When ``pilot``'s time limit ends it, once it started."""
        start = None if pilot.info is None else self._rel(pilot.info.start_time)
        return None if start is None else start + pilot.request.time_limit_s

    # ---- pilots ---------------------------------------------------------------

    def request(self, pilot_id: str, alloc: Allocation, after: tuple[str, ...]) -> PilotRequest:
        return PilotRequest(
            name=f"lt-{self.run_id}-{pilot_id}",
            cores=alloc.cores,
            nodes=alloc.nodes,
            memory_mb=alloc.memory_mb,
            time_limit_s=alloc.time_limit_s,
            partition=alloc.partition,
            account=alloc.account,
            qos=alloc.qos,
            dependency=Dependency("afterok", after) if after else None,
            comment=f"leadtime run={self.run_id} pilot={pilot_id}",
            extra=alloc.sbatch,
        )

    def submitting(self, action: Submit) -> PilotRun:
        """A pilot the planner asked for, about to be submitted."""
        alloc = action.allocation
        pilot_id = f"{action.stages[0] if len(action.stages) == 1 else 'all'}-{len(self.pilots)}"
        after = tuple(self.pilots[p].job_id or "" for p in action.after)
        pilot = PilotRun(
            pilot_id,
            action.stages,
            alloc,
            self.request(pilot_id, alloc, after),
            self.now,
            action.predicted_wait,
            action.prediction,
        )
        self.pilots[pilot_id] = pilot
        self._track(pilot)
        return pilot

    def _track(self, pilot: PilotRun) -> None:
        """Keep :attr:`live` as ``pilot``'s job is."""
        self._unheard = True
        if pilot.live:
            self.live.setdefault(pilot.pilot_id, pilot)
        else:
            self.live.pop(pilot.pilot_id, None)
            self._views.pop(pilot.pilot_id, None)

    def submitted(self, pilot: PilotRun, job_id: str) -> None:
        pilot.job_id = job_id
        self.by_job[job_id] = pilot

    def let_go(self, action: Cancel | Release) -> PilotRun:
        """A pilot the planner cancels or releases: it takes no new task."""
        pilot = self.pilots[action.pilot_id]
        pilot.released = True
        self._unheard = True
        self.pool.drain(pilot.pilot_id)
        self._empty_if_released(pilot)
        return pilot

    def note_let_go(self, actions: Sequence[Cancel | Release]) -> None:
        """One note for the pilots a pass lets go for the same reason: a stage's pilots of
        one task each go together."""
        by_why: dict[str, list[str]] = {}
        for action in actions:
            by_why.setdefault(action.why, []).append(action.pilot_id)
        for line in per_pilot(by_why):
            self.note(line)

    def release_all(self) -> list[PilotRun]:
        """The run is over: every pilot with a job still alive is let go (the backend cancels
        one still pending)."""
        alive = [p for p in self.live.values() if p.job_id is not None]
        for pilot in alive:
            pilot.released = True
            self._empty_if_released(pilot)
        return alive

    def _empty_if_released(self, pilot: PilotRun) -> None:
        """``pilot`` is released and the workers it had have all left: its job should end now.
        One whose workers never came is left to its release (they may still be starting)."""
        if (
            pilot.released
            and pilot.joined
            and not pilot.workers
            and pilot.live
            and not pilot.emptied
        ):
            pilot.emptied = True
            self._emptied[pilot.pilot_id] = self.now + EMPTY_RELEASE_S

    @property
    def stuck_due(self) -> float | None:
        """When (on the loop's clock) the first released pilot left without workers is due to
        be cancelled if its job is still alive."""
        return self.t0 + min(self._emptied.values()) if self._emptied else None

    def _stuck(self) -> list[Effect]:
        """Cancel the released pilots whose job outlived their workers by ``EMPTY_RELEASE_S``."""
        effects: list[Effect] = []
        for pilot_id, due in list(self._emptied.items()):
            if self.now < due:
                continue
            del self._emptied[pilot_id]
            pilot = self.pilots[pilot_id]
            self.note(
                f"pilot {pilot.pilot_id}: its job {pilot.job_id} did not end "
                f"{duration(EMPTY_RELEASE_S)} after its workers left on its release (a node "
                "of it no longer answers?): cancelled"
            )
            effects.append(CancelJob(pilot.job_id or ""))
        return effects

    def _finished(self) -> list[PilotRun]:
        """Pilots whose stages are all over and on which nothing runs: to be released (each
        is drained, so that it takes no new task meanwhile)."""
        finished = []
        busy = self._busy()
        open_ = {name for name, stage in self.stages.items() if stage.phase.open}
        for pilot in self.live.values():
            if pilot.released or not open_.isdisjoint(pilot.stages):
                continue
            self.pool.drain(pilot.pilot_id)
            if not busy(pilot.pilot_id):
                finished.append(pilot)
        return finished

    def _busy(self) -> Callable[[str], bool]:
        """Whether attempts run on a pilot: on its workers in the pool, or on workers of it
        that a resumed run awaits (releasing it would kill what they run)."""
        awaited = set(self.expected_on.values())
        return lambda pilot_id: self.pool.busy(pilot_id) or pilot_id in awaited

    def _on_job(self, info: JobInfo) -> list[Effect]:
        pilot = self.by_job.get(info.job_id)
        if pilot is None:
            return []
        before = pilot.info
        pilot.info = info
        self._track(pilot)
        self.recorder.pilot_changed(pilot, info, self.t0)
        started = info.start_time is not None and (before is None or before.start_time is None)
        if started:
            self._observe_wait(pilot, info)
        effects: list[Effect] = []
        if info.state == JobState.RUNNING and not pilot.workers and not pilot.released:
            effects.append(WorkersDue(pilot, info))
        if info.state.finished:
            effects += self._pilot_ended(pilot, info)
        return effects

    def _observe_wait(self, pilot: PilotRun, info: JobInfo) -> None:
        wait = info.wait
        if wait is None or self.learner is None:
            return
        pilot.hit = self.learner.observe_wait(
            pilot.allocation, pilot.prediction, wait, pilot.predicted_wait
        )
        self.recorder.wait(pilot, wait, self.now)

    def _pilot_ended(self, pilot: PilotRun, info: JobInfo) -> list[Effect]:
        self._emptied.pop(pilot.pilot_id, None)
        workers, pilot.workers = pilot.workers, []
        for worker in workers:
            self.pool.leave(worker.id)
        effects: list[Effect] = [WorkersGone(pilot, workers)]
        failed = self.breaker.ended(
            pilot.stages, joined=pilot.joined > 0, finished=pilot.finished,
            released=pilot.released, now=self.now, state=str(info.state), reason=info.reason,
        )  # fmt: skip
        if failed and self.running:
            self.error, self.status = failed, Status.FAILED
            self.note(failed)
        if info.state == JobState.COMPLETED:
            return effects
        if not pilot.released:
            self._ended.setdefault(f"ended {info.state}", []).append(pilot.pilot_id)
        # Pilots waiting on this one with afterok can never start: replace them.
        for other in self.live.values():
            dep = other.request.dependency
            if dep and pilot.job_id in dep.job_ids and not other.released:
                other.released = True
                self.note(f"pilot {other.pilot_id}: its dependency ended {info.state}, replacing")
                effects.append(CancelJob(other.job_id or ""))
        return effects

    # ---- workers and tasks ----------------------------------------------------

    def _on_join(self, worker: Worker) -> list[Effect]:
        pilot = self.by_job.get(worker.pilot_id)
        if pilot is None or not pilot.live:  # a pilot this run does not know: send it home
            self.note(f"worker {worker.id} sent away: no live pilot {worker.pilot_id!r}")
            return [WorkersGone(None, [worker])]
        pilot.workers.append(worker)
        pilot.joined += 1
        self.pool.join(worker, pilot.pilot_id, frozenset(pilot.stages))
        # What it kept for us, as it holds them: those running, then those waiting in the
        # order they were sent (as the store reads them back), which it starts first come.
        kept = self.expected.pop(worker.id, [])
        kept.sort(key=lambda spec: spec.key in self.stage_of(spec.task_id).waiting)
        for spec in kept:
            key = spec.key
            self.expected_on.pop(key, None)  # in the pool now
            started = key not in self.stage_of(spec.task_id).waiting
            self._began(self.pool.occupy(worker.id, key, spec.allocation, started))
        if pilot.released:
            self.pool.drain(pilot.pilot_id)
        return []

    def _on_lost_worker(self, worker_id: str) -> None:
        slot = self.pool.leave(worker_id)
        if slot is not None:
            pilot = self.pilots[slot.pilot_id]
            if slot.worker in pilot.workers:
                pilot.workers.remove(slot.worker)
            self._empty_if_released(pilot)

    def place(self) -> list[Launch]:
        """Place ready tasks, stage by stage in workflow order, head of each queue first."""
        starts = []
        now = self.clock
        self.sent_ahead = False
        self.sizer.running.now = self.now
        for stage in self.stages.values():
            if stage.phase not in (Phase.READY, Phase.RUNNING):
                continue
            mean = stage.durations.mean
            ahead = mean is not None and mean < AHEAD_BELOW_S
            depth = math.ceil(AHEAD_S / mean) if ahead and mean > 0 else AHEAD_DEPTH
            stage.outgrown = False
            while stage.queue:
                task = stage.queue[0]
                first = task.allocation is None and task.previous is None
                if first and not self.sizer.ready(task.features):
                    break  # its category's first records are awaited (asked again)
                if task.allocation is None:
                    self.sizer.running.queued = self._queued()
                    try:
                        task.allocation = self.sizer.allocate(
                            task.features, task.previous, task.exhaustion
                        )
                    except Unfittable as e:
                        stage.queue.popleft()
                        self._fail(stage, task, unfittable(e))
                        break
                expected = task.allocation.wall
                if expected == float("inf"):
                    expected = max(stage.durations.mean or 0.0, task.outlasted)
                slot = self.pool.place(
                    stage.spec.name, task.allocation, now + expected, ahead, depth
                )
                if slot is None:
                    largest = self.pool.largest_for(stage.spec.name)
                    if not self._own_workers(stage) or largest is None:
                        break
                    if task.allocation.fits_in(largest):
                        break
                    try:
                        task.allocation, waits = self._refitted(task, largest)
                    except Unfittable as e:
                        stage.queue.popleft()
                        self._fail(stage, task, unfittable(e))
                        break
                    if waits:
                        stage.last_allocation = task.allocation  # the size its pilots grow to
                        stage.outgrown = True
                        break
                    continue
                stage.queue.popleft()
                self.sent_ahead |= slot.holds_ahead
                starts.append(Launch(slot.worker, self._start(stage, task, slot)))
        self._idled |= bool(self.pool.newly_idle())
        return starts

    def _queued(self) -> int:
        """Tasks of the ready stages waiting for room: in their stage's queue, or sent ahead
        to a worker and not started there."""
        return sum(
            len(s.queue) + len(s.waiting)
            for s in self.stages.values()
            if s.phase in (Phase.READY, Phase.RUNNING)
        )

    def _refitted(self, task: TaskRun, largest: Resources) -> tuple[Resources, bool]:
        """``task``'s allocation cut to ``largest``, the largest worker there is; where it was
        killed at all of that and the planner sizes pilots to their tasks, for a worker to
        come of its stage's share of a node's cores and memory (a pilot asks for no disk: its
        workers have their node's, as ``largest`` does), and True: it waits for one.
        Unfittable where neither holds what it is known to need."""
        try:
            return _fitted(task, largest), False
        except Unfittable:
            own = task.features.worker
            if not self.planner.sized_to_tasks or own is None:
                raise
            return _fitted(task, Resources(own.cores, own.memory, largest.disk)), True

    def _own_workers(self, stage: StageRun) -> bool:
        """The stage's own pilot runs and its workers have joined."""
        return any(p.workers for p in self.live.values() if stage.spec.name in p.stages)

    def _start(self, stage: StageRun, task: TaskRun, slot: Slot) -> AttemptSpec:
        assert task.allocation is not None
        task.attempts += 1
        task.state = TaskState.RUNNING
        task.running = task.attempts
        stage.attempts += 1
        stage.last_allocation = task.allocation
        if stage.phase == Phase.READY:
            self._set_phase(stage, Phase.RUNNING)
        spec = self._spec(task, task.attempts, task.allocation)
        key = spec.key
        if self.pool.sent(slot, key, spec.allocation):
            self.recorder.attempt_sent(spec, slot.worker.id, slot.pilot_id, started=self.now)
            self._running(task, key, self.now)
        else:
            self.recorder.attempt_sent(spec, slot.worker.id, slot.pilot_id)
            self._waiting(stage, task, key)
        return spec

    def _waiting(self, stage: StageRun, task: TaskRun, key: Key) -> None:
        """Attempt ``key`` of ``task`` is on its worker, not started yet: the sizer counts it
        among its category's attempts under way."""
        stage.waiting.add(key)
        self.sizer.running.wait(task.task.category, 1)

    def _not_waiting(self, stage: StageRun, task: TaskRun, key: Key) -> None:
        """Attempt ``key`` of ``task`` started, or ended, if it was waiting on its worker."""
        if key in stage.waiting:
            stage.waiting.remove(key)
            self.sizer.running.wait(task.task.category, -1)

    def _began(self, keys: list[Key]) -> None:
        """Attempts ``keys`` start on their worker now (as they came, or after waiting)."""
        for key in keys:
            task = self.task(key[0])
            self._not_waiting(self.stages[task.task.stage], task, key)
            self._running(task, key, self.now)
            self.recorder.attempt_started(key, self.now)

    def _running(self, task: TaskRun, key: Key, since: float) -> None:
        """Attempt ``key`` of ``task`` runs on its worker since ``since``; the sizer counts it
        among its category's running attempts (those that outlast every record tell it
        something)."""
        self.stages[task.task.stage].running[key] = since
        self.sizer.running.start(task.task.category, since)

    def stage_of(self, task_id: str) -> StageRun:
        """The stage of task ``task_id``."""
        return self.stages[self.task(task_id).task.stage]

    def _spec(self, task: TaskRun, attempt: int, allocation: Resources) -> AttemptSpec:
        t = task.task
        return AttemptSpec(
            t.id, attempt, t.command, allocation, t.category, str(self.workdir), t.outputs
        )

    def _on_result(self, worker: Worker, spec: AttemptSpec, result: AttemptResult) -> None:
        key = spec.key
        self.expected_on.pop(key, None)
        started = self.pool.release(worker.id, key, spec.allocation)
        task_run = self.task(spec.task_id)
        stage = self.stages[task_run.task.stage]
        since = stage.running.pop(key, None)
        ran = since is not None
        if since is not None:
            self.sizer.running.end(task_run.task.category, since)
        self._not_waiting(stage, task_run, key)
        self._began(started)
        if task_run.running != spec.attempt:
            if spec.attempt in task_run.lost and result.outcome is not Outcome.LOST:
                self.recorder.attempt_late(spec, result)  # given up on, then heard of
            return  # else a result told twice (a worker resends what a dead manager heard)
        task_run.running = None
        why = cause(result, spec.allocation)
        stopped = result.outcome is Outcome.LOST and not self.running
        if stopped:  # by the run's end, not its worker's: counted apart, never as a loss
            why = f"stopped with the run ({self.status})"
        elif why is not None and self.running:  # a result heard after the run's end
            stage.causes[cause_kind(result)] += 1
        moments = _moments(since, self.now, result.peak.wall)
        self.recorder.attempt_ended(spec, result, why, self.now, moments, stopped)
        task_run.allocation = None
        if result.outcome == Outcome.SUCCESS:
            task_run.state = TaskState.DONE
            stage.done += 1
            if (pilot := self.by_job.get(worker.pilot_id)) is not None:
                pilot.finished += 1
            self.recorder.stage(stage)  # its count of tasks done, for a status of the live run
            stage.durations.add(result.peak.wall)
            self.sizer.observe(
                Record(
                    task_run.features,
                    result.sizing_peak(spec.allocation),
                    result.memory_series,
                    result.sample_interval_s,
                )
            )
        elif result.outcome == Outcome.EXHAUSTED:
            assert result.exhaustion is not None
            self.sizer.observe_exhaustion(task_run.features, spec.allocation, result.exhaustion)
            task_run.previous, task_run.exhaustion = spec.allocation, result.exhaustion
            self._requeue(stage, task_run)
        elif result.outcome == Outcome.LOST:
            task_run.lost.add(spec.attempt)
            task_run.allocation = spec.allocation
            if result.vanished and ran and self.running:
                task_run.crashes += 1
                seen = task_run.beside
                task_run.beside = result.beside if seen is None else seen & result.beside
            cut = None
            if since is not None and self.running and self.clock >= worker.end_time - TIME_UP_S:
                task_run.outlasted = max(task_run.outlasted, self.now - since)
                cut = self._cut_by_time_limit(stage, worker, since, task_run)
            if cut is not None:
                self._fail(stage, task_run, cut)
            elif task_run.crashes >= task_run.task.max_attempts:
                vanished, limit = count(task_run.crashes, "time"), task_run.task.max_attempts
                self._fail(
                    stage,
                    task_run,
                    f"its worker vanished while running it, {vanished} (last: {why})"
                    f"{_suspects(task_run.beside)}; a task that takes its worker down runs at "
                    f"most max_attempts ({limit}) times",
                )
            else:
                self._requeue(stage, task_run)
        else:
            task_run.failures += 1
            if task_run.failures >= task_run.task.max_attempts:
                tail = f": {result.output_tail.strip()}" if result.output_tail else ""
                failed = count(task_run.failures, "time")
                self._fail(stage, task_run, f"failed {failed} (exit code {result.exit_code}){tail}")
            else:
                task_run.allocation = spec.allocation
                self._requeue(stage, task_run)
        self.recorder.task(task_run)

    def _cut_by_time_limit(
        self, stage: StageRun, worker: Worker, started: float, task: TaskRun
    ) -> str | None:
        """Why ``task`` cannot finish, if its attempt that ``worker``'s pilot's time limit
        ended (started at run time ``started``) had the pilot's whole time and no pilot of
        ``stage`` gets a longer one, or if that happened ``max_attempts`` times (each such
        time is counted in ``task.cut``)."""
        pilot = self.by_job.get(worker.pilot_id)
        if pilot is None or pilot.info is None or pilot.info.start_time is None:
            return None
        limit = pilot.request.time_limit_s
        if started + self.t0 - pilot.info.start_time > max(WHOLE_PILOT_S, limit / 20):
            return None  # a fresh pilot gives it longer
        task.cut += 1
        allocation = stage.spec.allocation
        if allocation.auto:  # its pilots may get longer, up to its max_time
            longest, field = allocation.max_time_s or limit, "max_time"
        else:
            longest, field = allocation.time_limit_s, "time"
        ran = f"it ran {duration(task.outlasted)} until its pilot's time limit ended it"
        advice = f"give stage {stage.spec.name} a longer allocation {field}"
        if longest <= limit:
            return f"{ran}, the whole {duration(limit)} its pilots get: {advice}"
        if task.cut >= task.task.max_attempts:
            return f"{ran}, {count(task.cut, 'time')} on a whole pilot: {advice}"
        return None

    def _enqueue(self, stage: StageRun) -> None:
        """The stage's tasks still to run join its queue: submitted, as the sizer counts them
        (a workflow's retry room is a share of the tasks submitted so far)."""
        queued = [t for t in stage.tasks if t.state == TaskState.QUEUED]
        stage.queue.extend(queued)
        for category, n in Counter(t.task.category for t in queued).items():
            self.sizer.running.submit(category, n)

    def _requeue(self, stage: StageRun, task: TaskRun) -> None:
        task.state = TaskState.QUEUED
        stage.queue.appendleft(task)

    def _fail(self, stage: StageRun, task: TaskRun, why: str) -> None:
        """The task cannot succeed: its stage, and so the run, failed (no event may follow)."""
        task.state = TaskState.FAILED
        self.error = f"task {task.task.id}: {why}"
        self.note(self.error)
        self._set_phase(stage, Phase.FAILED)
        self.status = Status.FAILED

    def task(self, task_id: str) -> TaskRun:
        stage_name, index = _task_place(task_id)
        return self.stages[stage_name].tasks[index]

    # ---- stages ---------------------------------------------------------------

    def _set_phase(self, stage: StageRun, phase: Phase) -> None:
        stage.phase = phase
        self._unheard = True
        now = self.now
        if phase == Phase.READY:
            stage.ready_t = now
            self._enqueue(stage)
        elif phase == Phase.RUNNING and stage.start_t is None:
            stage.start_t = now
        elif phase in (Phase.DONE, Phase.FAILED):
            stage.end_t = now
        self.recorder.stage(stage)

    # ---- what a person reads --------------------------------------------------

    def note(self, text: str) -> None:
        self.notes.append((self.now, text))
        self.notes_total += 1

    def summary(self, strategy: str, end: float) -> RunSummary:
        stages = [
            StageFigures(
                s.spec.name,
                s.ready_t,
                min(
                    (p.submit_t for p in self.pilots.values() if s.spec.name in p.stages),
                    default=None,
                ),
                s.start_t,
                s.end_t,
                len(s.tasks),
                s.attempts,
            )
            for s in self.stages.values()
        ]
        pilots = [self._figures(p) for p in self.pilots.values()]
        return summarize(
            self.run_id,
            self.workflow.name,
            strategy,
            str(self.status),
            end,
            stages,
            pilots,
            self.error,
        )

    def _figures(self, p: PilotRun) -> PilotFigures:
        info = p.info
        return PilotFigures(
            p.pilot_id,
            p.stages,
            p.request.cores,
            p.submit_t,
            self._rel(info.eligible_time) if info else None,
            self._rel(info.start_time) if info else None,
            self._rel(info.end_time) if info else None,
            p.predicted_wait,
            p.hit,
            str(info.state) if info else "SUBMITTING",
        )

    def _rel(self, t: float | None) -> float | None:
        return None if t is None else t - self.t0

    def _abs(self, t: float | None) -> float | None:
        return None if t is None else t + self.t0


def _forecast_of(ends: Callable[[], dict[str, float]], stage: str) -> float | None:
    return ends().get(stage)


SUSPECTS_SHOWN = 5
"""Tasks named, at most, beside one whose workers vanished under it too often."""


def _suspects(beside: frozenset[str] | None) -> str:
    """The tasks that were on the worker each time, told: any of them may be the cause."""
    if not beside:
        return ""
    names = sorted(beside, key=_task_place)
    listed = listing(names, SUSPECTS_SHOWN)
    told = "was beside it each time: either" if len(names) == 1 else "were beside it each time: any"
    return f", and {listed} {told} may be what took its workers down"


def _task_place(task_id: str) -> tuple[str, int]:
    """A task's stage and index, read from its id (``project.12``)."""
    stage, index = task_id.rsplit(".", 1)
    return stage, int(index)


def _fitted(task: TaskRun, worker: Resources) -> Resources:
    """``task``'s allocation cut to ``worker``; Unfittable if that takes away what it is known
    to need.

    A sizer's "whole worker" is a guess at the workers to come; the workers that
    came may be smaller (a pilot's cores spread over nodes). Cutting is fine
    unless the task declared more, or was killed for exceeding the smaller size.
    """
    assert task.allocation is not None
    fitted = task.allocation
    for r in PACKED:
        if fitted[r] > worker[r]:
            needed = (
                task.exhaustion.measured if task.exhaustion and task.exhaustion.resource == r else 0
            )
            if r in task.task.declared:
                declared = task.task.declared[r]
                raise Unfittable(
                    task.task.category, r, Bound.WORKER, worker[r], declared, declares=True
                )
            if worker[r] <= needed:
                raise Unfittable(task.task.category, r, Bound.WORKER, worker[r], needed)
            fitted = fitted.with_(r, worker[r])
    return fitted


def _allocation_of(request: PilotRequest) -> Allocation:
    return Allocation(
        cores=request.cores,
        nodes=request.nodes,
        memory_mb=request.memory_mb,
        time_limit_s=request.time_limit_s,
        partition=request.partition,
        account=request.account,
        qos=request.qos,
        sbatch=request.extra,
    )


def _moments(since: float | None, now: float, wall: float) -> tuple[float, float | None]:
    """When an attempt that ran ``wall`` seconds by its worker's measure ended and started,
    where the manager heard of its start at ``since`` and of its end ``now``: the end is
    put no later than the measured run after the start, the start no later than the
    measured run before the end. A result held while there was no manager (its worker
    keeps it until a manager takes the run up) ended when it ended, not when it came; an
    attempt that started while there was none started before its manager heard. The start
    is None where it stays as recorded."""
    if since is None or since + wall <= now:
        return (now if since is None else since + wall), None
    return now, now - wall
