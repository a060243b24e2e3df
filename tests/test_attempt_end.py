"""One rule for how an attempt ends, shared by the simulated workers and the sizing replay."""

import numpy as np
import pytest

from learners.attempt_end import Kills, MemorySeries, attempt_end
from learners.replay import TraceTask, replay
from learners.resources import Resources
from learners.sizing.registry import make_sizer
from orchestrator.agent.attempt import Outcome
from orchestrator.simulate import TaskTruth, simulate_attempt

PEAK = Resources(cores=2.0, memory=400.0, disk=100.0, wall=100.0)
SLOW = Kills("slow")


def test_enough_of_everything_ends_at_the_tasks_own_time():
    ended = attempt_end(PEAK, Resources(2, 400, 100, 1e9), SLOW)
    assert (ended.end, ended.exhausted, ended.stretch) == (100.0, (), 1.0)


def test_fewer_cores_than_used_stretch_the_run_and_may_reach_the_time_limit():
    assert attempt_end(PEAK, Resources(1, 400, 100, 1e9), SLOW).end == 200.0
    assert attempt_end(PEAK, Resources(1, 400, 100, 1e9), SLOW, use=1.5).end == 150.0
    ended = attempt_end(PEAK, Resources(1, 400, 100, 150), SLOW)
    assert ended.end == 150.0 and [e.resource for e in ended.exhausted] == ["wall"]


@pytest.mark.parametrize(
    ("kills", "end", "reported"), [(Kills("slow"), 100.0, 300.0), (Kills("fast"), 0.0, 400.0)]
)
def test_the_kill_model_says_when_a_memory_kill_comes_and_what_was_seen(kills, end, reported):
    ended = attempt_end(PEAK, Resources(2, 300, 100, 1e9), kills)
    assert ended.end == end
    assert [(e.resource, e.measured) for e in ended.exhausted] == [("memory", reported)]


def test_calibrated_kills_are_drawn_within_the_run_and_between_allocation_and_peak():
    kills = Kills("calibrated", np.random.default_rng(1))
    for _ in range(50):
        ended = attempt_end(PEAK, Resources(2, 300, 100, 1e9), kills)
        assert 0 <= ended.end <= 100.0
        assert 300.0 <= ended.exhausted[0].measured <= 400.0
    with pytest.raises(ValueError, match="random generator"):
        Kills("calibrated")


def test_a_memory_series_kills_at_its_first_sample_above_the_limit_stretched_with_the_run():
    series = MemorySeries(np.arange(5.0) * 10, np.array([100, 200, 350, 300, 100.0]))
    peak = PEAK.with_("wall", 40.0)
    ended = attempt_end(peak, Resources(1, 300, 100, 1e9), SLOW, series=series)
    assert (ended.end, ended.failed_at) == (40.0, 2)  # sample 2 at 20 s, run twice as slow
    assert [(e.resource, e.measured) for e in ended.exhausted] == [("memory", 350.0)]
    assert not attempt_end(peak, Resources(2, 350, 100, 1e9), SLOW, series=series).exhausted


def test_simulated_workers_and_the_replay_end_an_attempt_alike():
    """A task given too little memory on too few cores: the simulated worker and the sizing
    replay (slow peaks) kill it at the same moment, for the same reason."""
    series = MemorySeries(np.arange(5.0) * 10, np.array([100, 200, 350, 300, 100.0]))
    truth = TaskTruth(PEAK.with_("wall", 40.0), memory_series=series)
    simulated = simulate_attempt(truth, Resources(1, 300, 100, 1e9))
    assert simulated.outcome == Outcome.EXHAUSTED and simulated.duration == 40.0
    assert simulated.exhaustion is not None and simulated.exhaustion.measured == 350.0

    task = TraceTask("c", PEAK.with_("wall", 40.0), series=series)
    worker = Resources(1, 300, 1000, 1e9)
    sizer = make_sizer("whole", worker=worker)
    result = replay([task], sizer, workers=1, worker=worker, peaks="slow")
    assert (result.retries, result.unfit, result.makespan) == (1, 1, 40.0)
