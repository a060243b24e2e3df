"""elastic's trade-off between makespan and core-hours as lambda (``--cost``) goes from 0 to
large, with Big Job and Per-Stage as its two ends; the goal: both within 5%.

Every lambda meets the same queue as Big Job and Per-Stage: the same trace from the same
seeded offsets, the same task durations; each lambda's runs start from a fresh store, as
the comparison's do. Printed per workflow and lambda: the mean makespan over Big Job's and
the mean core-hours over Per-Stage's (each the mean over the scales of the ratio of the
means over the runs), and whether both are within 5% (the issue's goal).

    python bench/elastic_tradeoff.py [--costs 0,30,100,300,1000,10000] [--runs 3]
        [--scales 28,56,112] [--priority submit|eligible] [--trace HPC2N|none] [--load 0.7]
        [--strategy elastic|elastic-oracle] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from backends import clock
from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from orchestrator.compare import Row, compare
from orchestrator.session import RunConfig
from orchestrator.store import Store

EXAMPLES = Path(__file__).resolve().parent.parent / "workflows" / "examples"
WORKFLOWS = ("montage", "blast", "statistics")
GOAL = 1.05


async def rows_for(strategies: list[str], config: RunConfig, scales: list[int], runs: int):
    async with await Store.open(":memory:") as store:
        files = [EXAMPLES / f"{name}.toml" for name in WORKFLOWS]
        return await compare(files, strategies, scales, runs, config, store)


def ratios(rows: list[Row], ends: list[Row], strategy: str) -> dict[str, tuple[float, float]]:
    """Per workflow: mean over scales of makespan / Big Job's and core-hours / Per-Stage's."""
    by = {(r.workflow, r.scale, r.strategy): r for r in [*rows, *ends]}
    found = {}
    for workflow in WORKFLOWS:
        scales = sorted({r.scale for r in rows if r.workflow == workflow})
        makespan = [
            by[workflow, s, strategy].makespan_s / by[workflow, s, "bigjob"].makespan_s
            for s in scales
        ]
        hours = [
            by[workflow, s, strategy].core_hours / by[workflow, s, "per-stage"].core_hours
            for s in scales
        ]
        found[workflow] = (sum(makespan) / len(makespan), sum(hours) / len(hours))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", default="0,30,100,300,1000,10000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scales", default="28,56,112")
    parser.add_argument("--priority", default="submit", choices=("submit", "eligible"))
    parser.add_argument("--trace", default="HPC2N", help="a trace, or none: synthetic load")
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--strategy", default="elastic", choices=("elastic", "elastic-oracle"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trace = None if args.trace.lower() == "none" else args.trace
    cluster = None if trace else ClusterSpec(9, 28, 128 * 1024)  # HPC2N's shape
    mock = MockOptions(trace=trace, load=args.load, cluster=cluster, priority=args.priority)
    config = RunConfig(backend=mock)
    scales = [int(s) for s in args.scales.split(",")]
    ends = clock.run(rows_for(["bigjob", "per-stage"], config, scales, args.runs), virtual=True)
    table = []
    for cost in (float(c) for c in args.costs.split(",")):
        rows = clock.run(
            rows_for([args.strategy], replace(config, cost=cost), scales, args.runs), virtual=True
        )
        for workflow, (makespan, hours) in ratios(rows, ends, args.strategy).items():
            table.append({"workflow": workflow, "cost": cost, "makespan": makespan, "ch": hours})
    if args.json:
        print(json.dumps(table))
        return
    queue = f"{trace} replayed" if trace else f"synthetic load {args.load:g} on 9x28"
    print(f"{args.strategy}, {queue}, priority by {args.priority} time, {args.runs} runs")
    print("workflow    lambda (s/CH)  makespan/Big Job  core-hours/Per-Stage  goal")
    for row in table:
        met = "yes" if row["makespan"] <= GOAL and row["ch"] <= GOAL else "no"
        print(
            f"{row['workflow']:11s} {row['cost']:13g}  {row['makespan']:16.2f}  "
            f"{row['ch']:20.2f}  {met}"
        )


if __name__ == "__main__":
    main()
