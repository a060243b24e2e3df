"""Runs one workflow: stages -> pilots -> pool -> tasks.

The engine is the effects half of a run; :class:`~orchestrator.runstate.RunState` is
its state. Each turn of the loop gathers every event ready now (a pilot changed
state, a worker joined or was lost, an attempt ended, or the planner's wake-up time
came), applies them all to the state, plans once, writes what changed to the store
in one transaction (through the run's :class:`~orchestrator.recorder.Recorder`) and
then acts: submits, cancels and releases pilots and starts attempts. So a crash
leaves the store consistent with what was done.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from backends import clock
from backends.base import BatchBackend, JobInfo, SubmitError
from learners.sizing.base import Sizer, TaskFeatures
from orchestrator import autoalloc, human
from orchestrator.agent.attempt import AttemptResult, AttemptSpec
from orchestrator.agent.protocol import lost
from orchestrator.events import AttemptEnded, Event, JobChanged, Tick, WorkerJoined
from orchestrator.planner import Cancel, Planner, Release, Submit
from orchestrator.pool import Pool, Told, Worker
from orchestrator.recorder import Recorder
from orchestrator.runs import HEARTBEAT_S, Manager, SavedRun
from orchestrator.runs import RunState as Status
from orchestrator.runstate import (
    CancelJob,
    Effect,
    Launch,
    PilotRun,
    RunState,
    WaitLearner,
    WorkersDue,
    WorkersGone,
)
from orchestrator.sizing_state import SizingState
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from workflows.spec import Allocation, Task, Workflow

LAST_ANSWERS_S = 5.0
"""How long a run's end waits to hear how the attempts on its ended pilots ended."""
GATHER_S = 0.04
"""After a pass that sent attempts ahead, the loop gathers events this long once one came, so
that one pass takes in many results (a pass, its store write and its frames cost about as much
as a dozen results): the workers have work meanwhile (``pool.AHEAD_DEPTH``). 40 ms, not 20: a
tenth less of the manager's CPU a task for tasks of a few milliseconds."""


async def next_events(
    queue: asyncio.Queue[Event], timeout: float | None, gather: float = 0.0
) -> list[Event]:
    """Every event ready once one is, and those that come within ``gather`` s after it (none
    if ``timeout`` s pass first). A cancellation (Ctrl-C) leaves every event queued, in order,
    for the run's end to take in.

    ``asyncio.timeout``, not ``wait_for``: before Python 3.12, ``wait_for`` returns the
    event and swallows a cancellation that comes as it arrives, and the run would go on."""
    try:
        async with asyncio.timeout(timeout):
            events = [await queue.get()]
    except TimeoutError:
        return []
    if gather:
        try:
            await clock.sleep(gather)
        except asyncio.CancelledError:
            events += [queue.get_nowait() for _ in range(queue.qsize())]
            for event in events:
                queue.put_nowait(event)
            raise
    while not queue.empty():
        events.append(queue.get_nowait())
    return events


class Refused(SubmitError):
    """A pilot the run needs would be refused: the run stops before anything is submitted."""


class SavedLearner(WaitLearner, Protocol):
    """The queue-wait learner as the engine keeps it (see orchestrator.waits)."""

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

    def expect(self, worker_id: str) -> Any:
        """A resumed run: the worker that was running some of its attempts; its
        ``follow(key, since, told)`` tells how each ended."""
        ...


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
        learner: SavedLearner | None = None,
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
        self.source = workers
        self.learner = learner
        self.sizing = sizing
        self.options = options or EngineOptions()
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.observer = observer
        self.workdir = (workdir or workflow.workdir or Path.cwd()).absolute()
        """Where tasks run."""
        self.run_dir = run_dir or self.workdir / ".leadtime" / self.run_id
        self.recorder = Recorder(store, self.run_id, simulated=backend.simulated)
        self.state = RunState(
            workflow,
            self.run_id,
            self.recorder,
            planner=planner,
            sizer=sizer,
            pool=pool or Pool(),
            learner=learner,
            workdir=self.workdir,
            run_dir=self.run_dir,
            features=features
            or (lambda t: TaskFeatures(t.category, declared=t.declared, key=t.id)),
        )
        self.recorded = False
        """The store holds the run (a resume could take it up)."""
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._inflight: set[asyncio.Future[Any]] = set()
        self._unanswered: dict[tuple[str, int], tuple[Worker, AttemptSpec]] = {}
        """Attempts sent whose worker has not answered yet."""
        self._unsent: list[Launch] = []
        """Attempts placed, not yet sent (the write that records them is under way)."""
        self._wake: float | None = None
        self._choosing = planner.fit is not None and any(s.allocation.auto for s in workflow.stages)
        """The planner chooses automatic allocations: the scheduler is asked first."""
        self._record = record or {}
        self._restored: list[PilotRun] | None = None
        """Pilots to take over before the loop starts, for a resumed run."""

    # ---- public -------------------------------------------------------------

    def post(self, event: Event) -> None:
        """Hand the engine an event (e.g. from a worker source: a worker joined or was lost)."""
        self._events.put_nowait(event)

    def now(self) -> float:
        """Seconds since the run started."""
        return clock.now() - self.state.t0

    async def run(self) -> RunSummary:
        """Run the workflow to its end; always leaves no pilot of the run behind."""
        state = self.state
        if self._restored is None:
            state.t0 = clock.now()
            self._tick()
            try:
                await self._preflight()
            except Refused as e:
                state.stop(Status.FAILED, str(e))
                raise
        await self._record_start()
        pump = asyncio.create_task(self._pump_updates())
        beat = None if self.backend.simulated else asyncio.create_task(self._heartbeat())
        try:
            self._tick()
            if self._restored is None:
                state.start()
            else:
                await self._take_over(self._restored)
            while state.running:
                await self._pass()
                if not state.running:
                    break
                self._apply_all(await self._next_events())
        except BaseException as e:
            if state.running:
                stopped = isinstance(e, asyncio.CancelledError | KeyboardInterrupt)
                state.stop(
                    Status.INTERRUPTED if stopped else Status.FAILED,
                    "interrupted" if stopped else f"{type(e).__name__}: {e}",
                )
            raise
        finally:
            if beat is not None:
                beat.cancel()
            await self._shutdown()
            pump.cancel()
        return self.summary()

    def restore(self, saved: SavedRun) -> None:
        """Take up a run whose manager died (or that was interrupted, or failed), as the
        store left it: what is done stays done (but in the stages ``saved.again``), attempts
        that were running are awaited from their workers, pilots are taken over (by
        :meth:`run`, before anything else)."""
        state = self.state
        state.t0 = clock.now() - (clock.wall() - saved.run["created"])
        self._tick()
        self._restored = state.restore(saved)
        now = clock.now()
        for worker_id, specs in state.expected.items():  # before any worker can register
            for spec in specs:
                stage = state.stage_of(spec.task_id)
                started = stage.running.get(spec.key, state.now)  # or waits
                since = min(now, state.t0 + started)
                worker = self.source.expect(worker_id)
                self._follow(worker, spec, since)

    def summary(self) -> RunSummary:
        end = self.state.end_t if self.state.end_t is not None else self.now()
        return self.state.summary(self.options.strategy, end)

    # ---- the loop -------------------------------------------------------------

    def _tick(self) -> None:
        self._effects(self.state.apply(Tick(clock.now())))

    def _apply_all(self, events: Sequence[Event]) -> None:
        """Apply ``events`` in order, at the time they are taken in, and do what they ask."""
        self._tick()
        for event in events:
            self._effects(self.state.apply(event))

    def _effects(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            match effect:
                case WorkersDue(pilot, info):
                    for worker in self.source.started(pilot, info):
                        self._effects(self.state.apply(WorkerJoined(worker)))
                case WorkersGone(pilot, workers):
                    self.source.ended(pilot, workers)
                    if pilot is not None:
                        self._give_up_on(
                            {pilot.pilot_id}, "its pilot ended before its worker came back"
                        )
                case CancelJob(job_id):
                    self._spawn(self.backend.cancel(job_id))

    async def _pass(self) -> None:
        state = self.state
        self._tick()
        state.advance()
        if not state.running:
            await self.recorder.flush()
            return
        if self._choosing:
            await self._ask_scheduler()
            self._tick()
        due = state.plan_due
        if due > state.now:  # only attempts that succeeded since the last plan
            self._wake = due + state.t0
            await self._place()
            return
        plan = state.plan()
        self._wake = None if plan.wake_at is None else plan.wake_at + state.t0
        # What the events taught is written before anything is submitted, cancelled or
        # released: a pilot released for a stage whose last result is not in the store would
        # take that result with it if the manager died now. A pass that acts on no pilot
        # writes once, with its placements.
        if plan.actions:
            await self.recorder.write_ahead()
        if self.learner is not None:
            await self.learner.save(self.store)
        if self.sizing is not None:
            await self.sizing.save(self.store)
        for action in plan.actions:
            if isinstance(action, Submit):
                await self._submit(action)
            else:
                await self._let_go(action)
        state.note_let_go([a for a in plan.actions if not isinstance(a, Submit)])
        self._tick()
        await self._place()

    async def _place(self) -> None:
        """Place what waits where there is room, and send it once written."""
        state = self.state
        self._unsent = state.place()  # recorded running by this write, then sent
        if state.plan_again:
            self._wake = clock.now()  # the next pass at once
        await self.recorder.write_ahead()
        launches, self._unsent = self._unsent, []
        for launch in launches:
            self._launch(launch.worker, launch.spec)
        if self.observer is not None:
            self.observer(self)

    async def _next_events(self) -> list[Event]:
        wake = min((t for t in (self._wake, self.state.stuck_due) if t is not None), default=None)
        timeout = None if wake is None else max(0.0, wake - clock.now())
        gather = GATHER_S if self.state.sent_ahead else 0.0
        return await next_events(self._events, timeout, gather)

    async def _settle(
        self, timeout: float = 600.0, unreleased: frozenset[str] = frozenset()
    ) -> None:
        """Take in job updates until every pilot has ended (or ``timeout`` s passed), but for
        the ``unreleased`` jobs, whose release failed; then the last answers of their
        workers (:meth:`_hear_the_last`)."""
        deadline = clock.now() + timeout
        self._wake = deadline

        def waiting() -> bool:
            return any(
                p.live and p.job_id and p.job_id not in unreleased
                for p in self.state.pilots.values()
            )

        while waiting() and clock.now() < deadline:
            self._apply_all(await self._next_events())
        await self._hear_the_last(min(deadline, clock.now() + LAST_ANSWERS_S))

    async def _hear_the_last(self, deadline: float) -> None:
        """The attempts that ran on pilots now ended: their workers tell how each ended as
        they leave, which may come after the pilot's end; one not told by ``deadline`` (or
        never sent: the run stopped between recording and sending it) is recorded lost (at the
        run's end: stopped), as its pilot's end ended it. Left running, it would make the
        run's resume wait for a worker that cannot come back."""

        def ended_with_pilot() -> list[tuple[Worker, AttemptSpec]]:
            pilots = self.state.by_job
            return [
                (worker, spec)
                for worker, spec in self._unanswered.values()
                if worker.pilot_id in pilots and not pilots[worker.pilot_id].live
            ]

        self._wake = deadline
        while ended_with_pilot() and clock.now() < deadline:
            self._apply_all(await self._next_events())
        self._apply_all(await next_events(self._events, 0.0))  # told just now
        for worker, spec in ended_with_pilot():
            self._given_up(worker, spec, "its pilot ended with the run")
        for launch in self._unsent:
            self._given_up(launch.worker, launch.spec, "never sent: the run stopped")

    async def _pump_updates(self) -> None:
        async for info in self.backend.updates():
            self.post(JobChanged(info))

    async def _heartbeat(self) -> None:
        """Tell the store, now and then, that this run's manager is alive."""
        while True:
            await self.recorder.heartbeat()
            await clock.sleep(HEARTBEAT_S)

    # ---- pilots ---------------------------------------------------------------

    async def _preflight(self) -> None:
        """Ask the backend about every pilot the planner may submit (each allocation once: on a
        busy cluster a test submission takes a while), and check that every stage's tasks fit
        its nodes, before submitting anything."""
        try:
            pilots = self.planner.allocations(self.state.first_views())
        except SubmitError as e:
            where = self.workflow.source or self.workflow.name
            raise Refused(f"{where}: {e}; nothing was submitted", e.option) from e
        asked: dict[Allocation, list[str]] = {}  # each allocation once, with its stages
        for pilot in pilots:
            asked.setdefault(pilot.allocation, []).extend(pilot.stages)
        for i, (allocation, stages) in enumerate(asked.items()):
            try:
                await self.backend.check(self.state.request(f"check-{i}", allocation, ()))
            except SubmitError as e:
                where = self.workflow.refused(stages, e.option, allocation)
                culprit = f" ({e.option})" if e.option else ""
                raise Refused(
                    f"{where}: the batch system refused a pilot of "
                    f"{human.allocation(allocation)} in a test submission: {e}{culprit}; "
                    "nothing was submitted",
                    e.option,
                ) from e
        for stage in self.state.stages.values():
            features = stage.tasks[0].features if stage.tasks else None
            if features is None or features.worker is None:
                continue
            for name, value in features.declared.items():
                most = features.worker[name]  # type: ignore[index]
                if value > most:
                    unset = name == "memory" and stage.spec.allocation.memory_mb is None
                    default = " (its allocation sets no memory: the batch system's default)"
                    raise Refused(
                        f"{self.workflow.where(stage.spec.name, 'tasks', name)}: a task declares "
                        f"{human.amount(name, value)}, but a node gives the stage's pilot at most "
                        f"{human.amount(name, most)}{default if unset else ''}: no task could "
                        "start; nothing was submitted"
                    )

    async def _ask_scheduler(self) -> None:
        """Ask the batch system what it foresees of the pilots an automatic allocation is
        about to choose between: the queue as it is now, where the learner knows the past."""
        fit = self.planner.fit
        assert fit is not None
        state = self.state
        views = state.stage_views()
        asking: list[tuple[str | None, Allocation]] = [
            (None, allocation) for allocation in fit.to_ask(state.now, views.values())
        ]
        asking += fit.to_ask_instead(state.now, views, state.pilot_views())
        for pilot_id, allocation in asking:  # in place of pilot_id's pending job, if any
            request = state.request("foreseen", allocation, ())
            instead_of = None if pilot_id is None else state.pilots[pilot_id].job_id
            fit.foreseen(allocation, await self.backend.expected_wait(request, instead_of))

    async def _submit(self, action: Submit) -> None:
        pilot = self.state.submitting(action)
        await self.recorder.pilot_submitting(pilot, action.fit)
        self.state.submitted(pilot, await self.backend.submit(pilot.request))
        await self.recorder.pilot_submitted(pilot)

    async def _let_go(self, action: Cancel | Release) -> None:
        """Cancel a pilot, or give back a running one no task runs on (its job ends as the
        run's release, not as a cancellation)."""
        pilot = self.state.let_go(action)
        if pilot.job_id is None:
            return
        if isinstance(action, Release):
            await self.backend.release(pilot.job_id)
        else:
            await self.backend.cancel(pilot.job_id)

    async def _take_over(self, pilots: Sequence[PilotRun]) -> None:
        """A resumed run's live pilots followed again; those gone meanwhile are replaced by
        the planner, and the attempts that ran on a pilot ended are lost at once (its workers
        cannot come back to tell)."""
        gone = []
        for pilot in pilots:
            if not pilot.live:
                continue
            submitted = clock.to_epoch(self.state.t0 + pilot.submit_t)
            job_id = await self.backend.reattach(pilot.request, pilot.job_id, submitted)
            if job_id is None:
                gone.append(pilot)
            else:
                self.state.taken_over(pilot, job_id)
        ended = {p.pilot_id for p in pilots if not p.live} | {p.pilot_id for p in gone}
        self._give_up_on(ended, "its pilot ended while the run had no manager")
        for pilot in gone:  # after the others: a dependent of a gone pilot is cancelled
            self._effects(self.state.gone(pilot))
        await self.recorder.flush()

    def _give_up_on(self, pilot_ids: set[str], why: str) -> None:
        """The attempts a resumed run awaits from workers of ``pilot_ids``, which ended: lost
        at once (no worker of theirs can come back to tell)."""
        for key, pilot_id in list(self.state.expected_on.items()):
            if pilot_id in pilot_ids and key in self._unanswered:
                self._given_up(*self._unanswered[key], why)

    # ---- attempts -------------------------------------------------------------

    def _launch(self, worker: Worker, spec: AttemptSpec) -> None:
        worker.start(spec, self._told(worker, spec))

    def _follow(self, worker: Any, spec: AttemptSpec, since: float) -> None:
        worker.follow(spec.key, since, self._told(worker, spec))

    def _told(self, worker: Any, spec: AttemptSpec) -> Told:
        """Where ``worker`` tells how attempt ``spec`` ended: posted as an event. Until then
        the attempt is unanswered (the run's end stops it on its worker)."""
        key = spec.key
        self._unanswered[key] = (worker, spec)

        def told(result: AttemptResult) -> None:
            self._unanswered.pop(key, None)
            self.post(AttemptEnded(worker, spec, result))

        return told

    def _given_up(self, worker: Any, spec: AttemptSpec, why: str) -> None:
        """Record attempt ``spec`` lost, ``why`` its worker cannot tell how it ended."""
        self._tick()
        stage = self.state.stage_of(spec.task_id)
        since = stage.running.get(spec.key, self.state.now)
        ended = lost(spec.task_id, spec.attempt, self.state.now - since, why)
        self._effects(self.state.apply(AttemptEnded(worker, spec, ended)))

    def _spawn(self, coro: Any) -> None:
        self._follow_future(asyncio.ensure_future(coro))

    def _follow_future(self, future: asyncio.Future[Any]) -> None:
        """Keep ``future`` until it is done; the run's end cancels what is still pending."""
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)

    # ---- the run's record -----------------------------------------------------

    async def _record_start(self) -> None:
        history = await self.store.task_durations(self.workflow.name, self.backend.name)
        for name, mean in history.items():
            if name in self.state.stages:
                self.state.stages[name].durations.prior = mean
        if any(s.spec.allocation.auto for s in self.state.stages.values()):
            runs = await self.store.task_runs(
                self.workflow.name, self.backend.name, autoalloc.LEARNED_KEEP
            )
            for name, found in runs.items():
                if name in self.state.stages:
                    self.state.stages[name].earlier = found
        manager = {"manager": Manager.this().as_json(), "heartbeat": clock.wall()}
        if self._restored is not None:
            text = self._record.get("workflow_text")  # as this manager runs it (maybe edited)
            self.recorder.run(
                status=str(Status.RUNNING),
                error=None,
                ended=None,
                **({"workflow_text": text} if text else {}),
                **manager,
            )
            await self.recorder.flush()
            self.recorded = True
            return
        self.recorder.run(
            workflow=self.workflow.name,
            source=str(self.workflow.source) if self.workflow.source else None,
            backend=self.backend.name,
            strategy=self.options.strategy,
            sizer=self.options.sizer,
            seed=self.options.seed,
            scale=self.options.scale,
            status=str(Status.RUNNING),
            created=clock.wall(),
            run_dir=str(self.run_dir),
            **self._record,
            **manager,
        )
        for stage in self.state.stages.values():
            self.recorder.stage(stage)
        await self.recorder.flush()
        self.recorded = True

    async def _shutdown(self) -> None:
        """Release every pilot still alive, then record how the run ended.

        The backend cancels a pilot still pending: it knows the job's state better than the
        last update did (a pilot seen pending may have started since). A release that fails
        stops neither the others nor the record of the run; the first failure is raised after.
        """
        failed: dict[str, Exception] = {}
        for pilot in self.state.release_all():
            try:
                await self.backend.release(pilot.job_id)
            except Exception as e:  # the other pilots must not outlive the run
                failed[pilot.job_id] = e
        await self._settle(unreleased=frozenset(failed))
        for task in self._inflight:
            task.cancel()
        for worker, spec in list(self._unanswered.values()):
            worker.stop(spec.key)
        if self.learner is not None:  # the waits seen since the last plan (as pilots started)
            await self.learner.save(self.store)
        if self.sizing is not None:
            await self.sizing.save(self.store, final=True)
        if self.state.end_t is None:
            self.state.end_t = self.now()
        summary = self.summary()
        self.recorder.run(
            status=str(self.state.status),
            error=self.state.error,
            ended=clock.wall(),
            summary=summary.as_json(),
        )
        await self.recorder.flush()
        if failed:
            raise next(iter(failed.values()))
