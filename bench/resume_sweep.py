"""Kill a run's manager at twenty moments and resume each run: does every run finish, with no
task completed twice and nothing of the run left behind?

For each backend (``local``; ``slurm`` when the local Slurm of ``scripts/slurm-local up``
answers), twenty runs of a three-stage workflow of real tasks (tests/crash.py: each task
appends its id to one file). The moment of each kill is drawn from a seeded schedule: a time
after the start, the boundary between the first two stages, a point inside the second stage,
or (Slurm) the middle of a pilot's submission (the first or the second pilot the run submits:
under the default strategy, ``elastic``, the run's two units). Then ``leadtime resume``
finishes the run.

    python bench/resume_sweep.py [--backends local,slurm] [--points 20] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from crash import Crash, slow_sbatch

KINDS = ("time", "boundary", "second stage", "submission")


def schedule(seed: int, points: int, backend: str) -> list[tuple[str, float]]:
    """``points`` kill moments: a kind, and its parameter (seconds, or outputs, or sbatch)."""
    rng = random.Random(seed)
    kinds = KINDS if backend == "slurm" else KINDS[:3]
    out = []
    for i in range(points):
        kind = kinds[i % len(kinds)]
        if kind == "time":
            out.append((kind, round(rng.uniform(0.5, 6.0), 2)))
        elif kind == "second stage":
            out.append((kind, rng.randint(1, 6)))
        elif kind == "submission":
            out.append((kind, rng.randint(1, 2)))  # the n-th pilot submitted
        else:
            out.append((kind, 0))
    return out


def states(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT pilot_id, state FROM pilots").fetchall()
    return {pilot: json.loads(state) for pilot, state in rows}


def one(root: Path, backend: str, kind: str, value: float) -> dict:
    env, submitting = slow_sbatch(root / "bin")
    extra = ("--bind", "127.0.0.1") if backend == "slurm" else ()
    crash = Crash(root / "run", backend, extra=extra, env=env if kind == "submission" else None)
    started = time.monotonic()
    crash.start()
    moments = {
        "time": lambda c: time.monotonic() - started >= value,
        "boundary": lambda c: c.done("a") == c.tasks,
        "second stage": lambda c: c.done("b") >= value,
        "submission": lambda c: submitting(int(value)),
    }
    hit = crash.wait_for(moments[kind], timeout=300)
    crash.kill()
    row = {"kind": kind, "at": value, "killed": hit, "resumed": False}
    if not hit or crash.run_id is None:
        return row
    alive = {p for p, s in states(crash.db).items() if s in ("PENDING", "RUNNING")}
    summary = crash.resume(timeout=600)
    after = states(crash.db)
    ids = crash.ids()
    queued = []
    if backend == "slurm":
        lines = subprocess.run(
            ["squeue", "--noheader", "--format=%j"], capture_output=True, text=True, check=False
        ).stdout.split()
        queued = [n for n in lines if n.startswith(f"lt-{crash.run_id}")]
    row |= {
        "resumed": summary["status"] == "done",
        "duplicates": len(ids) - len(set(ids)),
        "complete": sorted(set(ids)) == crash.expected_ids(),
        "reattached": sum(1 for p in alive if after.get(p) == "COMPLETED"),
        "queued": len(queued),
        "leftovers": len(crash.leftovers()),
        "seconds": round(time.monotonic() - started, 1),
    }
    return row


def slurm_up() -> bool:
    script = Path(__file__).resolve().parents[1] / "scripts" / "slurm-local"
    return subprocess.run([script, "status"], capture_output=True, check=False).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,slurm")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for backend in args.backends.split(","):
        if backend == "slurm" and not slurm_up():
            print("slurm: the local Slurm is not running (scripts/slurm-local up): skipped")
            continue
        rows = []
        for i, (kind, value) in enumerate(schedule(args.seed, args.points, backend)):
            root = Path(tempfile.mkdtemp(prefix=f"leadtime-sweep-{backend}-{i}-"))
            try:
                row = one(root, backend, kind, value)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            rows.append(row)
            print(f"{backend} {i + 1:2d} {kind:>12} {value:>5} {row}", flush=True)
        killed = [r for r in rows if r["killed"]]
        done = [r for r in killed if r["resumed"] and r["complete"]]
        print(
            f"{backend}: {len(done)}/{len(killed)} killed runs resumed and completed "
            f"({len(rows) - len(killed)} ended before their kill point); "
            f"duplicates {sum(r.get('duplicates', 0) for r in killed)}, "
            f"pilots re-attached {sum(r.get('reattached', 0) for r in killed)}, "
            f"jobs left queued {sum(r.get('queued', 0) for r in killed)}, "
            f"processes left {sum(r.get('leftovers', 0) for r in killed)}"
        )


if __name__ == "__main__":
    main()
