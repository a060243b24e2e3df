"""The circuit breaker: pilots that keep failing at start stop the run with the batch
system's reason, instead of being replaced forever."""

from collections.abc import Sequence

import pytest

from backends import clock
from backends.local import LocalOptions
from backends.sim import MockOptions, MockSlurm
from backends.sim.workload import ClusterSpec
from orchestrator.breaker import IN_A_ROW, PER_MINUTE, Breaker
from orchestrator.pool import Worker
from orchestrator.runstate import PilotRun
from orchestrator.session import RunConfig, execute, run_simulated
from orchestrator.store import Store
from workflows.spec import Allocation, Stage, TaskTemplate, Workflow, loads

IDLE = MockOptions(load=0, cluster=ClusterSpec(nodes=2, cores_per_node=28))


def fail(breaker, stage="a", now=0.0, reason="launch failed requeued held"):
    return breaker.ended(
        [stage], joined=False, finished=0, released=False, now=now, state="FAILED", reason=reason
    )


def useful(breaker, stage="a", now=0.0, finished=1, released=True):
    return breaker.ended(
        [stage], joined=True, finished=finished, released=released, now=now,
        state="COMPLETED", reason="",
    )  # fmt: skip


def test_n_failures_in_a_row_stop_with_the_reason():
    breaker = Breaker()
    for i in range(IN_A_ROW - 1):
        assert fail(breaker, now=100.0 * i) is None  # far apart: only the streak counts
    stop = fail(breaker, now=1000.0)
    assert stop == (
        f"stage a: {IN_A_ROW} in a row of its pilots ended before any worker started (the "
        "batch system says: FAILED, launch failed requeued held); stopped instead of "
        "submitting more"
    )


def test_a_useful_pilot_resets_the_streak_of_its_stage_only():
    breaker = Breaker()
    for i in range(IN_A_ROW - 1):
        fail(breaker, "a", now=100.0 * i)
        fail(breaker, "b", now=100.0 * i)
    assert useful(breaker, "a", now=500.0, finished=3) is None
    assert fail(breaker, "a", now=600.0) is None
    assert fail(breaker, "b", now=600.0) is not None


def test_pilots_the_run_released_are_no_failures():
    breaker = Breaker()
    for i in range(3 * IN_A_ROW):
        assert useful(breaker, now=100.0 * i, finished=0) is None  # released before any task


def test_a_pilot_that_finished_nothing_failed():
    breaker = Breaker()
    assert useful(breaker, now=0.0, finished=4, released=False) is None
    ended = {"joined": True, "finished": 0, "released": False, "state": "TIMEOUT", "reason": ""}
    stops = [breaker.ended(["a"], now=600.0 * i, **ended) for i in range(1, IN_A_ROW + 1)]
    assert stops[:-1] == [None] * (IN_A_ROW - 1)
    assert stops[-1] == (
        f"stage a: {IN_A_ROW} in a row of its pilots ended before finishing any task (the "
        "batch system says: TIMEOUT); stopped instead of submitting more"
    )


def test_m_failures_within_a_minute_stop_even_between_useful_pilots():
    breaker = Breaker()
    stops = []
    for i in range(PER_MINUTE):
        stops.append(fail(breaker, now=5.0 * i, reason=""))
        useful(breaker, now=5.0 * i + 1)
    assert stops[:-1] == [None] * (PER_MINUTE - 1)
    assert stops[-1] is not None and f"{PER_MINUTE} in 60 s" in stops[-1]
    assert "(the batch system says: FAILED)" in stops[-1]


def test_failures_more_than_a_minute_apart_do_not_add_up():
    breaker = Breaker(in_a_row=100)
    assert all(fail(breaker, now=61.0 * i) is None for i in range(3 * PER_MINUTE))


def test_a_pilot_of_several_stages_counts_for_each():
    breaker = Breaker(in_a_row=2)
    both = ["a", "b"]
    failed = {"joined": False, "finished": 0, "released": False, "state": "FAILED", "reason": ""}
    assert breaker.ended(both, now=0, **failed) is None
    stop = breaker.ended(both, now=1, **failed)
    assert stop is not None and stop.startswith("stage a:")


class NoWorkers:
    """Pilots whose workers never come: each one's allocation runs out unused."""

    def started(self, pilot: PilotRun, info) -> Sequence[Worker]:
        return ()

    def ended(self, pilot: PilotRun, workers: Sequence[Worker]) -> None:
        pass


def test_the_engine_stops_a_stage_whose_pilots_never_bring_workers():
    workflow = loads(
        """
        name = "nobody"
        [[stage]]
        name = "work"
        allocation = { cores = 4, time = "10m" }
        tasks = { command = "true", count = 4, cores = 1 }
        """
    )

    async def main():
        backend = MockSlurm(ClusterSpec(nodes=2, cores_per_node=28))
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="per-stage")
            return await execute(workflow, config, store, backend=backend, workers=NoWorkers())

    summary = clock.run(main(), virtual=True)
    assert summary.status == "failed"
    assert summary.error == (
        f"stage work: {IN_A_ROW} in a row of its pilots ended before any worker started (the "
        "batch system says: TIMEOUT, TimeLimit); stopped instead of submitting more"
    )
    assert [p.state for p in summary.pilots] == ["TIMEOUT"] * IN_A_ROW


def test_tasks_that_outlast_every_pilot_stop_the_run():
    """Found by running what validate accepts: a task longer than its pilot's time limit was
    lost at every pilot's end, and its stage resubmitted for ever. It had the first pilot's
    whole time, so the run stops there, naming the task, before the breaker counts pilots."""
    workflow = loads(
        """
        name = "long"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = "10m" }
        tasks = { command = "x", count = 1 }
        simulate = { duration = 1200 }
        """
    )
    summary = run_simulated(workflow, RunConfig(strategy="per-stage", backend=IDLE))
    assert summary.status == "failed"
    assert summary.error == (
        "task a.0: it ran 10 min until its pilot's time limit ended it, the whole 10 min its "
        "pilots get: give stage a a longer allocation time"
    )
    assert summary.makespan_s == 600.0  # at the first pilot's end (its replacement let go)


@pytest.mark.parametrize(
    ("strategy", "cores", "count"), [("per-stage", 1, 45), ("elastic", 28, 300)]
)
def test_a_run_of_useful_pilots_is_not_stopped(strategy, cores, count):
    """Pilots shorter than the stage: each finishes some tasks, the next goes on. Elastic's
    28 units of one core start at once on the idle cluster and reach their limit together
    (found on the HPC2N replay, where BLAST's units did so and the run stopped: judged by the
    stage's progress since the previous pilot's end, the second to fifth looked useless)."""
    workflow = loads(
        f"""
        name = "waves"
        [[stage]]
        name = "a"
        allocation = {{ cores = {cores}, time = "10m" }}
        tasks = {{ command = "x", count = {count}, cores = 1 }}
        simulate = {{ duration = 100 }}
        """
    )
    summary = run_simulated(workflow, RunConfig(strategy=strategy, backend=IDLE))
    assert summary.status == "done", summary.error
    assert sum(p.state == "TIMEOUT" for p in summary.pilots) >= IN_A_ROW


def test_a_local_pilot_that_cannot_start_stops_the_run_with_its_reason(tmp_path):
    """The issue's 6,388 failed pilots in 90 s: a stage name too long for a file name (which
    a workflow file can no longer give) made every pilot of the local backend fail at once."""
    stage = Stage("s" * 300, TaskTemplate("true", count=1), Allocation(cores=1))
    workflow = Workflow("long-names", (stage,))
    config = RunConfig(strategy="per-stage", backend=LocalOptions(), workdir=tmp_path)

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            return await execute(workflow, config, store)

    summary = clock.run(main(), virtual=False)
    assert summary.status == "failed"
    assert f"{IN_A_ROW} in a row" in summary.error
    assert "File name too long" in summary.error
    assert len(summary.pilots) == IN_A_ROW


def test_a_pilot_of_several_stages_is_useful_if_it_finished_a_task_of_any():
    """An elastic unit or a big job serves stages in a row: its time ran out while the first
    progressed and the second could not begin yet. That is no failure of the second."""
    breaker = Breaker()
    ended = {"joined": True, "released": False, "state": "TIMEOUT", "reason": ""}
    for i in range(2 * IN_A_ROW):
        assert breaker.ended(["first", "second"], finished=3, now=1000.0 * i, **ended) is None
    for i in range(IN_A_ROW):  # pilots that finish nothing count again
        stop = breaker.ended(["first", "second"], finished=0, now=1e5 + 1000.0 * i, **ended)
    assert stop is not None and stop.startswith(f"stage first: {IN_A_ROW} in a row")


def test_many_pilots_of_a_stage_ending_at_one_moment_each_useful_are_no_failures():
    """Elastic units of one core that started together reach their time limit together, each
    having finished tasks: each pilot is judged by the tasks that finished on it."""
    breaker = Breaker()
    ended = {"joined": True, "released": False, "state": "TIMEOUT", "reason": "TimeLimit"}
    assert all(breaker.ended(["search"], finished=6, now=600.0, **ended) is None for _ in range(28))
