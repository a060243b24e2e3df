"""Does elastic keep leadtime's promise? Big Job's makespan at Per-Stage's core-hours, on every
example workflow, under both priority modes, on a replayed queue and on synthetic load.

For each queue (the HPC2N replay; synthetic load 0.7 and 0.9 on 9 nodes of 28 cores) and each
priority mode (``submit``: FIFO; ``eligible``: age counted from eligibility, as Slurm's
multifactor priority does), one comparison of the three example workflows (``leadtime compare
workflows/examples/{montage,blast,statistics}.toml``, one store, the runs in sequence) by
``--strategies``. Printed per workflow: elastic's mean makespan over Big Job's and its mean
core-hours over Per-Stage's (each the mean over the scales of the ratio of the means over the
runs) and whether both are within 5% (the goal); with ``--tables``, also each comparison's
table normalised to the best strategy of each row, as ``leadtime compare`` prints it.

    python bench/elastic_goal.py [--runs 5] [--scales 28,56,112] [--unit task|node|N]
        [--cost 3000] [--queues hpc2n,0.7,0.9] [--priorities submit,eligible] [--tables]
        [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from elastic_tradeoff import EXAMPLES, GOAL, WORKFLOWS, ratios
from rich.console import Console

from backends import clock
from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from orchestrator.compare import compare
from orchestrator.report import compare_tables
from orchestrator.session import RunConfig
from orchestrator.store import Store

STRATEGIES = "bigjob,per-stage,asa,asa-naive,elastic"


def queue_options(queue: str, priority: str) -> MockOptions:
    """``hpc2n``: the HPC2N log replayed; a number: synthetic load of that utilisation on the
    HPC2N machine's shape."""
    if queue.lower() == "hpc2n":
        return MockOptions(trace="HPC2N", priority=priority)
    cluster = ClusterSpec(9, 28, 128 * 1024)
    return MockOptions(trace=None, load=float(queue), cluster=cluster, priority=priority)


async def comparison(config: RunConfig, strategies: list[str], scales: list[int], runs: int):
    async with await Store.open(":memory:") as store:
        files = [EXAMPLES / f"{name}.toml" for name in WORKFLOWS]
        return await compare(files, strategies, scales, runs, config, store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scales", default="28,56,112")
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--unit", default="task", help="elastic's --unit: task, node or cores")
    parser.add_argument("--cost", type=float, default=None, help="elastic's lambda (--cost)")
    parser.add_argument("--queues", default="hpc2n,0.7,0.9")
    parser.add_argument("--priorities", default="submit,eligible")
    parser.add_argument("--tables", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    scales = [int(s) for s in args.scales.split(",")]
    unit = int(args.unit) if args.unit.isdigit() else args.unit
    base = RunConfig(unit=unit)
    if args.cost is not None:
        base = replace(base, cost=args.cost)
    found = []
    console = Console(width=120)
    for queue in args.queues.split(","):
        for priority in args.priorities.split(","):
            config = replace(base, backend=queue_options(queue, priority))
            rows = clock.run(comparison(config, strategies, scales, args.runs), virtual=True)
            name = "HPC2N replay" if queue.lower() == "hpc2n" else f"synthetic {queue}"
            for workflow, (makespan, hours) in ratios(rows, rows, "elastic").items():
                met = makespan <= GOAL and hours <= GOAL
                found.append(
                    {"queue": name, "priority": priority, "workflow": workflow,
                     "makespan": makespan, "ch": hours, "goal": met}
                )  # fmt: skip
            if args.tables and not args.json:
                console.print(f"[bold]{name}, priority by {priority} time[/]")
                for table in compare_tables(rows):
                    console.print(table)
    if args.json:
        print(json.dumps(found))
        return
    print(f"elastic (--unit {args.unit}), {args.runs} runs, scales {args.scales}")
    print("queue          priority  workflow    makespan/Big Job  core-hours/Per-Stage  goal")
    for row in found:
        print(
            f"{row['queue']:14s} {row['priority']:9s} {row['workflow']:11s} "
            f"{row['makespan']:16.2f}  {row['ch']:20.2f}  {'yes' if row['goal'] else 'no'}"
        )
    met = sum(row["goal"] for row in found)
    print(f"goal met in {met} of {len(found)} cells")


if __name__ == "__main__":
    main()
