"""Hand-written allocations against ``allocation = "auto"`` on the simulated HPC2N replay.

    python bench/auto_allocation.py [--runs N] [--trace HPC2N] [--cost S] [--strategy S]
                                    [--mode M] [--priority P] [--json]

For each of the montage, blast and statistics examples, under both priority modes
(``--priority submit``: FIFO; ``eligible``: age counted from eligibility, as Slurm's
multifactor priority does) and two queue models of the replay (``site``, the default of
``leadtime run``: the log's own policies with EASY backfill; ``fair-share``: Slurm's
multifactor fair-share priority as well), and at ``--runs`` seeded start points of the
trace: the
workflow as written, and the same workflow with every stage's allocation ``"auto"``, each
run twice on its own store (a learning run, then 6 h later the measured one, so the store
has learned its tasks' run times and its geometries' waits). Both variants meet the same
start points, task durations and strategy (``--strategy``: asa, whose one pilot a stage
``auto`` sizes, or elastic, whose units an automatic stage's width is cut into); ``--cost``
prices a core-hour in the width choice (0: wait + run time alone).

Printed per workflow and mode: the measured runs' mean makespan, total waiting time (TWT:
every pilot's time in the queue once eligible, those cancelled while they waited included)
and core-hours, hand-written and auto side by side with auto / hand ratios, and the share
of auto's pilots (over every run) that hit their time limit. The issue's goal: TWT ratio
<= 0.7 at makespan and core-hours ratios <= 1, time-limit hits <= 1%.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np

from backends import clock
from backends.sim import MockOptions
from orchestrator.compare import start_offsets
from orchestrator.elastic import DEFAULT_COST
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from workflows.spec import Allocation, Workflow, example, load

WORKFLOWS = ("montage", "blast", "statistics")
MODES = ("site", "fair-share")
PRIORITIES = ("submit", "eligible")
LEARN_GAP_S = 6 * 3600.0
"""The measured run starts this long after the learning run."""
WARMUP_S = 7 * 86400.0


def automatic(workflow: Workflow) -> Workflow:
    """``workflow`` with every stage's allocation ``"auto"`` (partition kept)."""
    stages = tuple(
        replace(s, allocation=Allocation(1, auto=True, partition=s.allocation.partition))
        for s in workflow.stages
    )
    return replace(workflow, stages=stages)


async def twice(workflow: Workflow, config: RunConfig, offset: float) -> list[RunSummary]:
    """A learning run and the measured one, on one fresh store."""
    found = []
    async with await Store.open(":memory:") as store:
        for k in range(2):
            at = replace(config.backend, offset=offset + k * LEARN_GAP_S)
            found.append(await execute(workflow, replace(config, backend=at), store))
    return found


def figures(runs: list[RunSummary]) -> dict[str, float]:
    done = [r for r in runs if r.status == "done"]
    pilots = [p for r in runs for p in r.pilots if p.start_t is not None]
    return {
        "makespan_s": float(np.mean([r.makespan_s for r in done])) if done else float("nan"),
        "twt_s": float(np.mean([r.twt_s for r in done])) if done else float("nan"),
        "core_hours": float(np.mean([r.core_hours for r in done])) if done else float("nan"),
        "failed": len(runs) - len(done),
        "pilots": len(pilots),
        "timeouts": sum(p.state == "TIMEOUT" for p in pilots),
    }


async def bench(
    trace: str,
    runs: int,
    seed: int,
    workflows: list[str],
    modes: list[str],
    priorities: list[str],
    cost: float,
    strategy: str,
) -> list[dict]:
    rows = []
    offsets = start_offsets(trace, runs, seed, WARMUP_S, 30 * 86400.0)
    for name in workflows:
        hand = load(example(name))
        variants = {"hand": hand, "auto": automatic(hand)}
        for mode, priority in ((m, p) for m in modes for p in priorities):
            measured: dict[str, list[RunSummary]] = {v: [] for v in variants}
            every: dict[str, list[RunSummary]] = {v: [] for v in variants}
            for i, offset in enumerate(offsets):
                mock = MockOptions(trace=trace, queue_model=mode, priority=priority, seed=seed + i)
                config = RunConfig(strategy=strategy, seed=seed + i, backend=mock, cost=cost)
                for variant, workflow in variants.items():
                    pair = await twice(workflow, config, offset)
                    measured[variant].append(pair[1])
                    every[variant] += pair
            row = {"workflow": name, "mode": mode, "priority": priority, "runs": runs}
            for variant in variants:
                mine = figures(measured[variant])
                mine.update({k: figures(every[variant])[k] for k in ("pilots", "timeouts")})
                row[variant] = mine
            rows.append(row)
    return rows


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan") if a > 0 else 1.0


def met(row: dict) -> bool:
    """The issue's goal in one row: TWT <= 0.7x, makespan and core-hours no worse, and at
    most 1% of auto's pilots at their time limit; every measured run finished."""
    h, a = row["hand"], row["auto"]
    return (
        not h["failed"]
        and not a["failed"]
        and ratio(a["twt_s"], h["twt_s"]) <= 0.7
        and ratio(a["makespan_s"], h["makespan_s"]) <= 1.0
        and ratio(a["core_hours"], h["core_hours"]) <= 1.0
        and ratio(a["timeouts"], a["pilots"]) <= 0.01
    )


def show(rows: list[dict]) -> None:
    head = (
        f"{'workflow':<11}{'mode':<11}{'priority':<10}{'makespan hand/auto':>22}{'ratio':>7}"
        f"{'TWT hand/auto':>20}{'ratio':>7}{'core-h hand/auto':>19}{'ratio':>7}"
        f"{'limit hits hand':>17}{'limit hits auto':>17}{'goal':>6}"
    )
    print(head)
    for r in rows:
        h, a = r["hand"], r["auto"]

        def hits(f: dict) -> str:
            return f"{f['timeouts']}/{f['pilots']} ({ratio(f['timeouts'], f['pilots']):.1%})"

        print(
            f"{r['workflow']:<11}{r['mode']:<11}{r['priority']:<10}"
            f"{h['makespan_s']:>10.0f} /{a['makespan_s']:>9.0f} s"
            f"{ratio(a['makespan_s'], h['makespan_s']):>7.2f}"
            f"{h['twt_s']:>9.0f} /{a['twt_s']:>7.0f} s{ratio(a['twt_s'], h['twt_s']):>7.2f}"
            f"{h['core_hours']:>9.1f} /{a['core_hours']:>7.1f}"
            f"{ratio(a['core_hours'], h['core_hours']):>7.2f}"
            f"{hits(h):>17}{hits(a):>17}{'yes' if met(r) else 'no':>6}"
        )
        for variant in ("hand", "auto"):
            if r[variant]["failed"]:
                print(f"  {variant}: {r[variant]['failed']} measured runs did not finish")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        print(f"{mode}: goal met in {sum(map(met, mine))} of {len(mine)} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="HPC2N")
    parser.add_argument("--runs", type=int, default=3, help="start points of the trace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workflow", action="append", choices=WORKFLOWS)
    parser.add_argument("--mode", action="append", choices=MODES, help="queue model")
    parser.add_argument("--priority", action="append", choices=PRIORITIES)
    parser.add_argument(
        "--cost", type=float, default=DEFAULT_COST, help="seconds of makespan per core-hour"
    )
    parser.add_argument("--strategy", choices=("asa", "elastic"), default="asa")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = bench(
        args.trace,
        args.runs,
        args.seed,
        args.workflow or list(WORKFLOWS),
        args.mode or list(MODES),
        args.priority or list(PRIORITIES),
        args.cost,
        args.strategy,
    )
    rows = clock.run(work, virtual=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        show(rows)


if __name__ == "__main__":
    main()
