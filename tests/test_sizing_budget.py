"""The retry budget's quantile: careful with few records, and not led down by the newest."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from learners.replay import TraceTask, replay
from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer
from learners.sizing.base import Running
from learners.sizing.budget import UNTIMED_CORES, BudgetCategory


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


def test_records_equal_to_what_a_killed_attempt_reached_count_among_those_it_may_need():
    """Tasks that all reach the same value (bioblast's Split, 1,304 MB): a kill that reports
    exactly it is retried just above the records, not at twice it."""
    category = BudgetCategory(("memory",))
    for _ in range(20):
        category.observe(record(1304.0))
    task = TaskFeatures("a")
    assert category.retry(task, "memory", 1000.0, 1304.0) == pytest.approx(1304 * (1 + 1 / 20))
    assert category.retry(task, "memory", 1304.0, 1305.0) == 2610.0  # above every record


def test_cores_are_the_worker_share_memory_and_disk_take_or_the_use_of_nine_tasks_in_ten():
    worker = Resources(16, 64000, 64000)
    category = BudgetCategory(("cores", "memory", "disk"), worker=worker)
    for i in range(200):  # use 1 to 10 cores, 10% above 9; memory above half the worker
        category.observe(Record(TaskFeatures("a"), Resources(1 + i % 10, 33000.0, 100.0, 60.0)))
    first = category.first(TaskFeatures("a"))
    assert first["memory"] == 33000.0
    assert first["cores"] == 9.0  # the use only 10% of the tasks exceed; the share is 8.25
    alone = BudgetCategory(("cores", "memory"), worker=worker)
    for i in range(200):
        alone.observe(Record(TaskFeatures("a"), Resources(1 + i % 4, 48000.0, 100.0, 60.0)))
    assert alone.first(TaskFeatures("a"))["cores"] == 4.0  # memory takes 3/4 of the worker: 12
    assert alone.first(TaskFeatures("a"))["memory"] == 48000.0
    few = BudgetCategory(("cores", "memory"), worker=worker)
    few.observe(Record(TaskFeatures("a"), Resources(2, 60000.0, 100.0, 60.0)))
    assert few.first(TaskFeatures("a"))["cores"] == 2.0  # never above the use's quantile


def test_cores_slow_no_task_where_none_waits_for_the_cores_it_would_leave():
    worker = Resources(16, 64000, 64000)
    waiting = [5]
    category = BudgetCategory(("cores", "memory"), worker=worker, queued=lambda: waiting[0])
    for i in range(200):  # use 1 to 10 cores, 10% above 9; one task a worker
        category.observe(Record(TaskFeatures("a"), Resources(1 + i % 10, 33000.0, 100.0, 60.0)))
    assert category.first(TaskFeatures("a"))["cores"] == 9.0  # four others wait: slowed
    waiting[0] = 1  # the task sized is the last one waiting
    assert category.first(TaskFeatures("a"))["cores"] == 10.0  # the use's quantile
    waiting[0] = None  # an executor that does not tell
    assert category.first(TaskFeatures("a"))["cores"] == 9.0


def test_cores_below_the_use_let_one_more_task_fit_where_memory_and_disk_leave_room():
    """9 cores fit one task a worker of 16, 8 fit two: where memory lets two fit, 8, slowing
    the 20% of the tasks that use 9 or 10 (within twice the 10% the quantile slows)."""
    worker = Resources(16, 64000, 64000)
    category = BudgetCategory(("cores", "memory"), worker=worker, queued=lambda: 50)
    for i in range(200):  # use 1 to 10 cores, 10% above 9; memory half the worker
        category.observe(Record(TaskFeatures("a"), Resources(1 + i % 10, 32000.0, 100.0, 60.0)))
    assert category.first(TaskFeatures("a"))["cores"] == 8.0
    slower = BudgetCategory(("cores", "memory"), worker=worker, queued=lambda: 50)
    for i in range(200):  # use 2 to 11 cores: 30% above 8
        slower.observe(Record(TaskFeatures("a"), Resources(2 + i % 10, 32000.0, 100.0, 60.0)))
    assert slower.first(TaskFeatures("a"))["cores"] == 10.0  # the use of nine tasks in ten
    fat = BudgetCategory(("cores", "memory"), worker=worker, queued=lambda: 50)
    for i in range(200):  # memory above half the worker: one a worker whatever the cores
        fat.observe(Record(TaskFeatures("a"), Resources(1 + i % 10, 33000.0, 100.0, 60.0)))
    assert fat.first(TaskFeatures("a"))["cores"] == 9.0


def test_sizes_too_small_to_count_how_many_fit_leave_the_cores_as_they_are():
    """A peak of 5e-324 cores (or of memory) fits a worker an uncountable number of times:
    the packing rule has nothing to gain there (it raised OverflowError)."""
    worker = Resources(16, 64000, 64000)
    for peak in (Resources(5e-324, 1000.0, 100.0, 60.0), Resources(1.0, 5e-324, 5e-324, 60.0)):
        category = BudgetCategory(("cores", "memory", "disk"), worker=worker, queued=lambda: 50)
        for _ in range(3):
            category.observe(Record(TaskFeatures("a"), peak))
        cores = category.first(TaskFeatures("a"))["cores"]
        assert cores == pytest.approx(peak.cores)


def test_cores_no_waiting_task_can_take_go_to_the_task_up_to_its_request():
    """A category whose tasks alone run while more wait (nf-core eager's bwa: 36 hours of its
    longest task at 7.04 cores, given the 6.93 nine tasks in ten stay within, two a worker of
    16 either way): the cores below 16 / 2 fit no task waiting, and the task gets them up to
    its request; not where another category's tasks run too, nor without a request."""
    worker = Resources(16, 64000, 64000)
    busy = [4]
    category = BudgetCategory(
        ("cores", "memory"),
        worker=worker,
        queued=lambda: 6,
        concurrent=lambda: 4,
        busy=lambda: busy[0],
    )
    for i in range(100):  # use 6.0 to 6.99 cores, memory a quarter of the worker
        category.observe(Record(TaskFeatures("a"), Resources(6 + i / 100, 16000.0, 0.0, 60.0)))
    requested = TaskFeatures("a", requested={"cores": 8.0})
    assert category.first(TaskFeatures("a"))["cores"] == pytest.approx(6.89)
    assert category.first(requested)["cores"] == 8.0
    busy[0] = 5  # a task of another category runs too: it may take what this one leaves
    assert category.first(requested)["cores"] == pytest.approx(6.89)


def test_the_replay_tells_the_sizer_how_many_tasks_wait_for_room():
    seen: list[int | None] = []
    sizer = make_sizer("budget", worker=Resources(2, 8000, 8000))
    allocate = sizer.allocate

    def spy(task, previous=None, exhaustion=None):
        seen.append(sizer.running.queued)
        return allocate(task, previous, exhaustion)

    sizer.allocate = spy
    tasks = [TraceTask("a", Resources(1, 500, 10, 60), requested={"cores": 1}) for _ in range(6)]
    replay(tasks, sizer, workers=1, worker=Resources(2, 8000, 8000))
    assert seen[0] == 6 and seen[-1] == 1
    assert seen == sorted(seen, reverse=True)


def phase(category: BudgetCategory, memory: float, disk: float, count: int = 100) -> None:
    """``count`` successes around ``memory`` and ``disk`` (MB), spread by 1% steps."""
    for i in range(count):
        spread = 1.0 + (i % 20) / 100
        category.observe(
            Record(TaskFeatures("a"), Resources(1.0, memory * spread, disk * spread, 150.0))
        )


def test_a_kill_outside_what_the_category_showed_grows_the_retry_s_other_resources_alike():
    """A workflow whose tasks change size in phases: memory is killed within seconds, disk
    late, so a retry that kept its disk would be killed again."""
    worker = Resources(16, 64000, 64000)
    sizer = make_sizer("budget", worker=worker)
    task = TaskFeatures("a")
    for i in range(100):  # memory and disk 4,000 to 4,990 MB
        sizer.observe(Record(task, Resources(1, 4000.0 + 10 * i, 4000.0 + 10 * i, 150.0)))
    first = sizer.allocate(task)
    tail = Exhaustion("memory", first.memory + 10)  # within what the category showed
    sizer.observe_exhaustion(task, first, tail)
    assert sizer.allocate(task, first, tail).disk == first.disk
    shifted = Exhaustion("memory", 12000.0)  # beyond 4,990 + (4,990 - 4,490)
    sizer.observe_exhaustion(task, first, shifted)
    retry = sizer.allocate(task, first, shifted)
    assert retry.memory >= 24000.0
    assert retry.disk == pytest.approx(retry.memory)  # the same multiple of the same level


def test_a_shift_sizes_first_attempts_at_the_multiple_of_their_level_it_showed():
    category = BudgetCategory(("cores", "memory", "disk"))
    phase(category, 4000.0, 4000.0)
    before = category.first(TaskFeatures("a"))
    assert not category.outside("memory", 5000.0)  # a tail event
    category.exhausted(TaskFeatures("a"), "memory", before["memory"], 12000.0)
    assert category.shift is not None
    after = category.first(TaskFeatures("a"))
    scale = 12000.0 / category.shift.base["memory"]
    assert after["disk"] >= category.shift.base["disk"] * scale  # memory tells disk
    assert after["memory"] >= 12000.0


def test_a_shift_s_records_replace_the_older_ones_once_they_show_the_new_level():
    category = BudgetCategory(("cores", "memory", "disk"))
    phase(category, 4000.0, 4000.0)
    category.exhausted(TaskFeatures("a"), "memory", 4800.0, 12000.0)
    phase(category, 4000.0, 4000.0, count=60)  # tasks started before the shift end after it
    for _ in range(20):
        category.exhausted(TaskFeatures("a"), "memory", 4800.0, 11000.0)
    assert category.shift is not None  # still killed: the new level has not shown
    phase(category, 12000.0, 12000.0, count=60)
    assert category.shift is None
    assert category.first(TaskFeatures("a"))["disk"] >= 12000.0
    assert category.peaks["disk"].n < 200  # the records before the shift are gone


def test_a_storm_that_shows_no_new_level_ends_once_kills_are_back_within_budget():
    category = BudgetCategory(("cores", "memory", "disk"))
    phase(category, 4000.0, 4000.0)
    category.exhausted(TaskFeatures("a"), "memory", 4800.0, 12000.0)
    phase(category, 4000.0, 4000.0, count=100)
    assert category.shift is None
    assert category.peaks["memory"].n > 200  # nothing replaced


def test_kills_beyond_the_budget_of_the_records_raise_the_quantile_s_level():
    """The budget is a limit over the category's run, not only over its recent attempts."""
    calm, killed = BudgetCategory(("memory",)), BudgetCategory(("memory",))
    values = [float(v) for v in range(1000, 3000, 10)]  # 1,000 to 2,990 MB
    for category in (calm, killed):
        for value in values:
            category.observe(record(value))
    for _ in range(30):
        killed.exhausted(TaskFeatures("a"), "memory", 900.0, 1000.0)
    for category in (calm, killed):  # the moving kill share is long back within budget
        for value in values:
            category.observe(record(value))
    assert killed.killed < killed.budget < killed.kills / killed.records
    assert killed.first(TaskFeatures("a"))["memory"] > calm.first(TaskFeatures("a"))["memory"]


def test_memory_follows_a_rise_in_disk_only_as_the_successes_since_show():
    """A memory kill comes within seconds and tells at little cost; a simulation whose few
    large outputs come late grows its disk alone (the Lobster CMS trace)."""
    category = BudgetCategory(("cores", "memory", "disk"))
    phase(category, 4000.0, 4000.0)
    category.exhausted(TaskFeatures("a"), "disk", 4800.0, 12000.0)
    assert category.alongside("disk", 12000.0, 24000.0) == {}  # memory keeps what it had
    for _ in range(3):  # tasks beyond the disk fence whose memory rose too
        category.observe(Record(TaskFeatures("a"), Resources(1.0, 12000.0, 13000.0, 150.0)))
    grown = category.alongside("disk", 12000.0, 24000.0)
    assert grown["memory"] == pytest.approx(24000.0)  # memory and disk had the same level
    alone = BudgetCategory(("cores", "memory", "disk"))
    phase(alone, 4000.0, 4000.0)
    alone.exhausted(TaskFeatures("a"), "memory", 4800.0, 12000.0)
    for _ in range(3):  # beyond the memory fence, disk as before: disk moves alone
        alone.observe(Record(TaskFeatures("a"), Resources(1.0, 13000.0, 4000.0, 150.0)))
    assert alone.alongside("memory", 12000.0, 24000.0) == {}


def test_attempts_outlasting_every_record_count_as_records_above_them():
    """Tasks that all start at once end shortest first: while many still run, the records
    are the quickest tasks', and the running ones (censored) lie above them."""
    running = Running()
    category = BudgetCategory(("memory",), outlasting=partial(running.outlasting, "a"))
    for i in reversed(range(100)):
        category.observe(record(1000.0 + i))  # each ran 60 s
    alone = category.first(TaskFeatures("a"))["memory"]
    assert alone == 1000.0 + 94
    for _ in range(3):
        running.start("a", 0.0)
    running.now = 30.0  # not yet longer than any record
    assert category.first(TaskFeatures("a"))["memory"] == alone
    running.now = 61.0  # 3 of 103: the quantile lies among the records
    assert category.first(TaskFeatures("a"))["memory"] == alone
    for _ in range(3):
        running.start("a", 0.0)
    asking = TaskFeatures("a", requested={"memory": 4000.0})
    assert category.first(asking)["memory"] == 4000.0  # the quantile lies among the running
    assert category.first(TaskFeatures("a"))["memory"] == pytest.approx(1099 * (1 + 1 / 100))
    running.end("a", 0.0)
    assert running.outlasting("a", 60.0) == 5


def test_the_moving_kill_share_spans_the_attempts_running_at_once():
    """Two kills close together among 300 running attempts are within budget; among the
    20 of :data:`RECENT`, they are not."""
    few, many = BudgetCategory(("memory",)), BudgetCategory(("memory",), concurrent=lambda: 300)
    values = [float(v) for v in range(1000, 3000, 10)]
    for category in (few, many):
        for value in values:
            category.observe(record(value))
        for _ in range(2):
            category.exhausted(TaskFeatures("a"), "memory", 2900.0, 3000.0)
    assert many.killed < many.budget < few.killed
    assert many.first(TaskFeatures("a"))["memory"] < few.first(TaskFeatures("a"))["memory"]


def test_records_that_ran_no_time_size_cores_only_until_one_that_ran_comes():
    """A task that ran 0 s measured no use of its cores (CPU time over no wall time): it
    counts one core at most, what Slurm gives a task unasked."""
    category = BudgetCategory(("cores", "memory"))
    untimed = Record(TaskFeatures("a"), Resources(2.0, 300.0, 100.0, 0.0))
    category.observe(untimed)
    assert category.first(TaskFeatures("a"))["cores"] == UNTIMED_CORES == 1.0
    category.observe(record(300.0, cores=1.5))
    category.observe(untimed)
    assert category.first(TaskFeatures("a"))["cores"] == 1.5
    assert category.peaks["memory"].n == 3  # its memory is a measure all the same
