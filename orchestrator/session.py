"""Everything one run needs, assembled from a few options: backend, learners, planner, engine.

The CLI, the comparison and the tests all start runs through :func:`execute`,
so a run looks the same whichever door it came in by.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from backends import clock
from backends.base import NODE, BatchBackend, JobState, node_share
from backends.options import BackendOptions, RemoteOptions, RunSite, Workers
from backends.registry import open_backend, options_json, options_of, simulated
from backends.sim import MockOptions
from learners.queue_wait import GEOMETRY_FIELDS
from learners.resources import Resources
from learners.sizing import DEFAULT_SIZER, make_sizer
from learners.sizing.base import TaskFeatures
from orchestrator import runs, workdirlock
from orchestrator.agent import protocol
from orchestrator.agent import worker as agent
from orchestrator.autoalloc import Node, with_fallbacks
from orchestrator.elastic import DEFAULT_COST, Unit
from orchestrator.engine import Engine, EngineOptions, Observer, WorkerSource
from orchestrator.manager import Manager, host_address
from orchestrator.planner import AutoFit, Planner, make_planner
from orchestrator.pool import Pool
from orchestrator.recorder import request_of
from orchestrator.remote import RemoteWorkers
from orchestrator.runs import RunState, SavedRun
from orchestrator.simulate import SimulatedWorkers, task_truths
from orchestrator.sizing_state import SizingState, stage_share
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from orchestrator.waits import DEFAULT_POLICY, NoQueue, QueueWaits
from workflows.changes import Reshaped, changed_stages
from workflows.spec import Task, Workflow, loads

YOUNG_COLLECTION = 50_000
"""Allocations between two collections of Python's youngest generation, for a process that
manages runs (Python's default is 700). A manager allocates a few objects for every event of
a task and holds every task of its run: at the default, runs of 100,000 and 1,000,000
simulated tasks spent 2.7 s and 19.9 s collecting, at this threshold 0.4 s and 4.9 s."""


def collect_less() -> None:
    """Collect the youngest generation of objects every :data:`YOUNG_COLLECTION` allocations;
    the command line does so in every process it starts."""
    gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])


class SetupError(Exception):
    """A run could not start for a reason its user can fix (an address, a directory)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    backend: BackendOptions = field(default_factory=MockOptions)
    """Where pilots come from, as that backend's options: the simulated cluster on virtual
    time (:class:`~backends.sim.MockOptions`), processes on this machine
    (:class:`~backends.local.LocalOptions`), Slurm's batch jobs
    (:class:`~backends.slurm.SlurmOptions`), or any backend registered
    (:mod:`backends.registry`)."""
    strategy: str = "per-stage"
    sizer: str = DEFAULT_SIZER
    seed: int = 0
    scale: int | None = None
    policy: str = DEFAULT_POLICY
    learn_by: tuple[str, ...] = GEOMETRY_FIELDS
    """The geometry fields that tell queue-wait learner states apart."""
    wait_estimate: str = "auto"
    """The wait the planner uses: ``sample`` (the learner's draw), a quantile of its
    distribution (``0.9``), or ``auto``: 0.9 with a dependency, 0.5 without (asa-naive)."""
    share: bool = True
    """Tasks may run on any pilot with room (the unified pool), not only their stage's."""
    idle_cancel_s: float = 600.0
    cost: float = DEFAULT_COST
    """elastic's lambda: the seconds of makespan a core-hour is worth."""
    unit: Unit = "task"
    """The most cores an elastic pilot holds: one task's, a node's, or a number of cores
    (whole tasks, at most a node)."""
    learner_scope: str | None = None
    """Whose queue waits the learner learns and uses: by default the cluster's (its name on
    Slurm, the simulated cluster and its load; a local run has no queue and learns none); a
    name shares one learner between clusters deliberately."""
    workdir: Path | None = None
    """Where tasks run and their relative paths lead (default: the workflow's ``workdir``,
    that is its file's directory). The run's own files (pilot output, the secret, kept
    scratch directories) go to its run directory, ``WORKDIR/.leadtime/RUN_ID``. Under Slurm
    it must be on a file system the compute nodes share."""

    def options(self) -> EngineOptions:
        return EngineOptions(self.strategy, self.sizer, self.seed, self.scale)

    def learner_flags(self) -> list[str]:
        """The queue-wait learner's options given otherwise than by default, as flags."""
        flags = {"policy": "--policy", "learn_by": "--learn-by", "wait_estimate": "--wait-estimate",
                 "learner_scope": "--learner-scope"}  # fmt: skip
        default = {f.name: f.default for f in fields(self)}
        return [flag for name, flag in flags.items() if getattr(self, name) != default[name]]

    def estimate(self) -> float | None:
        """The quantile the planner plans with (None: the learner's own draw)."""
        if self.wait_estimate == "sample":
            return None
        if self.wait_estimate == "auto":
            return 0.5 if self.strategy == "asa-naive" else 0.9
        q = float(self.wait_estimate)
        if not 0 < q <= 1:
            raise ValueError(f"wait estimate {self.wait_estimate}: a quantile is in (0, 1]")
        return q


def config_json(config: RunConfig) -> dict[str, Any]:
    """A run's configuration as plain data, for the store (:func:`config_of` reads it)."""
    data = json.loads(json.dumps(asdict(config), default=str))
    return {**data, "backend": options_json(config.backend)}


def config_of(data: dict[str, Any]) -> RunConfig:
    """The configuration :func:`config_json` wrote."""
    return RunConfig(
        **{
            **data,
            "learn_by": tuple(data["learn_by"]),
            "workdir": Path(data["workdir"]) if data["workdir"] else None,
            "backend": options_of(data["backend"]),
        }
    )


def largest_worker(workers: Iterable[Resources]) -> Resources:
    """Per resource, the most any of ``workers`` has."""
    found = list(workers)
    return Resources(*(max(w[r] for w in found) for r in ("cores", "memory", "disk")))


def new_run_id() -> str:
    """A new run's id: twelve hex digits, unique in any store."""
    return uuid.uuid4().hex[:12]


async def execute(
    workflow: Workflow,
    config: RunConfig,
    store: Store,
    *,
    backend: BatchBackend | None = None,
    workers: WorkerSource | None = None,
    observer: Observer | None = None,
    run_id: str | None = None,
    planner: Planner | None = None,
    saved: SavedRun | None = None,
) -> RunSummary:
    """Run ``workflow`` once and return its figures (the store keeps the details); with
    ``saved``, take over that run where its dead manager left it (:func:`resume`).

    Without ``backend``, ``config.backend`` opens the backend pilots come from.
    """
    if saved is not None:
        run_id = saved.run["run_id"]
        dirs = RunDirs(Path(config.workdir or "."), Path(saved.run["run_dir"]))
    else:
        run_id = run_id or new_run_id()
        dirs = RunDirs.of(workflow, config, run_id)
    async with contextlib.AsyncExitStack() as stack:
        run: RunManager | None = None
        if backend is None and config.backend.workers is Workers.SIMULATED:
            backend = open_backend(config.backend, RunSite(dirs.run_dir))
        elif backend is None:
            if problem := workflow.dirs_in_quotes(dirs.workdir, dirs.run_dir):
                raise SetupError(problem)
            try:
                stack.enter_context(workdirlock.holding(dirs.workdir, workflow.name, run_id))
            except workdirlock.Busy as e:
                raise SetupError(str(e)) from None
            run = await stack.enter_async_context(
                run_manager(config.backend, dirs.run_dir, resumed=saved is not None)
            )
            backend, workers = run.backend, run.workers
        stack.push_async_callback(backend.close)
        if planner is None and config.strategy == "oracle" and backend.true_wait is None:
            if run is not None:
                run.end()
            raise SetupError(
                f"strategy oracle needs the queue's true waits, which the {backend.name} "
                "backend cannot tell: use the simulated cluster (--backend mock)"
            )
        return await _execute(
            workflow, config, store, backend, workers, observer, run_id, planner, dirs, run, saved
        )


class ResumeError(Exception):
    """A run that cannot be resumed or cancelled, and why (a user's mistake: exit 2)."""


TAKEN_UP = (RunState.MANAGER_GONE, RunState.INTERRUPTED, RunState.FAILED)
"""The runs ``resume`` takes up: their manager died, they were interrupted, or they failed."""


async def resume(
    store: Store,
    run_id: str,
    *,
    edited: Workflow | None = None,
    observer: Observer | None = None,
) -> RunSummary:
    """Take over run ``run_id`` where it stopped: its manager died, it was interrupted, or it
    failed (its tasks not done get their attempts anew). Nothing that finished runs again;
    live pilots and their running attempts carry on. With ``edited`` (the run's workflow
    file as it is now, fixed after a failure), the stages whose tasks changed run again,
    with every stage after them (:func:`workflows.changes.changed_stages`)."""
    saved = await SavedRun.load(store, run_id)
    if saved is None:
        raise ResumeError(f"no run {run_id} in the store")
    run = saved.run
    state = runs.state(run)
    if state is RunState.RUNNING:
        manager = runs.Manager.of(run.get("manager"))
        where = f" (pid {manager.pid} on {manager.host})" if manager else ""
        raise ResumeError(f"run {run_id} is running: its manager{where} is alive")
    if state not in TAKEN_UP:
        again = "" if state is RunState.DONE else f"; run {run['source'] or 'the workflow'} again"
        raise ResumeError(
            f"run {run_id} is {state}: nothing to resume (resume takes up a run whose manager "
            f"died, was interrupted or failed){again}"
        )
    if simulated(run.get("backend") or ""):
        raise ResumeError(
            f"run {run_id} ran on the simulated cluster, which lived in its manager: run it again"
        )
    if not run.get("workflow_text") or not run.get("options"):
        raise ResumeError(f"run {run_id} was started from Python: it cannot be resumed")
    config = recorded_config(run)
    source = run["source"] or "<string>"
    workflow = loads(run["workflow_text"], source=source, scale=run["scale"])
    text = None if edited is None else _text(edited)
    if text is not None and text != run["workflow_text"]:
        if state is RunState.MANAGER_GONE:
            raise ResumeError(
                f"{source} changed since run {run_id} recorded it, and the run's pilots may "
                f"still run its tasks as they were: take it up as recorded (leadtime resume "
                f"{run_id}), or cancel it (leadtime cancel {run_id}) and run {source} again"
            )
        recorded, workflow = workflow, loads(text, source=source, scale=run["scale"])
        try:
            again = changed_stages(recorded, workflow)
        except Reshaped as e:
            raise ResumeError(
                f"{source} changed since run {run_id} recorded it: {e}; resume needs the same "
                f"stages and tasks (run {source} without --resume to start afresh)"
            ) from None
        saved = replace(saved, run={**run, "workflow_text": text}, again=again)
    return await execute(workflow, config, store, observer=observer, saved=saved)


def recorded_config(run: dict[str, Any]) -> RunConfig:
    """The configuration a run was recorded with; a run recorded by a leadtime that wrote
    its options otherwise is refused, naming it, rather than taken up wrongly."""
    try:
        return config_of(run["options"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ResumeError(
            f"run {run['run_id']} was recorded by another version of leadtime, whose options "
            f"this one cannot read ({type(e).__name__}: {e}): run the workflow again (the "
            "run's workers leave by themselves when no manager comes back)"
        ) from e


async def resumable(store: Store) -> list[dict[str, Any]]:
    """The runs whose manager died or that were interrupted, newest first: those that
    ``leadtime resume`` takes up without being named (a failed one must be named)."""
    return [
        run
        for run in await store.rows("runs", order="created DESC")
        if runs.state(run) in (RunState.MANAGER_GONE, RunState.INTERRUPTED)
    ]


async def last_run(store: Store, workflow: Workflow | None = None) -> dict[str, Any] | None:
    """The newest run of the store, or of ``workflow``'s file, whatever became of it."""
    if workflow is None:
        return next(iter(await store.rows("runs", order="created DESC")), None)
    source = None if workflow.source is None else str(workflow.source)
    found = await store.rows("runs", {"workflow": workflow.name}, order="created DESC")
    return next((run for run in found if run["source"] == source), None)


async def cancel(store: Store, run_id: str) -> list[str]:
    """End run ``run_id`` for good: its manager stopped if it runs on this host, else every
    pilot of it cancelled from the store's record; the job ids cancelled."""
    saved = await SavedRun.load(store, run_id)
    if saved is None:
        raise ResumeError(f"no run {run_id} in the store")
    run = saved.run
    state = runs.state(run)
    manager = runs.Manager.of(run.get("manager"))
    if state is RunState.RUNNING and manager is not None:
        if manager.host != socket.gethostname():
            raise ResumeError(
                f"run {run_id} is managed by pid {manager.pid} on {manager.host}: stop it there"
            )
        told = Path(run["run_dir"]) / CANCELLING
        with contextlib.suppress(OSError):  # its manager then says cancelled, not interrupted
            told.touch()
        os.kill(manager.pid, signal.SIGTERM)  # it releases its pilots, as on Ctrl-C
        while manager.alive(None):
            await clock.sleep(0.2)
        await _cancelled(store, run_id)  # for good: not 'interrupted', which resume takes up
        told.unlink(missing_ok=True)
        return []
    if state not in (RunState.MANAGER_GONE, RunState.INTERRUPTED):
        raise ResumeError(f"run {run_id} has ended ({state}): nothing to cancel")
    cancelled = []
    config = recorded_config(run) if run.get("options") else None
    if config is not None and config.backend.workers is not Workers.SIMULATED:
        async with run_manager(config.backend, Path(run["run_dir"]), resumed=True) as owner:
            for row in saved.pilots:
                if row["state"] in _ENDED:
                    continue
                request = request_of(row["request"])
                submitted = run["created"] + (row["submit_t"] or 0.0)
                job_id = await owner.backend.reattach(request, row["job_id"], submitted)
                if job_id is not None:
                    await owner.backend.cancel(job_id)
                    cancelled.append(job_id)
            await owner.backend.close()
            owner.end()
    await _cancelled(store, run_id)
    return cancelled


async def cancelling(store: Store, run_id: str) -> bool:
    """Whether ``leadtime cancel`` is stopping run ``run_id``'s manager (with SIGTERM)."""
    found = await store.rows("runs", {"run_id": run_id})
    run_dir = found[0]["run_dir"] if found else None
    return run_dir is not None and (Path(run_dir) / CANCELLING).exists()


async def unreleased(store: Store, run_id: str) -> list[str]:
    """The jobs of run ``run_id``'s pilots that the store does not know ended, after its
    manager left without releasing them: a batch system's jobs outlive it, not the workers a
    backend started on this host (it kills them as it closes)."""
    found = await store.rows("runs", {"run_id": run_id})
    if not found or not found[0].get("options"):
        return []
    if recorded_config(found[0]).backend.workers is not Workers.CLUSTER:
        return []
    pilots = await store.rows("pilots", {"run_id": run_id}, order="rowid")
    return [p["job_id"] for p in pilots if p["job_id"] and p["state"] not in _ENDED]


async def _cancelled(store: Store, run_id: str) -> None:
    await store.put(
        "runs",
        {"run_id": run_id},
        status=str(RunState.CANCELLED),
        error="cancelled (leadtime cancel)",
        ended=clock.wall(),
    )


_ENDED = {str(s) for s in JobState if s.finished}
CANCELLING = "cancelling"
"""A file in a run's directory while ``leadtime cancel`` stops the run's live manager."""


@dataclass(frozen=True)
class RunDirs:
    """Where a run's tasks work, and where the run keeps its own files."""

    workdir: Path
    """The tasks' current directory, where their relative paths lead."""
    run_dir: Path
    """``WORKDIR/.leadtime/RUN_ID``: pilot output, the run's secret, kept scratch."""

    @classmethod
    def of(cls, workflow: Workflow, config: RunConfig, run_id: str) -> RunDirs:
        return cls.at(config.workdir or workflow.workdir, run_id)

    @classmethod
    def at(cls, workdir: Path | None, run_id: str) -> RunDirs:
        """Run ``run_id``'s directories in ``workdir`` (None: the current directory)."""
        workdir = (workdir or Path.cwd()).absolute()
        return cls(workdir, workdir / ".leadtime" / run_id)


async def _execute(
    workflow: Workflow,
    config: RunConfig,
    store: Store,
    backend: BatchBackend,
    workers: WorkerSource | None,
    observer: Observer | None,
    run_id: str,
    planner: Planner | None,
    dirs: RunDirs,
    run: RunManager | None,
    saved: SavedRun | None,
) -> RunSummary:
    partitions = {s.allocation.partition for s in workflow.stages}
    node = await backend.largest_node(partitions) or NODE
    disk_known = node.disk > 0
    if not disk_known:  # planned as large as any stage may ask; each task starts small
        node = replace(node, disk=NODE.disk)
    if workers is None:
        if not backend.simulated:
            raise ValueError(f"the {backend.name} backend needs a worker source")
        truths = task_truths(workflow, config.seed)
        workers = SimulatedWorkers(truths)
    else:
        truths = {}
    shape = Node(int(node.cores), backend.node_count)
    workflow = with_fallbacks(workflow, shape)
    own = {  # the largest worker each stage's pilot brings
        s.name: node_share(s.allocation.cores, s.allocation.nodes, s.allocation.memory_mb, node)
        for s in workflow.stages
    }
    share = {s.name: stage_share(s, own[s.name], s.tasks.size, disk_known) for s in workflow.stages}

    def features(task: Task) -> TaskFeatures:
        truth = truths.get(task.id) if truths else None
        size = truth.input_size if truth else None
        return TaskFeatures(
            task.category,
            size,
            declared=task.declared,
            worker=own[task.stage],
            share=share[task.stage],
            key=task.id,
        )

    cluster = config.learner_scope or await backend.cluster_name()
    waits: QueueWaits | NoQueue = NoQueue()
    if backend.queued:
        waits = await QueueWaits.load(
            store,
            cluster,
            policy=config.policy,
            seed=config.seed,
            key=config.learn_by,
            estimate=config.estimate(),
        )
    planner = planner or make_planner(
        config.strategy,
        predict=waits.predict,
        true_wait=backend.true_wait,
        idle_cancel_s=config.idle_cancel_s,
        fit=AutoFit(shape, waits.outlook, config.cost),
        law=waits.law,
        node=node,
        cost=config.cost,
        unit=config.unit,
        nodes=backend.node_count,
    )
    sizer = make_sizer(config.sizer, worker=largest_worker(own.values()), seed=config.seed)
    sizing = await SizingState.load(store, workflow.name, sizer)
    engine = Engine(
        workflow,
        backend,
        store,
        planner=planner,
        sizer=sizer,
        workers=workers,
        pool=Pool(share=config.share),
        learner=waits,
        sizing=sizing,
        options=config.options(),
        run_id=run_id,
        features=features,
        observer=observer,
        workdir=dirs.workdir,
        run_dir=dirs.run_dir,
        record={
            "options": config_json(replace(config, workdir=dirs.workdir)),
            "workflow_text": saved.run["workflow_text"] if saved else _text(workflow),
            "cluster": cluster,
        },
    )
    if not backend.queued and (ignored := config.learner_flags()):
        engine.state.note(f"{', '.join(ignored)}: no queue here, so no wait is learned or used")
    if config.unit != "task" and not config.strategy.startswith("elastic"):
        engine.state.note(f"--unit: {config.strategy} ignores it (only elastic cuts units)")
    if isinstance(workers, RemoteWorkers):
        workers.attach(engine.post)
    if saved is not None:
        engine.restore(saved)
    if run is None:
        return await engine.run()
    try:
        await run.start()
        return await engine.run()
    finally:
        if not engine.state.running or not engine.recorded:  # nothing a resume would take up
            run.end()
        if not engine.recorded:  # stopped before it began: its directory goes, if empty
            with contextlib.suppress(OSError):
                dirs.run_dir.rmdir()


def _text(workflow: Workflow) -> str | None:
    """The workflow file's text, kept so that a resumed run runs exactly what this one ran."""
    if workflow.source is None or not workflow.source.is_file():
        return None
    return workflow.source.read_text(encoding="utf-8")


@dataclass
class RunManager:
    """This process as a run's manager: its secret and directory, the manager that workers
    join, and the backend that starts them.

    The run's secret is a file of mode 0600 in the run directory, read by the workers
    (``--secret-file``): never on a command line (any user can read those), nor in a batch
    script (slurmctld keeps a copy). The manager's address is the file ``manager`` there,
    which workers read again whenever they look for their manager: a manager that resumes the
    run takes over the same secret and writes its own address. Both files stay while the run
    may be resumed and go when it ends (:meth:`end`).
    """

    manager: Manager
    backend: BatchBackend
    workers: RemoteWorkers
    run_dir: Path
    bind: str
    wildcard: str

    @property
    def secret_file(self) -> Path:
        return self.run_dir / "secret"

    @property
    def address_file(self) -> Path:
        return self.run_dir / "manager"

    async def start(self) -> None:
        """Listen, and tell the workers where (after a resumed engine expects its workers)."""
        try:
            host, port = await self.manager.start()
        except OSError as e:
            raise SetupError(f"the manager cannot listen on {self.bind}: {e}") from e
        if host in ("0.0.0.0", "::"):
            host = self.wildcard
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        temporary = self.address_file.with_name("manager.tmp")
        temporary.write_text(address + "\n")
        temporary.replace(self.address_file)

    def end(self) -> None:
        """The run is over: its secret and address go."""
        self.secret_file.unlink(missing_ok=True)
        self.address_file.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def run_manager(
    options: BackendOptions, run_dir: Path, *, resumed: bool
) -> AsyncIterator[RunManager]:
    """The run's directory, secret, manager (not listening yet) and backend.

    The workers are this process's agent (:func:`orchestrator.agent.worker.launch`).
    """
    if not isinstance(options, RemoteOptions):
        raise TypeError(f"the {options.name} backend's workers connect to a manager: its "
                        "options are RemoteOptions")  # fmt: skip
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SetupError(f"cannot make the run directory {run_dir}: {e.strerror}") from e
    secret_file = run_dir / "secret"
    try:
        if resumed and secret_file.exists():  # its workers may be alive: they know this one
            secret = protocol.load_secret(secret_file, {})
        else:
            secret = protocol.generate_secret()
            protocol.write_secret(secret_file, secret)
    except (protocol.SecretError, OSError) as e:
        raise SetupError(f"the run's secret: {e}") from e
    launch = agent.launch(
        run_dir / "manager",
        secret_file=secret_file,
        keep_to=run_dir / "kept",
        args=options.worker_options(),
    )
    backend = open_backend(options, RunSite(run_dir, launch))
    if options.workers is Workers.THIS_HOST:
        bind, wildcard = options.bind or "127.0.0.1", "127.0.0.1"
    else:
        bind, wildcard = options.bind or host_address(), socket.getfqdn()
    manager = Manager(secret, host=bind, heartbeat_s=options.heartbeat_s)
    try:
        yield RunManager(manager, backend, RemoteWorkers(manager), run_dir, bind, wildcard)
    finally:
        await manager.close()


def run_simulated(workflow: Workflow, config: RunConfig, db: str | Path = ":memory:") -> RunSummary:
    """Run ``workflow`` on the simulated cluster, on virtual time, from synchronous code."""

    async def main() -> RunSummary:
        async with await Store.open(db) as store:
            return await execute(workflow, config, store)

    return clock.run(main(), virtual=True)


__all__ = [
    "RunConfig",
    "SetupError",
    "execute",
    "replace",
    "run_simulated",
]
