"""ASA's convergence when the queue wait changes (ASA paper, section 4.4, Figure 5).

1000 iterations; the true wait changes at iterations 0, 200, 400, 600 and 800 to values drawn
log-uniformly from the grid's range (seeded), redrawn until at least one change is a sudden
drop (to a tenth or less), the case where the paper's greedy policy fails. Each iteration
predicts a wait and then observes the true one for that prediction.

Per policy: the hit rate (the predicted alternative is the one closest to the true wait), the
miss rate (over-predictions: above the closest alternative, so the allocation starts early),
and for every change the iterations until re-convergence: the first iteration after the change
from which the next 10 predictions are all hits, "never" if that does not happen before the
next change. "held" is the prediction most made in the last 20 iterations before each change.

    python bench/asa_convergence.py [--seed N] [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from learners.queue_wait import DEFAULT_GRID, Geometry, QueueWaitLearner

POLICIES = ("default", "tuned", "greedy")
ITERATIONS = 1000
CHANGES = (0, 200, 400, 600, 800)
ENDS = (*CHANGES[1:], ITERATIONS)
STREAK = 10
HELD = 20
GEOMETRY = Geometry(cores=28)


@dataclass(frozen=True)
class PolicyRun:
    hit_rate: float
    miss_rate: float
    reconverge: list[int | None]
    """Iterations after each change until STREAK hits in a row; None for never."""
    held: list[float]


def true_waits(rng: np.random.Generator) -> list[float]:
    """One wait per change, log-uniform over the grid's range, redrawn until every change
    moves the closest alternative and at least one is a sudden drop."""
    low, high = np.log(DEFAULT_GRID[0]), np.log(DEFAULT_GRID[-1])
    closest = QueueWaitLearner().closest
    while True:
        waits = [round(float(np.exp(rng.uniform(low, high))), 1) for _ in CHANGES]
        pairs = list(itertools.pairwise(waits))
        if all(closest(a) != closest(b) for a, b in pairs) and any(b <= a / 10 for a, b in pairs):
            return waits


def run(policy: str, waits: list[float], seed: int) -> PolicyRun:
    learner = QueueWaitLearner(policy=policy, seed=seed)
    hits, overs, values = [], [], []
    for start, end, wait in zip(CHANGES, ENDS, waits, strict=True):
        for _ in range(start, end):
            prediction = learner.predict(GEOMETRY)
            outcome = learner.observe(GEOMETRY, wait, prediction).outcome
            hits.append(outcome == "hit")
            overs.append(outcome == "over")
            values.append(prediction.value)
    reconverge = [
        next(
            (i - start for i in range(start, end - STREAK + 1) if all(hits[i : i + STREAK])),
            None,
        )
        for start, end in zip(CHANGES, ENDS, strict=True)
    ]
    held = [Counter(values[end - HELD : end]).most_common(1)[0][0] for end in ENDS]
    return PolicyRun(sum(hits) / ITERATIONS, sum(overs) / ITERATIONS, reconverge, held)


def drops(waits: list[float]) -> list[bool]:
    """Whether each change lowered the wait's closest alternative."""
    learner = QueueWaitLearner()
    best = [learner.closest(w) for w in waits]
    return [False] + [b < a for a, b in itertools.pairwise(best)]


GROUPS = ("start", "rises before 1st drop", "1st drop", "after 1st drop")


def groups(waits: list[float]) -> list[str]:
    """Each change's place relative to the first drop, where greedy goes wrong."""
    first = drops(waits).index(True)
    return [
        GROUPS[0] if i == 0 else GROUPS[1] if i < first else GROUPS[2] if i == first else GROUPS[3]
        for i in range(len(waits))
    ]


def seconds(value: float) -> str:
    return f"{value:g} s"


def print_run(seed: int, waits: list[float], runs: dict[str, PolicyRun]) -> None:
    learner = QueueWaitLearner()
    print(f"ASA convergence (ASA paper, section 4.4): {ITERATIONS} iterations, seed {seed}")
    print("true wait from iteration:")
    for start, wait, drop in zip(CHANGES, waits, drops(waits), strict=True):
        closest = learner.grid[learner.closest(wait)]
        mark = "  (drop)" if drop else ""
        print(f"  {start:>4}: {seconds(wait):>10}  closest alternative {seconds(closest)}{mark}")
    print()
    print(f"{'':22}iterations to re-converge after the change at iteration")
    print(f"{'policy':<8}{'hit':>7}{'miss':>7}" + "".join(f"{c:>8}" for c in CHANGES))
    for policy, r in runs.items():
        cells = "".join(f"{'never' if n is None else n:>8}" for n in r.reconverge)
        print(f"{policy:<8}{r.hit_rate:>7.1%}{r.miss_rate:>7.1%}{cells}")
    print()
    print(f"{'':22}held: most made of the last {HELD} predictions before")
    print(f"{'policy':<22}" + "".join(f"{end:>8}" for end in ENDS))
    for policy, r in runs.items():
        print(f"{policy:<22}" + "".join(f"{v:>8g}" for v in r.held))


def aggregate(scenarios: list[tuple[list[float], dict[str, PolicyRun]]]) -> dict[str, dict]:
    """Mean rates, and re-convergence grouped by the changes' place relative to the first drop."""
    out = {}
    for policy in POLICIES:
        runs = [r[policy] for _, r in scenarios]
        grouped: dict[str, list[int | None]] = {g: [] for g in GROUPS}
        for waits, r in scenarios:
            for n, group in zip(r[policy].reconverge, groups(waits), strict=True):
                grouped[group].append(n)
        out[policy] = {
            "hit_rate": statistics.fmean(r.hit_rate for r in runs),
            "miss_rate": statistics.fmean(r.miss_rate for r in runs),
            "reconverged": {g: _reconverged(ns) for g, ns in grouped.items()},
        }
    return out


def _reconverged(ns: list[int | None]) -> dict[str, float | int | None]:
    done = [n for n in ns if n is not None]
    return {
        "changes": len(ns),
        "fraction": len(done) / len(ns) if ns else None,
        "median_iterations": statistics.median(done) if done else None,
    }


def print_aggregate(seed: int, runs: int, summary: dict[str, dict]) -> None:
    print(f"ASA convergence (ASA paper, section 4.4): {runs} runs of {ITERATIONS} iterations,")
    print(f"seeds {seed}..{seed + runs - 1}: share of changes re-converged within their")
    print(f"{CHANGES[1] - CHANGES[0]} iterations (median iterations to re-converge)")
    print()
    widths = [max(len(g), 12) + 2 for g in GROUPS]
    counts = [summary[POLICIES[0]]["reconverged"][g]["changes"] for g in GROUPS]
    print(f"{'':22}" + "".join(f"{g:>{w}}" for g, w in zip(GROUPS, widths, strict=True)))
    print(
        f"{'policy':<8}{'hit':>7}{'miss':>7}"
        + "".join(f"{f'({n} changes)':>{w}}" for n, w in zip(counts, widths, strict=True))
    )
    for policy, s in summary.items():
        line = f"{policy:<8}{s['hit_rate']:>7.1%}{s['miss_rate']:>7.1%}"
        for group, w in zip(GROUPS, widths, strict=True):
            r = s["reconverged"][group]
            median = "-" if r["median_iterations"] is None else f"{r['median_iterations']:g}"
            cell = f"{r['fraction']:.0%} ({median})" if r["changes"] else "-"
            line += f"{cell:>{w}}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the waits and learners")
    parser.add_argument("--runs", type=int, default=1, help="scenarios to average over")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.seed < 0 or args.runs < 1:
        parser.error("--seed must be >= 0 and --runs >= 1")

    scenarios = []
    for seed in range(args.seed, args.seed + args.runs):
        waits = true_waits(np.random.default_rng(seed))
        scenarios.append((waits, {p: run(p, waits, seed) for p in POLICIES}))

    if args.json:
        result = {
            "iterations": ITERATIONS,
            "changes": list(CHANGES),
            "streak": STREAK,
            "runs": [
                {
                    "seed": args.seed + i,
                    "waits": w,
                    "policies": {p: asdict(r) for p, r in rs.items()},
                }
                for i, (w, rs) in enumerate(scenarios)
            ],
            "summary": aggregate(scenarios),
        }
        print(json.dumps(result, indent=2))
    elif args.runs == 1:
        print_run(args.seed, *scenarios[0])
    else:
        print_aggregate(args.seed, args.runs, aggregate(scenarios))


if __name__ == "__main__":
    main()
