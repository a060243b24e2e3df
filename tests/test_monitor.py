"""The monitor: peaks from samples, enforcement of real processes, the cgroup backstop."""

import asyncio
import json
import math
import os
import shlex
import sys

import psutil
import pytest

from learners.resources import Resources
from learners.sizing.base import Exhaustion
from orchestrator.agent.attempt import AttemptSpec, Outcome
from orchestrator.agent.footprint import directory_size
from orchestrator.agent.monitor import (
    CpuTimes,
    MemoryCgroups,
    Monitor,
    MonitorConfig,
    Sample,
    Usage,
    broken_limit,
    high_water_rss,
)
from orchestrator.agent.taskrun import Runner, RunnerConfig

PY = sys.executable
FAST = MonitorConfig(interval_s=0.2, first_sample_s=0.02, window_s=0.5)


# --- the pure core ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sample, expected",
    [
        (Sample(1.0, 99.0, 0.5, 9.0), None),
        (Sample(1.0, 101.0, 0.5, 9.0), Exhaustion("memory", 101.0)),
        (Sample(1.0, 50.0, 0.5, 10.5), Exhaustion("disk", 10.5)),
        (Sample(30.5, 50.0, 0.5, 1.0), Exhaustion("wall", 30.5)),
        (Sample(1.0, 50.0, 99.0, 1.0), None),  # cores are pinned, not enforced
    ],
)
def test_broken_limit(sample, expected):
    assert broken_limit(Resources(1, 100, 10, 30), sample) == expected


def test_unsized_memory_and_disk_are_not_enforced():
    assert broken_limit(Resources(cores=1), Sample(1.0, 5000.0, 1.0, 5000.0)) is None


def test_peaks_series_and_average_cores():
    usage = Usage(Resources(1, 1000, 1000), MonitorConfig(interval_s=1.0, window_s=100))
    for t, memory in [(0.1, 10), (0.4, 50), (1.2, 30), (1.9, 40), (2.5, 20)]:
        assert usage.add(Sample(t, memory, cpu=t / 2, disk=memory / 10)) is None
    assert usage.series == ((50, 40, 20), 1.0)  # the peak within each second
    peak = usage.finish(wall=3.0, cpu=1.5, max_rss=45.0, disk=1.0)
    assert peak == Resources(cores=0.5, memory=50, disk=5.0, wall=3.0)


def test_exact_peak_from_rusage_shows_in_the_series():
    usage = Usage(Resources(1, 1000, 1000), MonitorConfig())
    usage.add(Sample(0.5, 10.0, 0.1, 0.0))
    peak = usage.finish(wall=0.9, cpu=0.5, max_rss=80.0, disk=0.0)
    assert peak.memory == 80.0
    assert usage.series == ((80.0,), 1.0)


def test_a_task_never_sampled_has_its_peak_as_series():
    usage = Usage(Resources(1, 1000, 1000), MonitorConfig())
    usage.finish(wall=0.01, cpu=0.005, max_rss=3.0, disk=0.0)
    assert usage.series == ((3.0,), 1.0)


def test_window_cores_catch_a_burst_the_average_hides():
    usage = Usage(Resources(4, 1000, 1000), MonitorConfig(interval_s=1.0, window_s=2.0))
    cpu = 0.0
    for t in range(1, 21):
        cpu += 3.0 if 10 < t <= 12 else 0.1  # 3 cores busy for two seconds
        usage.add(Sample(float(t), 1.0, cpu, 0.0))
    peak = usage.finish(wall=20.0, cpu=cpu, max_rss=1.0, disk=0.0)
    assert peak.cores == pytest.approx(3.0)
    assert cpu / 20 < 0.5


def test_short_spans_do_not_inflate_cores():
    usage = Usage(Resources(1, 100, 100), MonitorConfig(window_s=5.0))
    usage.add(Sample(0.0625, 1.0, 0.08, 0.0))  # clock ticks round up over 62 ms
    assert usage.finish(wall=1.0, cpu=0.9, max_rss=1.0, disk=0.0).cores == pytest.approx(0.9)


def test_long_series_are_halved():
    usage = Usage(Resources(1, 1000, 1000), MonitorConfig(interval_s=1.0, max_series=4))
    for t in range(10):
        usage.add(Sample(t + 0.5, float(t), 0.0, 0.0))
    series, step = usage.series
    assert step == 4.0
    assert series == (3.0, 7.0, 9.0)


def test_a_late_tick_fills_the_steps_it_skipped():
    usage = Usage(Resources(1, 1000, 1000), MonitorConfig(interval_s=1.0))
    usage.add(Sample(0.5, 10.0, 0.0, 0.0))
    usage.add(Sample(3.5, 30.0, 0.0, 0.0))
    assert usage.series == ((10.0, 30.0, 30.0, 30.0), 1.0)


def test_first_delays_nest_in_the_interval():
    assert MonitorConfig(interval_s=1.0, first_sample_s=0.1).first_delay == 1 / 16
    assert MonitorConfig(interval_s=1.0, first_sample_s=1.0).first_delay == 1.0
    with pytest.raises(ValueError):
        MonitorConfig(interval_s=1.0, first_sample_s=2.0)


def test_directory_size_counts_nested_files_not_links(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "b").write_bytes(b"x" * 24)
    (tmp_path / "link").symlink_to("/usr")
    assert directory_size(tmp_path) == 1000 + 24 + len("/usr")
    assert directory_size(tmp_path / "missing") == 0


# --- real processes --------------------------------------------------------------------------


@pytest.fixture
def runner(tmp_path):
    return Runner(RunnerConfig(root=tmp_path / "sandboxes", kill_grace_s=0.5), Monitor(FAST))


def python(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


async def test_a_memory_hog_is_killed_quickly(runner):
    hog = python("import time; x = bytearray(300 * 2**20); time.sleep(30)")
    result = await runner.run(AttemptSpec("hog", 0, hog, Resources(1, 100, 100)))
    assert result.outcome is Outcome.EXHAUSTED
    assert result.exhaustion.resource == "memory"
    assert result.exhaustion.measured > 100
    assert result.peak.memory >= result.exhaustion.measured
    assert result.peak.wall < 5
    assert "memory reached" in result.output_tail


async def test_a_disk_filler_is_killed(runner):
    filler = python(
        "import time\nwith open('big', 'wb') as f:\n"
        "    for _ in range(200):\n        f.write(b'x' * 2**20); f.flush(); time.sleep(0.005)\n"
        "time.sleep(30)"
    )
    result = await runner.run(AttemptSpec("fill", 0, filler, Resources(1, 1000, 20)))
    assert result.outcome is Outcome.EXHAUSTED
    assert result.exhaustion.resource == "disk"
    assert 20 < result.exhaustion.measured <= 200
    assert result.peak.wall < 5


async def test_a_wall_time_overrun_is_killed_on_time(runner):
    result = await runner.run(AttemptSpec("slow", 0, "sleep 30", Resources(1, 100, 10, 0.3)))
    assert result.outcome is Outcome.EXHAUSTED
    assert result.exhaustion.resource == "wall"
    assert 0.3 <= result.exhaustion.measured < 1.0
    assert result.exit_code == -15


async def test_a_task_ignoring_sigterm_is_killed_after_the_grace(runner):
    stubborn = "trap '' TERM; sleep 30"  # an ignored signal stays ignored across exec
    result = await runner.run(AttemptSpec("stubborn", 0, stubborn, Resources(1, 100, 10, 0.2)))
    assert result.outcome is Outcome.EXHAUSTED
    assert result.exit_code == -9
    assert result.peak.wall < 2


async def test_an_attempt_that_ended_before_it_was_stopped_keeps_its_outcome(runner):
    """A stop (a worker shutting down) that comes after the task exited, before the worker
    read its exit, must not turn a finished task into a lost one: it would run twice."""
    spec = AttemptSpec("quick", 0, "sleep 1", Resources(1, 100, 10))
    done = asyncio.create_task(runner.run(spec))
    while not runner.running:
        await asyncio.sleep(0.001)
    [running] = runner._running.values()
    # Blocks the loop until the task exits: the worker cannot have read its exit yet.
    os.waitid(os.P_PID, running.pid, os.WEXITED | os.WNOWAIT)
    assert not runner.stop("quick", 0, "worker shut down")
    result = await done
    assert result.outcome is Outcome.SUCCESS and result.exit_code == 0


async def test_stopping_a_running_attempt_reports_it_lost(runner):
    done = asyncio.create_task(
        runner.run(AttemptSpec("slow", 0, "sleep 30", Resources(1, 100, 10)))
    )
    while not runner.running:
        await asyncio.sleep(0.001)
    assert runner.stop("slow", 0, "worker shut down")
    result = await done
    assert result.outcome is Outcome.LOST and "worker shut down" in result.output_tail


async def test_peaks_match_what_the_task_did(runner, tmp_path):
    """A task reports its own CPU time and peak RSS; the monitor agrees within 10%."""
    report = tmp_path / "self.json"
    task = python(
        "import json, resource, time\n"
        "x = bytearray(200 * 2**20)\n"
        "t = time.time()\n"
        "while time.time() - t < 1.0: pass\n"
        "r = resource.getrusage(resource.RUSAGE_SELF)\n"
        "own = {'cpu': r.ru_utime + r.ru_stime, 'rss': r.ru_maxrss / 1024}\n"
        f"json.dump(own, open({str(report)!r}, 'w'))"
    )
    result = await runner.run(AttemptSpec("honest", 0, task, Resources(1, 1000, 100)))
    assert result.outcome is Outcome.SUCCESS, result.output_tail
    own = json.loads(report.read_text())
    assert result.peak.memory == pytest.approx(own["rss"], rel=0.1)
    average = own["cpu"] / result.peak.wall
    assert average * 0.9 <= result.peak.cores <= 1.1  # one busy thread: at most one core
    series, step = result.memory_series, result.sample_interval_s
    assert step == FAST.interval_s
    assert len(series) == pytest.approx(result.peak.wall / step, abs=2)
    assert max(series) == result.peak.memory


async def test_a_peak_between_two_samples_is_the_task_s(runner):
    """A task that makes and frees an array below the worker's own peak (which the kernel's
    count of the whole attempt starts from), then sleeps: its samples see the memory freed,
    yet its peak is the array (else the sizer would give its next tasks too little)."""
    size = int(high_water_rss() / 2)  # MB: the kernel's count cannot tell it
    assert size > 20
    task = python(f"import time; x = bytearray({size} * 2**20); x = None; time.sleep(1.0)")
    result = await runner.run(AttemptSpec("transient", 0, task, Resources(1, 1000, 100)))
    assert result.outcome is Outcome.SUCCESS, result.output_tail
    assert result.peak.memory > size and max(result.memory_series) > size


async def test_memory_is_summed_over_the_process_tree(runner):
    child = python("import time; x = bytearray(80 * 2**20); time.sleep(1.0)")
    tree = f"{child} & {child} & {child} & wait"
    result = await runner.run(AttemptSpec("tree", 0, tree, Resources(3, 1000, 100)))
    assert result.outcome is Outcome.SUCCESS
    assert result.peak.memory > 3 * 80  # no single process ever held more than ~90 MB


async def test_a_tree_over_its_limit_is_killed_whole(runner):
    child = python("import time; x = bytearray(80 * 2**20); time.sleep(30)")
    tree = f"{child} & {child} & {child} & wait"
    result = await runner.run(AttemptSpec("trees", 0, tree, Resources(3, 200, 100)))
    assert result.outcome is Outcome.EXHAUSTED
    assert result.exhaustion.resource == "memory"
    assert result.peak.wall < 5


async def dies(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (a killed process still needs a CPU to die)."""
    for _ in range(200):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_background_leftovers_die_with_the_task(runner, tmp_path):
    pidfile = tmp_path / "pid"
    result = await runner.run(
        AttemptSpec("bg", 0, f"sleep 60 & echo $! > {pidfile}", Resources(1, 100, 10))
    )
    assert result.outcome is Outcome.SUCCESS
    assert await dies(int(pidfile.read_text()))


# --- the cgroup backstop ---------------------------------------------------------------------


def test_cgroup_backstop_writes_limits_and_reads_oom_kills(tmp_path):
    """On a stand-in cgroup directory: the files the kernel would act on."""
    cgroups = MemoryCgroups(tmp_path)
    cgroup = cgroups.create("t.0", 100.0)
    assert (cgroup / "memory.max").read_text() == str(100 * 2**20)
    assert (cgroup / "memory.oom.group").read_text() == "1"
    assert (cgroup / "memory.swap.max").read_text() == "0"
    cgroups.add(cgroup, 4242)
    assert (cgroup / "cgroup.procs").read_text() == "4242"
    assert not cgroups.oom_killed(cgroup)
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroups.oom_killed(cgroup)
    assert (cgroups.create("u.0", 0.0) / "memory.max").read_text() == "max"


def test_cgroup_detection_never_breaks_a_worker():
    cgroups = MemoryCgroups.detect()
    assert cgroups is None or cgroups.base.is_dir()


async def test_the_kernel_backstop_kills_a_hog_faster_than_sampling(tmp_path):
    cgroups = MemoryCgroups.detect()
    if cgroups is None:
        pytest.skip("no delegated cgroup v2 memory controller here")
    runner = Runner(
        RunnerConfig(root=tmp_path),
        Monitor(MonitorConfig(interval_s=60, first_sample_s=60)),
        cgroups=cgroups,
    )
    hog = python("x = bytearray(400 * 2**20)")
    result = await runner.run(AttemptSpec("hog", 0, hog, Resources(1, 100, 100)))
    assert result.outcome is Outcome.EXHAUSTED
    assert result.exhaustion.resource == "memory"
    assert math.isfinite(result.exhaustion.measured)


def test_cpu_times_give_the_busy_share_of_a_set_of_cpus(tmp_path):
    stat = tmp_path / "stat"
    line = "cpu{} {} 0 {} {} {} 0 0 0 0 0\n"  # user nice system idle iowait ...
    total = "cpu  9 9 9 9 9 0 0 0 0 0\n"  # all CPUs together: not one of them
    stat.write_text(total + line.format(0, 10, 0, 90, 0) + line.format(1, 50, 0, 50, 0))
    before = CpuTimes.read(str(stat))
    stat.write_text(line.format(0, 110, 0, 90, 0) + line.format(1, 60, 10, 120, 10))
    after = CpuTimes.read(str(stat))
    assert after.busy_since(before, frozenset({0})) == 1.0  # busy all along
    assert after.busy_since(before, frozenset({1})) == 0.2  # idle and iowait are not busy
    assert after.busy_since(before, frozenset({0, 1})) == pytest.approx(120 / 200)
    assert after.busy_since(None, frozenset({0})) is None  # no earlier reading
    assert after.busy_since(after, frozenset({0})) is None  # no time between
    assert CpuTimes.read(str(tmp_path / "absent")) is None


def test_an_attempt_is_starved_when_its_cpus_were_saturated_and_it_used_well_below_its_cores():
    def run(busy: float, cpu_per_s: float, cores: float = 1.0) -> Usage:
        usage = Usage(Resources(cores, 1000, 100), MonitorConfig(window_s=1.0))
        for step in range(1, 11):
            t = 0.5 * step
            usage.add(Sample(t, 10.0, cpu_per_s * t, 0.0, None if step == 1 else busy))
        usage.finish(wall=5.0, cpu=cpu_per_s * 5.0, max_rss=0.0, disk=0.0)
        return usage

    assert run(busy=1.0, cpu_per_s=0.2).starved  # crowded out: used 0.2 of 1 core
    assert not run(busy=0.6, cpu_per_s=0.2).starved  # room to spare: it wanted no more
    assert not run(busy=1.0, cpu_per_s=0.9).starved  # it got its share
    assert not run(busy=1.0, cpu_per_s=0.2, cores=0.25).starved  # nearly all it was given
    unknown = Usage(Resources(1, 1000, 100), MonitorConfig())
    unknown.finish(wall=0.01, cpu=0.001, max_rss=0.0, disk=0.0)  # no sample: nothing known
    assert not unknown.starved
