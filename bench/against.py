"""The manager's CPU per task of this build against an earlier one, measured in turn.

python bench/against.py REV [--tasks N] [--rounds R] [--workers W] [--json]

What a dispatched task costs leadtime's manager (``bench/dispatch.py``: N ``true`` tasks
on W local workers) moves with the machine: on one 2-core VM the same build measured
0.12 ms a task one day and 0.16 the next, and by a quarter from run to run. A figure
taken on another day says little; two builds measured in turn on the same machine say how
much leaner one is. This checks out REV (a commit, tag or branch of this repository) in a
temporary git worktree and runs its ``bench/dispatch.py --only leadtime`` and this
tree's, one after the other, R rounds (the order turned each round), each in a fresh
interpreter; it prints every run, the medians and their ratio.

REV runs with this interpreter and the packages installed for it: a build that needed
another dependency needs it installed (leadtime used aiosqlite until 2026-11-23).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from dispatch import ROOT, run_isolated


class Failed(Exception):
    """A build's run that gave no figures: ``str(e)`` says which and why."""


def measure(tree: Path, tasks: int, workers: int | None) -> dict[str, float]:
    """One run of ``tree``'s dispatch benchmark, leadtime only, in an interpreter of its own."""
    row = run_isolated("leadtime", tasks, workers, calls=False, root=tree)
    if "error" in row:
        raise Failed(f"{tree}: {row['error']}")
    return {"manager_ms": row["manager_cpu_ms_per_task"], "tasks_per_s": row["tasks_per_s"]}


def worktree(rev: str, where: Path) -> Path:
    """``rev`` checked out at ``where`` (detached); a revision git does not know is an error."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise Failed(f"{rev}: not a commit of {ROOT}")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), rev],
        check=True,
    )
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier build: a commit, tag or branch")
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per run (default 3000)")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each build (default 5)")
    parser.add_argument(
        "--workers", type=int, help="workers, one core each (default: each build's own, 2)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for name in ("tasks", "rounds", "workers"):
        if (value := getattr(args, name)) is not None and value < 1:
            parser.error(f"--{name} must be at least 1")
    with tempfile.TemporaryDirectory(prefix="leadtime-against-") as tmp:
        try:
            earlier = worktree(args.rev, Path(tmp) / "build")
        except Failed as e:
            parser.exit(2, f"error: {e}\n")
        try:
            runs = rounds(earlier, args)
        except Failed as e:
            parser.exit(1, f"error: {e}\n")
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(earlier)],
                check=False,
            )
    report(args, runs)


def rounds(earlier: Path, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {args.rev: [], "this tree": []}
    trees = {args.rev: earlier, "this tree": ROOT}
    order = list(trees)
    for _ in range(args.rounds):
        for name in order:
            runs[name].append(measure(trees[name], args.tasks, args.workers))
            if not args.json:
                row = runs[name][-1]
                print(f"  {name:<12} manager {row['manager_ms']:.3f} ms a task", flush=True)
        order.reverse()  # neither build always runs on a machine the other just warmed
    return runs


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    medians = {
        name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for name, rows in runs.items()
    }
    then, now = medians[args.rev]["manager_ms"], medians["this tree"]["manager_ms"]
    if args.json:
        figures = {"tasks": args.tasks, "runs": runs, "medians": medians, "ratio": now / then}
        print(json.dumps(figures, indent=2))
        return
    runs_of = f"{args.rounds} run" + ("s" if args.rounds > 1 else "")
    print(f"{args.tasks} tasks of `true`, {runs_of} of each build, in turn")
    for name, median in medians.items():
        spread = [r["manager_ms"] for r in runs[name]]
        print(
            f"{name:<12} manager {median['manager_ms']:.3f} ms a task (median; "
            f"{min(spread):.3f} to {max(spread):.3f})   {median['tasks_per_s']:6.0f} tasks/s"
        )
    ratio = f"{now / then:.3f} of {args.rev}'s a task ({then / now:.1f}x leaner)"
    print(f"this tree's manager costs {ratio}")


if __name__ == "__main__":
    main()
