"""k-Segments, Witt LR, the Tovar and user-default sizers on the k-Segments data (GOLDEN.md)."""

from __future__ import annotations

import numpy as np
import pytest

from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer
from learners.sizing.ksegments import (
    KSegments,
    Steps,
    attempt_waste,
    retry_steps,
    simulate,
    train,
)
from learners.sizing.tovar import Histogram, min_waste
from learners.sizing.witt import witt_line, witt_predict

XS = np.arange(1, 7, dtype=float)


def series(x: float, length: int) -> np.ndarray:
    j = np.arange(length)
    return 100 + 50 * x + 300 * x * (j / (length - 1)) ** 2 + ((7 * j + 3 * int(2 * x)) % 5) * 10.0


TRAIN = [series(x, int(20 + 4 * x)) for x in XS]
TEST0 = series(3.5, 34)
TEST1 = TEST0.copy()
TEST1[11:22] *= 1.3


@pytest.fixture(scope="module")
def steps() -> Steps:
    return Steps.of(train(XS, TRAIN, 4).predict(3.5, 4))


def test_time_model_and_segments(steps):
    model = train(XS, TRAIN, 4)
    assert model.runtime.slope == pytest.approx(4) and model.runtime.intercept == pytest.approx(20)
    assert steps.runs == ((0, 7), (8, 15), (16, 23), (24, 31))
    assert [round(steps.values[first], 4) for first, _ in steps.runs] == [
        365.2767,
        554.0924,
        892.9316,
        1363.5714,
    ]


def test_test0_succeeds_first_time(steps):
    out = simulate(TEST0, steps, "selective")
    assert (round(out.waste, 4), out.retries, out.runtime) == (5994.3928, 0, 35)


def test_test1_selective_retry(steps):
    failed_at, waste = attempt_waste(TEST1, steps)
    assert (failed_at, round(waste, 4)) == (13, 5787.0834)
    second = retry_steps(steps, 13, "selective")
    assert round(second.values[8], 4) == 1108.1848
    failed_at, waste = attempt_waste(TEST1, second)
    assert (failed_at, round(waste, 4)) == (21, 16516.1773)
    assert round(retry_steps(second, 21, "selective").values[16], 4) == 1785.8632
    out = simulate(TEST1, steps, "selective")
    assert (round(out.waste, 4), out.retries, out.runtime) == (38050.9818, 2, 71)


def test_test1_partial_retry(steps):
    after = retry_steps(steps, 13, "partial")
    assert [round(after.values[first], 4) for first, _ in after.runs] == [
        365.2767,
        1108.1848,
        1785.8632,
        2727.1429,
    ]
    out = simulate(TEST1, steps, "partial")
    assert (round(out.waste, 4), out.retries, out.runtime) == (34488.7331, 1, 49)


PEAKS = np.array([s.max() for s in TRAIN])


def constant(value: float) -> Steps:
    return Steps.of(np.full(34, value))


def test_witt_mean():
    line = witt_line(XS, PEAKS, "mean")
    assert round(line.slope, 6) == 352.857143
    assert round(line.intercept, 6) == 123.093073
    assert witt_predict(line, 3.5) == 1358
    assert round(simulate(TEST0, constant(1358), "selective").waste, 4) == 23538.6970
    assert round(simulate(TEST1, constant(1358), "selective").waste, 4) == 21715.8333


def test_witt_under_and_max():
    assert witt_predict(witt_line(XS, PEAKS, "under"), 3.5) == 1359
    assert witt_predict(witt_line(XS, PEAKS, "max"), 3.5) == 1363


def test_tovar_and_user_default_sizers():
    h = Histogram(1)
    for s in TRAIN:
        h.insert(float(s.max()), len(s))
    tovar = min_waste(h, float(PEAKS.max()))
    assert tovar == 2220
    assert round(simulate(TEST0, constant(tovar), "selective").waste, 4) == 51984.6970
    assert round(simulate(TEST0, constant(8192), "selective").waste, 4) == 249060.6970


def test_peak_sizer_is_the_step_function_maximum():
    learner = KSegments(64000.0)
    for x, s in zip(XS, TRAIN, strict=True):
        task = TaskFeatures("c", input_size=float(x))
        learner.observe(float(s.max()), Record(task, Resources(1, s.max(), 0, len(s)), tuple(s)))
    task = TaskFeatures("c", input_size=3.5)
    assert round(learner.first(task), 4) == 1363.5714
    assert learner.retry(task, 1363.5714, 1400.0) == 2 * 1363.5714


def test_sizer_uses_the_request_until_it_has_two_records():
    sizer = make_sizer("ksegments", worker=Resources(16, 64000, 64000), resources=("memory",))
    task = TaskFeatures("c", input_size=1.0, requested={"memory": 8192})
    assert sizer.allocate(task).memory == 8192
    assert sizer.memory_steps(task) is None
    for x, s in zip(XS[:2], TRAIN[:2], strict=True):
        t = TaskFeatures("c", input_size=float(x))
        sizer.observe(Record(t, Resources(1, float(s.max()), 0, len(s)), tuple(s)))
    steps = sizer.memory_steps(task)
    assert steps is not None and sizer.allocate(task).memory == steps.peak
    more = sizer.memory_retry(task, steps, 0)
    assert more.values[0] == 2 * steps.values[0]
    doubled = sizer.allocate(task, sizer.allocate(task), Exhaustion("memory", steps.peak))
    assert doubled.memory == 2 * steps.peak


def test_a_runtime_extrapolated_far_past_the_series_seen_is_cut():
    # Two records whose runtime line is steep: an input 10^9 times larger once asked for
    # billions of samples.
    model = train(np.array([1.0, 2.0]), [np.full(10, 100.0), np.full(1000, 300.0)], 4)
    assert len(model.predict(1e9, 4)) == 2 * 1000  # k segments of 2 x 1,000 / k samples
    assert len(model.predict(2.0, 4)) == 1000  # within what was seen: the reference's length
