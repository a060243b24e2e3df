"""Choose the default sizer by measurement on every trace of ``../shared/data``.

Every sizer replays every task trace (the ipdps2024 ground truths, bioblast,
lobster, coffea, k-Segments' eager and sarek with their memory series, five
nf-core workflows) on 20 workers of 16 cores / 64,000 MB / 64,000 MB, doubled
per resource where a trace's largest task needs it, under slow peaks (the
worst case), with limits fixed for an attempt's life as on the engine's
backends (so k-Segments runs as the peak sizer the engine would run). A trace
scores a sizer by its mean AWE over the resources it measured; the default is
the best mean score over traces among the sizers whose retries average at most
10% of tasks (and that leave no task unfit).

    python bench/sizing_default.py [--json] [--sizer a,b] [--workers 20]
    python bench/sizing_default.py --rows rows.json   # the report from saved --json rows
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

from learners.sizing import SIZERS
from orchestrator import clock
from workflows.sizing_bench import PAPER_WORKER, bench_sizing, widened
from workflows.traces import all_traces, load_trace

RETRY_LIMIT = 10.0
"""Retries, in % of tasks, a default may cost on average."""

FAMILIES = {
    "ipdps2024": "synthetic_",
    "jobsizing": ("bioblast", "lobster", "coffea"),
    "k-segments": "_tasks",
    "nf-core": "trace_",
}


def family(trace: str) -> str:
    for name, mark in FAMILIES.items():
        marks = mark if isinstance(mark, tuple) else (mark,)
        if any(m in trace for m in marks):
            return name
    return "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizer", default=",".join(SIZERS), help="names, comma separated")
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="per trace and sizer rows")
    parser.add_argument("--rows", help="report on rows saved by --json instead of replaying")
    args = parser.parse_args(argv)
    if args.rows:
        with open(args.rows) as f:
            rows = json.load(f)
        print("\n".join(report(rows, list(dict.fromkeys(r["sizer"] for r in rows)))))
        return 0
    sizers = [s.strip() for s in args.sizer.split(",") if s.strip()]
    rows = []
    for path in all_traces():
        trace = load_trace(path)
        worker = widened(PAPER_WORKER, trace)
        for name in sizers:
            start = clock.monotonic()
            (result,) = bench_sizing(
                trace, [name], workers=args.workers, worker=worker, time_varying=False
            )
            rows.append(
                {
                    "trace": trace.name,
                    "family": family(trace.name),
                    "sizer": name,
                    "awe": statistics.fmean(u.awe for u in result.usage.values()),
                    **{f"awe_{r}": u.awe for r, u in result.usage.items()},
                    "retries_pct": result.retries_pct,
                    "unfit": result.unfit,
                }
            )
            took = clock.monotonic() - start
            print(f"{trace.name:<30} {name:<20} {took:6.1f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("\n".join(report(rows, sizers)))
    return 0


def report(rows: list[dict], sizers: list[str]) -> list[str]:
    """Mean AWE per trace family and overall, retries, and the choice."""
    families = list(dict.fromkeys(r["family"] for r in rows))
    by = defaultdict(list)
    for r in rows:
        by[r["sizer"], r["family"]].append(r)
        by[r["sizer"], "all"].append(r)
    scores = []
    for s in sizers:
        everything = by[s, "all"]
        awe = statistics.fmean(r["awe"] for r in everything)
        retries = statistics.fmean(r["retries_pct"] for r in everything)
        worst = max(everything, key=lambda r: r["retries_pct"])
        per_family = [statistics.fmean(r["awe"] for r in by[s, f]) for f in families]
        unfit = sum(r["unfit"] for r in everything)
        scores.append((s, awe, retries, worst, per_family, unfit))
    scores.sort(key=lambda x: -x[1])
    head = f"| sizer | {' | '.join(families)} | mean AWE | retries % (mean / worst trace) | ok |"
    lines = [head, "|" + "---|" * (len(families) + 4)]
    for s, awe, retries, worst, per_family, unfit in scores:
        ok = "yes" if retries <= RETRY_LIMIT and not unfit else "no"
        cells = " | ".join(f"{v:.3f}" for v in per_family)
        worst_text = f"{worst['retries_pct']:.1f} ({worst['trace']})"
        lines.append(f"| {s} | {cells} | {awe:.3f} | {retries:.1f} / {worst_text} | {ok} |")
    eligible = [x for x in scores if x[2] <= RETRY_LIMIT and not x[5]]
    if eligible:
        best = eligible[0]
        lines.append("")
        lines.append(
            f"default: {best[0]} (mean AWE {best[1]:.3f} over {len(by[best[0], 'all'])} traces, "
            f"retries {best[2]:.1f}% of tasks on average)"
        )
    else:
        lines.append(f"\nno sizer keeps retries within {RETRY_LIMIT:g}% of tasks")
    return lines


if __name__ == "__main__":
    sys.exit(main())
