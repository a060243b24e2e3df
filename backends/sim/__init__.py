"""The simulated Slurm cluster as a backend (``--backend mock``): pilots queue on virtual time
behind a replayed queue log (:mod:`backends.sim.swf`, under a site policy:
:mod:`backends.sim.site`) or synthetic load (:mod:`backends.sim.workload`), in a
discrete-event core (:mod:`backends.sim.simulator`) behind an asyncio adapter
(:mod:`backends.sim.backend`); their workers are simulated too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from backends.options import RunSite, Seconds, Workers, one_of, option, positive
from backends.sim.backend import MockSlurm
from backends.sim.simulator import Priority
from backends.sim.site import QueueModel, SitePolicy
from backends.sim.swf import BUILTIN_TRACES, SwfTrace, load_trace, trace_path
from backends.sim.workload import ClusterSpec, SyntheticLoad, TraceReplay
from workflows.datasets import DataNotFound

__all__ = ["MockOptions", "MockSlurm", "open"]


def _trace(text: str) -> str | None:
    """A shipped log's name, in any case, the path of an SWF file or the name of a log of the
    data directory (:func:`~backends.sim.swf.trace_path`); none: no log."""
    if text.lower() == "none":
        return None
    try:
        trace_path(text)
    except DataNotFound as e:
        raise ValueError(str(e)) from None
    return text.upper() if text.upper() in BUILTIN_TRACES else text


@dataclass(frozen=True, kw_only=True)
class MockOptions:
    """The simulated cluster: a replayed trace, or synthetic load on a given cluster."""

    name: ClassVar[str] = "mock"
    workers: ClassVar[Workers] = Workers.SIMULATED

    trace: str | None = option(
        None,
        "Mock background load: HPC2N, KTH, CTC, an SWF file, or an SWF log in the swf "
        "directory of $LEADTIME_DATA by the start of its file name (SDSC-BLUE, say); none: "
        "synthetic load (--load).",
        parse=_trace,
    )
    """None for synthetic load."""
    load: float = option(0.7, "Mock synthetic utilisation without --trace (0: idle).")
    trace_load: float = option(
        1.0, "Mock trace arrival-rate factor (1: as recorded).", parse=positive
    )
    cluster: ClusterSpec | None = option(
        None,
        "Mock cluster NODESxCORES[:MEMORY per node], e.g. 9x28:128G.",
        parse=ClusterSpec.parse,
    )
    priority: str = option(
        "submit",
        "Mock queue order: submit (FIFO, priority/basic) or eligible time.",
        parse=one_of("priority", get_args(Priority)),
    )
    queue_model: str = option(
        QueueModel.SITE.value,
        "Mock scheduling of the replayed log: site (its per-user limits, whole nodes where "
        "its machine gave them, its cancelled jobs queued until cancelled), fair-share (site "
        "with Slurm's fair-share priority, age counted as --priority says) or easy (FIFO and "
        "EASY backfill alone).",
        parse=one_of("queue model", [m.value for m in QueueModel]),
    )
    """Synthetic load is always ``easy``."""
    offset: Seconds | None = option(
        None, "Mock trace offset from its start (781d, or 67500401 seconds)."
    )
    warmup: float | None = None
    cluster_scale: int = 1
    seed: int = 0
    """The seed of synthetic load."""


def open(options: MockOptions, run: RunSite | None = None) -> MockSlurm:
    """The simulated cluster (it lives in memory: ``run`` is not used)."""
    common: dict[str, Any] = {"priority": options.priority}
    if options.trace is not None:
        extra = {} if options.warmup is None else {"warmup": options.warmup}
        log, policy = _log_and_policy(options.trace, options.queue_model)
        replay = TraceReplay(
            log,
            offset=options.offset,
            scale=options.cluster_scale,
            load=options.trace_load,
            site=policy,
            **extra,
        )
        return MockSlurm(options.cluster, background=replay, **common)
    if options.load <= 0:
        return MockSlurm(options.cluster, **common)
    cluster = options.cluster or ClusterSpec(nodes=64, cores_per_node=32)
    load = SyntheticLoad(utilisation=options.load, seed=options.seed, cluster=cluster)
    return MockSlurm(cluster, background=load, **common)


@functools.lru_cache(maxsize=8)
def _log_and_policy(trace: str, model: str) -> tuple[SwfTrace, SitePolicy]:
    """A log and the policy ``model`` reads from it, once per process (a comparison replays
    the same log in every run)."""
    log = load_trace(trace)
    return log, SitePolicy.of(model, log)
