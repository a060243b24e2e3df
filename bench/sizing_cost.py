"""Cost of one bucketing step: absorb a record, then allocate (Phung & Thain, IPDPS 2024, Table I).

As in a run, records arrive one after another, each followed by an allocation:
a learner holding N - 1 records (memory-like values in MB from a seeded
log-normal) takes its N-th record and predicts, then the next, for N/20 steps
at most (so the state stays "at N records" within 5%); passes restart from a
rebuilt learner until ``--repeat`` steps are timed. The median is printed next
to the paper's C code (TaskVine, the same operation, averaged) and this
project's goals.

    python bench/sizing_cost.py [--json] [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from backends import clock
from learners.sizing.bucketing import Bucketing

RECORDS = (10, 200, 1000, 2000, 5000, 100_000)
PAPER_US = {
    "greedy": {10: 11.2, 200: 586.4, 1000: 14_588, 2000: 62_207, 5000: 441_051},
    "exhaustive": {10: 14.4, 200: 76.5, 1000: 323.5, 2000: 567.8, 5000: 1_632},
}
GOAL_US = {"greedy": 2000.0, "exhaustive": 50.0}
"""At 5,000 records."""


def step_cost(mode: str, records: int, repeat: int, seed: int = 0) -> float:
    """Median microseconds to add the ``records``-th record and predict (``repeat`` samples)."""
    rng = np.random.default_rng(seed)
    per_pass = max(1, min(repeat, records // 20))
    values = np.round(rng.lognormal(8.5, 0.7, records - 1 + per_pass)).tolist()
    times: list[float] = []
    while len(times) < repeat:
        learner = Bucketing(mode, 1000.0, np.random.default_rng(len(times)))  # type: ignore[arg-type]
        for v in values[: records - 1]:
            learner.add(v)
        learner.predict()
        for v in values[records - 1 :]:
            start = clock.monotonic()
            learner.add(v)
            learner.predict()
            times.append(clock.monotonic() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=200, help="steps timed per cell")
    args = parser.parse_args(argv)
    rows = []
    for mode in ("greedy", "exhaustive"):
        for n in RECORDS:
            cost = step_cost(mode, n, args.repeat)
            rows.append({"algorithm": mode, "records": n, "median_us": cost})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("median us to absorb a record and allocate (paper: TaskVine's C code, Table I)")
    print(f"{'algorithm':<11}" + "".join(f"{n:>11,}" for n in RECORDS))
    for mode in ("greedy", "exhaustive"):
        ours = [r["median_us"] for r in rows if r["algorithm"] == mode]
        print(f"{mode:<11}" + "".join(f"{v:>11,.1f}" for v in ours))
        paper = [PAPER_US[mode].get(n) for n in RECORDS]
        print(f"{'  paper':<11}" + "".join(f"{v:>11,.1f}" if v else f"{'-':>11}" for v in paper))
    for mode, goal in GOAL_US.items():
        at = next(r["median_us"] for r in rows if r["algorithm"] == mode and r["records"] == 5000)
        verdict = "met" if at <= goal else "MISSED"
        print(f"goal {mode} <= {goal:,.0f} us at 5,000 records: {at:,.1f} us, {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
