"""Runs one workflow: stages -> pilots -> pool -> tasks.

The engine is a single loop over events (a pilot changed state, a worker
joined or was lost, an attempt ended, the planner's wake-up time came).
Each pass applies the events to its state, asks the planner what to submit
or cancel, releases pilots no longer needed and places ready tasks on the
pool. Every change is queued in the store and flushed in one transaction
before the pass acts on it (submits, cancels, starts attempts), so a crash
leaves the store consistent with what was done.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from backends import clock
from backends.base import BatchBackend, Dependency, JobInfo, JobState, PilotRequest, SubmitError
from learners.resources import PACKED, Resources
from learners.sizing.base import Exhaustion, Record, Sizer, TaskFeatures, Unfittable
from orchestrator import autoalloc, human
from orchestrator.agent import footprint
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Outcome, cause, cause_kind
from orchestrator.breaker import Breaker
from orchestrator.events import AttemptEnded, Event, JobChanged, WorkerJoined, WorkerLost
from orchestrator.forecast import Durations, forecast_end
from orchestrator.planner import Cancel, Phase, PilotView, Planner, Release, StageView, Submit
from orchestrator.pool import Pool, Slot, Worker
from orchestrator.runs import HEARTBEAT_S, Manager, RunState, SavedRun
from orchestrator.sizing_state import SizingState
from orchestrator.store import Store
from orchestrator.summary import PilotFigures, RunSummary, StageFigures, summarize
from workflows.spec import Allocation, Stage, Task, Workflow

GROUP_COMMIT_S = 0.05
"""At most this much of a simulated run's bookkeeping waits to be written."""


class Refused(SubmitError):
    """A pilot the run needs would be refused: the run stops before anything is submitted."""


class WaitLearner(Protocol):
    """The queue-wait learner as the engine uses it (see learners.queue_wait)."""

    def observe_wait(
        self, allocation: Allocation, prediction: Any, wait: float, planned: float | None
    ) -> bool | None:
        """Learn an observed wait; return whether the planned wait hit (None without one)."""
        ...

    async def save(self, store: Store) -> None: ...


class WorkerSource(Protocol):
    """Where a started pilot's workers come from."""

    def started(self, pilot: PilotRun, info: JobInfo) -> Sequence[Worker]:
        """Workers that come with the pilot at once (simulated nodes); remote ones join later."""
        ...

    def ended(self, pilot: PilotRun | None, workers: Sequence[Worker]) -> None:
        """The pilot's allocation ended (None: a worker of no pilot of the run came): its
        workers are gone, or sent away."""
        ...

    def expect(self, worker_id: str, key: tuple[str, int], since: float) -> Any:
        """A resumed run: the worker that was running attempt ``key`` (sent ``since``); its
        ``follow(key, since)`` gives the attempt's result."""
        ...


class TaskState(StrEnum):
    """Where a task is in the run (``tasks.state`` in the store)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass
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


@dataclass
class StageRun:
    spec: Stage
    tasks: list[TaskRun]
    phase: Phase = Phase.WAITING
    queue: deque[TaskRun] = field(default_factory=deque)
    running: dict[tuple[str, int], float] = field(default_factory=dict)
    durations: Durations = field(default_factory=Durations)
    done: int = 0
    attempts: int = 0
    ready_t: float | None = None
    start_t: float | None = None
    end_t: float | None = None
    last_allocation: Resources | None = None
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

    @property
    def state(self) -> JobState | None:
        return None if self.info is None else self.info.state

    @property
    def live(self) -> bool:
        return self.info is None or not self.info.state.finished


@dataclass(frozen=True)
class EngineOptions:
    strategy: str = "per-stage"
    sizer: str = ""
    seed: int = 0
    scale: int | None = None


Observer = Callable[["Engine"], None]


class Engine:
    """One run of ``workflow`` on ``backend``."""

    def __init__(
        self,
        workflow: Workflow,
        backend: BatchBackend,
        store: Store,
        *,
        planner: Planner,
        sizer: Sizer,
        workers: WorkerSource,
        pool: Pool | None = None,
        learner: WaitLearner | None = None,
        sizing: SizingState | None = None,
        options: EngineOptions | None = None,
        run_id: str | None = None,
        features: Callable[[Task], TaskFeatures] | None = None,
        observer: Observer | None = None,
        workdir: Path | None = None,
        run_dir: Path | None = None,
        record: dict[str, Any] | None = None,
    ) -> None:
        """``record``: more of the run for the store (its options, the workflow's text ...)."""
        self.workflow = workflow
        self.backend = backend
        self.store = store
        self.planner = planner
        self.sizer = sizer
        self.source = workers
        self.pool = pool or Pool()
        self.learner = learner
        self.sizing = sizing
        self.options = options or EngineOptions()
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.observer = observer
        features = features or (lambda t: TaskFeatures(t.category, declared=t.declared))
        self.workdir = (workdir or workflow.workdir or Path.cwd()).absolute()
        """Where tasks run."""
        self.run_dir = run_dir or self.workdir / ".leadtime" / self.run_id
        self.stages: dict[str, StageRun] = {}
        for stage in workflow.stages:
            tasks = [
                TaskRun(t, features(t)) for t in stage.expand(str(self.workdir), str(self.run_dir))
            ]
            self.stages[stage.name] = StageRun(stage, tasks)
        self.pilots: dict[str, PilotRun] = {}
        self._by_job: dict[str, PilotRun] = {}
        """Every submitted pilot by its job id: the pilot id its workers give."""
        self.notes: deque[tuple[float, str]] = deque(maxlen=50)
        self.notes_total = 0
        """Notes taken since the start (``notes`` keeps the last 50)."""
        self._standing: frozenset[str] = frozenset()
        """The planner's notes of the last pass: repeated ones are not noted again."""
        self.status = RunState.RUNNING
        self.error: str | None = None
        self.recorded = False
        """The store holds the run (a resume could take it up)."""
        self.breaker = Breaker()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._inflight: set[asyncio.Task[None]] = set()
        self._wake: float | None = None
        self._t0 = 0.0
        self._end_t: float | None = None
        self._record = record or {}
        self._restored: list[PilotRun] | None = None
        """Pilots to take over before the loop starts, for a resumed run."""
        self._commit_due = -math.inf
        """When a simulated run's store is written next (see :meth:`_write_ahead`)."""
        self._expected: dict[str, list[AttemptSpec]] = {}
        """Attempts of a resumed run still running on their workers, by worker id."""

    # ---- public -------------------------------------------------------------

    def post(self, event: Event) -> None:
        """Hand the engine an event (e.g. from a worker source: a worker joined or was lost)."""
        self._events.put_nowait(event)

    def now(self) -> float:
        """Seconds since the run started."""
        return clock.now() - self._t0

    async def run(self) -> RunSummary:
        """Run the workflow to its end; always leaves no pilot of the run behind."""
        if self._restored is None:
            self._t0 = clock.now()
            try:
                await self._preflight()
            except Refused as e:
                self.status, self.error = RunState.FAILED, str(e)
                raise
        await self._record_start()
        pump = asyncio.create_task(self._pump_updates())
        beat = None if self.backend.simulated else asyncio.create_task(self._heartbeat())
        try:
            if self._restored is None:
                for stage in self.stages.values():
                    if not stage.spec.after:
                        self._set_phase(stage, Phase.READY)
            else:
                await self._take_over(self._restored)
            while self.status == RunState.RUNNING:
                await self._pass()
                if self.status != RunState.RUNNING:
                    break
                for event in await self._next_events():
                    self._apply(event)
        except BaseException as e:
            if self.status == RunState.RUNNING:
                stopped = isinstance(e, asyncio.CancelledError | KeyboardInterrupt)
                self.status = RunState.INTERRUPTED if stopped else RunState.FAILED
                self.error = self.error or (
                    "interrupted" if stopped else f"{type(e).__name__}: {e}"
                )
            raise
        finally:
            if beat is not None:
                beat.cancel()
            await self._shutdown()
            pump.cancel()
        return self.summary()

    def restore(self, saved: SavedRun) -> None:
        """Take up a run whose manager died, as the store left it: what is done stays done,
        attempts that were running are awaited from their workers, pilots are taken over
        (by :meth:`run`, before anything else)."""
        self._t0 = clock.now() - (clock.wall() - saved.run["created"])
        tasks = {row["task_id"]: row for row in saved.tasks}
        for row in saved.attempts:
            self._restore_attempt(row)
        phases = {row["stage"]: Phase(row["state"]) for row in saved.stages}
        for stage in self.stages.values():
            for task in stage.tasks:
                if tasks.get(task.task.id, {}).get("state") != TaskState.DONE:
                    continue
                gone = phases[stage.spec.name].open and footprint.missing(
                    self.workdir, task.task.outputs
                )
                if gone:  # a later stage has not read them yet: they are made again
                    lost = ", ".join(gone)
                    self._note(f"task {task.task.id}: done, but {lost} is gone: run again")
                    continue
                task.state = TaskState.DONE
                task.running = None
                stage.done += 1
        for row in saved.stages:
            stage = self.stages[row["stage"]]
            stage.phase = Phase(row["state"])
            stage.ready_t, stage.start_t, stage.end_t = row["ready_t"], row["start_t"], row["end_t"]
            if stage.phase in (Phase.READY, Phase.RUNNING):
                stage.queue.extend(t for t in stage.tasks if t.state == TaskState.QUEUED)
        now = clock.now()
        for worker_id, specs in self._expected.items():  # before any worker can register
            for spec in specs:
                stage = self.stages[self._task(spec.task_id).task.stage]
                since = min(now, self._t0 + stage.running[(spec.task_id, spec.attempt)])
                worker = self.source.expect(worker_id, (spec.task_id, spec.attempt), since)
                self._follow(worker, spec, since)
        hits = {row["pilot_id"]: row["hit"] for row in saved.waits}
        self._restored = [
            self._restore_pilot(row, hits.get(row["pilot_id"])) for row in saved.pilots
        ]

    def _restore_attempt(self, row: dict[str, Any]) -> None:
        task = self._task(row["task_id"])
        stage = self.stages[task.task.stage]
        attempt, outcome = row["attempt"], row["outcome"]
        task.attempts = max(task.attempts, attempt)
        stage.attempts += 1
        allocation = Resources(**row["allocation"]) if row["allocation"] else None
        if outcome == "running" and allocation is not None and row["worker"]:
            task.state, task.running = TaskState.RUNNING, attempt
            stage.running[(task.task.id, attempt)] = row["start_t"] or 0.0
            spec = self._spec(task, attempt, allocation)
            self._expected.setdefault(row["worker"], []).append(spec)
            return
        if outcome == "running":  # sent to no worker: it never ran
            task.lost.add(attempt)
            return
        if outcome == Outcome.SUCCESS and row["peak"]:
            stage.durations.add(row["peak"]["wall"])
        elif outcome == Outcome.FAILED:
            task.failures += 1
        elif outcome == Outcome.EXHAUSTED and allocation is not None:
            task.previous = allocation
            task.exhaustion = Exhaustion(row["exhausted"], row["measured"])
        elif outcome == Outcome.LOST:
            task.lost.add(attempt)

    def _restore_pilot(self, row: dict[str, Any], hit: bool | None) -> PilotRun:
        request = request_of(row["request"])
        absolute = self._abs
        info = JobInfo(
            job_id=row["job_id"] or "",
            state=JobState(row["state"]) if row["state"] != "SUBMITTING" else JobState.PENDING,
            reason=row["reason"] or "",
            submit_time=absolute(row["submit_t"]),
            eligible_time=absolute(row["eligible_t"]),
            start_time=absolute(row["start_t"]),
            end_time=absolute(row["end_t"]),
        )
        pilot = PilotRun(
            row["pilot_id"],
            tuple(row["stage"].split(",")),
            allocation_of(request),
            request,
            row["submit_t"],
            row["predicted_wait"],
            job_id=row["job_id"],
            info=info,
            hit=hit,
        )
        self.pilots[pilot.pilot_id] = pilot
        if pilot.job_id:  # one whose submission was under way is found again by _take_over
            self._by_job[pilot.job_id] = pilot
        return pilot

    async def _take_over(self, pilots: Sequence[PilotRun]) -> None:
        """A resumed run's live pilots followed again; those gone meanwhile are replaced by
        the planner."""
        gone = []
        for pilot in pilots:
            if not pilot.live:
                continue
            submitted = clock.to_epoch(self._t0 + pilot.submit_t)
            job_id = await self.backend.reattach(pilot.request, pilot.job_id, submitted)
            if job_id is None:
                gone.append(pilot)
                continue
            pilot.job_id = job_id
            self._by_job[job_id] = pilot
            self.store.stage(
                "pilots", {"run_id": self.run_id, "pilot_id": pilot.pilot_id}, job_id=job_id
            )
            self._note(f"pilot {pilot.pilot_id}: taken over (job {job_id})")
        for pilot in gone:  # after the others: a dependent of a gone pilot is cancelled
            assert pilot.info is not None
            pilot.info = replace(pilot.info, state=JobState.FAILED, reason="gone")
            self.store.stage(
                "pilots",
                {"run_id": self.run_id, "pilot_id": pilot.pilot_id},
                state=str(JobState.FAILED),
                reason="gone while the run had no manager",
            )
            self._note(f"pilot {pilot.pilot_id}: gone while the run had no manager")
            self._pilot_ended(pilot, pilot.info)
        await self.store.flush()

    def _follow(self, worker: Any, spec: AttemptSpec, since: float) -> None:
        async def attempt() -> None:
            result = await worker.follow((spec.task_id, spec.attempt), since)
            self.post(AttemptEnded(worker, spec, result))

        self._spawn(attempt())

    async def _heartbeat(self) -> None:
        """Tell the store, now and then, that this run's manager is alive."""
        while True:
            await self.store.put("runs", {"run_id": self.run_id}, heartbeat=clock.wall())
            await clock.sleep(HEARTBEAT_S)

    def summary(self) -> RunSummary:
        end = self._end_t if self._end_t is not None else self.now()
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
            self.options.strategy,
            str(self.status),
            end,
            stages,
            pilots,
            self.error,
        )

    # ---- the loop -------------------------------------------------------------

    async def _pass(self) -> None:
        self._advance_phases()
        if self.status != RunState.RUNNING:
            await self.store.flush()
            return
        plan = self.planner.decide(self.now(), self._stage_views(), self._pilot_views())
        self._wake = None if plan.wake_at is None else plan.wake_at + self._t0
        for note in plan.notes:
            if note not in self._standing:
                self._note(note)
        self._standing = frozenset(plan.notes)
        finished = self._finished_pilots()
        # What the events taught is written before anything is submitted, cancelled or
        # released: a pilot released for a stage whose last result is not in the store would
        # take that result with it if the manager died now. A pass that acts on no pilot
        # writes once, with its placements.
        if plan.actions or finished:
            await self._write_ahead()
        if self.learner is not None:
            await self.learner.save(self.store)
        if self.sizing is not None:
            await self.sizing.save(self.store)
        for action in plan.actions:
            if isinstance(action, Submit):
                await self._submit(action)
            else:
                await self._let_go(action)
        await self._release(finished)
        starts = self._place()
        await self._write_ahead()
        for worker, spec in starts:
            self._launch(worker, spec)
        if self.observer is not None:
            self.observer(self)

    async def _write_ahead(self) -> None:
        """Put in the store what the engine is about to act on, so that a manager that dies
        leaves a record of every pilot submitted and attempt placed. A simulated world dies
        with its manager (its runs are not resumed), so there the store is written at most
        every ``GROUP_COMMIT_S`` of wall time, many passes in one transaction."""
        if self.backend.simulated:
            now = time.monotonic()
            if now < self._commit_due:
                return
            self._commit_due = now + GROUP_COMMIT_S
        await self.store.flush()

    async def _next_events(self) -> list[Event]:
        timeout = None if self._wake is None else max(0.0, self._wake - clock.now())
        try:
            first = await asyncio.wait_for(self._events.get(), timeout)
        except TimeoutError:
            return []
        events = [first]
        while not self._events.empty():
            events.append(self._events.get_nowait())
        return events

    def _apply(self, event: Event) -> None:
        match event:
            case JobChanged(info):
                self._on_job(info)
            case AttemptEnded(worker, spec, result):
                self._on_result(worker, spec, result)
            case WorkerJoined(worker):
                self._on_join(worker)
            case WorkerLost(worker_id):
                self._on_lost_worker(worker_id)

    async def _settle(
        self, timeout: float = 600.0, unreleased: frozenset[str] = frozenset()
    ) -> None:
        """Take in job updates until every pilot has ended (or ``timeout`` s passed), but for
        the ``unreleased`` jobs, whose release failed."""
        deadline = clock.now() + timeout
        self._wake = deadline

        def waiting() -> bool:
            return any(
                p.live and p.job_id and p.job_id not in unreleased for p in self.pilots.values()
            )

        while waiting() and clock.now() < deadline:
            for event in await self._next_events():
                self._apply(event)

    async def _pump_updates(self) -> None:
        async for info in self.backend.updates():
            self.post(JobChanged(info))

    # ---- stages ---------------------------------------------------------------

    def _set_phase(self, stage: StageRun, phase: Phase) -> None:
        stage.phase = phase
        now = self.now()
        if phase == Phase.READY:
            stage.ready_t = now
            stage.queue.extend(t for t in stage.tasks if t.state == TaskState.QUEUED)
        elif phase == Phase.RUNNING and stage.start_t is None:
            stage.start_t = now
        elif phase in (Phase.DONE, Phase.FAILED):
            stage.end_t = now
        self.store.stage(
            "stages",
            {"run_id": self.run_id, "stage": stage.spec.name},
            state=str(phase),
            tasks_total=len(stage.tasks),
            tasks_done=stage.done,
            ready_t=stage.ready_t,
            start_t=stage.start_t,
            end_t=stage.end_t,
        )

    def _advance_phases(self) -> None:
        for stage in self.stages.values():
            if stage.phase == Phase.WAITING and all(
                self.stages[a].phase == Phase.DONE for a in stage.spec.after
            ):
                self._set_phase(stage, Phase.READY)
            if stage.phase.open and stage.done == len(stage.tasks):
                self._set_phase(stage, Phase.DONE)
        if any(s.phase == Phase.FAILED for s in self.stages.values()):
            self.status = RunState.FAILED
        elif all(s.phase == Phase.DONE for s in self.stages.values()):
            self.status = RunState.DONE
            self._end_t = self.now()

    def _stage_view_now(self, s: StageRun) -> StageView:
        return StageView(s.spec.name, s.spec.after, s.spec.allocation, s.phase, s.ready_t)

    def _stage_views(self) -> dict[str, StageView]:
        ends = self._forecasts()
        return {
            name: StageView(
                name,
                s.spec.after,
                s.spec.allocation,
                s.phase,
                s.ready_t,
                ends.get(name),
                functools.partial(self._demand, s) if s.spec.allocation.auto else None,
                self._width(s),
            )
            for name, s in self.stages.items()
        }

    @staticmethod
    def _width(stage: StageRun) -> int:
        """The cores the stage's tasks not done yet can use at once, at most its allocation's:
        each as large as its latest attempt, or as declared."""
        left = len(stage.tasks) - stage.done
        if stage.last_allocation is not None:
            each = stage.last_allocation.cores
        else:
            each = stage.tasks[0].task.declared.get("cores", 1.0) if stage.tasks else 1.0
        return min(stage.spec.allocation.cores, math.ceil(left * each))

    def _demand(self, stage: StageRun) -> autoalloc.Demand:
        left = len(stage.tasks) - stage.done
        values = stage.durations.values()
        return autoalloc.demand(left, stage.spec.tasks.declared, values, stage.earlier)

    def _forecasts(self) -> dict[str, float]:
        """Forecast end (run time) of every open stage that an open stage waits for: the
        planner asks no other, and a forecast costs a pass as many steps as tasks run.

        A running stage is forecast from its progress; a later one starts when
        the stages it waits for are forecast to end and lasts as long as its
        tasks take on its own allocation, by the durations seen (in this run
        or earlier ones), or its time limit while nothing is known.
        """
        now = self.now()
        ends: dict[str, float] = {}

        def end(name: str) -> float:
            if name not in ends:
                stage = self.stages[name]
                if not stage.phase.open:
                    ends[name] = stage.end_t if stage.end_t is not None else now
                elif stage.phase == Phase.RUNNING:
                    ends[name] = self._progress_forecast(stage)
                else:
                    start = max([now, *(end(a) for a in stage.spec.after)])
                    ends[name] = start + self._expected_length(stage)
            return ends[name]

        for stage in self.stages.values():
            if stage.phase.open:
                for name in stage.spec.after:
                    end(name)
        return {name: t for name, t in ends.items() if self.stages[name].phase.open}

    def _progress_forecast(self, stage: StageRun) -> float:
        """A running stage's end from its progress; its pilot's deadline while nothing is known."""
        now = self.now()
        size = stage.last_allocation or Resources(cores=1)
        slots = self.pool.slots_for(stage.spec.name, size, clock.now())
        elapsed = now - np.fromiter(stage.running.values(), float, len(stage.running))
        end = forecast_end(now, stage.durations, elapsed, len(stage.queue), slots)
        if end is not None:
            return end
        starts = [
            p.info.start_time - self._t0
            for p in self.pilots.values()
            if stage.spec.name in p.stages and p.info and p.info.start_time is not None
        ]
        return min(starts, default=now) + stage.spec.allocation.time_limit_s

    @staticmethod
    def _expected_length(stage: StageRun) -> float:
        """How long a stage not yet started should take on its own allocation."""
        cores = stage.tasks[0].task.declared.get("cores", 1.0) if stage.tasks else 1.0
        slots = max(1, int(stage.spec.allocation.cores // max(cores, 1e-9)))
        remaining = len(stage.tasks) - stage.done
        end = forecast_end(0.0, stage.durations, [], remaining, slots)
        return stage.spec.allocation.time_limit_s if end is None else end

    # ---- pilots ---------------------------------------------------------------

    def _pilot_views(self) -> list[PilotView]:
        return [
            PilotView(
                p.pilot_id,
                p.stages,
                p.state == JobState.RUNNING,
                self.pool.busy(p.pilot_id),
                p.info.wait if p.info else None,
                p.allocation,
            )
            for p in self.pilots.values()
            if p.live and not p.released
        ]

    def _request(self, pilot_id: str, alloc: Allocation, after: tuple[str, ...]) -> PilotRequest:
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

    async def _preflight(self) -> None:
        """Ask the backend about every pilot the planner may submit, and check that every
        stage's tasks fit its nodes, before submitting anything."""
        views = [self._stage_view_now(s) for s in self.stages.values()]
        try:
            pilots = self.planner.allocations(views)
        except SubmitError as e:
            where = self.workflow.source or self.workflow.name
            raise Refused(f"{where}: {e}; nothing was submitted", e.option) from e
        for i, pilot in enumerate(pilots):
            try:
                await self.backend.check(self._request(f"check-{i}", pilot.allocation, ()))
            except SubmitError as e:
                where = self.workflow.refused(pilot.stages, e.option, pilot.allocation)
                culprit = f" ({e.option})" if e.option else ""
                raise Refused(
                    f"{where}: the batch system refused a pilot of "
                    f"{human.allocation(pilot.allocation)} in a test submission: {e}{culprit}; "
                    "nothing was submitted",
                    e.option,
                ) from e
        for stage in self.stages.values():
            features = stage.tasks[0].features if stage.tasks else None
            if features is None or features.worker is None:
                continue
            for name, value in features.declared.items():
                most = features.worker[name]  # type: ignore[index]
                if value > most:
                    raise Refused(
                        f"{self.workflow.where(stage.spec.name, 'tasks', name)}: a task declares "
                        f"{name} = {value:g}, but a node gives the stage's pilot at most "
                        f"{most:g}: no task could start; nothing was submitted"
                    )

    async def _submit(self, action: Submit) -> None:
        alloc = action.allocation
        pilot_id = f"{action.stages[0] if len(action.stages) == 1 else 'all'}-{len(self.pilots)}"
        after = tuple(self.pilots[p].job_id or "" for p in action.after)
        request = self._request(pilot_id, alloc, after)
        pilot = PilotRun(
            pilot_id,
            action.stages,
            alloc,
            request,
            self.now(),
            action.predicted_wait,
            action.prediction,
        )
        self.pilots[pilot_id] = pilot
        await self.store.put(
            "pilots",
            {"run_id": self.run_id, "pilot_id": pilot_id},
            stage=",".join(action.stages),
            state="SUBMITTING",
            request=_request_json(request),
            predicted_wait=action.predicted_wait,
            submit_t=pilot.submit_t,
            fit=action.fit,
        )
        pilot.job_id = await self.backend.submit(request)
        self._by_job[pilot.job_id] = pilot
        await self.store.put(
            "pilots", {"run_id": self.run_id, "pilot_id": pilot_id}, job_id=pilot.job_id
        )

    async def _let_go(self, action: Cancel | Release) -> None:
        """Cancel a pilot, or give back a running one no task runs on (its job ends as the
        run's release, not as a cancellation)."""
        pilot = self.pilots[action.pilot_id]
        pilot.released = True
        self.pool.drain(pilot.pilot_id)
        self._note(f"pilot {pilot.pilot_id}: {action.why}")
        if pilot.job_id is None:
            return
        if isinstance(action, Release):
            await self.backend.release(pilot.job_id)
        else:
            await self.backend.cancel(pilot.job_id)

    def _finished_pilots(self) -> list[PilotRun]:
        """Pilots whose stages are all over and on which nothing runs: to be released (each
        is drained, so that it takes no new task meanwhile)."""
        finished = []
        for pilot in self.pilots.values():
            if pilot.released or not pilot.live:
                continue
            if any(self.stages[s].phase.open for s in pilot.stages):
                continue
            self.pool.drain(pilot.pilot_id)
            if not self.pool.busy(pilot.pilot_id):
                finished.append(pilot)
        return finished

    async def _release(self, pilots: list[PilotRun]) -> None:
        for pilot in pilots:
            if pilot.released:  # a planner's Release came first
                continue
            pilot.released = True
            if pilot.job_id is not None:
                await self.backend.release(pilot.job_id)

    def _on_job(self, info: JobInfo) -> None:
        pilot = next((p for p in self.pilots.values() if p.job_id == info.job_id), None)
        if pilot is None:
            return
        before = pilot.info
        pilot.info = info
        rel = self._rel
        self.store.stage(
            "pilots",
            {"run_id": self.run_id, "pilot_id": pilot.pilot_id},
            state=str(info.state),
            reason=info.reason,
            eligible_t=rel(info.eligible_time),
            start_t=rel(info.start_time),
            end_t=rel(info.end_time),
        )
        started = info.start_time is not None and (before is None or before.start_time is None)
        if started:
            self._observe_wait(pilot, info)
        if info.state == JobState.RUNNING and not pilot.workers and not pilot.released:
            for worker in self.source.started(pilot, info):
                self._on_join(worker)
        if info.state.finished:
            self._pilot_ended(pilot, info)

    def _observe_wait(self, pilot: PilotRun, info: JobInfo) -> None:
        wait = info.wait
        if wait is None or self.learner is None:
            return
        pilot.hit = self.learner.observe_wait(
            pilot.allocation, pilot.prediction, wait, pilot.predicted_wait
        )
        self.store.stage(
            "waits",
            {"run_id": self.run_id, "pilot_id": pilot.pilot_id},
            geometry=f"{pilot.request.cores}c/{pilot.request.partition or '-'}",
            predicted=pilot.predicted_wait,
            observed=wait,
            hit=pilot.hit,
            t=self.now(),
        )

    def _pilot_ended(self, pilot: PilotRun, info: JobInfo) -> None:
        workers, pilot.workers = pilot.workers, []
        for worker in workers:
            self.pool.leave(worker.id)
        self.source.ended(pilot, workers)
        done = {s: self.stages[s].done for s in pilot.stages}
        failed = self.breaker.ended(
            done, joined=pilot.joined > 0, released=pilot.released, now=self.now(),
            state=str(info.state), reason=info.reason,
        )  # fmt: skip
        if failed and self.status == RunState.RUNNING:
            self.error, self.status = failed, RunState.FAILED
            self._note(failed)
        if info.state == JobState.COMPLETED:
            return
        if not pilot.released:
            self._note(f"pilot {pilot.pilot_id} ended {info.state}")
        # Pilots waiting on this one with afterok can never start: replace them.
        for other in self.pilots.values():
            dep = other.request.dependency
            if other.live and dep and pilot.job_id in dep.job_ids and not other.released:
                other.released = True
                self._note(f"pilot {other.pilot_id}: its dependency ended {info.state}, replacing")
                self._spawn(self.backend.cancel(other.job_id or ""))

    # ---- workers and tasks ----------------------------------------------------

    def _on_join(self, worker: Worker) -> None:
        pilot = self._by_job.get(worker.pilot_id)
        if pilot is None or not pilot.live:  # a pilot this run does not know: send it home
            self._note(f"worker {worker.id} sent away: no live pilot {worker.pilot_id!r}")
            self.source.ended(None, [worker])
            return
        pilot.workers.append(worker)
        pilot.joined += 1
        self.pool.join(worker, pilot.pilot_id, frozenset(pilot.stages))
        for spec in self._expected.pop(worker.id, ()):  # attempts it kept running for us
            self.pool.occupy(worker.id, spec.allocation)
        if pilot.released:
            self.pool.drain(pilot.pilot_id)

    def _on_lost_worker(self, worker_id: str) -> None:
        slot = self.pool.leave(worker_id)
        if slot is not None:
            pilot = self.pilots[slot.pilot_id]
            if slot.worker in pilot.workers:
                pilot.workers.remove(slot.worker)

    def _place(self) -> list[tuple[Worker, AttemptSpec]]:
        """Place ready tasks, stage by stage in workflow order, head of each queue first."""
        starts = []
        now = clock.now()
        for stage in self.stages.values():
            if stage.phase not in (Phase.READY, Phase.RUNNING):
                continue
            while stage.queue:
                task = stage.queue[0]
                if task.allocation is None:
                    try:
                        task.allocation = self.sizer.allocate(
                            task.features, task.previous, task.exhaustion
                        )
                    except Unfittable as e:
                        stage.queue.popleft()
                        self._fail(stage, task, str(e))
                        break
                expected = task.allocation.wall
                if expected == float("inf"):
                    expected = stage.durations.mean or 0.0
                slot = self.pool.place(stage.spec.name, task.allocation, now + expected)
                if slot is None:
                    largest = self.pool.largest_for(stage.spec.name)
                    if not self._own_workers(stage) or largest is None:
                        break
                    if task.allocation.fits_in(largest):
                        break
                    fitted = _fitted(task, largest)
                    if fitted is None:
                        stage.queue.popleft()
                        self._fail(stage, task, f"{task.allocation} fits none of its workers")
                        break
                    task.allocation = fitted
                    continue
                stage.queue.popleft()
                starts.append((slot.worker, self._start(stage, task, slot)))
        return starts

    def _own_workers(self, stage: StageRun) -> bool:
        """The stage's own pilot runs and its workers have joined."""
        return any(
            p.workers for p in self.pilots.values() if stage.spec.name in p.stages and p.live
        )

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
        stage.running[(spec.task_id, spec.attempt)] = self.now()
        self.store.stage(
            "attempts",
            {"run_id": self.run_id, "task_id": spec.task_id, "attempt": spec.attempt},
            worker=slot.worker.id,
            pilot_id=slot.pilot_id,
            allocation=task.allocation.as_dict(),
            outcome="running",
            start_t=self.now(),
        )
        return spec

    def _spec(self, task: TaskRun, attempt: int, allocation: Resources) -> AttemptSpec:
        t = task.task
        return AttemptSpec(
            t.id, attempt, t.command, allocation, t.category, str(self.workdir), t.outputs
        )

    def _launch(self, worker: Worker, spec: AttemptSpec) -> None:
        async def attempt() -> None:
            result = await worker.run(spec)
            self.post(AttemptEnded(worker, spec, result))

        self._spawn(attempt())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def _on_result(self, worker: Worker, spec: AttemptSpec, result: AttemptResult) -> None:
        self.pool.release(worker.id, spec.allocation)
        task_run = self._task(spec.task_id)
        stage = self.stages[task_run.task.stage]
        stage.running.pop((spec.task_id, spec.attempt), None)
        key = {"run_id": self.run_id, "task_id": spec.task_id, "attempt": spec.attempt}
        if task_run.running != spec.attempt:
            if spec.attempt in task_run.lost and result.outcome is not Outcome.LOST:
                # given up on, then heard of: recorded, never counted
                self.store.stage("attempts", key, outcome=f"late {result.outcome}")
            return  # else a result told twice (a worker resends what a dead manager heard)
        task_run.running = None
        why = cause(result, spec.allocation)
        if (
            why is not None and self.status == RunState.RUNNING
        ):  # not the attempts a run's end stops
            stage.causes[cause_kind(result)] += 1
        self.store.stage(
            "attempts",
            key,
            outcome=str(result.outcome),
            peak=result.peak.as_dict(),
            exit_code=result.exit_code,
            exhausted=result.exhaustion.resource if result.exhaustion else None,
            measured=result.exhaustion.measured if result.exhaustion else None,
            end_t=self.now(),
            output_tail=result.output_tail or None,
            cause=why,
        )
        if (output := result.output()) is not None:
            self.store.stage("outputs", key, **output)
        task_run.allocation = None
        if result.outcome == Outcome.SUCCESS:
            task_run.state = TaskState.DONE
            stage.done += 1
            stage.durations.add(result.peak.wall)
            self.sizer.observe(
                Record(
                    task_run.features,
                    result.peak,
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
            self._requeue(stage, task_run)
        else:
            task_run.failures += 1
            if task_run.failures >= task_run.task.max_attempts:
                tail = f": {result.output_tail.strip()}" if result.output_tail else ""
                self._fail(
                    stage,
                    task_run,
                    f"failed {task_run.failures} times (exit code {result.exit_code}){tail}",
                )
            else:
                task_run.allocation = spec.allocation
                self._requeue(stage, task_run)
        self.store.stage(
            "tasks",
            {"run_id": self.run_id, "task_id": spec.task_id},
            stage=stage.spec.name,
            category=task_run.task.category,
            state=str(task_run.state),
            attempts=task_run.attempts,
        )

    def _requeue(self, stage: StageRun, task: TaskRun) -> None:
        task.state = TaskState.QUEUED
        stage.queue.appendleft(task)

    def _fail(self, stage: StageRun, task: TaskRun, why: str) -> None:
        """The task cannot succeed: its stage, and so the run, failed (no event may follow)."""
        task.state = TaskState.FAILED
        self.error = f"task {task.task.id}: {why}"
        self._note(self.error)
        self._set_phase(stage, Phase.FAILED)
        self.status = RunState.FAILED

    def _task(self, task_id: str) -> TaskRun:
        stage_name, index = task_id.rsplit(".", 1)
        return self.stages[stage_name].tasks[int(index)]

    # ---- bookkeeping ----------------------------------------------------------

    def _note(self, text: str) -> None:
        self.notes.append((self.now(), text))
        self.notes_total += 1

    def _rel(self, t: float | None) -> float | None:
        return None if t is None else t - self._t0

    def _abs(self, t: float | None) -> float | None:
        return None if t is None else t + self._t0

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

    async def _record_start(self) -> None:
        history = await self.store.task_durations(self.workflow.name, self.backend.name)
        for name, mean in history.items():
            if name in self.stages:
                self.stages[name].durations.prior = mean
        if any(s.spec.allocation.auto for s in self.stages.values()):
            runs = await self.store.task_runs(
                self.workflow.name, self.backend.name, autoalloc.LEARNED_KEEP
            )
            for name, found in runs.items():
                if name in self.stages:
                    self.stages[name].earlier = found
        manager = {"manager": Manager.this().as_json(), "heartbeat": clock.wall()}
        if self._restored is not None:
            self.store.stage(
                "runs", {"run_id": self.run_id}, status=str(RunState.RUNNING), **manager
            )
            await self.store.flush()
            self.recorded = True
            return
        self.store.stage(
            "runs",
            {"run_id": self.run_id},
            workflow=self.workflow.name,
            source=str(self.workflow.source) if self.workflow.source else None,
            backend=self.backend.name,
            strategy=self.options.strategy,
            sizer=self.options.sizer,
            seed=self.options.seed,
            scale=self.options.scale,
            status=str(RunState.RUNNING),
            created=clock.wall(),
            run_dir=str(self.run_dir),
            **self._record,
            **manager,
        )
        for stage in self.stages.values():
            self.store.stage(
                "stages",
                {"run_id": self.run_id, "stage": stage.spec.name},
                state=str(stage.phase),
                tasks_total=len(stage.tasks),
                tasks_done=0,
            )
        await self.store.flush()
        self.recorded = True

    async def _shutdown(self) -> None:
        """Release every pilot still alive, then record how the run ended.

        The backend cancels a pilot still pending: it knows the job's state better than the
        last update did (a pilot seen pending may have started since). A release that fails
        stops neither the others nor the record of the run; the first failure is raised after.
        """
        failed: dict[str, Exception] = {}
        for pilot in self.pilots.values():
            if pilot.live and pilot.job_id is not None:
                pilot.released = True
                try:
                    await self.backend.release(pilot.job_id)
                except Exception as e:  # the other pilots must not outlive the run
                    failed[pilot.job_id] = e
        await self._settle(unreleased=frozenset(failed))
        for task in self._inflight:
            task.cancel()
        if self.sizing is not None:
            await self.sizing.save(self.store, final=True)
        if self._end_t is None:
            self._end_t = self.now()
        summary = self.summary()
        self.store.stage(
            "runs",
            {"run_id": self.run_id},
            status=str(self.status),
            error=self.error,
            ended=clock.wall(),
            summary=summary.as_json(),
        )
        await self.store.flush()
        if failed:
            raise next(iter(failed.values()))


def _fitted(task: TaskRun, worker: Resources) -> Resources | None:
    """``task``'s allocation cut to ``worker``, unless that takes away what it is known to need.

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
            if r in task.task.declared or worker[r] <= needed:
                return None
            fitted = fitted.with_(r, worker[r])
    return fitted


def _request_json(request: PilotRequest) -> dict[str, Any]:
    return {
        "name": request.name,
        "cores": request.cores,
        "nodes": request.nodes,
        "memory_mb": request.memory_mb,
        "time_limit_s": request.time_limit_s,
        "partition": request.partition,
        "account": request.account,
        "qos": request.qos,
        "dependency": request.dependency.to_slurm() if request.dependency else None,
        "comment": request.comment,
        "extra": list(request.extra),
    }


def request_of(saved: dict[str, Any]) -> PilotRequest:
    """A pilot's request as :func:`_request_json` stored it."""
    dependency = saved["dependency"]
    return PilotRequest(
        name=saved["name"],
        cores=saved["cores"],
        nodes=saved["nodes"],
        memory_mb=saved["memory_mb"],
        time_limit_s=saved["time_limit_s"],
        partition=saved["partition"],
        account=saved["account"],
        qos=saved["qos"],
        dependency=Dependency.parse(dependency) if dependency else None,
        comment=saved["comment"],
        extra=tuple(saved["extra"]),
    )


def allocation_of(request: PilotRequest) -> Allocation:
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
