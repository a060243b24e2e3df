"""Task integrity on one node: nothing outlives its attempt or its worker, declared outputs are
there after a success and gone after anything else, and memory is the task's own."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from backends import clock
from learners.resources import Resources
from learners.sizing.base import Exhaustion
from orchestrator.agent import lineage
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Outcome, cause
from orchestrator.agent.monitor import CpuTimes, Monitor, MonitorConfig, Sample, Usage
from orchestrator.agent.taskrun import Runner, RunnerConfig
from orchestrator.events import AttemptEnded
from orchestrator.runstate import TaskState
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from workflows.spec import loads

FAST = MonitorConfig(interval_s=0.2, first_sample_s=0.05)
PY = sys.executable


@pytest.fixture
def runner(tmp_path):
    return Runner(RunnerConfig(root=tmp_path / "scratch", kill_grace_s=0.3), Monitor(FAST))


def alive(pid: int) -> bool:
    """The process runs (a zombie waiting for its parent does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def gone_soon(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


DAEMON = "setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' < /dev/null > /dev/null 2>&1 &"
"""A daemon in a session of its own, re-parented to init once the task's shell exits."""


def daemon_pid(pidfile: Path) -> int:
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        time.sleep(0.02)
    raise AssertionError("the daemon never wrote its pid")


async def test_a_setsid_daemon_is_gone_when_its_attempt_ends(runner, tmp_path):
    pidfile = tmp_path / "daemon.pid"
    command = DAEMON.format(pidfile=pidfile) + " sleep 0.3"
    result = await runner.run(AttemptSpec("d", 1, command, Resources(1, 200, 50)))
    assert result.outcome is Outcome.SUCCESS
    assert not alive(daemon_pid(pidfile))


def trapping(mark: Path, sleep: int) -> str:
    """A process left running that writes ``mark`` on SIGTERM and exits, its ``sleep`` with it."""
    trap = f'trap "echo term > {mark}; exit 0" TERM'
    return f"sh -c '{trap}; sleep {sleep} & wait' < /dev/null > /dev/null 2>&1 &"


async def test_what_an_attempt_leaves_running_gets_sigterm_then_the_grace(runner, tmp_path):
    """Left running when its task exits, a process gets SIGTERM and the grace to end, in the
    task's group or a session of its own (an `srun` ends its step on it, and only on it); one
    that ignores SIGTERM is killed after the grace."""
    grouped, detached, deaf = tmp_path / "grouped", tmp_path / "detached", tmp_path / "deaf.pid"
    command = (
        f"{trapping(grouped, 301)} setsid {trapping(detached, 302)} "
        f"sh -c 'trap \"\" TERM; echo $$ > {deaf}; exec sleep 303' < /dev/null > /dev/null 2>&1 & "
        "sleep 0.5"
    )
    result = await runner.run(AttemptSpec("left", 1, command, Resources(1, 200, 50)))
    assert result.outcome is Outcome.SUCCESS
    assert grouped.read_text() == "term\n" and detached.read_text() == "term\n"
    assert not alive(daemon_pid(deaf))
    left = subprocess.run(["pgrep", "-f", "sleep 30[123]$"], capture_output=True, text=True)
    assert left.stdout == ""


async def test_a_cancelled_attempt_is_killed_and_reaped(runner, tmp_path):
    pidfile = tmp_path / "leader.pid"
    spec = AttemptSpec("c", 1, f"echo $$ > {pidfile}; exec sleep 304", Resources(1, 200, 50))
    run = asyncio.ensure_future(runner.run(spec))
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        await asyncio.sleep(0.02)
    leader = int(pidfile.read_text())
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    for _ in range(100):  # reaped, not left a zombie
        if not Path(f"/proc/{leader}").exists():
            break
        await asyncio.sleep(0.02)
    assert not Path(f"/proc/{leader}").exists()
    assert runner.running == 0


def hold(tmp_path: Path, mb: int) -> str:
    """A command holding ``mb`` megabytes for 30 s."""
    script = tmp_path / f"hold{mb}.py"
    script.write_text(f"import time\nx = bytearray({mb} * 2**20)\ntime.sleep(30)\n")
    return f"{PY} {script}"


async def test_a_task_killed_for_memory_leaves_no_process(runner, tmp_path):
    pidfile = tmp_path / "daemon.pid"
    command = DAEMON.format(pidfile=pidfile) + f" sleep 31 & {hold(tmp_path, 300)}"
    result = await runner.run(AttemptSpec("hog", 1, command, Resources(1, 100, 50)))
    assert result.outcome is Outcome.EXHAUSTED and result.exhaustion.resource == "memory"
    assert not alive(daemon_pid(pidfile))
    left = subprocess.run(["pgrep", "-f", "sleep 31$"], capture_output=True, text=True)
    assert left.stdout == ""


async def test_a_daemon_is_measured_with_its_task(runner, tmp_path):
    """A process that left the task's session still counts against the task's memory."""
    pidfile = tmp_path / "daemon.pid"
    fat = hold(tmp_path, 150)
    command = (
        f"setsid sh -c 'echo $$ > {pidfile}; exec {fat}' < /dev/null > /dev/null 2>&1 & sleep 30"
    )
    result = await runner.run(AttemptSpec("fat", 1, command, Resources(1, 100, 50)))
    assert result.outcome is Outcome.EXHAUSTED and result.exhaustion.resource == "memory"
    assert result.exhaustion.measured > 100
    assert not alive(daemon_pid(pidfile))


WORKER_TASKS = """
import os, subprocess, sys, time
from orchestrator.agent.lineage import WORKER_TOKEN, Sentinel, new_token
token = new_token()
sentinel = Sentinel(token)
env = {**os.environ, WORKER_TOKEN: token}
task = subprocess.Popen(["sh", "-c", sys.argv[1]], env=env, start_new_session=True)
print(task.pid, flush=True)
time.sleep(300)
"""


def test_the_tasks_of_a_killed_worker_die_with_it(tmp_path):
    """SIGKILL of a worker: its sentinel kills its tasks, daemons included."""
    pidfile = tmp_path / "daemon.pid"
    task = DAEMON.format(pidfile=pidfile) + " exec sleep 300"
    worker = subprocess.Popen(
        [PY, "-c", WORKER_TASKS, task], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    task_pid = int(worker.stdout.readline())
    daemon = daemon_pid(pidfile)
    assert alive(task_pid) and alive(daemon)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert gone_soon(task_pid) and gone_soon(daemon)


def test_the_tasks_of_a_killed_worker_get_sigterm_then_the_grace(tmp_path):
    """SIGKILL of a worker: what its tasks run gets SIGTERM first (an `srun` ends its step on
    it), and one that ignores it is killed after the grace."""
    mark, deaf = tmp_path / "mark", tmp_path / "deaf.pid"
    task = f"{trapping(mark, 305)} sh -c 'trap \"\" TERM; echo $$ > {deaf}; exec sleep 306' & wait"
    worker = subprocess.Popen(
        [PY, "-c", WORKER_TASKS, task], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    task_pid = int(worker.stdout.readline())
    ignoring = daemon_pid(deaf)
    time.sleep(0.3)  # the trap is set
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert gone_soon(task_pid) and gone_soon(ignoring)
    assert mark.read_text() == "term\n"


def test_a_sweep_spares_other_workers_processes(tmp_path):
    mine, theirs = lineage.new_token(), lineage.new_token()
    procs = {
        token: subprocess.Popen(["sleep", "300"], env={**os.environ, lineage.WORKER_TOKEN: token})
        for token in (mine, theirs)
    }
    try:
        assert lineage.Lineage().sweep(mine, worker=True) == 1
        assert procs[mine].wait(5) == -signal.SIGKILL
        assert procs[theirs].poll() is None
    finally:
        procs[theirs].kill()
        procs[theirs].wait()


def test_a_sweep_finds_a_process_whose_pid_was_read_before_as_another_process():
    """Pids wrap (at 32,768 by default): a pid read once may name another process by the
    time of the sweep, one that carries the token."""
    token = lineage.new_token()
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, lineage.WORKER_TOKEN: token})
    try:
        seen = lineage.Lineage()
        seen.scan()
        seen._seen[proc.pid] = (None, None, None)  # as read when the pid was someone else's
        assert seen.sweep(token, worker=True) == 1
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_a_process_caught_inside_its_exec_is_read_once_it_is_through(monkeypatch):
    """Between an execve's closing of the close-on-exec descriptors (when Popen returns) and
    the setting up of the new stack, a process shows neither arguments nor environment: on a
    loaded node a sweep right after a spawn read the task's child as carrying no token."""
    token = lineage.new_token()
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, lineage.WORKER_TOKEN: token})
    real_read, reads = lineage._read, []

    def inside_exec_twice(path: str) -> bytes | None:
        reads.append(path)
        mine = path in (f"/proc/{proc.pid}/environ", f"/proc/{proc.pid}/cmdline")
        if mine and reads.count(path) <= 2:
            return b""  # as the kernel shows it before the new stack is set up
        return real_read(path)

    monkeypatch.setattr(lineage, "_read", inside_exec_twice)
    try:
        assert lineage._environ_tokens(proc.pid) == (None, token)
        assert reads.count(f"/proc/{proc.pid}/environ") == 3
    finally:
        proc.kill()
        proc.wait()


def test_a_process_with_no_address_space_or_no_environment_is_read_without_waiting(monkeypatch):
    """A zombie, a kernel thread and a process run with an empty environment all read as an
    empty environment too; none of them is inside an exec, and none is waited for."""
    bare = subprocess.Popen(["sleep", "300"], env={})
    zombie = subprocess.Popen(["true"])
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    while not lineage._read(f"/proc/{bare.pid}/cmdline"):  # through its own exec
        time.sleep(0.01)
    kernel_threads = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and lineage._read(f"/proc/{pid}/statm") == b"0 0 0 0 0 0 0\n"
    ]
    monkeypatch.setattr(lineage.time, "sleep", lambda s: pytest.fail(f"waited {s} s"))
    try:
        for pid in (bare.pid, zombie.pid, *kernel_threads[:5]):
            assert lineage._environ_tokens(pid) == (None, None)
    finally:
        bare.kill()
        bare.wait()
        zombie.wait()


ADOPTING_WORKER = """
import asyncio, os, sys
from pathlib import Path
from learners.resources import Resources
from orchestrator.agent import lineage
from orchestrator.agent.attempt import AttemptSpec
from orchestrator.agent.monitor import Monitor, MonitorConfig
from orchestrator.agent.taskrun import Runner, RunnerConfig

assert lineage.adopt_orphans() and lineage.adopting()
listed = []
scan = lineage.Lineage.scan
def counted_scan(self):
    listed.append(1)
    scan(self)
lineage.Lineage.scan = counted_scan
runner = Runner(RunnerConfig(root=Path(sys.argv[1])), Monitor(MonitorConfig(interval_s=0.2)))

async def main():
    for name, command in [("plain", "true"), ("orphan", sys.argv[2]), ("daemon", sys.argv[3])]:
        listed.clear()
        result = await runner.run(AttemptSpec(name, 1, command, Resources(1, 200, 50)))
        print(name, result.outcome, len(listed) > 0, sorted(lineage._children()), flush=True)
asyncio.run(main())
"""


def test_a_worker_adopts_what_its_tasks_leave_and_lists_proc_only_when_they_do(tmp_path):
    """A worker adopts its tasks' orphans: a look at its children shows that a plain task
    left nothing (no listing of /proc), an orphan that ended by itself is reaped, and a
    setsid daemon is found below it and killed."""
    pidfile = tmp_path / "daemon.pid"
    orphan = "(sleep 0.1 &); sleep 0.5"  # the subshell exits: its sleep is orphaned, then ends
    daemon = DAEMON.format(pidfile=pidfile) + " sleep 0.3"
    worker = subprocess.run(
        [PY, "-c", ADOPTING_WORKER, str(tmp_path / "scratch"), orphan, daemon],
        capture_output=True,
        text=True,
        cwd=Path.cwd(),
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.splitlines() == [
        "plain success False []",  # nothing left: found without listing /proc
        "orphan success False []",  # its zombie reaped; nothing else left
        "daemon success True []",  # found below us, then swept: killed and reaped
    ]
    assert not alive(daemon_pid(pidfile))


# --- declared outputs in the working directory -----------------------------------------------


def attempt(workdir: Path, command: str, outputs: tuple[str, ...], n: int = 1) -> AttemptSpec:
    return AttemptSpec("t", n, command, Resources(1, 200, 50), "", str(workdir), outputs)


async def test_tasks_run_in_the_working_directory_and_keep_their_outputs(runner, tmp_path):
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    command = "echo $LEADTIME_SCRATCH > out/scratch && pwd > out/cwd && echo tmp > $TMPDIR/t"
    result = await runner.run(attempt(work, command, ("out/cwd", "out/scr*")))
    assert result.outcome is Outcome.SUCCESS, result.output_tail
    assert (work / "out" / "cwd").read_text().strip() == str(work)
    scratch = Path((work / "out" / "scratch").read_text().strip())
    assert scratch.parent == tmp_path / "scratch"
    await runner.settle()
    assert not scratch.exists()  # the scratch directory goes, the outputs stay


async def test_a_task_gets_the_signals_python_ignores_back_at_their_defaults(runner, tmp_path):
    """The worker is Python, which ignores SIGPIPE and SIGXFSZ; an ignored signal stays
    ignored across exec, and a task ignoring SIGPIPE would run on after its reader ended
    (``yes | head`` would not end)."""
    command = "grep SigIgn /proc/self/status > ignored"
    result = await runner.run(attempt(tmp_path, command, ("ignored",)))
    assert result.outcome is Outcome.SUCCESS, result.output_tail
    ignored = int((tmp_path / "ignored").read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))


async def test_a_failed_attempts_outputs_never_appear(runner, tmp_path):
    result = await runner.run(attempt(tmp_path, "echo half > part.txt; exit 3", ("part.txt",)))
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, 3)
    assert not (tmp_path / "part.txt").exists()


async def test_a_killed_attempts_outputs_never_appear(runner, tmp_path):
    command = "mkdir -p d; echo half > d/a; sleep 30"
    spec = AttemptSpec("t", 1, command, Resources(1, 200, 50, 0.3), "", str(tmp_path), ("d",))
    result = await runner.run(spec)
    assert result.outcome is Outcome.EXHAUSTED and result.exhaustion.resource == "wall"
    assert not (tmp_path / "d").exists()


async def test_exit_0_without_a_declared_output_is_a_failure(runner, tmp_path):
    result = await runner.run(attempt(tmp_path, "touch a.txt", ("a.txt", "b-*.txt")))
    assert result.outcome is Outcome.FAILED
    assert "did not create its declared output 'b-*.txt'" in result.output_tail
    assert (
        cause(result, Resources(1)) == "exited 0 but did not create its declared output 'b-*.txt'"
    )
    assert not (tmp_path / "a.txt").exists()


async def test_a_stale_output_is_removed_before_an_attempt(runner, tmp_path):
    (tmp_path / "out.txt").write_text("from an earlier run\n")
    command = "test -e out.txt && exit 9; echo new > out.txt"
    result = await runner.run(attempt(tmp_path, command, ("out.txt",)))
    assert result.outcome is Outcome.SUCCESS
    assert (tmp_path / "out.txt").read_text() == "new\n"


async def test_the_directories_leading_to_declared_outputs_are_made_before_an_attempt(
    runner, tmp_path
):
    outputs = ("parts/7/a.txt", "hits/*/b.txt", "tables/**", "plain.txt")
    result = await runner.run(attempt(tmp_path, "echo 7 > parts/7/a.txt", outputs))
    assert not (tmp_path / "parts" / "7" / "a.txt").exists()  # 3 of 4 missing: removed
    assert "did not create its declared output 'hits/*/b.txt'" in result.output_tail
    assert (tmp_path / "parts" / "7").is_dir() and (tmp_path / "hits").is_dir()
    assert not (tmp_path / "tables").exists()  # 'tables/**' matches tables itself: not made

    result = await runner.run(attempt(tmp_path, "echo 7 > parts/7/a.txt", outputs[:1], n=2))
    assert result.outcome is Outcome.SUCCESS, result.output_tail
    assert (tmp_path / "parts" / "7" / "a.txt").read_text() == "7\n"


async def test_no_directory_is_made_through_a_link_leading_out(runner, tmp_path):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "link").symlink_to(outside)
    result = await runner.run(attempt(work, "true", ("link/sub/x.txt",)))
    assert result.outcome is Outcome.FAILED
    assert list(outside.iterdir()) == []


async def test_an_absolute_output_in_the_working_directory_counts_and_one_outside_is_left_be(
    runner, tmp_path
):
    """A glob's items are absolute paths, and an output may name one (``{item}.gz``)."""
    work, outside = tmp_path / "work", tmp_path / "outside.txt"
    work.mkdir()
    outside.write_text("not the task's\n")
    inside = work / "in" / "a.txt.gz"
    result = await runner.run(attempt(work, f"echo z > {inside}", (str(inside),)))
    assert result.outcome is Outcome.SUCCESS, result.output_tail
    result = await runner.run(attempt(work, "true", (str(outside),), n=2))
    assert "did not create its declared output" in result.output_tail
    assert outside.read_text() == "not the task's\n"


async def test_outputs_count_against_the_tasks_disk(runner, tmp_path):
    write = f"{PY} -c \"open('big', 'wb').write(b'x' * 30 * 2**20)\"; sleep 30"
    spec = AttemptSpec("t", 1, write, Resources(1, 200, 20), "", str(tmp_path), ("big",))
    result = await runner.run(spec)
    assert result.outcome is Outcome.EXHAUSTED and result.exhaustion.resource == "disk"
    assert not (tmp_path / "big").exists()


async def test_a_task_over_its_disk_too_quick_for_any_sample_is_exhausted_all_the_same(tmp_path):
    """The same task is judged the same however quick it is: one that wrote 30 MB into a
    10 MB disk and exited 0 before the first sample is found over as it ends, as a slower
    one is killed; its outputs go, and its words say which."""
    late = MonitorConfig(interval_s=60, first_sample_s=60)  # no sample comes
    runner = Runner(RunnerConfig(root=tmp_path / "scratch"), Monitor(late))
    write = "head -c 31457280 /dev/zero > big"
    spec = AttemptSpec("t", 1, write, Resources(1, 200, 10), "", str(tmp_path), ("big",))
    result = await runner.run(spec)
    assert result.outcome is Outcome.EXHAUSTED and result.exit_code == 0
    assert result.exhaustion == Exhaustion("disk", pytest.approx(30.0, abs=0.1))
    assert not (tmp_path / "big").exists()
    assert "over its allocation as it ended: disk reached 30" in result.output_tail
    assert cause(result, spec.allocation) == "disk 30 MB > 10 MB"
    within = AttemptSpec("t", 2, write, Resources(1, 200, 40), "", str(tmp_path), ("big",))
    assert (await runner.run(within)).outcome is Outcome.SUCCESS


async def test_an_attempt_without_its_working_directory_fails_clearly(runner, tmp_path):
    result = await runner.run(attempt(tmp_path / "nowhere", "true", ()))
    assert result.outcome is Outcome.FAILED
    assert (
        cause(result, Resources(1)) == f"no working directory {tmp_path / 'nowhere'} on this node"
    )


# --- measuring --------------------------------------------------------------------------------


def test_a_childs_max_rss_below_its_spawners_is_not_taken_for_its_own():
    """The kernel hands the forking worker's high-water RSS down to the task at exec."""
    usage = Usage(Resources(1, 1000, 10), FAST)
    usage.add(_sample(memory=40.0))
    assert usage.finish(1.0, 0.1, max_rss=60.0, disk=0.0, spawner_rss=60.0).memory == 40.0
    usage = Usage(Resources(1, 1000, 10), FAST)
    usage.add(_sample(memory=40.0))
    assert usage.finish(1.0, 0.1, max_rss=90.0, disk=0.0, spawner_rss=60.0).memory == 90.0
    quick = Usage(Resources(1, 1000, 10), FAST)  # ended before any sample: an upper bound
    assert quick.finish(0.01, 0.0, max_rss=60.0, disk=0.0, spawner_rss=60.0).memory == 60.0
    exiting = Usage(Resources(1, 1000, 10), FAST)  # its one sample read an exiting tree
    exiting.add(_sample(memory=0.0))
    assert exiting.finish(0.01, 0.0, max_rss=60.0, disk=0.0, spawner_rss=60.0).memory == 60.0


def test_the_totals_at_an_attempts_end_break_a_limit_only_where_they_are_its_own():
    """Disk at the end is exact; a max RSS is the task's own only above its spawner's."""
    usage = Usage(Resources(1, 50, 10), FAST)
    usage.finish(0.01, 0.0, max_rss=60.0, disk=12.0, spawner_rss=60.0)
    assert usage.over == Exhaustion("disk", 12.0)
    usage = Usage(Resources(1, 50, 10), FAST)  # 60 MB is the worker's, handed down
    usage.finish(0.01, 0.0, max_rss=60.0, disk=1.0, spawner_rss=60.0)
    assert usage.over is None
    usage = Usage(Resources(1, 50, 10), FAST)  # 90 MB is the task's own
    usage.finish(0.01, 0.0, max_rss=90.0, disk=1.0, spawner_rss=60.0)
    assert usage.over == Exhaustion("memory", 90.0)
    usage = Usage(Resources(1, 50, 10, wall=2.0), FAST)  # its timer, not its end, stops it
    usage.finish(2.003, 0.0, max_rss=1.0, disk=1.0, spawner_rss=60.0)
    assert usage.over is None


def _sample(memory: float) -> Sample:
    return Sample(time=0.1, memory=memory, cpu=0.0, disk=0.0)


def test_causes_read_as_a_person_says_them():
    lost = AttemptResult("t", 1, Outcome.LOST, Resources(), output_tail="[leadtime] worker left: x")
    assert cause(lost, Resources(1)) == "worker left: x"
    failed = AttemptResult("t", 1, Outcome.FAILED, Resources(), exit_code=3, output_tail="oops")
    assert cause(failed, Resources(1)) == "exit code 3"
    killed = AttemptResult(
        "t",
        1,
        Outcome.EXHAUSTED,
        Resources(),
        exit_code=-15,
        exhaustion=Exhaustion("memory", 812.4),
        output_tail="[leadtime] killed: memory reached 812.4 MB (allocation 500 MB)",
    )
    assert cause(killed, Resources(1, 500)) == "memory 812 MB > 500 MB"


def test_the_engine_counts_only_the_attempt_in_flight():
    """A result for an attempt given up on (its worker was lost) is recorded as late and
    never counted; a result told twice (a worker resends what a dead manager heard) is
    ignored."""

    workflow = loads(
        textwrap.dedent(
            """
            name = "fence"
            [[stage]]
            name = "a"
            allocation = { cores = 12, time = "1h" }
            tasks = { command = "true", count = 8, cores = 1, memory = "100M", disk = "10M" }
            simulate = { duration = "normal(60, 1)", memory = "normal(10, 1)" }
            """
        )
    )
    forged: list = []

    def observer(engine):
        done = [t for t in engine.state.stages["a"].tasks if t.state == TaskState.DONE]
        if done and not forged:
            task = done[0]
            given_up = AttemptSpec(task.task.id, task.attempts + 5, "true", Resources(1, 10, 1))
            task.lost.add(given_up.attempt)  # as when its worker was lost
            counted = AttemptSpec(task.task.id, task.attempts, "true", Resources(1, 10, 1))
            for spec in (given_up, counted):
                slot = engine.state.pool.place("a", spec.allocation, clock.now())
                assert slot is not None
                forged.append(spec)
                result = AttemptResult(task.task.id, spec.attempt, Outcome.SUCCESS, Resources(1, 5))
                engine.post(AttemptEnded(slot.worker, spec, result))

    async def main():
        async with await Store.open(":memory:") as store:
            summary = await execute(workflow, RunConfig(), store, observer=observer)
            return summary, await store.rows("attempts", {"run_id": summary.run_id})

    summary, attempts = clock.run(main(), virtual=True)
    assert summary.status == "done", summary.error
    given_up, counted = forged
    late = [a for a in attempts if a["attempt"] == given_up.attempt]
    assert [a["outcome"] for a in late] == ["late success"]
    twice = [
        a for a in attempts if (a["task_id"], a["attempt"]) == (counted.task_id, counted.attempt)
    ]
    assert [a["outcome"] for a in twice] == ["success"]
    assert summary.stages[0].tasks == 8


def test_a_kill_cause_shows_two_sizes_that_differ():
    """A few-MB limit and the few MB that exceeded it read apart, not as ``3 MB > 3 MB``."""

    def killed(measured: float) -> AttemptResult:
        exhausted = Exhaustion("memory", measured)
        return AttemptResult("t", 1, Outcome.EXHAUSTED, Resources(), exhaustion=exhausted)

    assert cause(killed(3.2227), Resources(1, 3.0703)) == "memory 3.22 MB > 3.07 MB"
    assert cause(killed(812.4), Resources(1, 812.2)) == "memory 812.4 MB > 812.2 MB"
    assert cause(killed(1200.0), Resources(1, 1000.0)) == "memory 1,200 MB > 1,000 MB"
    at_limit = "memory reached its limit, 1,069 MB"  # a kill that saw no more than the limit
    assert cause(killed(1068.52174), Resources(1, 1068.52174)) == at_limit


async def test_an_attempt_crowded_off_its_cpu_reports_it_was_starved(runner, tmp_path):
    """A task given a core it shares with a busy process uses half of it: starved. Alone,
    it uses the core: not starved."""
    cpu = min(os.sched_getaffinity(0))
    spin = f'{PY} -c "import time; end = time.time() + 1.5\nwhile time.time() < end: pass"'
    spec = AttemptSpec("t", 1, spin, Resources(1, 500, 10), "", str(tmp_path))
    hog = subprocess.Popen(
        [PY, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
    )
    try:
        crowded = await runner.run(spec, frozenset({cpu}))
    finally:
        hog.kill()
        hog.wait()
    assert crowded.outcome is Outcome.SUCCESS
    assert crowded.starved and crowded.peak.cores < 0.8
    for attempt in (2, 3, 4):  # alone: unless another process took the core meanwhile
        before = _busy_s(cpu)
        again = AttemptSpec("t", attempt, spin, Resources(1, 500, 10), "", str(tmp_path))
        alone = await runner.run(again, frozenset({cpu}))
        others = _busy_s(cpu) - before - alone.peak.cores * alone.peak.wall
        if others < 0.2 * alone.peak.wall:
            assert not alone.starved and alone.peak.cores > 0.8
            return
    pytest.skip(f"CPU {cpu} was never free of other processes for 1.5 s (this node is busy)")


def _busy_s(cpu: int) -> float:
    """The seconds CPU ``cpu`` has spent running something since boot (the monitor's read)."""
    times = CpuTimes.read()
    assert times is not None
    return times.busy[cpu] / os.sysconf("SC_CLK_TCK")
