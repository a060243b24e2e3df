"""The retry budget's quantile: careful with few records, and not led down by the newest."""

from __future__ import annotations

import numpy as np
import pytest

from learners.resources import Resources
from learners.sizing import Record, TaskFeatures
from learners.sizing.budget import BudgetCategory


def record(memory: float, cores: float = 1.0) -> Record:
    return Record(TaskFeatures("a"), Resources(cores, memory, 100.0, 60.0))


def test_a_draw_exceeds_the_quantile_about_as_often_as_the_level_says():
    rng = np.random.default_rng(1)
    category = BudgetCategory(("cores", "memory"))
    for value in rng.lognormal(8, 0.5, 2000):
        category.observe(record(float(value)))
    allocation = category.first(TaskFeatures("a"))["memory"]
    exceeded = np.mean(rng.lognormal(8, 0.5, 100_000) > allocation)
    assert exceeded <= 1 - category.level + 0.01


def test_few_records_give_their_largest_grown_by_one_over_n():
    category = BudgetCategory(("cores", "memory"))
    for value in (3.07, 3.13, 3.18):  # a tiny task's peaks jitter
        category.observe(record(value, cores=0.01))
    first = category.first(TaskFeatures("a"))
    assert first["memory"] == pytest.approx(3.18 * (1 + 1 / 3))
    assert first["cores"] == pytest.approx(0.01)  # fewer cores only slow a task down


def test_newest_small_records_do_not_lower_the_quantile_of_every_record():
    """The first records of a category come from its quickest tasks, often its smallest."""
    category = BudgetCategory(("memory",))
    for _ in range(20):
        category.observe(record(800.0))
    for _ in range(280):
        category.observe(record(30.0))
    assert category.first(TaskFeatures("a"))["memory"] == 800.0


def test_a_retry_gets_the_largest_seen_or_twice_what_the_killed_attempt_reached():
    category = BudgetCategory(("memory",))
    category.observe(record(1000.0))
    task = TaskFeatures("a")
    assert category.retry(task, "memory", 300.0, 310.0) == 1000.0
    assert category.retry(task, "memory", 900.0, 910.0) == 1820.0  # not just above the largest
