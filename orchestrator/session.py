"""Everything one run needs, assembled from a few options: backend, learners, planner, engine.

The CLI, the comparison and the tests all start runs through :func:`execute`,
so a run looks the same whichever door it came in by.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from backends.base import BatchBackend
from backends.mock import MockSlurm
from backends.workload import ClusterSpec, SyntheticLoad, TraceReplay
from learners.queue_wait import GEOMETRY_FIELDS
from learners.resources import Resources
from learners.sizing import make_sizer
from learners.sizing.base import TaskFeatures
from orchestrator import clock
from orchestrator.engine import Engine, EngineOptions, Observer, WorkerSource
from orchestrator.planner import Planner, make_planner
from orchestrator.pool import Pool
from orchestrator.simulate import SimulatedWorkers, task_truths
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from orchestrator.waits import DEFAULT_POLICY, QueueWaits
from workflows.spec import Allocation, Task, Workflow

BACKENDS = ("mock", "local", "slurm")
DEFAULT_SIZER = "ksegments"
"""The best mean AWE over every shared trace with at most 10% of tasks retried (docs/sizing.md)."""
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
    offset: float | None = None
    warmup: float | None = None
    cluster_scale: int = 1
    seed: int = 0

    def backend(self) -> MockSlurm:
        common: dict[str, Any] = {"priority": self.priority}
        if self.trace is not None:
            extra = {} if self.warmup is None else {"warmup": self.warmup}
            replay = TraceReplay.of(
                self.trace,
                offset=self.offset,
                scale=self.cluster_scale,
                load=self.trace_load,
                **extra,
            )
            return MockSlurm(self.cluster, background=replay, **common)
        if self.load <= 0:
            return MockSlurm(self.cluster, **common)
        cluster = self.cluster or ClusterSpec(nodes=64, cores_per_node=32)
        load = SyntheticLoad(utilisation=self.load, seed=self.seed, cluster=cluster)
        return MockSlurm(cluster, background=load, **common)


@dataclass(frozen=True)
class RunConfig:
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
    """Run ``workflow`` once and return its figures (the store keeps the details)."""
    mock = None
    if backend is None:
        backend = mock = config.mock.backend()
    elif isinstance(backend, MockSlurm):
        mock = backend
    node = _node(mock.cluster) if mock else NODE
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
    try:
        return await engine.run()
    finally:
        await backend.close()


NODE = Resources(cores=1024, memory=1024 * 4096.0, disk=1_000_000.0)
"""A node as large as any stage may ask, when the backend does not say."""


def _node(cluster: ClusterSpec) -> Resources:
    memory = cluster.memory_per_node_mb or 4096.0 * cluster.cores_per_node
    return Resources(cluster.cores_per_node, memory, SimulatedWorkers.DISK_MB)


def run_simulated(workflow: Workflow, config: RunConfig, db: str | Path = ":memory:") -> RunSummary:
    """Run ``workflow`` on the simulated cluster, on virtual time, from synchronous code."""

    async def main() -> RunSummary:
        async with await Store.open(db) as store:
            return await execute(workflow, config, store)

    return clock.run(main(), virtual=True)


__all__ = ["BACKENDS", "TRACES", "MockOptions", "RunConfig", "execute", "replace", "run_simulated"]
