"""Simulated against recorded queue waits: each log's submit stream replayed by the simulator,
one site-policy ingredient at a time.

    python bench/sim_fidelity.py [--traces HPC2N KTH CTC PATH ...] [--no-backfill] [--json]

Every job is submitted at its recorded time with its requested processors and
time limit and runs for its recorded runtime, on the machine of the log's
header, under EASY backfill. Rows add one ingredient of the site policy read
from the log (backends/sim/site.py) to the plain FIFO + EASY model ("easy"):
node granularity, per-user limits, fair share, withdrawn cancelled jobs; then
the queue models ``site`` (granularity, limits, withdrawn jobs) and
``fair-share`` (all four). Waits are compared over the same jobs in every row:
those that ran, with a recorded wait, that fit the machine.

Calibration against the recorded schedule (a valid schedule under the site's
real constraints): "early" is the share of jobs the simulator starts before
their recorded start; "free" the share of those whose processors were free in
the recorded schedule at the simulated start (the real scheduler held them for
reasons the log does not record: holds, reservations, outages, policies),
the rest started early because the simulated schedule differs. Per log, the
share of the recorded waiting time during which the waiting job's processors
were free in the recorded schedule.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace

import numpy as np

from backends import clock
from backends.sim.simulator import Simulator
from backends.sim.site import NO_POLICY, QueueModel, SitePolicy, cancelled_before_start
from backends.sim.swf import RecordedSchedule, SwfTrace, load_trace
from backends.sim.workload import ClusterSpec, JobStream, replayable


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


@dataclass(frozen=True)
class Busy:
    """Processors busy over time in the recorded schedule, as a step function."""

    times: np.ndarray
    busy: np.ndarray

    @classmethod
    def of(cls, schedule: RecordedSchedule) -> Busy:
        times = np.concatenate([schedule.start, schedule.end])
        delta = np.concatenate([schedule.procs, -schedule.procs])
        order = np.lexsort((delta, times))
        return cls(times[order], np.cumsum(delta[order]))

    def at(self, t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.times, t, side="right") - 1
        return np.where(i >= 0, self.busy[np.maximum(i, 0)], 0)


def ingredients(trace: SwfTrace) -> dict[str, SitePolicy]:
    """The policies compared: none, each ingredient alone, the two queue models."""
    full = SitePolicy.read(trace)
    return {
        "easy": NO_POLICY,
        "+granularity": replace(NO_POLICY, node_procs=full.node_procs),
        "+limits": replace(NO_POLICY, limits=full.limits),
        "+fair share": replace(NO_POLICY, fair_share=full.fair_share),
        "+cancelled": replace(NO_POLICY, withdraw_cancelled=full.withdraw_cancelled),
        QueueModel.SITE.value: SitePolicy.of(QueueModel.SITE, trace),
        QueueModel.FAIR_SHARE.value: SitePolicy.of(QueueModel.FAIR_SHARE, trace),
    }


def replay(trace: SwfTrace, site: SitePolicy, backfill: bool) -> tuple[np.ndarray, float]:
    """Simulated start of every job of the trace (NaN: not replayed or never started)."""
    cluster = ClusterSpec.for_trace(trace)
    stream = JobStream.from_trace(trace, max_cores=cluster.total_cores, site=site)
    t0 = clock.monotonic()
    sim = Simulator(
        cluster, stream=stream, backfill=backfill, limits=site.limits, fair_share=site.fair_share
    )
    sim.run()
    wall = clock.monotonic() - t0
    starts = np.full(len(trace), np.nan)
    starts[replayable(trace, cluster.total_cores, site)] = sim.stream_starts
    return starts, wall


def compare(name: str, backfill: bool) -> dict[str, object]:
    trace = load_trace(name)
    cluster = ClusterSpec.for_trace(trace)
    jobs = trace.jobs
    ran = ~cancelled_before_start(trace) & (jobs["wait"] >= 0)
    measured = replayable(trace, cluster.total_cores) & ran
    recorded = jobs["wait"][measured]
    submit = jobs["submit"][measured]
    procs = trace.procs()[measured]
    schedule = RecordedSchedule.of(trace)
    busy = Busy.of(schedule)
    full = SitePolicy.read(trace)
    result: dict[str, object] = {
        "trace": trace.name,
        "jobs": int(measured.sum()),
        "procs": cluster.total_cores,
        "node_procs": full.node_procs,
        "limits": None if full.limits is None else vars(full.limits),
        "withdrawn": int(cancelled_before_start(trace).sum()),
        "rec_median": float(np.median(recorded)) if len(recorded) else None,
        "rec_mean": float(np.mean(recorded)) if len(recorded) else None,
        "rec_p90": float(np.quantile(recorded, 0.9)) if len(recorded) else None,
        "held_while_free": held_while_free(submit, recorded, procs, busy, cluster.total_cores),
        "rows": [],
    }
    for label, site in ingredients(trace).items():
        starts, wall = replay(trace, site, backfill)
        simulated = starts[measured] - submit
        started = ~np.isnan(simulated)
        sim_w, rec_w = simulated[started], recorded[started]
        early = sim_w < rec_w - 1.0
        free_then = busy.at((submit[started] + sim_w)[early]) + procs[started][early]
        row = {
            "model": label,
            "sim_median": float(np.median(sim_w)) if sim_w.size else None,
            "sim_mean": float(np.mean(sim_w)) if sim_w.size else None,
            "sim_p90": float(np.quantile(sim_w, 0.9)) if sim_w.size else None,
            "spearman": round(spearman(sim_w, rec_w), 3) if sim_w.size > 1 else None,
            "early": float(early.mean()) if sim_w.size else None,
            "early_free": float((free_then <= cluster.total_cores).mean()) if early.any() else None,
            "unstarted": int((~started).sum()),
            "simulate_s": round(wall, 2),
        }
        result["rows"].append(row)  # type: ignore[union-attr]
    return result


def held_while_free(
    submit: np.ndarray, wait: np.ndarray, procs: np.ndarray, busy: Busy, capacity: int
) -> float:
    """Share of the recorded waiting time during which the job's processors were free in the
    recorded schedule (16 points along each wait)."""
    total = float(wait.sum())
    if total <= 0:
        return 0.0
    points = (np.arange(16) + 0.5) / 16
    free = 0.0
    for chunk in range(0, len(wait), 50_000):
        part = slice(chunk, chunk + 50_000)
        at = submit[part, None] + wait[part, None] * points
        fits = busy.at(at) + procs[part, None] <= capacity
        free += float((fits.mean(axis=1) * wait[part]).sum())
    return free / total


def _seconds(value: object) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _share(value: object, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=["HPC2N", "KTH", "CTC"])
    parser.add_argument("--no-backfill", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [compare(name, backfill=not args.no_backfill) for name in args.traces]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    scheduler = "FIFO" if args.no_backfill else "EASY backfill"
    print(f"simulated vs recorded wait (s), {scheduler}, each log on its own machine")
    for r in results:
        limits = r["limits"]
        held = f"{limits['jobs']} jobs, {limits['cores']} procs" if limits else "none"
        nodes = f"{r['node_procs']} procs" if r["node_procs"] > 1 else "shared"
        print(
            f"\n{r['trace']}: {r['jobs']} jobs, {r['procs']} procs; read from the log: "
            f"node-exclusive {nodes}, per-user limits {held}, {r['withdrawn']} withdrawn "
            f"cancelled jobs; recorded waiting time with the job's processors free: "
            f"{r['held_while_free']:.0%}"
        )
        header = ["model", "median", "mean", "p90", "spearman", "early", "free", "sim s"]
        lines = [header]
        lines.append(
            ["recorded"] + [_seconds(r[f"rec_{k}"]) for k in ("median", "mean", "p90")] + [""] * 4
        )
        for row in r["rows"]:
            lines.append(
                [row["model"]]
                + [_seconds(row[f"sim_{k}"]) for k in ("median", "mean", "p90")]
                + [_share(row["spearman"], ".3f"), _share(row["early"], ".0%")]
                + [_share(row["early_free"], ".0%")]
                + [f"{row['simulate_s']:.1f}"]
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        for line in lines:
            print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
