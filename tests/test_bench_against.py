"""bench/against.py: two builds' dispatch measured in turn, and nothing of the earlier build
left behind."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AGAINST = [sys.executable, str(ROOT / "bench" / "against.py")]

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode != 0,
    reason="not a git checkout: bench/against.py checks out an earlier commit",
)


def worktrees() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in listed.stdout.splitlines() if line.startswith("worktree ")]


def test_each_build_runs_in_turn_and_the_ratio_is_of_their_medians():
    before = worktrees()
    done = subprocess.run(
        [*AGAINST, "HEAD", "--tasks", "30", "--rounds", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tasks"] == 30
    assert [len(runs) for runs in report["runs"].values()] == [2, 2]
    for name, runs in report["runs"].items():
        median = report["medians"][name]["manager_ms"]
        assert all(run["manager_ms"] > 0 and run["tasks_per_s"] > 0 for run in runs)
        assert median == pytest.approx(sum(run["manager_ms"] for run in runs) / 2)
    medians = report["medians"]
    assert report["ratio"] == pytest.approx(
        medians["this tree"]["manager_ms"] / medians["HEAD"]["manager_ms"]
    )
    assert worktrees() == before  # the earlier build's checkout is gone


def test_a_revision_git_does_not_know_is_refused_before_anything_runs():
    before = worktrees()
    done = subprocess.run([*AGAINST, "no-such-build"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no-such-build: not a commit of" in done.stderr
    assert "Traceback" not in done.stderr
    assert worktrees() == before
