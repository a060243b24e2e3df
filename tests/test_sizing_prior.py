"""A category's first tasks start from what is known, not from a whole worker."""

from __future__ import annotations

from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer
from learners.sizing.composite import PRIOR_FLOOR, PROBES, RAMPED

WORKER = Resources(16, 64000, 64000)
SHARE = {"cores": 0.5, "memory": 2000.0, "disk": 4000.0}


def test_the_share_of_the_stage_sizes_the_first_wave_with_at_least_a_core():
    sizer = make_sizer("select", worker=WORKER)
    first = sizer.allocate(TaskFeatures("a", share=SHARE))
    assert first == Resources(1, 2000, 4000)  # half a core of share: one core, as Slurm gives


def test_tiny_peaks_of_another_category_do_not_size_a_new_one():
    """A user's stage of ``wc | sleep`` tasks got another category's 3.23 MB and 0.01 cores:
    a new category gets at least its share of the stage, and the floor where the share
    allows it (a stage that gives its tasks less than the floor was sized so)."""
    sizer = make_sizer("select", worker=WORKER)
    sizer.observe(Record(TaskFeatures("wc"), Resources(0.004, 3.23, 0.1, 2)))
    small = {"cores": 0.2, "memory": 400.0, "disk": 8000.0}  # less memory than the floor
    first = sizer.allocate(TaskFeatures("sleep", share=small))
    assert first == Resources(1, 400, 8000)
    alone = sizer.allocate(TaskFeatures("other"))  # no share: the floor
    assert alone == Resources(1, PRIOR_FLOOR["memory"], PRIOR_FLOOR["disk"])


def test_a_request_below_the_floor_is_kept():
    sizer = make_sizer("budget", worker=WORKER)
    task = TaskFeatures("a", requested={"cores": 0.5, "memory": 100.0}, share=SHARE)
    assert sizer.allocate(task) == Resources(0.5, 100, 4000)


def test_a_request_comes_before_the_share_and_a_kill_doubles_the_start():
    sizer = make_sizer("budget", worker=WORKER)
    task = TaskFeatures("a", requested={"memory": 3000.0}, share=SHARE)
    assert sizer.allocate(task).memory == 3000
    sizer.observe_exhaustion(task, sizer.allocate(task), Exhaustion("memory", 3500))
    assert sizer.allocate(task).memory == 7000  # the next tasks of the category start above


def test_other_categories_inform_a_new_one():
    """The larger of the other categories' largest peaks and the share, per resource."""
    sizer = make_sizer("budget", worker=WORKER)
    sizer.observe(Record(TaskFeatures("a"), Resources(2, 5000, 300, 60)))
    assert sizer.allocate(TaskFeatures("b", share=SHARE)) == Resources(2, 5000, 4000)
    assert sizer.allocate(TaskFeatures("a")) == Resources(2, 10000, 600)  # one record, doubled


def test_published_sizers_keep_their_authors_start():
    sizer = make_sizer("max-seen", worker=WORKER)
    assert sizer.allocate(TaskFeatures("a", share=SHARE)) == WORKER


def test_a_category_nothing_tells_the_size_of_runs_probes_then_more_per_record():
    sizer = make_sizer("select", worker=WORKER)
    task = TaskFeatures("a")
    for _ in range(PROBES):
        assert sizer.ready(task)
        assert sizer.allocate(task) == WORKER  # nothing known: a whole worker
        sizer.running.start("a", 0.0)
    assert not sizer.ready(task)
    assert sizer.ready(TaskFeatures("a", requested={"memory": 500}))
    assert sizer.ready(TaskFeatures("a", share=SHARE))
    sizer.observe(Record(task, Resources(1, 100, 100, 10)))
    for _ in range(PROBES):
        assert sizer.ready(task)
        sizer.running.start("a", 10.0)
    assert not sizer.ready(task)
    for _ in range(RAMPED - 1):
        sizer.observe(Record(task, Resources(1, 100, 100, 10)))
    assert sizer.ready(task)  # enough records: its tasks start freely
    assert make_sizer("max-seen", worker=WORKER, running=sizer.running).ready(task)
