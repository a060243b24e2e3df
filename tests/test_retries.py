"""How the engine retries: only the exhausted resource grows; declared sizes are fixed."""

from backends import clock
from backends.sim.backend import MockSlurm
from backends.sim.workload import ClusterSpec
from learners.resources import RESOURCES, Resources
from learners.sizing import make_sizer
from orchestrator.engine import Engine
from orchestrator.planner import PerStage
from orchestrator.simulate import SimulatedWorkers, task_truths
from orchestrator.store import Store
from workflows.spec import loads

CLUSTER = ClusterSpec(nodes=2, cores_per_node=8, memory_per_node_mb=32000)


def run(toml: str, sizer):
    """The workflow on an idle simulated cluster with ``sizer``; its summary and attempts."""
    workflow = loads(toml)

    async def main():
        async with await Store.open(":memory:") as store:
            engine = Engine(
                workflow,
                MockSlurm(CLUSTER),
                store,
                planner=PerStage(),
                sizer=sizer,
                workers=SimulatedWorkers(task_truths(workflow, seed=0)),
            )
            summary = await engine.run()
            attempts = await store.rows("attempts", {"run_id": summary.run_id}, order="start_t")
            return summary, attempts

    return clock.run(main(), virtual=True)


def test_a_retry_grows_the_exhausted_resource_only_wall_time_too():
    """With a sizer of wall time, tasks that outlive their limit are retried longer."""
    summary, attempts = run(
        """
        name = "slow"
        [[stage]]
        name = "s"
        allocation = { cores = 8, time = "10h" }
        tasks = { command = "true", count = 30, cores = 1 }
        [stage.simulate]
        duration = "trimodal(60, 1, 60, 1, 300, 1)"
        memory = "normal(300, 30)"
        disk = "normal(300, 10)"
        """,
        make_sizer("exhaust", worker=Resources(8, 32000, 10_000, 36_000), resources=RESOURCES),
    )
    assert summary.status == "done"
    exhausted = [a for a in attempts if a["outcome"] == "exhausted"]
    timed_out = {a["task_id"] for a in exhausted if a["exhausted"] == "wall"}
    assert len(timed_out) >= 5
    for a in exhausted:
        retry = next(
            b for b in attempts if (b["task_id"], b["attempt"]) == (a["task_id"], a["attempt"] + 1)
        )
        grown = a["exhausted"]
        assert retry["allocation"][grown] > a["allocation"][grown]
        others = [r for r in RESOURCES if r != grown]
        assert [retry["allocation"][r] for r in others] == [a["allocation"][r] for r in others]


def test_a_declared_wall_time_is_fixed_and_exceeding_it_fails_the_stage():
    summary, attempts = run(
        """
        name = "late"
        [[stage]]
        name = "s"
        allocation = { cores = 1, time = "1h" }
        tasks = { command = "true", count = 1, cores = 1, memory = "1G", disk = "1G", wall = 60 }
        simulate = { duration = "100" }
        """,
        make_sizer("exhaust", worker=Resources(8, 32000, 10_000)),
    )
    assert summary.status == "failed"
    assert "needs more wall time than the 1 min its workflow declares (it reached 1 min)" in (
        summary.error
    )
    assert [(a["outcome"], a["exhausted"]) for a in attempts] == [("exhausted", "wall")]
