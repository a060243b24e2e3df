"""Choose the default sizer by measurement on every task trace of $LEADTIME_DATA.

Every sizer replays every task trace (the ipdps2024 ground truths, bioblast,
lobster, coffea, k-Segments' eager and sarek with their memory series, five
nf-core workflows) on 20 workers of 16 cores / 64,000 MB / 64,000 MB, doubled
per resource where a trace's largest task needs it (the ipdps2024 traces on the
workers of their recorded run, as they came), tasks arriving at their recorded
submit times, kills at the calibrated times (``learners.kill_times``), with
limits fixed for an attempt's life as on the engine's backends (so k-Segments
runs as the peak sizer the engine would run).

A trace scores a sizer by its mean AWE over the resources it measured; the
default is the best mean score over traces among the sizers whose retries
average at most 10% of tasks (and that leave no task unfit). Throughput
(completed tasks per worker-hour) is reported beside it, as a share of the
best sizer's on each trace, so that a choice that serialises tasks shows. A
second table checks the issue's goals per trace: the default against the best
single published sizer that retries at most 10% of tasks, and its cores against
the user's request (AWE and throughput).

    python bench/sizing_default.py [--json] [--sizer a,b] [--trace x,y] [--workers 20] [--seed 0]
    python bench/sizing_default.py --rows rows.json   # the report from saved --json rows
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict

from backends import clock
from learners.sizing import DEFAULT_SIZER, SIZERS
from workflows.sizing_bench import PAPER_WORKER, bench_sizing, widened
from workflows.traces import all_traces, load_trace

RETRY_LIMIT = 10.0
"""Retries, in % of tasks, a default may cost on average."""

CANDIDATES = tuple(SIZERS)
"""Every sizer (the memory-only ones with their default companion)."""
OURS = ("budget", "select")
"""Sizers of this project; the others are the published algorithms and baselines."""

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
    parser.add_argument("--sizer", default=",".join(CANDIDATES), help="names, comma separated")
    parser.add_argument(
        "--trace", help="only traces whose names contain one of these, comma separated"
    )
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the kill draws and the sizers' generators"
    )
    parser.add_argument("--json", action="store_true", help="per trace and sizer rows")
    parser.add_argument("--rows", help="report on rows saved by --json instead of replaying")
    args = parser.parse_args(argv)
    if args.rows:
        with open(args.rows) as f:
            rows = json.load(f)
        print("\n".join(report(rows, list(dict.fromkeys(r["sizer"] for r in rows)))))
        return 0
    sizers = [s.strip() for s in args.sizer.split(",") if s.strip()]
    marks = [m.strip() for m in (args.trace or "").split(",") if m.strip()]
    rows = []
    for path in all_traces():
        if marks and not any(m in path.name for m in marks):
            continue
        trace = load_trace(path)
        worker = widened(PAPER_WORKER, trace)
        arrivals = trace.concurrency if family(trace.name) == "ipdps2024" else None
        for name in sizers:
            start = clock.monotonic()
            (result,) = bench_sizing(
                trace,
                [name],
                workers=args.workers,
                worker=worker,
                time_varying=False,
                arrivals=arrivals,
                seed=args.seed,
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
                    "tasks_per_worker_hour": result.tasks_per_worker_hour,
                }
            )
            took = clock.monotonic() - start
            print(f"{trace.name:<30} {name:<28} {took:6.1f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("\n".join(report(rows, sizers)))
    return 0


def relative_throughput(rows: list[dict]) -> dict[tuple[str, str], float]:
    """Each (sizer, trace)'s tasks per worker-hour as a share of the best sizer's on the trace."""
    best: dict[str, float] = defaultdict(float)
    for r in rows:
        best[r["trace"]] = max(best[r["trace"]], r["tasks_per_worker_hour"])
    return {(r["sizer"], r["trace"]): r["tasks_per_worker_hour"] / best[r["trace"]] for r in rows}


def report(rows: list[dict], sizers: list[str]) -> list[str]:
    """Mean AWE per trace family, per resource and overall, retries, throughput, the choice."""
    families = list(dict.fromkeys(r["family"] for r in rows))
    resources = [r for r in ("cores", "memory", "disk") if any(f"awe_{r}" in row for row in rows)]
    throughput = relative_throughput(rows)
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
        per_resource = [
            statistics.fmean(r[f"awe_{res}"] for r in everything if f"awe_{res}" in r)
            for res in resources
        ]
        rates = {r["trace"]: throughput[s, r["trace"]] for r in everything}
        slowest = min(rates, key=rates.__getitem__)
        rate = (statistics.fmean(rates.values()), rates[slowest], slowest)
        unfit = sum(r["unfit"] for r in everything)
        scores.append((s, awe, retries, worst, per_family, per_resource, rate, unfit))
    scores.sort(key=lambda x: -x[1])
    head = (
        f"| sizer | {' | '.join(families)} | {' | '.join(resources)} | mean AWE "
        "| retries % (mean / worst trace) | throughput (mean / worst trace) | ok |"
    )
    lines = [head, "|" + "---|" * (len(families) + len(resources) + 5)]
    for s, awe, retries, worst, per_family, per_resource, rate, unfit in scores:
        ok = "yes" if retries <= RETRY_LIMIT and not unfit else "no"
        cells = " | ".join(_number(v) for v in (*per_family, *per_resource))
        worst_text = f"{worst['retries_pct']:.1f} ({worst['trace']})"
        rate_text = f"{rate[0]:.2f} / {rate[1]:.2f} ({rate[2]})"
        lines.append(
            f"| {s} | {cells} | {awe:.3f} | {retries:.1f} / {worst_text} | {rate_text} | {ok} |"
        )
    lines.append("")
    lines.append(
        "(AWE per trace family and per resource: means over traces, each weighing the same; "
        "throughput: tasks per worker-hour as a share of the best candidate's on each trace.)"
    )
    eligible = [x for x in scores if x[2] <= RETRY_LIMIT and not x[7]]
    if eligible:
        best = eligible[0]
        lines.append("")
        lines.append(
            f"default: {best[0]} (mean AWE {best[1]:.3f} over {len(by[best[0], 'all'])} traces, "
            f"retries {best[2]:.1f}% of tasks on average, throughput {best[6][0]:.2f} of the "
            "best on average)"
        )
    else:
        lines.append(f"\nno sizer keeps retries within {RETRY_LIMIT:g}% of tasks")
    if any(r["sizer"] == DEFAULT_SIZER for r in rows):
        lines += ["", *goals(rows)]
    return lines


def goals(rows: list[dict]) -> list[str]:
    """Per trace: the default against the best published sizer within the retry limit, and
    its cores against the user's request."""
    throughput = relative_throughput(rows)
    by = {(r["trace"], r["sizer"]): r for r in rows}
    lines = [
        f"| trace | {DEFAULT_SIZER} AWE (cores / memory / disk) | retries % | throughput "
        "| best published within 10% retries | its AWE | user cores AWE / throughput "
        "| default >= best | cores >= user |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    met = [0, 0]
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    for trace in traces:
        ours = by.get((trace, DEFAULT_SIZER))
        if ours is None:
            continue
        published = [
            r
            for (t, s), r in by.items()
            if t == trace and s not in OURS and r["retries_pct"] <= RETRY_LIMIT and not r["unfit"]
        ]
        best = max(published, key=lambda r: r["awe"], default=None)
        user = by.get((trace, "user"))
        beats = best is None or ours["awe"] >= best["awe"] - 1e-9
        cores = (
            user is None
            or "awe_cores" not in ours
            or (
                ours["awe_cores"] >= user["awe_cores"] - 1e-9
                and throughput[DEFAULT_SIZER, trace] >= throughput["user", trace] - 1e-9
            )
        )
        met[0] += beats
        met[1] += cores
        awe = " / ".join(
            _number(ours.get(f"awe_{r}", math.nan)) for r in ("cores", "memory", "disk")
        )
        lines.append(
            f"| {trace} | {awe} | {ours['retries_pct']:.1f} "
            f"| {throughput[DEFAULT_SIZER, trace]:.2f} "
            f"| {best['sizer'] if best else '-'} | {_number(best['awe']) if best else '-'} "
            f"| {_number(user.get('awe_cores', math.nan)) if user else '-'} / "
            f"{throughput['user', trace]:.2f} | {'yes' if beats else 'no'} "
            f"| {'yes' if cores else 'no'} |"
        )
    lines.append("")
    lines.append(
        f"{DEFAULT_SIZER} >= the best published sizer within {RETRY_LIMIT:g}% retries on "
        f"{met[0]} of {len(traces)} traces; cores >= the user's request at equal or better "
        f"throughput on {met[1]} of {len(traces)}"
    )
    return lines


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
