"""A category's first tasks start from what is known, not from a whole worker."""

from __future__ import annotations

from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer

WORKER = Resources(16, 64000, 64000)
SHARE = {"cores": 0.5, "memory": 2000.0, "disk": 4000.0}


def test_the_share_of_the_stage_sizes_the_first_wave():
    sizer = make_sizer("select", worker=WORKER)
    first = sizer.allocate(TaskFeatures("a", share=SHARE))
    assert first == Resources(0.5, 2000, 4000)


def test_a_request_comes_before_the_share_and_a_kill_doubles_the_start():
    sizer = make_sizer("budget", worker=WORKER)
    task = TaskFeatures("a", requested={"memory": 3000.0}, share=SHARE)
    assert sizer.allocate(task).memory == 3000
    sizer.observe_exhaustion(task, sizer.allocate(task), Exhaustion("memory", 3500))
    assert sizer.allocate(task).memory == 7000  # the next tasks of the category start above


def test_other_categories_inform_a_new_one():
    sizer = make_sizer("budget", worker=WORKER)
    sizer.observe(Record(TaskFeatures("a"), Resources(2, 5000, 300, 60)))
    assert sizer.allocate(TaskFeatures("b", share=SHARE)) == Resources(2, 5000, 300)
    assert sizer.allocate(TaskFeatures("a")) == Resources(2, 5000, 300)


def test_published_sizers_keep_their_authors_start():
    sizer = make_sizer("max-seen", worker=WORKER)
    assert sizer.allocate(TaskFeatures("a", share=SHARE)) == WORKER
