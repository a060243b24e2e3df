"""The elastic strategy: its cost arithmetic, its plans as pure decisions, and whole runs on
the simulated cluster (reuse across a stage boundary, early release, no request for width
already held)."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from learners.resources import Resources
from orchestrator import runstate
from orchestrator.cli import app
from orchestrator.elastic import (
    DUE,
    MAX_UNITS,
    Elastic,
    Kept,
    Profile,
    Span,
    acquire_cost,
    lead,
    split,
)
from orchestrator.planner import Cancel, Phase, PilotView, Release, StageView, Submit
from orchestrator.session import RunConfig, run_simulated
from orchestrator.summary import RunSummary
from workflows.spec import Allocation, example, loads

NODE = Resources(cores=28, memory=128_000, disk=1_000_000)
WIDE = Allocation(cores=28, time_limit_s=3600)
NARROW = Allocation(cores=1, memory_mb=8000, time_limit_s=3600)


def certain(wait):
    """A law that knows the wait."""
    return lambda allocation: [(wait, 1.0)]


def planner(wait, cost=300.0, unit=28):
    """Units of a node by default here: the decisions on wide units."""
    return Elastic(lambda allocation: (wait, None), certain(wait), NODE, cost, unit=unit)


def chain(*stages):
    """Stages s0 -> s1 -> ... from (allocation, phase, width, forecast end)."""
    views = {}
    for i, (allocation, phase, width, end) in enumerate(stages):
        after = (f"s{i - 1}",) if i else ()
        forecast = lambda end=end: end  # noqa: E731
        views[f"s{i}"] = StageView(f"s{i}", after, allocation, phase, None, forecast, width=width)
    return views


def unit(pilot_id, cores, *, started=True, busy=False, allocation=WIDE):
    return PilotView(pilot_id, (), started, busy, allocation=replace(allocation, cores=cores))


def of(kind, plan):
    return [a for a in plan.actions if isinstance(a, kind)]


def test_the_lead_is_the_newsvendor_quantile_of_the_wait():
    law = [(100.0, 0.25), (1000.0, 0.5), (5000.0, 0.25)]
    assert lead(law, 0.0) == 5000.0  # idle costs nothing: never late
    assert lead(law, 1.0) == 1000.0  # the median
    assert lead(law, 100.0) == 100.0  # idle costs much: rather late than early
    # At the lead, a second more or less changes the expected cost by about nothing.
    assert acquire_cost(law, 1.0, 1000.0) <= acquire_cost(law, 1.0, 999.0)
    assert acquire_cost(law, 1.0, 1000.0) <= acquire_cost(law, 1.0, 1001.0)
    assert acquire_cost(law, 1.0, 1000.0) == pytest.approx(0.25 * 900 + 0.25 * 4000)


def test_a_width_is_cut_where_the_need_falls_and_at_nodes():
    assert split(0, 24, {24, 1}, 28) == [1, 23]
    assert split(1, 56, {1, 56}, 28) == [28, 27]
    assert split(0, 28, set(), 28) == [28]
    assert split(0, 5, set(), 1) == [1] * 5
    assert split(0, 13, set(), 6, task=2) == [6, 6, 2]  # whole 2-core tasks
    assert split(0, 7, set(), 4, task=2) == [4, 4]


def test_the_profile_sums_the_widths_of_the_stages_running_at_once():
    spans = [Span("a", 0, 100, 28), Span("b", 100, 300, 1), Span("c", 300, math.inf, 28)]
    profile = Profile.of(0.0, spans)
    assert [profile.need(t) for t in profile.points] == [28, 1, 28]
    assert profile.widths == (28, 1, 28)
    assert profile.stages_from(150) == ("b", "c")


@settings(max_examples=200, deadline=None)
@given(
    now=st.sampled_from([0.0, 50.0]),
    points=st.lists(st.sampled_from([0.0, 0.5, 50.0, 50.5, 100.0, 300.0]), unique=True),
    units=st.lists(
        st.tuples(
            st.sampled_from([-math.inf, 0.0, 0.5, 50.0, 60.0, 100.0, math.inf]),
            st.integers(1, 28),
        )
    ),
)
def test_the_units_kept_hold_at_each_point_the_cores_of_those_kept_past_it_or_now(
    now, points, units
):
    points = sorted(t for t in points if t >= now)
    kept = Kept(now, points)
    for until, cores in units:
        kept.add(until, cores)
    assert kept.held == [
        sum(c for until, c in units if until > t or t <= now + DUE) for t in points
    ]


_UNIT_KINDS = st.tuples(
    st.sampled_from([1, 2, 4, 28]),  # cores
    st.booleans(),  # started
    st.booleans(),  # busy
    st.sampled_from([None, 300.0, 900.0, 5000.0]),  # ends
    st.integers(1, 30),  # how many alike
)


@settings(max_examples=150, deadline=None)
@given(
    stages=st.lists(
        st.tuples(
            st.sampled_from([Phase.RUNNING, Phase.READY, Phase.WAITING]),
            st.integers(0, 60),
            st.sampled_from([100.0, 400.0, 1200.0, 4000.0, None]),
        ),
        min_size=1,
        max_size=3,
    ),
    kinds=st.lists(_UNIT_KINDS, max_size=5),
    wait=st.sampled_from([0.0, 60.0, 600.0, 3000.0]),
    cost=st.sampled_from([0.0, 300.0, 3000.0, 1e6]),
    now=st.sampled_from([0.0, 250.0]),
)
def test_alike_units_weighed_together_get_the_plan_of_units_weighed_one_by_one(
    stages, kinds, wait, cost, now
):
    """Grouping alike units changes no decision and no note: the same plan as weighing each
    unit on its own (each given an sbatch option of its own, which no fate reads)."""
    views = chain(*[(replace(WIDE, cores=60), p, w, end) for p, w, end in stages])
    pilots = [
        PilotView(
            f"u{k}.{i}", (), started, busy and started, allocation=replace(WIDE, cores=cores),
            ends=ends if started else None,
        )
        for k, (cores, started, busy, ends, n) in enumerate(kinds)
        for i in range(n)
    ]  # fmt: skip
    apart = [
        replace(p, allocation=replace(p.allocation, sbatch=(f"--comment={p.pilot_id}",)))
        for p in pilots
    ]
    law = lambda allocation: [(wait / 2, 0.5), (wait * 2, 0.5)]  # noqa: E731

    def plan(units):
        return Elastic(lambda a: (wait, None), law, NODE, cost, unit="task").decide(
            now, views, units
        )

    assert plan(pilots) == plan(apart)


def test_the_first_pass_requests_the_stages_widths_as_units_without_a_dependency():
    stages = chain(
        (NARROW, Phase.READY, 1, 1300.0),
        (WIDE, Phase.WAITING, 28, 2500.0),
        (NARROW, Phase.WAITING, 1, None),
    )
    plan = planner(wait=600.0).decide(0.0, stages, [])
    (now,) = of(Submit, plan)
    assert now.allocation.cores == 1 and now.after == ()
    assert plan.notes[0].endswith(
        "1 core needed at t+0 s: submitting now (late for its lead of 10 min, no dependency)"
    )
    assert now.allocation.memory_mb == 8000  # the narrow stages' memory
    # The 27 cores the second stage adds are due 600 s before it starts.
    assert plan.wake_at == pytest.approx(1300.0 - 600.0)
    elastic = planner(wait=600.0)
    said = [
        [n for n in elastic.decide(t, chain(
            (NARROW, Phase.READY, 1, end), (WIDE, Phase.WAITING, 28, end + 1200),
            (NARROW, Phase.WAITING, 1, None)), []).notes if "27 cores" in n]
        for t, end in ((0.0, 1300.0), (10.0, 1320.0), (20.0, 2000.0))
    ]  # fmt: skip
    assert said == [  # said once, again only when its moment moved much
        ["27 cores needed at t+21 min 40 s: submitting at t+11 min 40 s (10 min ahead)"],
        [],
        ["27 cores needed at t+33 min 20 s: submitting at t+23 min 20 s (10 min ahead)"],
    ]
    later = planner(wait=600.0).decide(700.0, stages, [unit("u0", 1, allocation=NARROW)])
    (added,) = of(Submit, later)
    assert added.allocation.cores == 27 and added.after == ()
    assert "27 cores needed at t+21 min 40 s: submitting now (10 min ahead, no dependency)" in (
        later.notes
    )
    assert added.predicted_wait == 600.0


def test_a_plan_is_not_said_again_when_the_pilot_submitted_now_is_held_next_pass():
    """The width a stage adds is the same need whether the unit submitted now is counted as
    planned (this pass) or as held (the next): said once."""
    stages = chain(
        (NARROW, Phase.READY, 1, 1300.0),
        (WIDE, Phase.WAITING, 28, 2500.0),
        (NARROW, Phase.WAITING, 1, None),
    )
    elastic = planner(wait=600.0)
    first = [n for n in elastic.decide(0.0, stages, []).notes if "27 cores" in n]
    held = [unit("u0", 1, allocation=NARROW)]
    second = [n for n in elastic.decide(0.0, stages, held).notes if "27 cores" in n]
    assert len(first) == 1 and second == []


def test_by_default_a_unit_is_one_task_wide_and_holds_its_memory():
    """The narrowest pilot the scheduler can start in a gap: one per task slot. A width of 27
    one-core tasks is 27 pilots of one core, said in one note, due together (each pilot's
    share of the width is its share of the delay, so all have the whole width's lead)."""
    stages = chain(
        (NARROW, Phase.READY, 1, 1300.0),
        (WIDE, Phase.WAITING, 28, 2500.0),
    )
    elastic = planner(wait=600.0, unit="task")
    plan = elastic.decide(0.0, stages, [])
    (now,) = of(Submit, plan)
    assert now.allocation.cores == 1
    assert plan.notes[1] == (
        "27 cores needed at t+21 min 40 s (27 pilots of 1 core): submitting at t+11 min 40 s "
        "(10 min ahead)"
    )
    later = elastic.decide(700.0, stages, [unit("u0", 1, allocation=NARROW)])
    assert [s.allocation.cores for s in of(Submit, later)] == [1] * 27
    # Tasks that now take 6 GB get units that hold them, above a node's share of a core.
    big = {n: replace(v, task=Resources(cores=1, memory=6000)) for n, v in stages.items()}
    units = of(Submit, elastic.decide(700.0, big, [unit("u0", 1, allocation=NARROW)]))
    assert {s.allocation.memory_mb for s in units} == {6000}
    # Tasks of 4 cores: units of whole tasks, within --unit 7.
    wide_tasks = {n: replace(v, task=Resources(cores=4)) for n, v in stages.items()}
    units = of(Submit, planner(600.0, unit=7).decide(700.0, wide_tasks, []))
    assert sorted(s.allocation.cores for s in units) == [4] * 7


def test_a_unit_too_small_for_the_tasks_left_goes_and_is_not_counted():
    """A task killed for memory is retried larger: units cut for the smaller size hold none
    of the stage's tasks. Idle, they go; the width is acquired again in units that hold them."""
    stages = {
        n: replace(v, task=Resources(cores=1, memory=6000))
        for n, v in chain((WIDE, Phase.RUNNING, 2, None)).items()
    }
    small = [unit("u0", 1, allocation=replace(WIDE, memory_mb=4000)), unit("u1", 1, busy=True)]
    plan = planner(wait=0.0, unit="task").decide(100.0, stages, small)
    (release,) = of(Release, plan)
    assert release.pilot_id == "u0" and "too small" in release.why
    # u1 runs a task (one sized before), so it stays and covers a core while it does: one
    # unit of 6,000 MB is submitted for the other.
    assert [s.allocation.memory_mb for s in of(Submit, plan)] == [6000]


def test_units_learn_what_the_scheduler_s_default_memory_gives_and_ask_beyond_it():
    """NODE's share of a core is 4,571 MB; a cluster whose default gives a core 1,000 MB
    (Slurm's DefMemPerCPU) left units of that much under tasks of 3,000: too small, though
    the planner took them for a node's share, so none was released and none asked for more."""
    stages = {
        n: replace(v, task=Resources(cores=1, memory=3000))
        for n, v in chain((WIDE, Phase.RUNNING, 2, None)).items()
    }
    elastic = planner(wait=0.0, unit="task")
    assert of(Submit, elastic.decide(0.0, stages, []))[0].allocation.memory_mb is None
    seen = [replace(unit("u0", 1), memory=1000.0), replace(unit("u1", 1, busy=True), memory=1000.0)]
    plan = elastic.decide(100.0, stages, seen)
    (release,) = of(Release, plan)
    assert release.pilot_id == "u0" and "too small" in release.why
    assert [s.allocation.memory_mb for s in of(Submit, plan)] == [3000]


def test_an_idle_unit_too_small_for_a_task_waiting_goes_though_a_later_stage_s_tasks_fit():
    """A task grown past every unit waits for one sized to it: a small idle unit kept for the
    next stage's small tasks counted as the width it needed, and none came (the demo's
    simulate stage waited an hour, until its units' time limit)."""
    stages = chain((WIDE, Phase.RUNNING, 2, None), (WIDE, Phase.WAITING, 2, None))
    grown = Resources(cores=1, memory=6000)
    stages["s0"] = replace(stages["s0"], task=grown, outgrown=True)
    stages["s1"] = replace(stages["s1"], task=Resources(cores=1, memory=1000))
    small = replace(WIDE, memory_mb=4000)
    held = [unit("u0", 1, allocation=small), unit("u1", 1, busy=True, allocation=small)]
    plan = planner(wait=0.0, unit="task").decide(100.0, stages, held)
    (release,) = of(Release, plan)
    assert release.pilot_id == "u0" and release.why == "too small for the tasks waiting: released"
    assert [s.allocation.memory_mb for s in of(Submit, plan)] == [6000]
    waiting = {"s0": replace(stages["s0"], outgrown=False), "s1": stages["s1"]}
    assert of(Release, planner(wait=0.0, unit="task").decide(100.0, waiting, held)) == []


def test_no_request_for_width_already_held():
    stages = chain((WIDE, Phase.RUNNING, 28, 1000.0), (WIDE, Phase.WAITING, 28, None))
    held = [unit("u0", 1), unit("u1", 27, busy=True)]
    plan = planner(wait=600.0).decide(500.0, stages, held)
    assert plan.actions == ()


def test_an_idle_unit_is_held_through_a_gap_cheaper_than_acquiring_it_again():
    """Between two wide stages, one 1-core stage of 1800 s: 27 idle cores for 1800 s cost
    13.5 core-hours. A certain wait of 2 h makes acquiring them again cost 5,400 s of delay."""
    stages = chain(
        (WIDE, Phase.DONE, 0, None),
        (NARROW, Phase.RUNNING, 1, 3000.0),
        (WIDE, Phase.WAITING, 28, None),
    )
    held = [unit("u0", 1, busy=True, allocation=NARROW), unit("u1", 27)]
    assert of(Release, planner(wait=7200.0, cost=300.0).decide(1200.0, stages, held)) == []
    # At 600 s a core-hour, holding costs 8,100 s: releasing is cheaper.
    (release,) = of(Release, planner(wait=7200.0, cost=600.0).decide(1200.0, stages, held))
    assert release.pilot_id == "u1"
    # A wait known to be short: release, and acquire again just in time.
    plan = planner(wait=300.0).decide(1200.0, stages, held)
    assert [r.pilot_id for r in of(Release, plan)] == ["u1"]
    assert plan.wake_at == pytest.approx(3000.0 - 300.0)


def test_a_wide_unit_left_alone_for_a_narrow_stage_is_swapped_for_a_narrow_one_if_cheaper():
    """The 1-core unit cut for the narrow stage is gone (it ended at its time limit): the
    27-core unit would run its one task with 26 cores idle for 1800 s (13 core-hours). A wait
    of 300 s for a 1-core unit and again for the wide one costs far less at 300 s per
    core-hour; a wait of 10 h does not."""
    stages = chain(
        (WIDE, Phase.DONE, 0, None),
        (NARROW, Phase.READY, 1, 3000.0),
        (WIDE, Phase.WAITING, 28, None),
    )
    alone = [unit("u1", 27)]
    plan = planner(wait=300.0).decide(1200.0, stages, alone)
    (release,) = of(Release, plan)
    assert release.pilot_id == "u1"
    assert "26 of its 27 cores idle" in release.why and "1-core unit" in release.why
    (narrow,) = of(Submit, plan)
    assert narrow.allocation.cores == 1
    assert plan.wake_at == pytest.approx(3000.0 - 300.0)  # the wide width, just in time
    assert of(Release, planner(wait=36_000.0).decide(1200.0, stages, alone)) == []
    # Running the narrow stage's task already: it stays.
    busy = [unit("u1", 27, busy=True)]
    assert of(Release, planner(wait=300.0).decide(1200.0, stages, busy)) == []
    # A narrow span shorter than a new pilot's start is not worth a swap.
    short = chain(
        (WIDE, Phase.DONE, 0, None),
        (NARROW, Phase.READY, 1, 1230.0),
        (WIDE, Phase.WAITING, 28, None),
    )
    assert of(Release, planner(wait=0.0).decide(1200.0, short, alone)) == []


def test_what_a_pass_submits_the_next_pass_keeps():
    """Units running now but given back before a later wide stage do not cover it: the
    width that stage adds is submitted, and the next pass, at the same moment, neither
    cancels what was submitted nor submits it again (they did, over and over, in a run
    whose units of 7 cores were released for a narrow stage: 42,000 pilots in no time)."""
    stages = chain(
        (WIDE, Phase.RUNNING, 22, 1000.0),
        (NARROW, Phase.WAITING, 1, 3000.0),
        (WIDE, Phase.WAITING, 27, None),
    )
    held = [
        unit("u0", 1, busy=True, allocation=NARROW),
        *(unit(f"u{i}", 7, busy=True) for i in (1, 2, 3)),
        unit("p", 6, started=False),
    ]
    elastic = planner(wait=3000.0, cost=3000.0)
    first = elastic.decide(500.0, stages, held)
    submitted = of(Submit, first)
    assert sum(s.allocation.cores for s in submitted) == 27 - 1 - 6
    pending = [
        PilotView(f"n{i}", s.stages, False, False, allocation=s.allocation)
        for i, s in enumerate(submitted)
    ]
    again = elastic.decide(500.0, stages, [*held, *pending])
    assert of(Cancel, again) == [] and of(Submit, again) == []


def test_a_unit_is_acquired_again_its_wait_ahead_of_its_time_limit():
    """A unit's time limit ends it while its stage still runs: the width it holds is
    submitted again its wait ahead, not once it ended (then the stage ran a whole wait
    narrower)."""
    stages = chain((NARROW, Phase.RUNNING, 1, 10_000.0))
    ending = [replace(unit("u0", 1, busy=True, allocation=NARROW), ends=4000.0)]
    early = planner(wait=600.0).decide(1000.0, stages, ending)
    assert early.actions == () and early.wake_at == pytest.approx(4000.0 - 600.0)
    (again,) = of(Submit, planner(wait=600.0).decide(3400.0, stages, ending))
    assert again.allocation.cores == 1
    lasting = [replace(unit("u0", 1, busy=True, allocation=NARROW), ends=20_000.0)]
    assert planner(wait=600.0).decide(3400.0, stages, lasting).actions == ()
    # Past what the forecasts say (a stage whose end is not known yet), nothing is planned
    # for it: idle units are not held for a width nobody knows is needed then (found on the
    # real Slurm: three idle units held through the last stage for its pilot's end).
    unknown = chain((NARROW, Phase.RUNNING, 1, None))
    plan = planner(wait=600.0).decide(3400.0, unknown, [*ending, unit("u1", 1, allocation=NARROW)])
    assert [r.pilot_id for r in of(Release, plan)] == ["u1"] and of(Submit, plan) == []


def test_a_unit_too_near_its_time_limit_for_another_task_goes_when_idle():
    """Placement gives a worker no task that would outlast its pilot: an idle unit whose
    limit is nearer than the run time of a task it could start now is released, not held idle
    until Slurm ends it (TIMEOUT), and its width is acquired again (found on the HPC2N replay:
    BLAST's units held for the merge stage, whose run time was not known yet)."""
    stages = chain((NARROW, Phase.RUNNING, 1, 9000.0), (NARROW, Phase.WAITING, 1, None))
    # The later stage's run time is not known yet: its tasks do not keep the unit (they
    # cannot start before the first stage ends; the units acquired for it run them).
    stages["s0"] = replace(stages["s0"], duration=300.0)
    spent = [replace(unit("u0", 1, allocation=NARROW), ends=4000.0)]
    plan = planner(wait=0.0).decide(3800.0, stages, spent)
    (release,) = of(Release, plan)
    assert release.why == "its time limit ends before another task could finish: released"
    assert [s.allocation.cores for s in of(Submit, plan)] == [1]
    # Running its last task, it stays; with time for one more, it stays idle.
    busy = [replace(spent[0], busy=True)]
    assert of(Release, planner(wait=0.0).decide(3800.0, stages, busy)) == []
    assert of(Release, planner(wait=0.0).decide(3600.0, stages, spent)) == []


def test_a_unit_no_stage_needs_again_goes_and_a_pending_one_is_cancelled():
    stages = chain((WIDE, Phase.DONE, 0, None), (NARROW, Phase.RUNNING, 1, None))
    held = [
        unit("u0", 1, busy=True),
        unit("u1", 27),
        unit("u2", 28, started=False),
    ]
    plan = planner(wait=0.0, cost=0.0).decide(10.0, stages, held)
    assert [r.pilot_id for r in of(Release, plan)] == ["u1"]
    assert [c.pilot_id for c in of(Cancel, plan)] == ["u2"]
    assert of(Submit, plan) == []


CLUSTER = ClusterSpec(nodes=4, cores_per_node=28, memory_per_node_mb=128000)
IDLE = MockOptions(load=0, cluster=CLUSTER)

THREE = loads(
    """
    name = "three"
    [[stage]]
    name = "first"
    allocation = { cores = 28, time = "1h" }
    tasks = { command = "true", count = 28, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "uniform(100, 600)" }
    [[stage]]
    name = "second"
    allocation = { cores = 28, time = "1h" }
    tasks = { command = "true", count = 28, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "normal(300, 10)" }
    [[stage]]
    name = "last"
    allocation = { cores = 1, time = "1h" }
    tasks = { command = "true", count = 1, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "1000" }
    """
)


def test_a_run_reuses_its_pilots_across_a_boundary_and_gives_back_what_the_tail_frees():
    """By default a unit is one task wide: the first stage's 28 pilots of one core run the
    second stage too (none is submitted for it), each goes as soon as no task is left for it,
    and one runs the last stage."""
    summary = run_simulated(THREE, RunConfig(strategy="elastic", backend=IDLE))
    assert summary.status == "done", summary.error
    assert [p.cores for p in summary.pilots] == [1] * 28
    assert all(p.submit_t == 0 for p in summary.pilots)  # none for the second stage
    first, second, last = summary.stages
    assert second.start_t == pytest.approx(first.end_t)
    ends = sorted(p.end_t for p in summary.pilots)
    assert ends[-2] <= second.end_t + 1  # released when their stages end ...
    assert ends[0] < second.end_t - 1  # ... some while the second stage's tail still runs
    assert ends[-1] == pytest.approx(last.end_t, abs=1)  # the last stage's
    # On an idle cluster, Per-Stage's pilots start at once: holding across the boundary
    # costs nothing more.
    per_stage = run_simulated(THREE, RunConfig(strategy="per-stage", backend=IDLE))
    assert summary.core_hours <= per_stage.core_hours


def test_units_of_a_node_are_reused_and_the_wide_one_goes_when_its_stages_end():
    summary = run_simulated(THREE, RunConfig(strategy="elastic", backend=IDLE, unit="node"))
    assert summary.status == "done", summary.error
    pilots = {p.pilot_id: p for p in summary.pilots}
    assert sorted(p.cores for p in pilots.values()) == [1, 27]
    assert all(p.submit_t == 0 for p in pilots.values())  # none for the second stage
    first, second, last = summary.stages
    assert second.start_t == pytest.approx(first.end_t)
    (wide,) = [p for p in pilots.values() if p.cores == 27]
    (narrow,) = [p for p in pilots.values() if p.cores == 1]
    assert wide.end_t == pytest.approx(second.end_t, abs=1)  # released when its stages end
    assert narrow.end_t == pytest.approx(last.end_t, abs=1)
    assert summary.makespan_s == pytest.approx(last.end_t)
    per_stage = run_simulated(THREE, RunConfig(strategy="per-stage", backend=IDLE))
    assert summary.core_hours == pytest.approx(per_stage.core_hours)


TAIL = loads(
    """
    name = "tail"
    [[stage]]
    name = "wide"
    allocation = { cores = 56, time = "1h" }
    tasks = { command = "true", count = 56, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "uniform(60, 1200)" }
    [[stage]]
    name = "narrow"
    allocation = { cores = 1, time = "1h" }
    tasks = { command = "true", count = 1, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "100" }
    """
)


@pytest.mark.parametrize("unit", ["node", 7])
def test_idle_nodes_go_back_while_the_stage_s_tail_still_runs(unit):
    """Two nodes' worth of tasks, ending at widely spread times, then one 1-core stage: a
    pilot whose tasks all ended goes back before the stage's last task ends."""
    summary = run_simulated(TAIL, RunConfig(strategy="elastic", backend=IDLE, unit=unit))
    assert summary.status == "done", summary.error
    wide = summary.stages[0]
    ends = sorted(p.end_t for p in summary.pilots if p.cores > 1)
    # cut where the width falls to the narrow stage's one core, and at the unit's size
    cut = [1, 27, 28] if unit == "node" else [1, 6, *[7] * 7]
    assert sorted(p.cores for p in summary.pilots) == cut
    assert ends[0] < wide.end_t - 1  # released while the wide stage still ran


QUEUED = loads(
    """
    name = "queued"
    [[stage]]
    name = "wide"
    allocation = { cores = 28, time = "4h" }
    tasks = { command = "true", count = 300, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "uniform(2, 20)" }
    [[stage]]
    name = "narrow"
    after = ["wide"]
    allocation = { cores = 4, time = "4h" }
    tasks = { command = "true", count = 40, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "uniform(2, 6)" }
    [[stage]]
    name = "last"
    after = ["narrow"]
    allocation = { cores = 1, time = "1h" }
    tasks = { command = "true", count = 1, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "100" }
    """
)


@pytest.mark.parametrize("strategy", ["elastic", "elastic-node", "per-stage", "asa"])
def test_planning_on_its_period_decides_what_planning_every_pass_does(monkeypatch, strategy):
    """Successes alone wait for the planner up to PLAN_PERIOD_S; a unit they leave idle, and
    anything else, is planned for at once: the run is the one planning every pass gives
    (every pilot's cores, submission, start and end), with fewer plans."""
    unit = "node" if strategy == "elastic-node" else "task"
    config = RunConfig(strategy=strategy.removesuffix("-node"), backend=IDLE, unit=unit)
    plans = []
    plan = runstate.RunState.plan
    monkeypatch.setattr(runstate.RunState, "plan", lambda self: plans.append(1) or plan(self))

    def run() -> tuple[int, RunSummary]:
        plans.clear()
        summary = run_simulated(QUEUED, config)
        assert summary.status == "done", summary.error
        return len(plans), summary

    periodic, on_period = run()
    monkeypatch.setattr(runstate, "PLAN_PERIOD_S", 0.0)
    every, on_every_pass = run()
    assert periodic < every
    assert on_period.pilots == on_every_pass.pilots
    assert on_period.makespan_s == on_every_pass.makespan_s
    assert on_period.core_hours == on_every_pass.core_hours


def test_each_partition_has_units_of_its_own():
    """Stages that ask for different partitions (or accounts, or QOS) are planned apart: a
    unit serves the stages of its place, and a place whose stages are over gives its units
    back while the others' run."""
    gpu = replace(WIDE, partition="gpu", cores=4)
    stages = chain((gpu, Phase.RUNNING, 4, 1000.0), (NARROW, Phase.WAITING, 1, None))
    plan = planner(wait=5000.0, unit="task").decide(0.0, stages, [])
    assert sorted((str(s.allocation.partition), s.stages) for s in of(Submit, plan)) == [
        ("None", ("s1",)),
        *[("gpu", ("s0",))] * 4,
    ]
    done = chain((gpu, Phase.DONE, 0, None), (NARROW, Phase.RUNNING, 1, None))
    held = [unit("g", 4, allocation=gpu), unit("n", 1, busy=True, allocation=NARROW)]
    (release,) = of(Release, planner(wait=0.0).decide(10.0, done, held))
    assert release.pilot_id == "g"


@st.composite
def situations(draw):
    """A chain of stages (the first running or ready, later ones waiting; their tasks' run
    times), the units held (those started maybe ending at their time limit), a law of waits
    and a cost."""
    n = draw(st.integers(1, 4))
    ends = sorted(draw(st.lists(st.floats(100, 20_000), min_size=n, max_size=n, unique=True)))
    stages = []
    for i in range(n):
        width = draw(st.integers(1, 112))
        allocation = WIDE if width > 1 else NARROW
        phase = Phase.RUNNING if i == 0 else Phase.WAITING
        end = None if i == n - 1 and draw(st.booleans()) else ends[i]
        stages.append((replace(allocation, cores=max(width, 1)), phase, width, end))
    units = [
        replace(
            unit(f"u{i}", draw(st.integers(1, 28)), started=started, busy=started and busy),
            ends=draw(st.none() | st.floats(100, 30_000)) if started else None,
        )
        for i, (started, busy) in enumerate(
            draw(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=6))
        )
    ]
    waits = draw(st.lists(st.floats(0, 50_000), min_size=1, max_size=4))
    law = sorted((w, 1.0 / len(waits)) for w in waits)
    cost = draw(st.sampled_from([0.0, 300.0, 3000.0, 100_000.0]))
    durations = draw(st.lists(st.sampled_from([0.0, 60.0, 900.0]), min_size=n, max_size=n))
    views = chain(*stages)
    return (
        {k: replace(v, duration=d) for (k, v), d in zip(views.items(), durations, strict=True)},
        units,
        law,
        cost,
    )


@settings(max_examples=300, deadline=None)
@given(situations())
def test_passes_at_one_moment_settle_and_keep_what_they_submit(situation):
    """Whatever the stages, units, law and cost, passes at one moment, each seeing what the
    last did, settle within a few passes, and none cancels a unit that one of them
    submitted: a plan that contradicts itself would submit and cancel pilots over and over
    without the clock moving."""
    stages, units, law, cost = situation
    elastic = Elastic(lambda allocation: (law[0][0], None), lambda allocation: law, NODE, cost)
    new: set[str] = set()
    for n in range(4):
        plan = elastic.decide(100.0, stages, units)
        if not plan.actions:
            break
        gone = {a.pilot_id for a in plan.actions if isinstance(a, Release | Cancel)}
        assert not gone & new, plan.actions
        submitted = [
            PilotView(f"n{n}.{i}", s.stages, False, False, allocation=s.allocation)
            for i, s in enumerate(of(Submit, plan))
        ]
        new |= {u.pilot_id for u in submitted}
        units = [u for u in units if u.pilot_id not in gone] + submitted
    else:
        raise AssertionError(f"still acting after 4 passes: {plan.actions}")


def test_a_place_holds_at_most_max_units_units():
    """A width of 250 one-core tasks is 84 units of 3 tasks (each at most a node), not 250
    pilots: a site caps the jobs a user may queue."""
    stages = chain((replace(WIDE, cores=250), Phase.RUNNING, 250, 1000.0))
    plan = planner(wait=0.0, unit="task").decide(0.0, stages, [])
    cores = [s.allocation.cores for s in of(Submit, plan)]
    assert sum(cores) == 250 and len(cores) <= MAX_UNITS and max(cores) == 3


def test_unit_given_to_another_strategy_is_noted_as_ignored(tmp_path):
    blast = str(example("blast"))
    done = CliRunner().invoke(
        app, ["run", blast, "--strategy", "asa", "--unit", "node", "--db", str(tmp_path / "s")]
    )
    assert done.exit_code == 0, done.output
    assert "--unit: asa ignores it (only elastic cuts units)" in done.output
    bad = CliRunner().invoke(app, ["run", blast, "--unit", "0", "--db", str(tmp_path / "s")])
    assert bad.exit_code == 2
    assert "--unit 0: expected task, node or a number of cores (1 or more)" in bad.output


def test_an_automatic_stage_is_as_wide_as_its_tasks_within_its_bounds():
    """allocation = "auto" under elastic: the units are the pilots, so the stage is as wide as
    its tasks left use, within max_cores, max_nodes and the partition's nodes, not the one
    node of the fallback pilot another strategy would submit first."""

    def auto(bounds: str) -> RunSummary:
        workflow = loads(
            f"""
            name = "wide"
            [[stage]]
            name = "a"
            allocation = {bounds}
            tasks = {{ command = "true", count = 60, cores = 1, memory = "1G", disk = "1G" }}
            simulate = {{ duration = "600" }}
            """
        )
        return run_simulated(workflow, RunConfig(strategy="elastic", backend=IDLE))

    free = auto('"auto"')
    assert free.status == "done", free.error
    assert len(free.pilots) == 60 and free.makespan_s < 700  # 4 nodes hold all at once
    bounded = auto("{ max_cores = 20 }")
    assert len(bounded.pilots) == 20 and bounded.makespan_s >= 1800  # three waves
