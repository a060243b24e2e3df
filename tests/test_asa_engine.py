"""ASA in the engine on the simulated cluster: dependencies, early submission, the oracle."""

import asyncio
import io

import pytest
from rich.console import Console

from backends import clock, sim
from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from learners.queue_wait import QueueWaitLearner
from orchestrator.dashboard import Dashboard, render
from orchestrator.engine import Engine
from orchestrator.planner import Asa
from orchestrator.session import RunConfig, execute, run_simulated
from orchestrator.store import Store
from orchestrator.waits import QueueWaits, geometry
from workflows.spec import Allocation, example, load, loads

CLUSTER = ClusterSpec(nodes=4, cores_per_node=28, memory_per_node_mb=128000)

TWO_STAGES = loads(
    """
    name = "two"
    [[stage]]
    name = "first"
    allocation = { cores = 28, time = "1h" }
    tasks = { command = "true", count = 28, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "1000" }
    [[stage]]
    name = "second"
    allocation = { cores = 28, time = "1h" }
    tasks = { command = "true", count = 28, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "500" }
    """
)


def test_a_proactive_pilot_is_pending_on_its_dependency_until_the_stage_before_ends():
    """With a predicted wait of 600 s, the second pilot goes in 600 s before the first stage's
    forecast end, pending with reason Dependency, and becomes eligible when the first ends.

    The first run knows nothing of the stage's durations and forecasts its deadline (the
    pilot's time limit); the second knows the durations of the first and forecasts right.
    """
    seen = []

    def watch(engine: Engine) -> None:
        pilot = engine.state.pilots.get("second-1")
        if pilot is not None and pilot.info is not None:
            seen.append((engine.now(), str(pilot.info.state), pilot.info.reason))

    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="asa", backend=MockOptions(load=0, cluster=CLUSTER))
            runs = []
            for _ in range(2):
                planner = Asa(lambda allocation: (600.0, None))
                runs.append(
                    await execute(TWO_STAGES, config, store, observer=watch, planner=planner)
                )
            return runs

    first_run, second_run = clock.run(main(), virtual=True)
    assert first_run.pilots[1].submit_t == pytest.approx(1000)  # deadline 3600 - 600 > 1000
    first, second = second_run.pilots
    assert second.submit_t == pytest.approx(1000 - 600, abs=1)
    assert second.eligible_t == pytest.approx(first.end_t)
    pending = [t for t, state, reason in seen if (state, reason) == ("PENDING", "Dependency")]
    assert pending and max(pending) <= first.end_t
    assert second_run.stages[1].start_t == pytest.approx(second_run.stages[0].end_t)


def test_asa_submits_earlier_than_per_stage():
    """Four waves of tasks: the first wave's durations let a fresh learner's ASA forecast."""
    waves = loads(
        """
        name = "waves"
        [[stage]]
        name = "first"
        allocation = { cores = 28, time = "1h" }
        tasks = { command = "true", count = 112, cores = 1, memory = "1G", disk = "1G" }
        simulate = { duration = "normal(250, 5)" }
        [[stage]]
        name = "second"
        allocation = { cores = 28, time = "1h" }
        tasks = { command = "true", count = 28, cores = 1, memory = "1G", disk = "1G" }
        """
    )
    mock = MockOptions(load=0, cluster=CLUSTER)
    per_stage = run_simulated(waves, RunConfig(strategy="per-stage", backend=mock))
    asa = run_simulated(waves, RunConfig(strategy="asa", backend=mock))
    assert asa.stages[1].submit_t < per_stage.stages[1].submit_t
    assert per_stage.stages[1].submit_t == pytest.approx(per_stage.stages[0].end_t)


@pytest.mark.parametrize("offset", [29_556_323.0, 68_493_283.0, 90_000_000.0])
def test_the_oracle_is_never_worse_than_asa_on_makespan(offset):
    workflow = load(example("montage"), scale=28)
    mock = MockOptions(trace="HPC2N", cluster=ClusterSpec(9, 28, 128000), offset=offset)
    asa = run_simulated(workflow, RunConfig(strategy="asa", backend=mock))
    oracle = run_simulated(workflow, RunConfig(strategy="oracle", backend=mock))
    assert oracle.status == asa.status == "done"
    assert oracle.makespan_s <= asa.makespan_s + 1.0


def test_the_learner_persists_in_the_store_across_runs():
    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="asa", backend=MockOptions(load=0.9, cluster=CLUSTER))
            cluster = await sim.open(config.backend).cluster_name()
            await execute(TWO_STAGES, config, store)
            first = (await QueueWaits.load(store, cluster)).learner.to_dict()
            await execute(TWO_STAGES, config, store)
            second = (await QueueWaits.load(store, cluster)).learner
            return first, second

    first, second = clock.run(main(), virtual=True)
    assert first["geometries"]  # waits were learned and saved ...
    observed = sum(second.stats(g).observations for g in second.geometries())
    assert observed == 4  # ... and the second run continued from them: two pilots each run


def test_the_wait_law_of_a_geometry_follows_what_the_learner_learns():
    waits = QueueWaits(QueueWaitLearner(policy="tuned", seed=0), "queue_wait/test/cores")
    four, eight = Allocation(cores=4), Allocation(cores=8)

    def fresh(allocation: Allocation) -> tuple[tuple[float, float], ...]:
        learner = waits.learner
        law = learner.distribution(geometry(allocation), top=len(learner.grid))
        return tuple(sorted((a.value, a.probability) for a in law))

    before = waits.law(four)
    assert before == fresh(four) == waits.law(eight)
    for _ in range(5):
        waits.observe_wait(four, None, 3600.0)
    assert waits.law(four) == fresh(four) != before
    assert waits.law(eight) == fresh(eight)


def test_the_dashboard_shows_stages_pilots_and_decisions():
    frames = []

    def keep(engine: Engine) -> None:
        console = Console(width=120, record=True)
        console.print(render(engine))
        frames.append(console.export_text())

    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="asa", backend=MockOptions(load=0, cluster=CLUSTER))
            for _ in range(2):  # the second run knows the stage durations
                planner = Asa(lambda allocation: (600.0, None))
                await execute(TWO_STAGES, config, store, observer=keep, planner=planner)

    clock.run(main(), virtual=True)
    text = "\n".join(frames)
    assert "first" in text and "second" in text
    assert "pending (Dependency)" in text
    assert "stage second: predicted wait 10 min, submitting at t+6 min 40 s" in text
    assert "28/28" in frames[-1]


def test_the_dashboard_redraws_at_a_bounded_real_rate(monkeypatch):
    """Hundreds of engine passes, a fake real clock moving 10 ms per pass: 4 redraws a second."""
    passes = []
    monkeypatch.setattr("orchestrator.dashboard.clock.monotonic", lambda: len(passes) * 0.01)

    async def main():
        async with await Store.open(":memory:") as store:
            workflow = load(example("blast"), scale=28)
            config = RunConfig(strategy="per-stage", backend=MockOptions(load=0, cluster=CLUSTER))
            with Dashboard(Console(file=io.StringIO()), max_hz=4) as view:

                def count(engine):
                    passes.append(1)
                    view(engine)

                await execute(workflow, config, store, observer=count)
            return view.frames

    frames = clock.run(main(), virtual=True)
    seconds = len(passes) * 0.01
    assert len(passes) > 100
    assert frames <= 4 * seconds + 1


def test_compare_rows_cover_every_strategy_and_scale():
    from orchestrator.compare import compare

    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(backend=MockOptions(trace="KTH", cluster=ClusterSpec(4, 28, 128000)))
            return await compare(
                [example("blast")], ["bigjob", "per-stage", "asa"], [28, 56], 1, config, store
            )

    rows = clock.run(main(), virtual=True)
    assert {(r.strategy, r.scale) for r in rows} == {
        (s, c) for s in ("bigjob", "per-stage", "asa") for c in (28, 56)
    }
    by = {(r.strategy, r.scale): r for r in rows}
    for scale in (28, 56):
        assert by["bigjob", scale].core_hours >= by["per-stage", scale].core_hours * 0.99
    assert asyncio.iscoroutinefunction(compare)
