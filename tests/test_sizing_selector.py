"""The online selector allocates, per category, with the candidate whose shadow score is best."""

from __future__ import annotations

import pytest

from learners.resources import Resources
from learners.sizing import Record, TaskFeatures, make_sizer
from learners.sizing.selector import WARMUP, Selector

WORKER = Resources(16, 64000, 64000)


def selector() -> Selector:
    names = ("whole", "budget", "user")
    return Selector("test", [make_sizer(n, worker=WORKER) for n in names])


def record(category: str, memory: float, requested: float = 0.0) -> Record:
    task = TaskFeatures(category, requested={"memory": requested} if requested else {})
    return Record(task, Resources(1, memory, 100, 60))


def test_steady_tasks_choose_the_tight_quantile():
    s = selector()
    for _ in range(WARMUP + 20):
        s.observe(record("steady", 2000))
    scores = [shadow.score for shadow in s.shadows["steady"]]
    assert s.chosen("steady") is s.candidates[1]
    assert scores[1] == max(scores) and scores[1] > 5 * scores[0]


def test_growing_tasks_shun_the_candidate_they_keep_killing():
    s = selector()
    for i in range(WARMUP + 20):  # every task needs more than any before: budget's quantile fails
        s.observe(record("growing", 1000 + 500 * i, requested=60000))
    scores = [shadow.score for shadow in s.shadows["growing"]]
    assert s.shadows["growing"][1].kills == WARMUP + 19
    assert s.chosen("growing") is s.candidates[2]  # the request: above every peak, never killed
    assert scores[2] == max(scores)


def test_categories_choose_apart_and_the_first_candidate_warms_up():
    s = selector()
    for _ in range(WARMUP + 5):
        s.observe(record("steady", 2000))
    s.observe(record("new", 2000))
    assert s.chosen("new") is s.candidates[0]
    assert s.allocate(TaskFeatures("new")).memory == WORKER.memory
    assert s.allocate(TaskFeatures("steady")).memory == pytest.approx(2000)


def test_the_default_is_the_selector():
    sizer = make_sizer("select", worker=WORKER)
    assert isinstance(sizer, Selector)
    assert [c.name for c in sizer.candidates] == ["budget", "ksegments+budget", "ponder+budget"]
