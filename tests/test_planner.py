"""The planners as pure functions of stage and pilot views."""

import pytest

from learners.queue_wait import Alternative, Prediction
from orchestrator.forecast import Durations, forecast_end
from orchestrator.planner import (
    Asa,
    BigJob,
    Cancel,
    PerStage,
    Phase,
    PilotView,
    PlannedMoments,
    StageView,
    Submit,
    big_allocation,
)
from orchestrator.waits import NoQueue, quantile
from workflows.spec import Allocation

A28 = Allocation(cores=28, time_limit_s=3600)
A1 = Allocation(cores=1, memory_mb=16000, time_limit_s=1800)


def chain(*phases, ends=None):
    """Stages s0 -> s1 -> ... with the given phases and forecast ends."""
    ends = ends or [None] * len(phases)
    views = {}
    for i, (phase, end) in enumerate(zip(phases, ends, strict=True)):
        after = (f"s{i - 1}",) if i else ()
        allocation = A28 if i % 2 == 0 else A1
        views[f"s{i}"] = StageView(f"s{i}", after, allocation, phase, None, lambda end=end: end)
    return views


def submits(plan):
    return [a for a in plan.actions if isinstance(a, Submit)]


def test_per_stage_submits_ready_stages_only():
    stages = chain(Phase.DONE, Phase.READY, Phase.WAITING)
    plan = PerStage().decide(100.0, stages, [])
    assert [s.stages for s in submits(plan)] == [("s1",)]
    assert submits(plan)[0].after == ()


def test_bigjob_takes_the_widest_stage_and_the_longest_path():
    stages = chain(Phase.READY, Phase.WAITING, Phase.WAITING)
    (submit,) = submits(BigJob().decide(0.0, stages, []))
    assert submit.stages == ("s0", "s1", "s2")
    assert submit.allocation.cores == 28
    assert submit.allocation.time_limit_s == 3600 + 1800 + 3600
    assert BigJob().decide(0.0, stages, [PilotView("all-0", submit.stages, False)]).actions == ()


def test_big_allocation_memory_follows_the_default_when_any_stage_leaves_it():
    assert big_allocation([A28, A1], 10).memory_mb is None
    explicit = Allocation(cores=28, memory_mb=56000)
    assert big_allocation([explicit, A1], 10).memory_mb == 56000


def test_asa_submits_at_forecast_end_minus_the_predicted_wait_with_a_dependency():
    asa = Asa(lambda allocation: (300.0, "p"))
    stages = chain(Phase.RUNNING, Phase.WAITING, ends=[1000.0, 1500.0])
    pilots = [PilotView("s0-0", ("s0",), True, True)]
    early = asa.decide(600.0, stages, pilots)
    assert submits(early) == [] and early.wake_at == 700.0
    assert "stage s1: predicted wait 5 min, submitting at t+11 min 40 s" in early.notes
    (submit,) = submits(asa.decide(700.0, stages, pilots))
    assert submit.after == ("s0-0",) and submit.predicted_wait == 300 and submit.prediction == "p"


@pytest.mark.parametrize("seen", [0, 3])
def test_a_wait_nothing_was_learned_of_is_said_to_be_the_priors(seen):
    prediction = Prediction(50000.0, 9, 0.1, observations=seen)
    asa = Asa(lambda allocation: (50000.0, prediction))
    stages = chain(Phase.RUNNING, Phase.WAITING, ends=[100.0, 200.0])
    plan = asa.decide(0.0, stages, [PilotView("s0-0", ("s0",), True, True)])
    (note,) = [n for n in plan.notes if n.startswith("stage s1")]
    if seen:
        assert note == "stage s1: predicted wait 13 h 53 min, submitting now after s0-0"
    else:
        assert note == (
            "stage s1: no wait learned yet for its geometry here "
            "(planning with 13 h 53 min, from the learner's prior), submitting now after s0-0"
        )


def test_a_planned_submission_is_said_once_and_again_only_when_it_moved_much():
    """A forecast moves with every result: the plan is said the first time, and again when it
    moved by more than a minute and a quarter of the time left until it."""
    asa = Asa(NoQueue().predict)
    pilots = [PilotView("s0-0", ("s0",), True, True)]
    said = []
    for now, end in ((0.0, 1000.0), (10.0, 1030.0), (20.0, 1050.0), (30.0, 1400.0), (40.0, 1420.0)):
        plan = asa.decide(now, chain(Phase.RUNNING, Phase.WAITING, ends=[end, end + 100]), pilots)
        said += [n for n in plan.notes if n.startswith("stage s1")]
    assert said == [
        "stage s1: no queue here (a pilot starts when submitted), submitting at t+16 min 40 s",
        "stage s1: no queue here (a pilot starts when submitted), submitting at t+23 min 20 s",
    ]
    assert PlannedMoments().worth_saying("x", 10.0, 0.0)


def test_a_stage_is_pulled_forward_by_the_stages_after_it():
    """s2 wants its pilot in 5000 s before its inputs end; s1 (predicted short) must go first,
    since s2's dependency needs s1's pilot: both are due now."""
    waits = {28: 5000.0, 1: 10.0}
    asa = Asa(lambda allocation: (waits[allocation.cores], None))
    stages = chain(Phase.RUNNING, Phase.WAITING, Phase.WAITING, ends=[1000.0, 1200.0, 2000.0])
    pilots = [PilotView("s0-0", ("s0",), True, True)]
    plan = asa.decide(0.0, stages, pilots)
    assert [s.stages for s in submits(plan)] == [("s1",)]  # s2 follows once s1 has a pilot
    pilots.append(PilotView("s1-1", ("s1",), False))
    (s2,) = submits(asa.decide(0.0, stages, pilots))
    assert s2.after == ("s1-1",)


def test_asa_waits_for_a_forecast_and_for_the_pilots_it_depends_on():
    asa = Asa(lambda allocation: (10_000.0, None))
    running = [PilotView("s0-0", ("s0",), True, True)]
    assert submits(asa.decide(0.0, chain(Phase.RUNNING, Phase.WAITING), running)) == []
    pending = chain(Phase.READY, Phase.WAITING, ends=[50, 60])
    assert [s.stages for s in submits(asa.decide(0.0, pending, []))] == [("s0",)]
    naive = Asa(lambda allocation: (10_000.0, None), dependency=False, name="asa-naive")
    plan = naive.decide(0.0, chain(Phase.RUNNING, Phase.WAITING, ends=[50, 60]), running)
    (submit,) = submits(plan)
    assert submit.stages == ("s1",) and submit.after == ()


def test_asa_naive_cancels_an_early_idle_pilot_and_resubmits_with_the_wait_it_saw():
    naive = Asa(lambda allocation: (5000.0, None), dependency=False, idle_cancel_s=600)
    stages = chain(Phase.RUNNING, Phase.WAITING, ends=[4000.0, 4500.0])
    early = PilotView("s1-1", ("s1",), started=True, busy=False, wait=120.0)
    plan = naive.decide(100.0, stages, [PilotView("s0-0", ("s0",), True, True), early])
    assert [a.pilot_id for a in plan.actions if isinstance(a, Cancel)] == ["s1-1"]
    assert submits(plan) == [] and plan.wake_at == 4000.0 - 120.0
    busy = PilotView("s1-1", ("s1",), started=True, busy=True, wait=120.0)
    assert naive.decide(100.0, stages, [PilotView("s0-0", ("s0",), True, True), busy]).actions == ()


def test_the_planned_wait_is_a_quantile_of_the_learned_distribution():
    alternatives = [
        Alternative(i, value, p, 0, None)
        for i, (value, p) in enumerate([(10, 0.5), (100, 0.3), (1000, 0.15), (10000, 0.05)])
    ]
    assert quantile(alternatives, 0.5) == 10
    assert quantile(alternatives, 0.8) == 100
    assert quantile(alternatives, 0.9) == 1000
    assert quantile(alternatives, 1.0) == 10000


def test_forecast_list_schedules_the_queue_behind_the_running_tasks():
    durations = Durations()
    for d in (10, 10, 10, 10):
        durations.add(d)
    # Two slots, running 5 s and 2 s: free at 5 and 8; five queued tasks of 10 s.
    assert forecast_end(100, durations, [5, 2], 5, 2) == pytest.approx(135)
    assert forecast_end(0, Durations(), [1], 3, 2) is None
    assert forecast_end(0, Durations(prior=20), [], 4, 2) == 40
    long = Durations()
    for d in (10, 20, 30, 40):
        long.add(d)
    assert long.remaining(25) == pytest.approx(35 - 25)  # mean of the longer ones, minus elapsed
    assert long.remaining(50) == 0
