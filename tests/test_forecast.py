"""Stage forecasts: the durations' residual life against a direct computation."""

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.forecast import Durations, forecast_end

durations = st.lists(st.floats(0, 1e5, allow_nan=False), min_size=1, max_size=200)


@given(durations, st.floats(0, 2e5, allow_nan=False), st.sampled_from([4096, 1, 7]))
def test_mean_and_remaining_life_are_those_of_the_latest_durations(values, elapsed, window):
    seen = Durations(window=window)
    for value in values:
        seen.add(value)
    latest = values[-window:]
    longer = [v for v in latest if v > elapsed]
    expected = sum(longer) / len(longer) - elapsed if longer else 0.0
    assert len(seen) == len(latest)
    assert abs(seen.mean - sum(latest) / len(latest)) <= 1e-9 * max(values)
    assert abs(seen.remaining(elapsed) - expected) <= 1e-9 * max(values)


def test_before_any_duration_the_prior_holds():
    assert Durations().mean is None and Durations().remaining(5) is None
    assert Durations(prior=60).remaining(45) == 15 and Durations(prior=60).remaining(90) == 0


def test_queued_tasks_are_list_scheduled_behind_the_running_ones():
    seen = Durations()
    for value in (10.0, 10.0, 10.0):
        seen.add(value)
    # Two slots, one idle and one busy 4 s more; 5 queued tasks of 10 s: the idle slot
    # runs them from 0, 10 and 20 s, the busy one from 4 and 14 s.
    assert forecast_end(100.0, seen, [6.0], queued=5, slots=2) == 100.0 + 30
