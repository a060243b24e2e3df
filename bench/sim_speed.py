"""How fast the simulator core replays a whole trace (default HPC2N) with EASY backfill.

python bench/sim_speed.py [--trace HPC2N|KTH|CTC|PATH] [--queue-model site|easy|fair-share]
                          [--scale N] [--no-backfill] [--json]

The queue model defaults to ``site``, the one runs and comparisons use by default.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from backends import clock
from backends.sim.simulator import Simulator
from backends.sim.site import QueueModel, SitePolicy
from backends.sim.swf import load_trace
from backends.sim.workload import ClusterSpec, JobStream


def measure(
    trace_name: str, backfill: bool, scale: int = 1, model: str = QueueModel.SITE
) -> dict[str, object]:
    t0 = clock.monotonic()
    trace = load_trace(trace_name)
    site = SitePolicy.of(model, trace)
    cluster = ClusterSpec.for_trace(trace).scaled(scale)
    stream = JobStream.from_trace(trace, cluster.total_cores, site).rotated_copies(scale)
    t1 = clock.monotonic()
    sim = Simulator(
        cluster, stream=stream, backfill=backfill, limits=site.limits, fair_share=site.fair_share
    )
    sim.run()
    wall = clock.monotonic() - t1
    waits = sim.stream_starts - stream.submit
    stats = sim.stats
    return {
        "trace": trace.name,
        "cluster": f"{cluster.nodes} nodes x {cluster.cores_per_node} cores",
        "scheduler": "EASY backfill" if backfill else "FIFO",
        "queue_model": str(model),
        "jobs": len(stream),
        "read_s": round(t1 - t0, 3),
        "simulate_s": round(wall, 3),
        "jobs_per_s": round(len(stream) / wall),
        "backfilled": stats.backfilled,
        "full_passes": stats.full_passes,
        "tail_passes": stats.tail_passes,
        "unstarted": int(np.isnan(waits).sum()),  # withdrawn before they could start
        "sim_median_wait_s": float(np.nanmedian(waits)),
        "sim_mean_wait_s": round(float(np.nanmean(waits)), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="HPC2N")
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument(
        "--queue-model", default=QueueModel.SITE.value, choices=[m.value for m in QueueModel]
    )
    parser.add_argument("--no-backfill", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.scale < 1:
        parser.error("--scale must be at least 1")
    result = measure(args.trace, not args.no_backfill, args.scale, args.queue_model)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
