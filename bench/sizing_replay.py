"""Replay one trace through sizers: ``python bench/sizing_replay.py --trace PATH --sizer a,b``.

The same as ``leadtime bench sizing``; see :mod:`workflows.sizing_bench`.
"""

from __future__ import annotations

import argparse
import json
import sys

from learners.resources import Resources
from learners.sizing import SIZERS
from workflows.sizing_bench import PAPER_WORKER, bench_sizing, format_sizing_table, sizing_rows
from workflows.traces import TraceError, load_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace",
        required=True,
        help="a task trace file (formats: docs/traces.md), such as one of $LEADTIME_DATA",
    )
    parser.add_argument("--sizer", default=",".join(SIZERS), help="names, comma separated")
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--worker-cores", type=float, default=PAPER_WORKER.cores)
    parser.add_argument("--worker-memory", type=float, default=PAPER_WORKER.memory)
    parser.add_argument("--worker-disk", type=float, default=PAPER_WORKER.disk)
    parser.add_argument("--peaks", choices=("slow", "fast"), default="slow")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    worker = Resources(args.worker_cores, args.worker_memory, args.worker_disk)
    try:
        trace = load_trace(args.trace)
        results = bench_sizing(
            trace,
            [s.strip() for s in args.sizer.split(",") if s.strip()],
            workers=args.workers,
            worker=worker,
            seed=args.seed,
            peaks=args.peaks,
        )
    except (TraceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(sizing_rows(results), indent=1))
    else:
        size = f"{worker.cores:g} cores / {worker.memory:g} MB / {worker.disk:g} MB"
        print(f"{trace.name}: {len(trace.tasks)} tasks, {args.workers} workers of {size}, ", end="")
        print(f"{args.peaks} peaks")
        print(format_sizing_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
