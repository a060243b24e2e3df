"""Simulated against recorded queue waits: each trace's submit stream replayed by the simulator.

    python bench/sim_fidelity.py [--traces HPC2N KTH CTC] [--no-backfill] [--json]

Every job is submitted at its recorded time with its requested processors and
time limit and runs for its recorded runtime, on the machine of the trace's
header, under EASY backfill with FIFO priority. The recorded waits came from the
sites' own schedulers and policies (fair share, per-user limits, reservations,
downtime), which the trace does not record.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from backends.simulator import Simulator
from backends.swf import load_trace
from backends.workload import ClusterSpec, JobStream, replayable
from orchestrator import clock


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(x)]
    average = (starts + ends + 1) / 2.0
    result = np.empty(len(x))
    result[order] = average[np.cumsum(first) - 1]
    return result


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def compare(name: str, backfill: bool) -> dict[str, object]:
    trace = load_trace(name)
    cluster = ClusterSpec.for_trace(trace)
    stream = JobStream.from_trace(trace, max_cores=cluster.total_cores)
    recorded = trace.jobs["wait"][replayable(trace, cluster.total_cores)]
    t0 = clock.monotonic()
    sim = Simulator(cluster, stream=stream, backfill=backfill)
    sim.run()
    wall = clock.monotonic() - t0
    simulated = sim.stream_starts - stream.submit
    known = recorded >= 0
    sim_w, rec_w = simulated[known], recorded[known]
    row: dict[str, object] = {"trace": name, "jobs": int(known.sum()), "procs": cluster.total_cores}
    for label, waits in (("rec", rec_w), ("sim", sim_w)):
        row[f"{label}_median"] = float(np.median(waits))
        row[f"{label}_mean"] = float(np.mean(waits))
        row[f"{label}_p90"] = float(np.quantile(waits, 0.9))
    row["spearman"] = round(spearman(sim_w, rec_w), 3)
    row["simulate_s"] = round(wall, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=["HPC2N", "KTH", "CTC"])
    parser.add_argument("--no-backfill", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [compare(name, backfill=not args.no_backfill) for name in args.traces]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    scheduler = "FIFO" if args.no_backfill else "EASY backfill"
    print(f"simulated vs recorded wait (s), {scheduler}, requested procs and time limits")
    header = ["trace", "jobs", "procs", "median rec/sim", "mean rec/sim", "p90 rec/sim"]
    header += ["spearman", "sim s"]
    lines = [header]
    for r in rows:
        lines.append(
            [str(r["trace"]), str(r["jobs"]), str(r["procs"])]
            + [f"{r[f'rec_{s}']:,.0f} / {r[f'sim_{s}']:,.0f}" for s in ("median", "mean", "p90")]
            + [f"{r['spearman']:.3f}", f"{r['simulate_s']:.1f}"]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
