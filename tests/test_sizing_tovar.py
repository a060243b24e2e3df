"""Tovar et al.'s first allocations and cctools' category life cycle (GOLDEN.md)."""

from __future__ import annotations

import pytest

from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer
from learners.sizing.tovar import Histogram, TovarCategory, max_seen, max_throughput, min_waste

VALUES = [512, 530, 480, 2100, 505, 2300, 495, 520, 2050, 610]
VALUES += [500, 2200, 515, 4000, 498, 525, 2150, 505, 490, 2400]
WALLS = [100, 110, 90, 400, 100, 450, 95, 105, 380, 120]
WALLS += [100, 420, 100, 900, 98, 102, 410, 101, 97, 460]
WORKER = Resources(16, 64000, 64000)


def histogram(size: float) -> Histogram:
    h = Histogram(size)
    for v, w in zip(VALUES, WALLS, strict=True):
        h.insert(v, w)
    return h


def test_histogram_keys_at_250():
    assert histogram(250).counts == {500: 5, 750: 8, 2250: 4, 2500: 2, 4000: 1}


def test_max_mode_adds_a_third_of_a_bucket():
    assert max_seen(histogram(250), 4000, 64000, -1) == 4250


@pytest.mark.parametrize(
    ("size", "a_m", "waste", "throughput"),
    [(250, 4000, 2500, 750), (250, 16000, 4000, 750), (1, 4000, 2400, 530), (1, 16000, 4000, 530)],
)
def test_first_allocation(size, a_m, waste, throughput):
    h = histogram(size)
    assert min_waste(h, a_m) == waste
    assert max_throughput(h, a_m) == throughput


def feed(category: TovarCategory, values, wall=100.0):
    task = TaskFeatures("c")
    for v in values:
        category.observe(Record(task, Resources(1, v, 10, wall)))


def test_whole_worker_until_steady_then_first_allocation():
    c = TovarCategory("min-waste", ("memory",), WORKER, every=25)
    feed(c, [1000.0] * 25)
    assert c.first(TaskFeatures("c")) == {"memory": 64000}  # cctools: steady from the next record
    feed(c, [1000.0])
    assert c.steady and c.first(TaskFeatures("c")) == {"memory": 1000}


def test_new_maximum_before_steady_restarts_the_count():
    c = TovarCategory("min-waste", ("memory",), WORKER, every=25)
    feed(c, [1000.0] * 20 + [3000.0])
    assert c.completions == 1
    feed(c, [1000.0] * 25)
    assert c.steady and c.first(TaskFeatures("c"))["memory"] == 1000


def test_retry_goes_to_the_largest_value_seen_or_doubles():
    for name, expected in (("min-waste", 3000), ("min-waste-doubling", 2000), ("max-seen", 64000)):
        sizer = make_sizer(name, worker=WORKER, resources=("memory",), every=5)
        task = TaskFeatures("c")
        for v in [1000.0] * 5 + [1000.0, 3000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0]:
            sizer.observe(Record(task, Resources(1, v, 10, 100)))
        first = sizer.allocate(task)
        assert first.memory == (3250 if name == "max-seen" else 1000)
        retry = sizer.allocate(task, first.with_("memory", 1000), Exhaustion("memory", 1000))
        assert retry.memory == expected, name


def test_explicit_maximum_is_a_m_and_the_whole_worker():
    c = TovarCategory("min-waste", ("memory",), WORKER, maximum={"memory": 16000}, every=20)
    assert c.first(TaskFeatures("c")) == {"memory": 16000}
    task = TaskFeatures("c")
    for v, w in zip([*VALUES, 700], [*WALLS, 100], strict=True):
        c.observe(Record(task, Resources(1, v, 10, w)))
    assert c.first(task) == {"memory": 4000}  # GOLDEN: size 250, a_m = 16000


def test_zero_wall_times_divide_as_c_does():
    h = Histogram(250)
    for v in (300, 600, 900):
        h.insert(v, 0.0)
    assert max_throughput(h, 900) == 500  # every rate is inf: the first key wins
    assert min_waste(h, 900) == 500  # every cost is 0: the first key wins
