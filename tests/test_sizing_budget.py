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


def test_a_retry_below_many_records_gets_their_largest_grown_by_one_over_their_count():
    category = BudgetCategory(("memory",))
    for value in range(1000, 2001, 10):  # 101 records, 1000 to 2000 MB
        category.observe(record(float(value)))
    task = TaskFeatures("a")
    above = 4  # 1970, 1980, 1990, 2000 lie above the 1965 MB it reached
    assert category.retry(task, "memory", 1960.0, 1965.0) == pytest.approx(2000 * (1 + 1 / above))
    assert category.retry(task, "memory", 2000.0, 2010.0) == 4020.0  # above every record


def test_cores_are_the_worker_share_memory_and_disk_take_or_the_use_of_nine_tasks_in_ten():
    worker = Resources(16, 64000, 64000)
    category = BudgetCategory(("cores", "memory", "disk"), worker=worker)
    for i in range(200):  # use 1 to 10 cores, 10% above 9; memory half the worker
        category.observe(Record(TaskFeatures("a"), Resources(1 + i % 10, 32000.0, 100.0, 60.0)))
    first = category.first(TaskFeatures("a"))
    assert first["memory"] == 32000.0
    assert first["cores"] == 9.0  # the use only 10% of the tasks exceed; half the worker is 8
    alone = BudgetCategory(("cores", "memory"), worker=worker)
    for i in range(200):
        alone.observe(Record(TaskFeatures("a"), Resources(1 + i % 4, 48000.0, 100.0, 60.0)))
    assert alone.first(TaskFeatures("a"))["cores"] == 4.0  # memory takes 3/4 of the worker: 12
    assert alone.first(TaskFeatures("a"))["memory"] == 48000.0
    few = BudgetCategory(("cores", "memory"), worker=worker)
    few.observe(Record(TaskFeatures("a"), Resources(2, 60000.0, 100.0, 60.0)))
    assert few.first(TaskFeatures("a"))["cores"] == 2.0  # never above the use's quantile
