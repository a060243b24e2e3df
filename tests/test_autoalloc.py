"""Automatic allocations: the pilot's width and time limit chosen from a constructed history."""

import math
from dataclasses import replace

import numpy as np
import pytest

from backends import clock
from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from orchestrator.autoalloc import (
    FALLBACK_TIME_S,
    MARGIN,
    NOW_S,
    STARTUP_S,
    Demand,
    Node,
    WaitFrom,
    choose,
    demand,
    fallback,
    fitted,
    to_ask,
    with_fallbacks,
)
from orchestrator.planner import (
    ASK_AGAIN_S,
    AutoFit,
    Cancel,
    PerStage,
    Phase,
    PilotView,
    StageView,
    Submit,
)
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from workflows.spec import Allocation, Stage, TaskTemplate, Workflow, loads

NODE = Node(cores=28, count=9)
AUTO = Allocation(1, auto=True)


def nothing_learned(nodes, cores):
    return None


def runs(median: float, n: int = 200, sigma: float = 0.1, seed: int = 1) -> tuple[float, ...]:
    return tuple(np.random.default_rng(seed).lognormal(math.log(median), sigma, n).tolist())


def test_nothing_known_falls_back_to_one_node_capped_by_the_tasks():
    fit = choose(Demand(tasks=10), NODE, AUTO, nothing_learned)
    assert (fit.cores, fit.nodes, fit.time_limit_s) == (10, 1, FALLBACK_TIME_S)
    assert "no run time known" in fit.because
    assert fit.words("s") == (  # no width weighed: no wait to speak of
        "stage s fit: 10 cores, 1 h, because no run time known yet (first run, no wall "
        "declared): one node, 1 h"
    )
    many = choose(Demand(tasks=500), NODE, Allocation(1, auto=True, max_time_s=7200), lambda *a: 5)
    assert (many.cores, many.time_limit_s) == (28, 7200)


def test_fallback_respects_max_cores():
    assert fallback(Demand(tasks=100), NODE, Allocation(1, auto=True, max_cores=8)).cores == 8


def test_without_learned_waits_the_fastest_width_wins_and_the_limit_is_tight():
    history = runs(150.0)
    fit = choose(Demand(448, durations=history, source="learned"), NODE, AUTO, nothing_learned)
    assert fit.cores >= 224  # two waves: the fewest 9 nodes allow
    assert fit.wait_s is None
    # two waves of ~150 s each: the limit is a few minutes, not the hand-written hour
    assert 2 * max(history) < fit.time_limit_s <= 2 * max(history) * (1 + MARGIN) + STARTUP_S + 60
    assert fit.time_limit_s % 60 == 0


def test_a_long_learned_wait_of_the_wide_geometry_makes_a_narrower_one_win():
    """Wide pilots waited 3 h; narrow ones 2 min: fewer cores and more waves win."""
    history = runs(150.0)

    def learned(nodes, cores):
        return 10_800.0 if cores > 28 else 120.0

    fit = choose(Demand(448, durations=history, source="learned"), NODE, AUTO, learned)
    assert fit.cores <= 28 and fit.wait_s == 120.0
    assert fit.run_s is not None and fit.run_s > 448 * 150 / 28 * 0.9
    # and the other way round: wide pilots start at once, narrow ones wait long
    wide = choose(
        Demand(448, durations=history, source="learned"),
        NODE,
        AUTO,
        lambda n, c: 10.0 if c > 100 else 20_000.0,
    )
    assert wide.cores > 100


def test_a_width_the_scheduler_starts_now_waits_nothing_whatever_was_learned():
    """Wide pilots waited 3 h when last seen; the scheduler now foresees a wide one starting
    at once (a gap its backfill can fill): that one is chosen, and the learned 3 h count for
    nothing. A foresight of a few minutes is no start now: what was learned stands."""
    history = runs(150.0)
    need = Demand(448, durations=history, source="learned")

    def learned(nodes, cores):
        return 10_800.0 if cores > 28 else 120.0

    asked = to_ask(need, NODE, AUTO, learned)
    narrow = choose(need, NODE, AUTO, learned)
    # only widths that would beat the narrow choice if they started now are asked about
    assert asked and all(cores > 28 for _, cores, _, _ in asked)
    assert narrow.cores not in {cores for _, cores, _, _ in asked}
    widest = max(asked, key=lambda g: g[1])
    now = choose(need, NODE, AUTO, learned, expected={widest: 30.0}.get)
    assert (now.cores, now.time_limit_s, now.wait_s) == (widest[1], widest[2], 0.0)
    assert now.wait_from is WaitFrom.SCHEDULER
    assert "starts now, as the scheduler foresees" in now.words("s")
    later = choose(need, NODE, AUTO, learned, expected={widest: NOW_S + 60}.get)
    assert (later.cores, later.wait_s, later.wait_from) == (narrow.cores, 120.0, WaitFrom.LEARNED)
    # nothing to ask where nothing is known, or where the choice is already the fastest
    assert to_ask(Demand(448), NODE, AUTO, learned) == []
    assert to_ask(need, NODE, AUTO, lambda n, c: 0.0) == []


def test_auto_fit_asks_before_its_choice_and_again_only_after_a_while():
    history = runs(150.0)
    view = StageView("s", (), AUTO, Phase.READY, 0.0, demand=lambda: Demand(448, durations=history))
    fit = AutoFit(NODE, lambda a: 10_800.0 if a.cores > 28 else 120.0)
    asked = fit.to_ask(0.0, [view])
    assert asked and all(a.auto and a.cores > 28 for a in asked)
    assert fit.to_ask(ASK_AGAIN_S / 2, [view]) == []  # asked a moment ago
    for allocation in asked:
        fit.foreseen(allocation, 0.0 if allocation is asked[-1] else 5000.0)
    allocation, chosen = fit.allocation(view)
    assert chosen.wait_from is WaitFrom.SCHEDULER and allocation == asked[-1]
    assert fit.to_ask(ASK_AGAIN_S, [view]) == []  # chosen: nothing more to ask until submitted
    fit.submitted("s")
    assert fit.to_ask(ASK_AGAIN_S, [view]) == asked  # its next pilot asks anew


def test_a_price_on_core_hours_keeps_the_pilot_narrower_where_the_last_wave_idles():
    """With no wait, the widest pilot is fastest; a core-hour worth 50 min of makespan
    keeps it where doubling the width saves less time than its idle last-wave cores cost."""
    history = runs(150.0, sigma=0.4)
    need = Demand(448, durations=history, source="learned")
    fastest = choose(need, NODE, AUTO, lambda n, c: 0.0)
    priced = choose(need, NODE, AUTO, lambda n, c: 0.0, cost=3000.0)
    assert priced.cores < fastest.cores
    assert priced.run_s > fastest.run_s
    held = {f.cores: f.cores * f.run_s / 3600 for f in (fastest, priced)}
    assert held[priced.cores] < held[fastest.cores]
    # its price is the least of every width's: wait + run time + cost x core-hours
    assert priced.run_s * (1 + 3000 * priced.cores / 3600) <= fastest.run_s * (
        1 + 3000 * fastest.cores / 3600
    )
    assert "+ 50 min per core-hour" in priced.because
    assert "per core-hour" not in fastest.because
    # a learned wait still weighs: narrow pilots waiting a day make the wide one cheapest
    waited = choose(need, NODE, AUTO, lambda n, c: 0.0 if c > 200 else 86_400.0, cost=3000.0)
    assert waited.cores > 200


def test_an_unlearned_width_borrows_the_nearest_learned_wait_scaled_by_cores():
    history = runs(100.0, n=50)

    def learned(nodes, cores):
        return 2000.0 if cores == 24 else None

    fit = choose(Demand(24, durations=history, source="learned"), NODE, AUTO, learned)
    # 24 cores: 2000 s + ~120 s; 12: 1000 s + ~230 s; 6: 500 s + ~450 s; 2: 167 s + ~1300 s
    assert 4 <= fit.cores <= 8
    assert fit.wait_s == pytest.approx(2000.0 * fit.cores / 24)


def test_the_limit_is_never_below_the_longest_learned_task_plus_margin():
    # one outlier among many short tasks: the 99% quantile of the stage misses it
    history = (*[60.0] * 999, 5000.0)
    for tasks in (1, 10, 1000):
        fit = choose(Demand(tasks, durations=history, source="x"), NODE, AUTO, nothing_learned)
        assert fit.time_limit_s >= 5000.0 * (1 + MARGIN) + STARTUP_S


def test_max_time_excludes_widths_that_would_need_longer():
    history = runs(600.0)
    bounded = Allocation(1, auto=True, max_time_s=3 * 3600)

    def learned(nodes, cores):
        return 60.0 if cores <= 2 else 50_000.0

    fit = choose(Demand(100, durations=history, source="x"), NODE, bounded, learned)
    assert fit.time_limit_s <= 3 * 3600 and fit.cores > 2
    impossible = Allocation(1, auto=True, max_time_s=600, max_cores=4)
    tight = choose(Demand(100, durations=history, source="x"), NODE, impossible, learned)
    assert tight.time_limit_s == 600 and tight.cores == 4
    assert "longer than max_time allows" in tight.because


def test_bounds_cap_the_width():
    history = runs(100.0)
    for bounds, most in (
        (Allocation(1, auto=True, max_nodes=2), 56),
        (Allocation(1, auto=True, max_cores=40), 40),
    ):
        fit = choose(Demand(448, durations=history, source="x"), NODE, bounds, nothing_learned)
        assert fit.cores <= most


def test_tasks_of_several_cores_get_whole_nodes():
    history = runs(100.0)
    fit = choose(
        Demand(20, task_cores=4, durations=history, source="x"), NODE, AUTO, nothing_learned
    )
    assert fit.pinned and fit.cores % fit.nodes == 0 and (fit.cores // fit.nodes) % 4 == 0
    allocation = fitted(AUTO, fit)
    assert allocation.nodes == fit.nodes and allocation.cores == fit.cores


def test_the_choice_is_deterministic():
    d = Demand(448, durations=runs(150.0), source="x")
    assert choose(d, NODE, AUTO, nothing_learned) == choose(d, NODE, AUTO, nothing_learned)


def test_demand_prefers_learned_run_times_then_the_declared_wall():
    learned = demand(5, {"wall": 900.0}, (10.0,), [(20.0, 2.0), (30.0, 2.0)])
    assert learned.durations == (20.0, 30.0, 10.0) and learned.task_cores == 2.0
    assert "2 in earlier runs and 1 in this run" in learned.source
    declared = demand(5, {"wall": 900.0, "cores": 4.0}, (), [])
    assert declared.durations == (900.0,) and declared.task_cores == 4.0
    assert demand(5, {}, (), []).durations == ()


def test_fallbacks_make_every_automatic_stage_concrete():
    wf = Workflow(
        "w",
        (
            Stage("a", TaskTemplate("x", count=6), AUTO),
            Stage("b", TaskTemplate("x", count=1), Allocation(cores=4)),
        ),
    )
    out = with_fallbacks(wf, NODE)
    assert out.stage("a").allocation.cores == 6 and out.stage("a").allocation.auto
    assert out.stage("b").allocation == Allocation(cores=4)


def test_the_planner_submits_the_fit_and_says_why():
    fit = AutoFit(NODE, lambda allocation: 600.0 if allocation.cores <= 28 else None)
    d = Demand(56, durations=runs(300.0, n=56), source="56 learned")
    view = StageView("s", (), Allocation(28, auto=True), Phase.READY, demand=lambda: d)
    plan = PerStage(fit).decide(0.0, {"s": view}, [])
    (submit,) = [a for a in plan.actions if isinstance(a, Submit)]
    assert submit.allocation.cores <= 28 and submit.allocation.time_limit_s < 3600
    (note,) = [n for n in plan.notes if " fit: " in n]
    assert (
        note.startswith("stage s fit: ")
        and "predicted wait" in note
        and "because 56 learned" in note
    )
    # the stage's next pilot (say the first was lost) is chosen again
    assert fit.submitted("s") is None


def test_a_pending_pilot_of_a_ready_stage_is_replaced_by_a_width_that_starts_now():
    """A 24-core pilot chosen ahead of its stage still waits 10 minutes after the stage became
    ready, and the scheduler foresees 8 cores starting now: the pilot is cancelled for them,
    both notes say why. It is first weighed NOW_S after the stage became ready; where nothing
    that would beat it starts now, it keeps its place and is weighed again once it has waited
    twice as long; a pilot of a stage that is not ready is never weighed."""
    fit = AutoFit(NODE, lambda allocation: 0.0)
    d = Demand(24, durations=runs(120.0, n=24), source="24 learned")
    view = StageView("s", ("a",), AUTO, Phase.READY, ready_t=1000.0, demand=lambda: d)
    pilot = PilotView("p-1", ("s",), False, allocation=Allocation(24), submitted=500.0)
    planner = PerStage(fit)
    early = planner.decide(1030.0, {"s": view}, [pilot])
    assert early.actions == () and early.wake_at == 1000.0 + NOW_S

    now = 1600.0
    asked = [a for pilot_id, a in fit.to_ask_instead(now, {"s": view}, [pilot])]
    assert {a.cores for a in asked} == {12, 8, 6, 5}  # narrower and quick enough to beat it
    assert fit.to_ask_instead(now + 1, {"s": view}, [pilot]) == []  # weighed a moment ago
    for allocation in asked:
        fit.foreseen(allocation, 0.0 if allocation.cores == 8 else 5000.0)
    plan = planner.decide(now, {"s": view}, [pilot])
    cancel, submit = plan.actions
    assert isinstance(cancel, Cancel) and cancel.pilot_id == "p-1"
    assert cancel.why == (
        "still waits 10 min after stage s became ready, where 8 cores start now: cancelled for them"
    )
    assert isinstance(submit, Submit) and submit.allocation.cores == 8
    assert "starts now, as the scheduler foresees" in submit.fit
    assert "its pilot of 24 cores still waited 10 min after the stage became ready" in submit.fit

    kept = AutoFit(NODE, lambda allocation: 0.0)
    for _, allocation in kept.to_ask_instead(now, {"s": view}, [pilot]):
        kept.foreseen(allocation, 5000.0)
    plan = PerStage(kept).decide(now, {"s": view}, [pilot])
    assert plan.actions == () and plan.wake_at == 2200.0  # when its wait has doubled

    waiting = replace(view, phase=Phase.WAITING)
    assert AutoFit(NODE, lambda a: 0.0).to_ask_instead(now, {"s": waiting}, [pilot]) == []
    assert PerStage(fit).decide(now, {"s": waiting}, [pilot]).actions == ()


def test_a_hand_written_stage_is_left_as_written():
    fit = AutoFit(NODE, nothing_learned)
    view = StageView("s", (), Allocation(28), Phase.READY)
    (submit,) = PerStage(fit).decide(0.0, {"s": view}, []).actions
    assert submit.allocation == Allocation(28)


WORKFLOW = """
name = "fitted"

[[stage]]
name = "many"
allocation = { max_time = "2h" }
tasks = { command = "run {index}", count = 40, cores = 1 }
simulate = { duration = "normal(120, 5)" }

[[stage]]
name = "one"
allocation = "auto"
tasks = { command = "merge", count = 1 }
simulate = { duration = "normal(30, 2)" }
"""


def test_a_second_run_fits_its_pilots_to_what_the_first_learned(tmp_path):
    """First run: the fallback (one node, max_time or 1 h); second run: a limit from the
    learned run times, never below the longest of them plus margin, and wider where the
    queue let the first pilots start at once; the choice is stored with each pilot."""
    wf = loads(WORKFLOW, source=tmp_path / "wf.toml")
    cluster = ClusterSpec(nodes=4, cores_per_node=8)
    backend = MockOptions(load=0, cluster=cluster)
    config = RunConfig(strategy="per-stage", backend=backend, cost=0.0)  # time alone

    async def main():
        async with await Store.open(tmp_path / "s.db") as store:
            runs = [await execute(wf, config, store) for _ in range(2)]
            pilots = [await store.rows("pilots", {"run_id": r.run_id}) for r in runs]
            attempts = await store.rows("attempts", {"run_id": runs[0].run_id})
        return runs, pilots, attempts

    runs, pilots, attempts = clock.run(main(), virtual=True)
    assert [r.status for r in runs] == ["done", "done"]
    first = {p["stage"]: p for p in pilots[0]}
    assert first["many"]["request"]["cores"] == 8
    assert first["many"]["request"]["time_limit_s"] == 7200
    assert first["one"]["request"]["time_limit_s"] == FALLBACK_TIME_S
    assert "no run time known" in first["many"]["fit"]
    second = {p["stage"]: p for p in pilots[1]}
    longest = max(a["end_t"] - a["start_t"] for a in attempts if a["task_id"].startswith("many"))
    limit = second["many"]["request"]["time_limit_s"]
    assert longest * (1 + MARGIN) + STARTUP_S <= limit < 1800
    # at most twice the widest learned width (16 cores): the fewest cores for 3 waves
    assert second["many"]["request"]["cores"] == 14
    assert "run times learned of 40 in earlier runs" in second["many"]["fit"]
    assert second["one"]["request"]["cores"] == 1
    assert second["one"]["request"]["time_limit_s"] <= 5 * 60
    assert not any(p["state"] == "TIMEOUT" for p in pilots[1])


def test_the_engine_asks_the_scheduler_before_an_automatic_choice(tmp_path):
    """Wide pilots are learned to wait 3 h, but on this idle cluster the scheduler starts any
    pilot now: the second run's pilot is wide all the same, and its note says why."""
    wf = loads(WORKFLOW, source=tmp_path / "wf.toml")
    cluster = ClusterSpec(nodes=4, cores_per_node=8)
    config = RunConfig(strategy="per-stage", backend=MockOptions(load=0, cluster=cluster), cost=0)

    def planner() -> PerStage:
        return PerStage(fit=AutoFit(Node(8, 4), lambda a: 10_800.0 if a.cores > 8 else 0.0))

    async def main():
        async with await Store.open(tmp_path / "s.db") as store:
            runs = [await execute(wf, config, store, planner=planner()) for _ in range(2)]
            return runs, await store.rows("pilots", {"run_id": runs[1].run_id})

    runs, pilots = clock.run(main(), virtual=True)
    assert [r.status for r in runs] == ["done", "done"]
    many = next(p for p in pilots if p["stage"] == "many")
    assert 20 <= many["request"]["cores"] <= 32  # two waves of 120 s, not five on 8 cores
    assert "starts now, as the scheduler foresees" in many["fit"]
