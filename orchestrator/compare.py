"""Strategies side by side under identical conditions (Table 1 of the ASA paper, Souza et al.).

Every strategy of a comparison meets the same cluster: the same trace under
the same queue model (by default ``site``, the log's own policies), from the
same start offset, with the same warm-up, and the same task durations (drawn
from the run's seed). Runs go in sequence, and every run uses the same
store, so the queue-wait learner starts each run with what the earlier ones
taught it, as the paper keeps Algorithm 1's state across its runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from backends.sim import MockOptions
from backends.sim.swf import load_trace
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from workflows.spec import Workflow, load

METRICS = ("twt_s", "makespan_s", "core_hours", "pwt_s", "oh_core_hours", "hit_ratio")
FLOOR = {"twt_s": 1.0, "makespan_s": 1.0, "pwt_s": 1.0, "core_hours": 0.01}
"""Normalising against a best of zero: a best below these counts as these (1 s, 0.01 CH).
OH is not normalised (its best is zero whenever one strategy never starts early)."""


@dataclass(frozen=True)
class Row:
    """The figures of one strategy on one workflow at one scale, averaged over the runs."""

    workflow: str
    scale: int
    strategy: str
    runs: int
    twt_s: float
    makespan_s: float
    core_hours: float
    pwt_s: float
    oh_core_hours: float
    hit_ratio: float | None
    failed: int = 0

    def as_json(self) -> dict:
        return {
            "workflow": self.workflow,
            "scale": self.scale,
            "strategy": self.strategy,
            "runs": self.runs,
            **{m: getattr(self, m) for m in METRICS},
            "failed": self.failed,
        }


def start_offsets(trace: str, runs: int, seed: int, warmup: float, margin: float) -> list[float]:
    """``runs`` seeded start points in the trace: a warm-up after its start, ``margin`` before
    its end."""
    submit = load_trace(trace).jobs["submit"]
    low, high = float(submit[0]) + warmup, float(submit[-1]) - margin
    if high <= low:
        raise ValueError(f"trace {trace} is too short for a {warmup:.0f} s warm-up")
    return sorted(np.random.default_rng(seed).uniform(low, high, runs).tolist())


Progress = Callable[[str, int, str, int, RunSummary], None]


async def compare(
    files: Sequence[Path],
    strategies: Sequence[str],
    scales: Sequence[int],
    runs: int,
    config: RunConfig,
    store: Store,
    *,
    observer_for: Callable[[Workflow, str], object] | None = None,
    progress: Progress | None = None,
    gap_s: float = 3600.0,
) -> list[Row]:
    """Run every strategy on every workflow and scale ``runs`` times; figures per row.

    A run is a sequence: its workflows and scales meet the trace one after the
    other, ``gap_s`` apart, from a seeded start, as the paper submitted its
    workflows one after the other; every strategy of a cell meets the same
    offset. Runs start at independent points of the trace.
    """
    mock = config.backend
    if not isinstance(mock, MockOptions):
        raise ValueError("a comparison needs the simulated cluster: only it replays identically")
    starts: list[float | None] = [None] * runs
    if mock.trace is not None:
        warmup = mock.warmup if mock.warmup is not None else 7 * 86400.0
        starts = list(start_offsets(mock.trace, runs, config.seed, warmup, 30 * 86400.0))
    results: dict[tuple[str, int, str], list[RunSummary]] = {}
    for run, start in enumerate(starts):
        cells = [(path, scale) for path in files for scale in scales]
        for k, (path, scale) in enumerate(cells):
            offset = None if start is None else start + k * gap_s
            workflow = load(path, scale=scale)
            for strategy in strategies:
                run_config = replace(
                    config,
                    strategy=strategy,
                    seed=config.seed + run,
                    scale=scale,
                    backend=replace(mock, offset=offset, seed=config.seed + run),
                )
                observer = observer_for(workflow, strategy) if observer_for else None
                if observer is None:
                    summary = await execute(workflow, run_config, store)
                else:
                    with observer as view:  # type: ignore[attr-defined]
                        summary = await execute(workflow, run_config, store, observer=view)
                results.setdefault((workflow.name, scale, strategy), []).append(summary)
                if progress is not None:
                    progress(workflow.name, scale, strategy, run, summary)
    return [_row(key, found) for key, found in results.items()]


def _row(key: tuple[str, int, str], found: list[RunSummary]) -> Row:
    done = [s for s in found if s.status == "done"]
    hits = [s.hit_ratio for s in done if s.hit_ratio is not None]

    def mean(metric: str) -> float:
        return float(np.mean([getattr(s, metric) for s in done])) if done else float("nan")

    return Row(
        *key,
        runs=len(found),
        twt_s=mean("twt_s"),
        makespan_s=mean("makespan_s"),
        core_hours=mean("core_hours"),
        pwt_s=mean("pwt_s"),
        oh_core_hours=mean("oh_core_hours"),
        hit_ratio=float(np.mean(hits)) if hits else None,
        failed=len(found) - len(done),
    )


def normalised(rows: Sequence[Row]) -> dict[tuple[str, str], dict[str, float]]:
    """Per workflow and strategy, each metric over the best strategy's at the same scale,
    averaged over the scales (1.0 = always the best), as the ASA paper's Table 1 does."""
    ratios: dict[tuple[str, str], dict[str, list[float]]] = {}
    cells = {(r.workflow, r.scale) for r in rows}
    for workflow, scale in cells:
        same = [r for r in rows if r.workflow == workflow and r.scale == scale]
        for metric, floor in FLOOR.items():
            best = max(min(getattr(r, metric) for r in same), floor)
            for r in same:
                value = max(getattr(r, metric), floor)
                ratios.setdefault((workflow, r.strategy), {}).setdefault(metric, []).append(
                    value / best
                )
    return {
        key: {metric: float(np.mean(values)) for metric, values in metrics.items()}
        for key, metrics in ratios.items()
    }
