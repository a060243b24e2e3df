"""How long a pilot waits by its width and time limit: what-if waits at random moments of a
simulated queue, the reason elastic's units are one task wide by default.

At each of ``--moments`` random moments of each of ``--seeds`` queues, a job of each width and
time limit is submitted on a fork of the simulator (every job running to its known end) and
its wait measured; printed per width and limit: the median, mean and 90th percentile of the
wait and the share of moments it started within a minute.

    python bench/wait_by_width.py [--trace none|HPC2N] [--load 0.9] [--widths 1,2,4,7,14,28]
        [--limits 3600,16200] [--seeds 5] [--moments 40] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from backends.sim.simulator import Simulator
from backends.sim.site import QueueModel, SitePolicy
from backends.sim.swf import load_trace
from backends.sim.workload import ClusterSpec, SyntheticLoad, TraceReplay

CLUSTER = ClusterSpec(9, 28, 128 * 1024)  # the HPC2N machine's shape, as compare replays it
DAY = 86400.0


def queue(trace: str | None, load: float, seed: int) -> tuple[Simulator, float]:
    """A simulated queue and the span of time to draw moments from."""
    if trace is None:
        stream = SyntheticLoad(utilisation=load, seed=seed, cluster=CLUSTER).stream(0.0, CLUSTER)
        return Simulator(CLUSTER, stream=stream, start=0.0), 20 * DAY
    log = load_trace(trace)
    start = float(log.jobs["submit"][0]) + 7 * DAY + seed * 60 * DAY
    replay = TraceReplay(log, offset=start, site=SitePolicy.of(QueueModel.SITE, log))
    stream = replay.stream(0.0, CLUSTER)
    site = replay.site
    sim = Simulator(CLUSTER, stream=stream, start=0.0, limits=site.limits)
    return sim, 20 * DAY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="none", help="a trace, or none: synthetic load")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--widths", default="1,2,4,7,14,28")
    parser.add_argument("--limits", default="3600,16200")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--moments", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trace = None if args.trace.lower() == "none" else args.trace
    widths = [int(w) for w in args.widths.split(",")]
    limits = [float(x) for x in args.limits.split(",")]
    waits: dict[tuple[int, float], list[float]] = {}
    for seed in range(args.seeds):
        sim, span = queue(trace, args.load, seed)
        rng = np.random.default_rng(100 + seed)
        for t in sorted(rng.uniform(0.0, span, args.moments)):
            sim.advance_to(t)
            for width in widths:
                for limit in limits:
                    waits.setdefault((width, limit), []).append(sim.what_if_wait(width, limit))
    rows = []
    for (width, limit), found in sorted(waits.items()):
        w = np.array(found)
        rows.append(
            {"width": width, "limit_s": limit, "median_s": float(np.median(w)),
             "mean_s": float(w.mean()), "p90_s": float(np.percentile(w, 90)),
             "started_within_1_min": float(np.mean(w < 60))}
        )  # fmt: skip
    if args.json:
        print(json.dumps(rows))
        return
    where = f"{trace} replayed" if trace else f"synthetic load {args.load:g}"
    print(f"{where} on 9 nodes of 28 cores, {args.seeds} x {args.moments} moments")
    print("cores  limit  median wait  mean wait  90th pct  started within 1 min")
    for r in rows:
        print(
            f"{r['width']:5d} {r['limit_s'] / 3600:5.1f}h {r['median_s']:10.0f} s "
            f"{r['mean_s']:8.0f} s {r['p90_s']:8.0f} s {r['started_within_1_min']:10.0%}"
        )


if __name__ == "__main__":
    main()
