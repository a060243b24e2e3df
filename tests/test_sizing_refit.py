"""The refit schedule of the learners that fit a model on all of a category's records."""

from __future__ import annotations

import numpy as np
import pytest

from learners.resources import Resources
from learners.sizing.base import Record, TaskFeatures
from learners.sizing.bucketing import Bucketing, greedy_buckets
from learners.sizing.ksegments import KSegments, fit
from learners.sizing.ponder import PonderPredictor
from learners.sizing.refit import SPAN, Refits
from learners.sizing.witt import Witt, witt_line


def fits(records: int) -> list[int]:
    """The record counts at which a model read after every record is fit."""
    refits, at = Refits(), []
    for n in range(1, records + 1):
        if refits.due(n):
            refits.fit(n)
            at.append(n)
    return at


def test_a_model_is_fit_at_every_record_then_as_they_grow_by_a_share():
    at = fits(10_000)
    assert at[:SPAN] == list(range(1, SPAN + 1))
    for before, after in zip(at[SPAN - 1 :], at[SPAN:], strict=False):
        assert after - before == max(1, before // SPAN)


def test_the_records_fit_over_stay_in_proportion_to_the_records():
    """What every fit reads, summed over a category's life, grows as its records do (about
    SPAN + 1 records read per record): the cost per task is flat, where a fit after every
    record reads n^2 / 2 of them."""
    for n in (1_000, 10_000, 100_000):
        assert sum(fits(n)) <= 1.1 * (SPAN + 1) * n


def test_a_model_read_again_without_new_records_is_not_fit_again():
    refits = Refits()
    assert refits.due(5)
    refits.fit(5)
    assert not refits.due(5)
    assert refits.due(6)


def _record(value: float, x: float = 0.0) -> Record:
    task = TaskFeatures("c", input_size=x)
    return Record(task, Resources(1.0, value, 0.0, 10.0))


def test_greedy_bucketing_keeps_its_buckets_until_its_records_grow_by_the_share():
    rng = np.random.default_rng(3)
    b = Bucketing("greedy", 1000.0, rng)
    for v in rng.normal(500, 50, 3 * SPAN):
        b.add(float(v))
    fitted = b.buckets
    assert fitted == greedy_buckets(b.state)  # fit on every record so far
    for v in rng.normal(900, 50, 3 - 1):
        b.add(float(v))
    assert b.buckets is fitted  # fewer new records than 1/SPAN of them
    b.add(900.0)
    assert b.buckets == greedy_buckets(b.state) != fitted


@pytest.mark.parametrize("kind", ["ksegments", "witt"])
def test_regressions_keep_their_line_until_their_records_grow_by_the_share(kind):
    learner = KSegments(1e6) if kind == "ksegments" else Witt(1e6)

    def model():
        return learner.model if isinstance(learner, KSegments) else learner.line

    def fresh():
        if isinstance(learner, KSegments):
            return fit(learner.x.values, learner.lengths.values, learner.peaks.values)
        return witt_line(learner.x.values, learner.y.values, learner.offset)

    for i in range(2 * SPAN):
        learner.observe(100.0 + i, _record(100.0 + i, float(i)))
    fitted = model()
    assert fitted == fresh()
    learner.observe(5000.0, _record(5000.0, 1.0))
    assert model() is fitted  # 1 record new of 2 * SPAN: less than 1/SPAN of them
    learner.observe(5000.0, _record(5000.0, 2.0))
    assert model() == fresh() != fitted


def test_ponder_keeps_its_line_and_residuals_until_its_records_grow_by_the_share():
    p = PonderPredictor()
    rng = np.random.default_rng(5)
    for x in rng.uniform(1, 8, 2 * SPAN):
        p.add(float(x) * 2**30, 300 + 200 * float(x) + float(rng.normal(0, 20)))
    before = p.predict(4 * 2**30)
    params = p.params
    p.add(4 * 2**30, 9000.0)
    assert p.params is params and p.predict(4 * 2**30) == before
    p.add(4 * 2**30, 9000.0)
    assert p.params is not params and p.predict(4 * 2**30) != before
