"""``leadtime bench sizing``: replay a trace through sizers and tabulate how they did.

For each sizer and resource: Absolute Workflow Efficiency, the waste split
into internal fragmentation and failed allocations (shares of all allocated
resource x time, so the three add up to 1), retries (killed attempts, % of
tasks) and completed tasks per worker-hour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from learners.attempt_end import Peaks
from learners.replay import ReplayResult, replay
from learners.resources import Resources
from learners.sizing import make_sizer, split_sizer
from workflows.traces import Trace, load_trace

PAPER_WORKER = Resources(16, 64000, 64000)
"""The bucketing paper's workers: 16 cores, 64,000 MB of memory and of disk."""


def widened(worker: Resources, trace: Trace) -> Resources:
    """``worker``, doubled per resource until the trace's largest task fits."""
    sizes = {}
    for r in ("cores", "memory", "disk"):
        size = worker[r]
        largest = max((t.peak[r] for t in trace.tasks), default=0.0)
        while size < largest:
            size *= 2
        sizes[r] = size
    return Resources(**sizes)


def bench_sizing(
    trace: str | Path | Trace,
    sizers: Sequence[str],
    *,
    workers: int = 20,
    worker: Resources = PAPER_WORKER,
    seed: int = 0,
    peaks: Peaks = "calibrated",
    use_series: bool = True,
    time_varying: bool = True,
    arrivals: Sequence[float] | None = None,
) -> list[ReplayResult]:
    """Replay ``trace`` through each sizer of ``sizers`` (names as :func:`make_sizer` takes).

    See :func:`learners.replay.replay` for ``peaks``, ``use_series``, ``time_varying``
    and ``arrivals`` (then ``workers`` is their number).
    """
    for name in sizers:
        split_sizer(name)  # every name checked before the first, maybe long, replay
    if not isinstance(trace, Trace):
        trace = load_trace(trace)
    return [
        replay(
            trace.tasks,
            make_sizer(name, worker=worker, seed=seed, resources=trace.resources),
            workers=workers if arrivals is None else len(arrivals),
            worker=worker,
            resources=trace.resources,
            use_series=use_series,
            peaks=peaks,
            time_varying=time_varying,
            arrivals=arrivals,
            seed=seed,
        )
        for name in sizers
    ]


def sizing_rows(results: Sequence[ReplayResult]) -> list[dict[str, float | str | int]]:
    """Rows for ``--json``: sizer, resource, awe, waste_fragmentation, waste_failed,
    retries_pct, retries, unfit, tasks_per_worker_hour (wastes in resource units x seconds)."""
    return [row for result in results for row in result.rows()]


def format_sizing_table(results: Sequence[ReplayResult]) -> str:
    """The human table: one line per sizer and resource."""
    header = (
        f"{'sizer':<20} {'resource':<8} {'AWE':>6} {'fragm.':>7} {'failed':>7} "
        f"{'retries':>8} {'unfit':>5} {'tasks/worker-h':>14}"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        for i, (r, usage) in enumerate(result.usage.items()):
            total = usage.allocated
            frag = usage.fragmentation / total if total else math.nan
            failed = usage.failed / total if total else math.nan
            name = result.sizer if i == 0 else ""
            rate = result.tasks_per_worker_hour
            tail = f"{result.retries_pct:>7.1f}% {result.unfit:>5} {rate:>14.2f}" if i == 0 else ""
            lines.append(
                f"{name:<20} {r:<8} {usage.awe:>6.3f} {frag:>7.1%} {failed:>7.1%} {tail}".rstrip()
            )
    return "\n".join(lines)
