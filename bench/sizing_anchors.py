"""Our replay of the bucketing paper's five synthetic workflows next to the paper's own runs.

Ground truth: the true peaks of ``ipdps2024/synthetic_<dist>_whole`` of the data directory,
``$LEADTIME_DATA`` (the whole-machine runs never fail). Every sizer replays them on workers of 16
cores / 64,000 MB / 64,000 MB, as many as the paper's run had and joining when
they did (the whole run's recorded concurrency: each of its tasks held a whole
worker), under three models of when an exhaustion shows: ``calibrated`` (when
the paper's own runs killed attempts, ``learners.kill_times``: the headline),
and the bounds ``slow`` (at the end of the run, reporting only the allocation)
and ``fast`` (at once, reporting the true peak). The paper's TaskVine runs
(``reference/ANCHORS.md`` beside the data directory) are the figures to beat. Marks: ``*``
best calibrated replay in the column, ``^`` best of the paper's runs.

The goal: the default sizer at or above the paper's best AWE of each cell (5
workflows x cores, memory, disk) with at most 10% of tasks retried.

    python bench/sizing_anchors.py [--workers N]   # N fixed workers instead of the recorded
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from learners.attempt_end import PEAKS
from learners.sizing import DEFAULT_SIZER, SIZERS
from workflows.datasets import data_dir
from workflows.sizing_bench import PAPER_WORKER, bench_sizing
from workflows.traces import load_trace

RETRY_LIMIT = 10.0
"""Retries, in % of tasks, the default may cost."""
WORKFLOWS = ("bimodal", "exponential", "normal", "trimodal", "uniform")
RESOURCES = ("cores", "memory", "disk")


def paper_anchors(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """ANCHORS.md's AWE table: (workflow, algorithm) -> AWE per resource and retries."""
    row = re.compile(r"^\| (\w+) \| ([\w-]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|$")
    out = {}
    for line in path.read_text().splitlines():
        m = row.match(line.strip())
        if m and m[1] in WORKFLOWS:
            out[m[1], m[2]] = dict(
                zip((*RESOURCES, "retries"), map(float, m.groups()[2:]), strict=True)
            )
    return out


def table(workflow: str, ours: dict, paper: dict, sizers: list[str]) -> list[str]:
    """One workflow's block: per algorithm, calibrated / slow / fast / paper per column."""
    columns = (*RESOURCES, "retries")
    best = {}
    for c in columns:
        pick = min if c == "retries" else max
        best["calibrated", c] = pick(ours["calibrated"][a][c] for a in sizers)
        best["paper", c] = pick(paper[workflow, a][c] for a in sizers if (workflow, a) in paper)
    marks = {"calibrated": "*", "paper": "^"}

    def cell(source: str, c: str, value: float | None) -> str:
        if value is None:
            return f"{'-':>6} "
        mark = marks.get(source, " ") if value == best.get((source, c)) else " "
        return f"{value:>6.0f}{mark}" if c == "retries" else f"{value:>6.3f}{mark}"

    sources = ("calibrated", "slow", "fast", "paper")
    head = f"{workflow:<19}" + "".join(f"{c:^29}" for c in columns)
    sub = f"{'algorithm':<19}" + "".join(
        f"{'calib':>7}{'slow':>7}{'fast':>7}{'paper':>7} " for _ in columns
    )
    lines = [head, sub]
    for a in sizers:
        line = f"{a:<19}"
        for c in columns:
            for source in sources:
                value = (
                    paper.get((workflow, a), {}).get(c) if source == "paper" else ours[source][a][c]
                )
                line += cell(source, c, value)
            line += " "
        lines.append(line.rstrip())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, help="fixed workers (default: the recorded ones)")
    args = parser.parse_args(argv)
    root = data_dir()
    paper = paper_anchors(root.parent / "reference" / "ANCHORS.md")
    sizers = list(SIZERS)
    w = PAPER_WORKER
    where = f"{args.workers} workers" if args.workers else "the recorded workers"
    print(f"AWE and retries on {where} of {w.cores:g} cores / {w.memory:g} MB / {w.disk:g} MB;")
    print("* best calibrated replay, ^ best of the paper's runs")
    goal = []
    for workflow in WORKFLOWS:
        trace = load_trace(root / "ipdps2024" / f"synthetic_{workflow}_whole.tasks.csv")
        arrivals = None if args.workers else trace.concurrency
        ours: dict = {}
        for peaks in PEAKS:
            results = bench_sizing(
                trace, sizers, workers=args.workers or 20, peaks=peaks, arrivals=arrivals
            )
            ours[peaks] = {
                r.sizer: {
                    **{k: u.awe for k, u in r.usage.items()},
                    "retries": r.retries,
                    "retries_pct": r.retries_pct,
                }
                for r in results
            }
        print()
        print("\n".join(table(workflow, ours, paper, sizers)))
        default = ours["calibrated"][DEFAULT_SIZER]
        for c in RESOURCES:
            theirs = max(
                (a for a in sizers if (workflow, a) in paper), key=lambda a: paper[workflow, a][c]
            )
            goal.append((workflow, c, default, paper[workflow, theirs][c], theirs, ours))
    print(
        f"\nthe default ({DEFAULT_SIZER}), calibrated replay (slow / fast bounds), "
        "against the paper's best"
    )
    print(
        f"{'workflow':<12} {'resource':<8} {'default':>7} {'slow':>6} {'fast':>6} "
        f"{'paper best':>17} {'retries %':>9}  goal"
    )
    met = 0
    for workflow, c, default, theirs, who, ours in goal:
        ok = default[c] >= theirs - 1e-9 and default["retries_pct"] <= RETRY_LIMIT
        met += ok
        slow, fast = ours["slow"][DEFAULT_SIZER][c], ours["fast"][DEFAULT_SIZER][c]
        print(
            f"{workflow:<12} {c:<8} {default[c]:>7.3f} {slow:>6.3f} {fast:>6.3f} "
            f"{theirs:>6.3f} {who:<10} {default['retries_pct']:>9.1f}  {'yes' if ok else 'no'}"
        )
    print(
        f"\n{met} of {len(goal)} cells at or above the paper's best with at most "
        f"{RETRY_LIMIT:g}% of tasks retried (goal: 13)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
