"""Background load for the simulated cluster: a trace replay or a synthetic generator.

Both produce a :class:`JobStream` (arrays sorted by submit time) placed on the
simulator's clock so that ``warmup`` seconds of load precede the moment the
workflow starts: the workflow then meets a queue in steady state, not an empty
machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from backends.sim.site import NO_POLICY, SitePolicy
from backends.sim.swf import SwfTrace, load_trace
from workflows import quantity

WEEK = 7 * 86400.0

REPLAY_NODE = (28, 128 * 1024)
"""Cores and memory (MB) of a node of the cluster a trace is replayed on by default: HPC2N's
Kebnekaise nodes, on which the ASA paper (Souza et al.) ran its experiments. The logs' own
machines had nodes of one to two processors, too small for a stage's pilot."""


@dataclass(frozen=True)
class ClusterSpec:
    """Identical nodes of one partition; memory defaults to 4 GiB per core."""

    nodes: int
    cores_per_node: int
    memory_per_node_mb: int | None = None
    partition: str = "batch"
    node_prefix: str = "node"

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.cores_per_node < 1:
            shape = f"{self.nodes}x{self.cores_per_node}"
            raise ValueError(f"a cluster needs nodes and cores, got {shape}")
        if self.memory_per_node_mb is None:
            object.__setattr__(self, "memory_per_node_mb", 4096 * self.cores_per_node)

    @property
    def total_cores(self) -> int:
        return self.nodes * self.cores_per_node

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """``NODESxCORES`` or ``NODESxCORES:MEMORY`` per node, e.g. ``9x28:128G``."""
        shape, _, memory = text.partition(":")
        nodes, _, cores = shape.lower().partition("x")
        try:
            memory_mb = round(quantity.size_mb(memory)) if memory else None
            return cls(int(nodes), int(cores), memory_mb)
        except ValueError as e:
            raise ValueError(f"cluster {text!r}: expected NODESxCORES[:MEMORY] ({e})") from None

    def node_names(self) -> list[str]:
        width = len(str(self.nodes))
        return [f"{self.node_prefix}{i:0{width}d}" for i in range(1, self.nodes + 1)]

    @classmethod
    def holding(cls, procs: int) -> ClusterSpec:
        """The fewest :data:`REPLAY_NODE` nodes that hold ``procs`` processors."""
        cores, memory_mb = REPLAY_NODE
        return cls(
            nodes=max(1, math.ceil(procs / cores)),
            cores_per_node=cores,
            memory_per_node_mb=memory_mb,
        )

    def scaled(self, factor: int) -> ClusterSpec:
        """``factor`` times as many nodes of the same kind."""
        return ClusterSpec(
            self.nodes * factor,
            self.cores_per_node,
            self.memory_per_node_mb,
            self.partition,
            self.node_prefix,
        )

    @classmethod
    def for_trace(cls, trace: SwfTrace) -> ClusterSpec:
        """MaxNodes nodes of MaxProcs/MaxNodes cores (rounded down).

        Without MaxNodes the trace says nothing about node boundaries, so every
        processor becomes a one-core node: jobs then pack exactly as the trace's
        processor counts allow, with no fragmentation the log did not have.
        """
        procs = trace.max_procs()
        nodes = trace.header.max_nodes or procs
        return cls(nodes=nodes, cores_per_node=max(1, procs // nodes))


@dataclass(frozen=True)
class JobStream:
    """Background jobs: submit times, cores, runtimes capped by time limits, time limits (s);
    users (0, 1, ...; all one user's when not given) and patience: the seconds after its
    submission at which a job not yet ended is cancelled (``inf``: never)."""

    submit: np.ndarray
    cores: np.ndarray
    run: np.ndarray
    limit: np.ndarray
    user: np.ndarray = None  # type: ignore[assignment]
    patience: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        n = len(self.submit)
        if self.user is None:
            object.__setattr__(self, "user", np.zeros(n, np.int64))
        if self.patience is None:
            object.__setattr__(self, "patience", np.full(n, np.inf))
        if any(len(a) != n for a in (self.cores, self.run, self.limit, self.user, self.patience)):
            raise ValueError("job stream arrays differ in length")
        if n and np.any(np.diff(self.submit) < 0):
            raise ValueError("job stream is not sorted by submit time")

    def __len__(self) -> int:
        return len(self.submit)

    def _with(self, submit: np.ndarray, rows: np.ndarray | slice = slice(None)) -> JobStream:
        """These jobs (``rows`` of them) at new submit times."""
        return JobStream(
            submit,
            self.cores[rows],
            self.run[rows],
            self.limit[rows],
            self.user[rows],
            self.patience[rows],
        )

    def select(self, mask: np.ndarray) -> JobStream:
        return self._with(self.submit[mask], mask)

    def shifted(self, seconds: float) -> JobStream:
        return self._with(self.submit + seconds)

    def compressed(self, around: float, factor: float) -> JobStream:
        """Arrivals ``factor`` times as frequent, time measured from ``around``.

        The usual way to study a trace under heavier load: job shapes and
        runtimes stay as recorded, only the gaps between submissions shrink.
        """
        return self._with(around + (self.submit - around) / factor)

    @classmethod
    def from_trace(
        cls, trace: SwfTrace, max_cores: int | None = None, site: SitePolicy = NO_POLICY
    ) -> JobStream:
        """The trace's submit stream: requested processors (whole nodes' where ``site`` says
        the machine allocated them) and time limits, recorded runtimes, users, for the jobs
        :func:`replayable` keeps. Runtimes beyond the time limit are cut to it, as the limit
        would kill them. A job the site policy withdraws holds its place in the queue until
        its recorded cancellation; started before, it ends at once (it never ran, the log
        records no runtime for it)."""
        keep = replayable(trace, max_cores, site)
        limit = trace.time_limits()
        run = np.minimum(trace.jobs["run"], limit)
        patience = np.full(len(trace), np.inf)
        gone = site.withdraws(trace)
        patience[gone] = trace.jobs["wait"][gone]
        run[gone] = 0.0
        _, user = np.unique(trace.jobs["user"][keep], return_inverse=True)
        return cls(
            submit=trace.jobs["submit"][keep].astype(np.float64),
            cores=site.footprint(trace.procs())[keep].astype(np.int64),
            run=run[keep].astype(np.float64),
            limit=limit[keep].astype(np.float64),
            user=user.astype(np.int64),
            patience=patience[keep],
        )

    def rotated_copies(self, copies: int) -> JobStream:
        """``copies`` overlaid copies, copy i rotated by i/copies of the stream's span.

        Each copy keeps every job and the total span stays the same, so a cluster
        ``copies`` times larger sees the same utilisation from independent-looking
        load rather than from ``copies`` synchronised bursts. Each copy's users are
        users of their own.
        """
        if copies == 1 or not len(self):
            return self
        t0, span = self.submit[0], self.submit[-1] - self.submit[0] + 1.0
        submit = np.concatenate(
            [t0 + (self.submit - t0 + i * span / copies) % span for i in range(copies)]
        )
        order = np.argsort(submit, kind="stable")
        users = int(self.user.max()) + 1
        user = np.concatenate([self.user + i * users for i in range(copies)])
        tile = [np.tile(a, copies)[order] for a in (self.cores, self.run, self.limit)]
        return JobStream(submit[order], *tile, user[order], np.tile(self.patience, copies)[order])


def replayable(
    trace: SwfTrace, max_cores: int | None = None, site: SitePolicy = NO_POLICY
) -> np.ndarray:
    """Which jobs of a trace a replay submits.

    Jobs without a recorded runtime never ran and are left out, as are jobs
    asking for more than ``max_cores`` (Slurm rejects those at submission),
    unless the site policy withdraws cancelled jobs: those queued until then.
    """
    cores = site.footprint(trace.procs())
    keep = ((trace.jobs["run"] >= 0) | site.withdraws(trace)) & (cores > 0)
    if max_cores is not None:
        keep &= cores <= max_cores
    return keep


class Background(Protocol):
    """A source of background jobs for the simulated cluster, and the site policy it runs
    under (which the simulator applies: per-user limits, fair share)."""

    site: SitePolicy

    def default_cluster(self) -> ClusterSpec:
        """The machine this load was recorded or generated for."""
        ...

    def stream(self, start: float, cluster: ClusterSpec) -> JobStream:
        """Jobs on the simulator's clock; those before ``start`` are the warm-up."""
        ...


@dataclass(frozen=True)
class TraceReplay:
    """Replay an SWF trace from ``offset`` seconds after its UnixStartTime on, or
    from the submission of its ``start_job``-th job (a 0-based position).

    The workflow's start is mapped to that trace time; the jobs of the
    ``warmup`` seconds before it are replayed first, at full speed, so the queue
    is in steady state when the workflow arrives. Without an offset or a job
    index the replay starts one warm-up period after the trace's first job.
    ``scale`` runs a ``scale`` times larger cluster under that many rotated
    copies of the trace (:meth:`JobStream.rotated_copies`). ``load`` multiplies
    the arrival rate (:meth:`JobStream.compressed`), a what-if for a busier
    machine; 1 replays the trace as recorded. ``site`` is the policy the jobs
    are replayed under (:meth:`SitePolicy.of`); by default none.
    """

    trace: SwfTrace
    offset: float | None = None
    start_job: int | None = None
    warmup: float = WEEK
    scale: int = 1
    load: float = 1.0
    site: SitePolicy = NO_POLICY

    def __post_init__(self) -> None:
        if self.offset is not None and self.start_job is not None:
            raise ValueError("give a trace offset or a start job, not both")
        if self.warmup < 0 or self.scale < 1:
            raise ValueError(f"need warmup >= 0 and scale >= 1, got {self.warmup}, {self.scale}")
        if not self.load > 0:
            raise ValueError(f"load must be positive, got {self.load}")

    @classmethod
    def of(cls, trace: SwfTrace | str | Path, **options: Any) -> TraceReplay:
        """A replay of a trace object, a known trace name (HPC2N, KTH, CTC) or an SWF path."""
        return cls(trace if isinstance(trace, SwfTrace) else load_trace(trace), **options)

    def default_cluster(self) -> ClusterSpec:
        """Nodes of 28 cores and 128 GB holding the log's processors (:meth:`ClusterSpec.holding`),
        ``scale`` times as many: the stages of a workflow fit, and the log's jobs keep their
        processor counts."""
        return ClusterSpec.holding(self.trace.max_procs()).scaled(self.scale)

    def origin(self) -> float:
        """The trace time (seconds since UnixStartTime) at which the workflow starts."""
        submit = self.trace.jobs["submit"]
        if self.start_job is not None:
            if not 0 <= self.start_job < len(submit):
                raise ValueError(f"start_job {self.start_job} is not among {len(submit)} jobs")
            return float(submit[self.start_job])
        if self.offset is not None:
            return float(self.offset)
        return float(submit[0]) + self.warmup if len(submit) else 0.0

    def stream(self, start: float, cluster: ClusterSpec) -> JobStream:
        jobs = JobStream.from_trace(self.trace, max_cores=cluster.total_cores, site=self.site)
        jobs = jobs.rotated_copies(self.scale)
        origin = self.origin()
        jobs = jobs.select(jobs.submit >= origin - self.warmup * self.load)
        return jobs.compressed(origin, self.load).shifted(start - origin)


@dataclass(frozen=True)
class SyntheticLoad:
    """Poisson arrivals keeping the cluster ``utilisation`` busy on average.

    Job sizes are log-uniform between 1 and ``max_job_fraction`` of the cluster,
    rounded to powers of two for ``pow2_fraction`` of the jobs (as in parallel
    workload models); runtimes are lognormal with median ``median_runtime``; time
    limits overestimate runtimes by a uniform factor up to ``overestimate``,
    rounded up to ``limit_rounding`` seconds (users ask in round numbers).
    Its jobs are all one user's; ``site`` is the policy they run under (none by default).
    """

    utilisation: float = 0.7
    median_runtime: float = 1800.0
    runtime_sigma: float = 1.5
    max_runtime: float = 2 * 86400.0
    max_job_fraction: float = 0.25
    pow2_fraction: float = 0.75
    overestimate: float = 4.0
    limit_rounding: float = 900.0
    duration: float = 30 * 86400.0
    warmup: float = 2 * 86400.0
    seed: int | np.random.Generator | None = None
    cluster: ClusterSpec | None = None
    site: SitePolicy = NO_POLICY

    def __post_init__(self) -> None:
        if not 0 < self.utilisation <= 1.5:
            raise ValueError(f"utilisation must be in (0, 1.5], got {self.utilisation}")
        if not 0 < self.max_job_fraction <= 1:
            raise ValueError(f"max_job_fraction must be in (0, 1], got {self.max_job_fraction}")

    def default_cluster(self) -> ClusterSpec:
        return self.cluster or ClusterSpec(nodes=64, cores_per_node=32)

    def stream(self, start: float, cluster: ClusterSpec) -> JobStream:
        rng = np.random.default_rng(self.seed)
        horizon = self.warmup + self.duration
        largest = max(1.0, self.max_job_fraction * cluster.total_cores)
        # Draw job shapes first, then space arrivals so the work matches the target.
        mean_work = float(np.mean(np.prod(self._shapes(rng, 4096, largest)[:2], axis=0)))
        rate = self.utilisation * cluster.total_cores / mean_work
        n = int(rate * horizon * 1.2) + 16
        cores, run, limit = self._shapes(rng, n, largest)
        submit = np.cumsum(rng.exponential(1.0 / rate, n))
        keep = submit < horizon
        return JobStream(
            submit=submit[keep] + start - self.warmup,
            cores=cores[keep],
            run=run[keep],
            limit=limit[keep],
        )

    def _shapes(
        self, rng: np.random.Generator, n: int, largest: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        log_size = rng.uniform(0.0, math.log2(largest), n)
        pow2 = rng.random(n) < self.pow2_fraction
        cores = np.where(pow2, np.exp2(np.round(log_size)), np.round(np.exp2(log_size)))
        cores = np.clip(cores, 1, int(largest)).astype(np.int64)
        run = rng.lognormal(math.log(self.median_runtime), self.runtime_sigma, n)
        run = np.clip(np.round(run), 1.0, self.max_runtime)
        wanted = run * rng.uniform(1.0, self.overestimate, n)
        limit = np.ceil(wanted / self.limit_rounding) * self.limit_rounding
        return cores, run, np.maximum(limit, run)
