"""Our replay of the bucketing paper's five synthetic workflows next to the paper's own runs.

Ground truth: the true peaks of ``../shared/data/ipdps2024/synthetic_<dist>_whole``
(the whole-machine runs never fail). Every sizer replays them on workers of 16
cores / 64,000 MB / 64,000 MB under two bounding models of when an exhaustion
shows: slow peaks (at the end of the run, reporting only the allocation: the
worst case) and fast peaks (at once, reporting the true peak: the best case).
The paper's TaskVine runs (``../shared/reference/ANCHORS.md``) should fall
between. Marks: ``*`` best slow replay in the column, ``+`` best fast replay,
``^`` best of the paper's runs.

    python bench/sizing_anchors.py [--workers 20]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from learners.sizing import SIZERS
from workflows.datasets import data_dir
from workflows.sizing_bench import PAPER_WORKER, bench_sizing
from workflows.traces import load_trace

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


def table(workflow: str, ours: dict, paper: dict) -> list[str]:
    """One workflow's block: per algorithm, slow / fast / paper for each resource and retries."""
    columns = (*RESOURCES, "retries")
    best = {}
    for c in columns:
        pick = min if c == "retries" else max
        for source, values in (("slow", ours["slow"]), ("fast", ours["fast"])):
            best[source, c] = pick(values[a][c] for a in values)
        papers = [paper[workflow, a][c] for a in SIZERS if (workflow, a) in paper]
        best["paper", c] = pick(papers)
    marks = {"slow": "*", "fast": "+", "paper": "^"}

    def cell(source: str, c: str, value: float | None) -> str:
        if value is None:
            return f"{'-':>6} "
        mark = marks[source] if value == best[source, c] else " "
        return f"{value:>6.0f}{mark}" if c == "retries" else f"{value:>6.3f}{mark}"

    head = f"{workflow:<19}" + "".join(f"{c:^22}" for c in columns)
    sub = f"{'algorithm':<19}" + "".join(f"{'slow':>7}{'fast':>7}{'paper':>7} " for _ in columns)
    lines = [head, sub]
    for a in SIZERS:
        line = f"{a:<19}"
        for c in columns:
            theirs = paper.get((workflow, a), {}).get(c)
            line += cell("slow", c, ours["slow"][a][c]) + cell("fast", c, ours["fast"][a][c])
            line += cell("paper", c, theirs) + " "
        lines.append(line.rstrip())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=20, help="the paper ran 20-50")
    args = parser.parse_args(argv)
    root = data_dir()
    paper = paper_anchors(root.parent / "reference" / "ANCHORS.md")
    w = PAPER_WORKER
    print(
        f"AWE and retries, {args.workers} workers of {w.cores:g} cores / {w.memory:g} MB / ", end=""
    )
    print(f"{w.disk:g} MB; * best slow, + best fast, ^ best of the paper's runs")
    summary = []
    for workflow in WORKFLOWS:
        trace = load_trace(root / "ipdps2024" / f"synthetic_{workflow}_whole.tasks.csv")
        ours: dict = {}
        for peaks in ("slow", "fast"):
            results = bench_sizing(trace, list(SIZERS), workers=args.workers, peaks=peaks)
            ours[peaks] = {
                r.sizer: {**{k: u.awe for k, u in r.usage.items()}, "retries": r.retries}
                for r in results
            }
        print()
        print("\n".join(table(workflow, ours, paper)))
        for c in RESOURCES:
            top = {
                source: max(values, key=lambda a, c=c, v=values: v[a][c])
                for source, values in ours.items()
            }
            theirs = max(
                (a for a in SIZERS if (workflow, a) in paper), key=lambda a: paper[workflow, a][c]
            )
            summary.append(
                f"{workflow:<12} {c:<7} slow {ours['slow'][top['slow']][c]:.3f} {top['slow']:<18} "
                f"fast {ours['fast'][top['fast']][c]:.3f} {top['fast']:<18} "
                f"paper {paper[workflow, theirs][c]:.3f} {theirs}"
            )
    print("\nbest per cell")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
