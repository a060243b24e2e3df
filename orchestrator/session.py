"""Everything one run needs, assembled from a few options: backend, learners, planner, engine.

The CLI, the comparison and the tests all start runs through :func:`execute`,
so a run looks the same whichever door it came in by.
"""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from backends.base import BatchBackend
from backends.local import WORKER_COMMAND, LocalBackend
from backends.mock import MockSlurm
from backends.site import QueueModel, SitePolicy
from backends.slurm import SlurmBackend
from backends.swf import SwfTrace, load_trace
from backends.workload import ClusterSpec, SyntheticLoad, TraceReplay
from learners.queue_wait import GEOMETRY_FIELDS
from learners.resources import Resources
from learners.sizing import DEFAULT_SIZER, make_sizer
from learners.sizing.base import TaskFeatures
from orchestrator import clock, protocol
from orchestrator.engine import Engine, EngineOptions, Observer, WorkerSource
from orchestrator.manager import Manager, host_address
from orchestrator.planner import Planner, make_planner
from orchestrator.pool import Pool
from orchestrator.remote import RemoteWorkers
from orchestrator.simulate import SimulatedWorkers, task_truths
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from orchestrator.waits import DEFAULT_POLICY, QueueWaits
from workflows.spec import Allocation, Task, Workflow

BACKENDS = ("mock", "local", "slurm")
TRACES = ("HPC2N", "KTH", "CTC")


@dataclass(frozen=True)
class MockOptions:
    """The simulated cluster: a replayed trace, or synthetic load on a given cluster."""

    trace: str | None = None
    """HPC2N, KTH, CTC or the path of an SWF file; None for synthetic load."""
    load: float = 0.7
    """Synthetic utilisation of the cluster (0 for an idle cluster) when no trace is given."""
    trace_load: float = 1.0
    """Arrival-rate factor of the replayed trace (1: as recorded)."""
    cluster: ClusterSpec | None = None
    priority: str = "submit"
    queue_model: str = QueueModel.SITE
    """How the replayed log is scheduled: ``site`` (the log's per-user limits, node
    granularity and cancelled jobs), ``fair-share`` (and Slurm's fair-share priority) or
    ``easy`` (FIFO and EASY backfill alone); synthetic load is always ``easy``."""
    offset: float | None = None
    warmup: float | None = None
    cluster_scale: int = 1
    seed: int = 0

    def backend(self) -> MockSlurm:
        common: dict[str, Any] = {"priority": self.priority}
        if self.trace is not None:
            extra = {} if self.warmup is None else {"warmup": self.warmup}
            log, site = _log_and_policy(self.trace, self.queue_model)
            replay = TraceReplay(
                log,
                offset=self.offset,
                scale=self.cluster_scale,
                load=self.trace_load,
                site=site,
                **extra,
            )
            return MockSlurm(self.cluster, background=replay, **common)
        if self.load <= 0:
            return MockSlurm(self.cluster, **common)
        cluster = self.cluster or ClusterSpec(nodes=64, cores_per_node=32)
        load = SyntheticLoad(utilisation=self.load, seed=self.seed, cluster=cluster)
        return MockSlurm(cluster, background=load, **common)


@functools.lru_cache(maxsize=8)
def _log_and_policy(trace: str, model: str) -> tuple[SwfTrace, SitePolicy]:
    """A log and the policy ``model`` reads from it, once per process (a comparison replays
    the same log in every run)."""
    log = load_trace(trace)
    return log, SitePolicy.of(model, log)


class SetupError(Exception):
    """A run could not start for a reason its user can fix (an address, a directory)."""


@dataclass(frozen=True)
class LocalOptions:
    """Pilots as processes on this machine, workers connecting to this process."""

    workdir: Path | None = None
    """A run's files (pilot logs, sandboxes) go to ``workdir/<run id>``; by default to
    ``runs/<run id>`` beside the store's file, or to a temporary directory removed after
    the run when the store is in memory."""
    bind: str = "127.0.0.1"
    """Address the manager listens on (loopback: only this machine's workers can reach it)."""
    oversubscribe: bool = False
    """Let a pilot ask for more cores than this machine has."""
    worker_args: tuple[str, ...] = ()
    """More ``leadtime worker`` options for every worker (``--sample-interval 0.2``, say)."""
    heartbeat_s: float = 5.0


@dataclass(frozen=True)
class SlurmOptions:
    """Pilots as Slurm batch jobs, workers connecting to this process from the compute nodes."""

    workdir: Path | None = None
    """As for local runs; it must be on a file system the compute nodes share: the pilots'
    output and the run's secret file go there."""
    bind: str | None = None
    """Address the manager listens on; by default this host's address as other nodes reach
    it (its name resolved)."""
    sbatch_options: tuple[str, ...] = ()
    """Added to every pilot's sbatch command line (``--account=proj``, ``--constraint=x``)."""
    worker_args: tuple[str, ...] = ()
    """More ``leadtime worker`` options for every worker."""
    heartbeat_s: float = 5.0
    poll_interval_s: float = 2.0
    """Seconds between two ``squeue`` readings of the run's jobs."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    backend: str = "mock"
    """mock (the simulated cluster, virtual time), local (real processes, real time) or slurm
    (real batch jobs)."""
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
    mock: MockOptions = field(default_factory=MockOptions)
    local: LocalOptions = field(default_factory=LocalOptions)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    def options(self) -> EngineOptions:
        return EngineOptions(self.strategy, self.sizer, self.seed, self.scale)

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


def stage_worker(allocation: Allocation, node: Resources) -> Resources:
    """The largest worker a stage's pilot brings: one node's share of its allocation.

    ``node`` is one node of the cluster; a stage that leaves memory to the
    scheduler gets the node's memory per core for each of its cores.
    """
    cores = min(allocation.cores // (allocation.nodes or 1), node.cores)
    if allocation.memory_mb is None:
        per_core = node.memory / node.cores
    else:
        per_core = allocation.memory_mb / allocation.cores
    return Resources(cores, math.floor(per_core * cores), node.disk)


def largest_worker(workers: Iterable[Resources]) -> Resources:
    """Per resource, the most any of ``workers`` has."""
    found = list(workers)
    return Resources(*(max(w[r] for w in found) for r in ("cores", "memory", "disk")))


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
) -> RunSummary:
    """Run ``workflow`` once and return its figures (the store keeps the details).

    Without ``backend``, ``config.backend`` says where pilots come from.
    """
    run_id = run_id or uuid.uuid4().hex[:12]
    async with contextlib.AsyncExitStack() as stack:
        if backend is None and config.backend == "local":
            backend, workers = await stack.enter_async_context(
                local_pilots(config.local, store, run_id)
            )
        elif backend is None and config.backend == "slurm":
            backend, workers = await stack.enter_async_context(
                slurm_pilots(config.slurm, store, run_id)
            )
        elif backend is None and config.backend == "mock":
            backend = config.mock.backend()
        elif backend is None:
            raise ValueError(f"unknown backend {config.backend!r}; choose one of {BACKENDS}")
        stack.push_async_callback(backend.close)
        return await _execute(workflow, config, store, backend, workers, observer, run_id, planner)


async def _execute(
    workflow: Workflow,
    config: RunConfig,
    store: Store,
    backend: BatchBackend,
    workers: WorkerSource | None,
    observer: Observer | None,
    run_id: str,
    planner: Planner | None,
) -> RunSummary:
    mock = backend if isinstance(backend, MockSlurm) else None
    if mock is not None:
        node = _node(mock.cluster)
    elif isinstance(backend, LocalBackend):
        node = backend.node
    elif isinstance(backend, SlurmBackend):
        node = await _slurm_node(backend, workflow)
    else:
        node = NODE
    if workers is None:
        if mock is None:
            raise ValueError(f"the {backend.name} backend needs a worker source")
        truths = task_truths(workflow, config.seed)
        workers = SimulatedWorkers(truths)
    else:
        truths = {}
    own = {s.name: stage_worker(s.allocation, node) for s in workflow.stages}

    def features(task: Task) -> TaskFeatures:
        truth = truths.get(task.id)
        size = truth.input_size if truth else None
        return TaskFeatures(task.category, size, declared=task.declared, worker=own[task.stage])

    waits = await QueueWaits.load(
        store,
        policy=config.policy,
        seed=config.seed,
        key=config.learn_by,
        estimate=config.estimate(),
    )
    planner = planner or make_planner(
        config.strategy,
        predict=waits.predict,
        true_wait=mock.true_wait if mock is not None else None,
        idle_cancel_s=config.idle_cancel_s,
    )
    sizer = make_sizer(config.sizer, worker=largest_worker(own.values()), seed=config.seed)
    engine = Engine(
        workflow,
        backend,
        store,
        planner=planner,
        sizer=sizer,
        workers=workers,
        pool=Pool(share=config.share),
        learner=waits,
        options=config.options(),
        run_id=run_id,
        features=features,
        observer=observer,
    )
    if isinstance(workers, RemoteWorkers):
        workers.attach(engine.post)
    return await engine.run()


@dataclass(frozen=True)
class RunManager:
    """This process as a run's manager: listening, with the run's secret and directory."""

    manager: Manager
    address: str
    """``HOST:PORT`` the workers connect to."""
    secret: bytes
    run_dir: Path


@contextlib.asynccontextmanager
async def run_manager(
    bind: str,
    heartbeat_s: float,
    workdir: Path | None,
    store: Store,
    run_id: str,
    *,
    wildcard: str,
) -> AsyncIterator[RunManager]:
    """Make the run's directory and secret, and start its manager on ``bind``.

    The run's files go to ``workdir/<run id>``, by default ``runs/<run id>``
    beside the store's file, or a temporary directory removed after the run
    when the store is in memory. Workers of a manager listening on every
    address (``0.0.0.0``, ``::``) connect to ``wildcard``.
    """
    async with contextlib.AsyncExitStack() as stack:
        if workdir is not None:
            run_dir = workdir / run_id
        elif store.path is not None:
            run_dir = store.path.parent / "runs" / run_id
        else:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="leadtime-"))
            run_dir = Path(scratch) / run_id
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SetupError(f"cannot make the run directory {run_dir}: {e.strerror}") from e
        secret = protocol.generate_secret()
        manager = Manager(secret, host=bind, heartbeat_s=heartbeat_s)
        try:
            host, port = await manager.start()
        except OSError as e:
            raise SetupError(f"the manager cannot listen on {bind}: {e}") from e
        stack.push_async_callback(manager.close)
        if host in ("0.0.0.0", "::"):
            host = wildcard
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        yield RunManager(manager, address, secret, run_dir)


@contextlib.asynccontextmanager
async def local_pilots(
    options: LocalOptions, store: Store, run_id: str
) -> AsyncIterator[tuple[LocalBackend, RemoteWorkers]]:
    """This process as the run's manager, and pilots of local workers that connect to it.

    The run's secret reaches the workers through their environment only.
    """
    async with run_manager(
        options.bind, options.heartbeat_s, options.workdir, store, run_id, wildcard="127.0.0.1"
    ) as run:
        backend = LocalBackend(
            run.address,
            run.run_dir,
            worker_args=options.worker_args,
            worker_env={protocol.SECRET_ENV: run.secret.hex()},
            oversubscribe=options.oversubscribe,
        )
        yield backend, RemoteWorkers(run.manager)


@contextlib.asynccontextmanager
async def slurm_pilots(
    options: SlurmOptions, store: Store, run_id: str
) -> AsyncIterator[tuple[SlurmBackend, RemoteWorkers]]:
    """This process as the run's manager, and Slurm pilots whose workers connect to it.

    The workers run this process's interpreter (a virtual environment's works
    on any node that shares its file system). The run's secret reaches them
    through a file of mode 0600 in the run directory, removed when the run
    ends: not on their command line (any user can read it), nor in the batch
    script (slurmctld keeps a copy).
    """
    bind = options.bind or host_address()
    async with run_manager(
        bind, options.heartbeat_s, options.workdir, store, run_id, wildcard=socket.getfqdn()
    ) as run:
        secret_file = protocol.write_secret(run.run_dir / "secret", run.secret)
        try:
            command = [*WORKER_COMMAND, "--manager", run.address, "--secret-file", str(secret_file)]
            backend = SlurmBackend(
                [*command, *options.worker_args],
                run.run_dir,
                sbatch_options=options.sbatch_options,
                poll_interval_s=options.poll_interval_s,
            )
            yield backend, RemoteWorkers(run.manager)
        finally:
            secret_file.unlink(missing_ok=True)


NODE = Resources(cores=1024, memory=1024 * 4096.0, disk=1_000_000.0)
"""A node as large as any stage may ask, when the backend does not say."""


async def _slurm_node(backend: SlurmBackend, workflow: Workflow) -> Resources:
    """The largest node of the partitions the workflow's stages ask for, as sinfo tells it
    (:data:`NODE` where it cannot: a guess the workers that arrive correct)."""
    size = await backend.node_size({s.allocation.partition for s in workflow.stages})
    if size is None:
        return NODE
    return Resources(size.cpus, float(size.memory_mb), float(size.tmp_disk_mb or NODE.disk))


def _node(cluster: ClusterSpec) -> Resources:
    memory = cluster.memory_per_node_mb or 4096.0 * cluster.cores_per_node
    return Resources(cluster.cores_per_node, memory, SimulatedWorkers.DISK_MB)


def run_simulated(workflow: Workflow, config: RunConfig, db: str | Path = ":memory:") -> RunSummary:
    """Run ``workflow`` on the simulated cluster, on virtual time, from synchronous code."""

    async def main() -> RunSummary:
        async with await Store.open(db) as store:
            return await execute(workflow, config, store)

    return clock.run(main(), virtual=True)


__all__ = [
    "BACKENDS",
    "TRACES",
    "LocalOptions",
    "MockOptions",
    "RunConfig",
    "SetupError",
    "SlurmOptions",
    "execute",
    "replace",
    "run_simulated",
]
