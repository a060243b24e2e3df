"""The replay on tiny hand-made traces whose AWE, retries and makespan are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from learners.metrics import Usage
from learners.replay import MemorySeries, TraceTask, replay
from learners.resources import Resources
from learners.sizing import make_sizer
from learners.sizing.composite import PROBES

SMALL = Resources(4, 1000, 1000)


def test_usage_splits_waste():
    u = Usage()
    u.success(consumed=30, allocated=40)
    u.failure(allocated=30)
    assert (u.awe, u.fragmentation, u.failed) == (30 / 70, 10, 30)


def test_whole_workers_never_fail():
    tasks = [
        TraceTask("a", Resources(1, 250, 100, 10)),
        TraceTask("a", Resources(2, 500, 200, 20)),
        TraceTask("a", Resources(4, 1000, 1000, 30)),
    ]
    out = replay(tasks, make_sizer("whole", worker=SMALL), workers=2, worker=SMALL)
    assert out.usage["cores"].awe == pytest.approx((1 * 10 + 2 * 20 + 4 * 30) / (4 * 60))
    assert out.usage["memory"].awe == pytest.approx((250 * 10 + 500 * 20 + 1000 * 30) / (1000 * 60))
    assert (out.retries, out.completed, out.makespan) == (0, 3, 40)  # task 2 starts at 10
    assert out.tasks_per_worker_hour == pytest.approx(3 / (2 * 40 / 3600))


def user(requested: float, peak: float = 250.0, wall: float = 10.0, **kw) -> TraceTask:
    return TraceTask("a", Resources(1, peak, 1, wall), requested={"memory": requested}, **kw)


def test_slow_peaks_fail_at_the_end():
    sizer = make_sizer("user", worker=SMALL, resources=("memory",))
    out = replay([user(200)], sizer, workers=1, worker=SMALL, resources=("memory",))
    memory = out.usage["memory"]
    assert memory.awe == pytest.approx(250 * 10 / (200 * 10 + 400 * 10))
    assert (memory.failed, memory.fragmentation) == (2000, 1500)
    assert (out.retries, out.retries_pct, out.makespan) == (1, 100.0, 20)
    assert out.rows()[0]["waste_failed"] == 2000


def test_fast_peaks_fail_at_once():
    sizer = make_sizer("user", worker=SMALL, resources=("memory",))
    out = replay([user(200)], sizer, workers=1, worker=SMALL, resources=("memory",), peaks="fast")
    assert out.usage["memory"].awe == pytest.approx(250 / 400)
    assert (out.retries, out.makespan) == (1, 10)


def test_a_task_larger_than_a_worker_is_dropped():
    tasks = [TraceTask("a", Resources(1, 2000, 1, 10)), TraceTask("a", Resources(1, 500, 1, 10))]
    out = replay(tasks, make_sizer("whole", worker=SMALL), workers=1, worker=SMALL)
    assert (out.unfit, out.retries, out.completed) == (1, 1, 1)
    assert out.usage["memory"].failed == 1000 * 10


STAIRS = MemorySeries(np.arange(8.0), np.array([100, 100, 200, 200, 300, 300, 400, 400.0]))
STAIRS_AREA = 1750.0  # trapezoid of the stairs over 0..7 s


def test_a_series_fails_at_its_first_sample_above():
    spike = MemorySeries(np.arange(4.0), np.array([100, 300, 200, 100.0]))
    sizer = make_sizer("user", worker=SMALL, resources=("memory",))
    out = replay([user(250, series=spike)], sizer, workers=1, worker=SMALL, resources=("memory",))
    memory = out.usage["memory"]
    assert memory.failed == 250  # 250 MB over the first second
    assert memory.consumed == 600 and memory.allocated_ok == 500 * 3
    assert out.makespan == 1 + 3


def test_ksegments_allocates_steps_and_retries_selectively():
    stairs = [user(500, peak=400, series=STAIRS, input_size=1.0) for _ in range(5)]
    spike = MemorySeries(STAIRS.times, np.array([100, 100, 250, 200, 300, 300, 400, 400.0]))
    tasks = [*stairs, user(500, peak=400, series=spike, input_size=1.0)]
    one_at_a_time = Resources(4, 600, 1000)
    sizer = make_sizer("ksegments", worker=one_at_a_time, resources=("memory",))
    out = replay(tasks, sizer, workers=1, worker=one_at_a_time, resources=("memory",))
    memory = out.usage["memory"]
    # two tasks on their 500 MB request, three on steps equal to their usage
    assert memory.consumed == 5 * STAIRS_AREA + 1800
    assert memory.failed == 100 + 150  # steps 100, 100, 200 up to the 250 MB sample
    assert memory.allocated_ok == 2 * 500 * 7 + 3 * STAIRS_AREA + 2150  # run (2, 3) doubled
    assert out.retries == 1


def test_replay_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        replay([], make_sizer("whole", worker=SMALL), workers=0, worker=SMALL)


def test_tasks_arrive_at_their_submit_times_and_workers_as_they_join():
    tasks = [
        TraceTask("a", Resources(1, 100, 1, 10), submit=0.0),
        TraceTask("a", Resources(1, 100, 1, 10), submit=50.0),
    ]
    out = replay(tasks, make_sizer("whole", worker=SMALL), workers=1, worker=SMALL)
    assert out.makespan == 60  # the second task waits for its submission, not for a worker
    joined = replay(
        tasks, make_sizer("whole", worker=SMALL), workers=2, worker=SMALL, arrivals=[20, 30]
    )
    assert joined.makespan == 60  # first at 20 (its worker came), second at 50
    assert joined.worker_seconds == (60 - 20) + (60 - 30)
    assert joined.tasks_per_worker_hour == pytest.approx(2 / (70 / 3600))


def test_the_replay_reports_each_task_as_it_is_submitted():
    """What a selector shares the workflow's retry room over: the tasks submitted so far."""
    tasks = [TraceTask(c, Resources(1, 100, 1, 10), submit=t) for c, t in (("a", 0), ("b", 50))]
    sizer = make_sizer("select", worker=SMALL)
    seen = []
    allocate = sizer.allocate

    def asking(task, previous=None, exhaustion=None):
        seen.append((task.category, sizer.running.submitted("a"), sizer.running.submitted()))
        return allocate(task, previous, exhaustion)

    sizer.allocate = asking
    replay(tasks, sizer, workers=1, worker=SMALL)
    assert seen == [("a", 1, 1), ("b", 1, 2)]


def test_fewer_cores_than_a_task_uses_slow_it_down():
    task = TraceTask("a", Resources(4, 100, 1, 10), cpu=2.0)
    sizer = make_sizer("user", worker=SMALL)
    one = TraceTask(task.category, task.peak, requested={"cores": 1}, cpu=2.0)
    out = replay([one], sizer, workers=1, worker=SMALL)
    assert (out.retries, out.makespan) == (0, 20)  # 2 cores of use on 1: twice as long
    assert out.usage["cores"].awe == pytest.approx(1.0)  # never more than allocated
    whole = replay([task], make_sizer("whole", worker=SMALL), workers=1, worker=SMALL)
    assert whole.makespan == 10 and whole.usage["cores"].awe == pytest.approx(1.0)


def test_calibrated_peaks_kill_memory_early():
    tasks = [user(100, peak=1000, wall=100) for _ in range(200)]
    big = Resources(4, 100000, 1000)

    def run(peaks: str, seed: int = 3):
        sizer = make_sizer("user", worker=big, resources=("memory",))
        return replay(
            tasks, sizer, workers=200, worker=big, resources=("memory",), peaks=peaks, seed=seed
        )

    calibrated, slow = run("calibrated"), run("slow")
    assert calibrated.retries == slow.retries == 4 * 200  # 100, 200, 400, 800 MB killed
    # killed at a few % of the run (the paper's logs) instead of at its end
    assert calibrated.usage["memory"].failed < 0.15 * slow.usage["memory"].failed
    assert calibrated.makespan < 0.5 * slow.makespan
    assert run("calibrated").usage["memory"].failed == calibrated.usage["memory"].failed


class Unwatched:
    """A sizer the replay cannot tell which attempts run."""

    def __init__(self, sizer) -> None:
        self.name = sizer.name
        self.allocate = sizer.allocate
        self.ready = sizer.ready
        self.observe = sizer.observe
        self.observe_exhaustion = sizer.observe_exhaustion


def test_the_replay_reports_running_attempts_so_a_wave_is_not_sized_by_its_quickest():
    """40 tasks submitted at once, 20 workers: the first 5 records come from short small
    tasks while 15 long large ones still run, so the next 5 tasks get their request."""
    short = [user(4000.0, peak=100.0, wall=10.0) for _ in range(5)]
    tasks = short + [user(4000.0, peak=3000.0, wall=1000.0) for _ in range(35)]
    worker = Resources(16, 64000, 64000)
    watched = replay(tasks, make_sizer("budget", worker=worker), workers=20, worker=worker)
    blind = replay(tasks, Unwatched(make_sizer("budget", worker=worker)), workers=20, worker=worker)
    assert watched.retries == 0
    assert blind.retries >= 5


def test_a_category_nothing_tells_the_size_of_starts_slowly_not_on_whole_workers():
    """40 tasks of 100 MB submitted at once, nothing declared or requested: PROBES run on
    whole workers, the others wait for records and start sized from them, side by side,
    while a task of another category behind them starts at once."""
    worker = Resources(16, 64000, 64000)
    tasks = [TraceTask("a", Resources(1, 100, 100, 10 + i % 3)) for i in range(40)]
    tasks.append(TraceTask("b", Resources(1, 100, 100, 5), requested={"memory": 200.0}))
    starts: list[tuple[str, Resources]] = []
    sizer = make_sizer("select", worker=worker)
    allocate = sizer.allocate

    def logged(task, previous=None, exhaustion=None):
        alloc = allocate(task, previous, exhaustion)
        starts.append((task.category, alloc))
        return alloc

    sizer.allocate = logged
    out = replay(tasks, sizer, workers=20, worker=worker)
    whole = [c for c, a in starts if a.memory == worker.memory]
    assert whole == ["a"] * PROBES
    assert starts[PROBES][0] == "b"  # not behind the held tasks of "a"
    assert out.completed == 41 and out.retries == 0
