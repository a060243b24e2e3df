"""Automatic allocations on the real Slurm of ``scripts/slurm-local up``: a learned time limit's
pilot starts by backfill in a gap that a hand-written 24 h limit cannot use, and a width Slurm
starts now is chosen whatever wait was learned of it."""

import textwrap
import time

import pytest
from test_e2e_slurm import Cluster, sh, slurm_config

from backends import clock
from orchestrator.autoalloc import Node
from orchestrator.planner import AutoFit, PerStage
from orchestrator.session import execute
from orchestrator.store import Store
from workflows.spec import loads

pytestmark = pytest.mark.slurm

WORKFLOW = """
name = "backfill"
[[stage]]
name = "short"
allocation = { max_time = "10m" }
tasks = { command = "sleep 2", count = 4, cores = 1, memory = "100M" }
"""


def sbatch(cluster: Cluster, name: str, cpus: int, limit: str, seconds: int) -> str:
    return sh(
        "sbatch", "--parsable", f"--job-name={cluster.prefix}-{name}", "--output=/dev/null",
        f"--ntasks={cpus}", "--mem-per-cpu=100", f"--time={limit}", f"--wrap=sleep {seconds}",
    ).strip()  # fmt: skip


def state(job_id: str) -> str:
    return sh("squeue", "--noheader", "-j", job_id, "--states=all", "--format=%T").strip()


def span(job_id: str) -> tuple[float | None, float | None]:
    """When Slurm started and ended ``job_id`` (Unix times); None for what has not happened."""
    out = sh("scontrol", "show", "job", "-o", job_id)
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)

    def at(field: str) -> float:
        return time.mktime(time.strptime(fields[field], "%Y-%m-%dT%H:%M:%S"))

    job = fields["JobState"]
    return (
        None if job == "PENDING" else at("StartTime"),
        None if job in ("PENDING", "RUNNING") else at("EndTime"),
    )


@pytest.fixture
def cluster():
    cluster = Cluster()
    yield cluster
    cluster.clean()


def test_an_auto_pilot_with_a_learned_limit_backfills_where_24_hours_cannot(tmp_path, cluster):
    """A first run learns the tasks' run times (its pilot has the fallback limit, max_time).
    Then a job holds 12 of the node's 16 CPUs for up to 5 minutes, a 16-CPU job waits for
    them (Slurm reserves the node for it when the first may end), and a hand-written pilot
    of 4 CPUs and 24 hours waits behind it: the 4 free CPUs are a gap of less than 5
    minutes. The second run's automatic pilot, 4 CPUs and a limit of a few minutes, starts
    in that gap while the 24 h job still waits. The jobs' order is checked on Slurm's record
    of their starts and ends, whatever time the run took to return."""
    workflow = loads(textwrap.dedent(WORKFLOW), source=tmp_path / "wf.toml")
    config = slurm_config(tmp_path, "per-stage")

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            first = await execute(workflow, config, store, run_id=f"{cluster.run_id}a")
            blocker = sbatch(cluster, "load", 12, "5", 240)
            deadline = time.monotonic() + 60
            while state(blocker) != "RUNNING" and time.monotonic() < deadline:
                await clock.sleep(0.5)
            sbatch(cluster, "wide-load", 16, "1", 1)
            hand = sbatch(cluster, "hand-load", 4, "24:00:00", 1)
            second = await execute(workflow, config, store, run_id=f"{cluster.run_id}b")
            pilots = await store.rows("pilots", {"run_id": second.run_id})
            return first, second, pilots, blocker, hand

    first, second, pilots, blocker, hand = clock.run(main(), virtual=False)
    assert first.status == "done" and second.status == "done", (first.error, second.error)
    assert first.pilots[0].state == "COMPLETED"
    (pilot,) = pilots
    limit = pilot["request"]["time_limit_s"]
    assert limit <= 3 * 60, pilot["fit"]  # learned: a few seconds' tasks, plus margin
    assert "run times learned of 4 in earlier runs" in pilot["fit"]
    (figures,) = second.pilots
    assert figures.wait is not None and figures.wait < 60  # backfilled, not after the blocker
    (pilot_start, pilot_end), (_, blocker_end) = span(pilot["job_id"]), span(blocker)
    hand_start, _ = span(hand)
    timeline = dict(pilot=(pilot_start, pilot_end), blocker_end=blocker_end, hand=hand_start)
    assert pilot_start is not None and (blocker_end is None or pilot_start < blocker_end), timeline
    # the 24 h limit does not fit the gap: it waits for the blocker's end, if not for more
    assert hand_start is None or (blocker_end is not None and hand_start >= blocker_end), timeline


def test_a_width_slurm_starts_now_is_chosen_though_it_was_learned_to_wait(tmp_path, cluster):
    """The planner is told that pilots of more than 4 CPUs waited 3 h, narrower ones nothing.
    The node is idle, so ``sbatch --test-only`` foresees any width starting now: the second
    run's pilot runs the 16 tasks side by side, not in four waves on 4 CPUs, and says why."""
    workflow = loads(
        textwrap.dedent(WORKFLOW.replace('"sleep 2", count = 4', '"sleep 1", count = 16')),
        source=tmp_path / "wf.toml",
    )
    config = slurm_config(tmp_path, "per-stage")

    def planner() -> PerStage:
        return PerStage(fit=AutoFit(Node(16), lambda a: 10_800.0 if a.cores > 4 else 0.0))

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            runs = [
                await execute(workflow, config, store, run_id=f"{cluster.run_id}{k}", planner=p)
                for k, p in (("a", planner()), ("b", planner()))
            ]
            return runs, await store.rows("pilots", {"run_id": runs[1].run_id})

    runs, pilots = clock.run(main(), virtual=False)
    assert [r.status for r in runs] == ["done", "done"], [r.error for r in runs]
    (pilot,) = pilots
    assert pilot["request"]["cores"] > 4, pilot["fit"]
    assert "starts now, as the scheduler foresees" in pilot["fit"]
    (figures,) = runs[1].pilots
    assert figures.wait is not None and figures.wait < 60


def test_a_pending_auto_pilot_gives_way_to_a_width_slurm_starts_now(tmp_path, cluster):
    """Every width is learned to start at once, so the second run's pilot takes the node's
    16 CPUs for its 16 tasks. But a job holds 8 of them for 5 minutes: the pilot waits. A
    minute after it was submitted it is weighed again; ``sbatch --test-only`` foresees 8 CPUs
    starting now, so it is cancelled for a pilot of 8, which runs the tasks in two waves
    while the other job still runs."""
    workflow = loads(
        textwrap.dedent(WORKFLOW.replace('"sleep 2", count = 4', '"sleep 1", count = 16')),
        source=tmp_path / "wf.toml",
    )
    config = slurm_config(tmp_path, "per-stage")

    def planner() -> PerStage:
        return PerStage(fit=AutoFit(Node(16), lambda a: 0.0))

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            first = await execute(
                workflow, config, store, run_id=f"{cluster.run_id}a", planner=planner()
            )
            blocker = sbatch(cluster, "load", 8, "6", 300)
            deadline = time.monotonic() + 60
            while state(blocker) != "RUNNING" and time.monotonic() < deadline:
                await clock.sleep(0.5)
            second = await execute(
                workflow, config, store, run_id=f"{cluster.run_id}b", planner=planner()
            )
            return first, second, await store.rows("pilots", {"run_id": second.run_id}), blocker

    first, second, pilots, blocker = clock.run(main(), virtual=False)
    assert [first.status, second.status] == ["done", "done"], (first.error, second.error)
    wide, narrow = sorted(pilots, key=lambda p: p["submit_t"])
    assert wide["request"]["cores"] == 16 and wide["state"] == "CANCELLED", wide
    assert narrow["request"]["cores"] == 8 and narrow["state"] == "COMPLETED", narrow
    assert "still waited 1 min after the stage became ready" in narrow["fit"]
    assert "starts now, as the scheduler foresees" in narrow["fit"]
    assert state(blocker) == "RUNNING"  # the tasks ran beside it, not after it
