"""Ponder against its authors' Java (GOLDEN.md): rules, unequal-loss line, variance offset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer
from learners.sizing.ponder import (
    PonderPredictor,
    Residuals,
    SimpleRegression,
    round_up_mib,
    weighted_variance,
)

GIB = float(2**30)
PAIRS = [(1, 900), (2, 1500), (0.5, 600), (3, 2300), (1.5, 1250), (2.5, 1800)]
PAIRS += [(4, 2900), (0.8, 750), (3.5, 2500), (2.2, 1700), (5, 3600), (1.2, 1000)]
INPUTS = (0.25, 1, 2.75, 4.5, 6)
KEEP = None
TABLE = {
    1: [1028, KEEP, KEEP, KEEP, KEEP],
    2: [1628, 1628, KEEP, KEEP, KEEP],
    4: [2428, 2428, 2428, KEEP, KEEP],
    5: [728, 1066.126, 2256.195, 3446.263, 4466.321],
    12: [728, 1063.396, 2247.288, 3431.181, 4445.946],
}


def predictor(n: int) -> PonderPredictor:
    p = PonderPredictor()
    for x, y in PAIRS[:n]:
        p.add(x * GIB, y)
    return p


@pytest.mark.parametrize("n", sorted(TABLE))
def test_predictions_after_n_pairs(n):
    p = predictor(n)
    for x, expected in zip(INPUTS, TABLE[n], strict=True):
        got = p.predict(x * GIB)
        if expected is KEEP:
            assert got is None
        else:
            assert got == pytest.approx(expected, abs=0.5)


def test_pearson_and_raw_line_at_12_pairs():
    p = predictor(12)
    assert round(p.regression.r, 6) == 0.998653
    assert float(p.line(0.0)) == pytest.approx(258.886, abs=0.5)


def test_simple_regression_matches_the_closed_form():
    r = SimpleRegression()
    for x, y in PAIRS:
        r.add(x, y / 1024)
    xs = [x for x, _ in PAIRS]
    ys = [y / 1024 for _, y in PAIRS]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sum(
        (a - mx) ** 2 for a in xs
    )
    assert r.slope == pytest.approx(slope) and r.intercept == pytest.approx(my - slope * mx)


def test_scheduler_clamps_to_the_request_and_rounds_to_whole_mib():
    assert round_up_mib(1066.126) == 1067 and round_up_mib(728.0) == 728
    sizer = make_sizer("ponder", worker=Resources(16, 64000, 64000), resources=("memory",))
    small = TaskFeatures("c", input_size=0.25 * GIB, requested={"memory": 700})
    assert sizer.allocate(small).memory == 700  # keep: no record yet
    for x, y in PAIRS:
        t = TaskFeatures("c", input_size=x * GIB)
        sizer.observe(Record(t, Resources(1, y, 0, 10)))
    assert sizer.allocate(small).memory == 700  # 728 clamped to the request
    big = TaskFeatures("c", input_size=2.75 * GIB, requested={"memory": 8000})
    first = sizer.allocate(big)
    assert first.memory == 2248
    assert sizer.allocate(big, first, Exhaustion("memory", 2248)).memory == 8000


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**36), st.floats(-500, 500)), min_size=1, max_size=60),
    st.integers(0, 2**37),
)
def test_residuals_give_the_java_weighted_variance(pairs, at):
    """The weighted variance from prefix sums is the Java pass over every record's
    (:func:`weighted_variance`, as the Java takes it; input sizes are whole bytes)."""
    xs = np.array([float(x) for x, _ in pairs])
    d = np.array([r for _, r in pairs])
    expected = weighted_variance(xs, d, float(at))
    assert Residuals.of(xs, d).variance(float(at)) == pytest.approx(expected, rel=1e-6, abs=1e-6)
