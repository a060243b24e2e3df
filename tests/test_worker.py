"""Running attempts and the worker agent, against a real manager and real processes."""

import asyncio
import contextlib
import math
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from strangers import intrude

from backends import clock
from backends.cores import CoreSet
from learners.resources import Resources
from orchestrator.agent import protocol, taskrun
from orchestrator.agent.attempt import AttemptSpec, Outcome
from orchestrator.agent.monitor import Monitor, MonitorConfig
from orchestrator.agent.taskrun import STDOUT, Runner, RunnerConfig, sandbox_name
from orchestrator.agent.worker import (
    EXIT_MANAGER_GONE,
    EXIT_REFUSED,
    EXIT_USAGE,
    Agent,
    OptionsError,
    WorkerOptions,
    detect_capacity,
    detect_end_time,
    main,
    make_options,
)
from orchestrator.manager import Manager
from workflows.template import render

SECRET = bytes(range(100, 132))
FAST = MonitorConfig(interval_s=0.2, first_sample_s=0.05)
SMALL = Resources(1, 200, 50)
SECRET_ENVIRON = {protocol.SECRET_ENV: SECRET.hex()}


def followed(worker, key, since):
    """The result of the attempt ``key`` a worker was running, as a future."""
    future = asyncio.get_running_loop().create_future()
    worker.follow(key, since, future.set_result)
    return future


def spec(task_id: str, command: str, allocation: Resources = SMALL, attempt: int = 0):
    return AttemptSpec(task_id, attempt, command, allocation)


# --- running one attempt ---------------------------------------------------------------------


@pytest.fixture
def runner(tmp_path):
    environ = {**os.environ, protocol.SECRET_ENV: SECRET.hex()}
    return Runner(RunnerConfig(root=tmp_path / "sb"), Monitor(FAST), environ=environ)


async def test_a_failing_command_reports_its_exit_code_and_last_lines(runner):
    command = "for i in $(seq 1 50); do echo line$i; done; echo oops >&2; exit 3"
    result = await runner.run(spec("bad", command))
    assert result.outcome is Outcome.FAILED
    assert result.exit_code == 3
    assert result.exhaustion is None
    assert "line50" in result.output_tail and "line30" not in result.output_tail
    assert result.output_tail.endswith("[stderr]\noops")
    assert (runner.sandbox(spec("bad", "")) / STDOUT).exists()  # kept for a look


async def test_success_cleans_its_sandbox_and_reports_no_tail(runner):
    result = await runner.run(spec("good", "echo fine; touch made"))
    assert (result.outcome, result.exit_code, result.output_tail) == (Outcome.SUCCESS, 0, "")
    await runner.settle()
    assert not runner.sandbox(spec("good", "")).exists()
    assert result.peak.wall > 0 and result.peak.memory > 0


async def test_a_flat_sandbox_is_gone_at_once_and_a_deep_one_once_settled(runner):
    """A few plain files are removed before the result is returned; a tree goes to a thread."""
    await runner.run(spec("flat", "echo fine; touch made"))
    assert not runner.sandbox(spec("flat", "")).exists()
    deep = spec("deep", "mkdir -p a/b/c && touch a/b/c/x")
    await runner.run(deep)
    await runner.settle()
    assert not runner.sandbox(deep).exists()
    many = spec("many", "for i in $(seq 1 40); do touch f$i; done")
    await runner.run(many)
    await runner.settle()
    assert not runner.sandbox(many).exists()


async def test_an_emptied_sandbox_is_the_next_attempts_and_none_outlives_the_worker(runner):
    """A flat sandbox is emptied and renamed for the next attempt (making and removing a
    directory costs more), its streams with it, emptied; the next attempt finds only those,
    and its stdout holds only what it wrote. Settling removes the spares."""
    inode = 'stat -c %i "$LEADTIME_SCRATCH" leadtime.stdout; ls -A "$LEADTIME_SCRATCH" >&2'
    first = await runner.run(spec("one", f"cd $LEADTIME_SCRATCH; touch junk; {inode}"))
    second = await runner.run(spec("two", f"cd $LEADTIME_SCRATCH; {inode}"))
    assert first.stdout.head == second.stdout.head  # the same directory and stdout
    assert second.stderr.head.split() == [taskrun.STDERR, STDOUT]  # junk went with one
    assert not runner.sandbox(spec("one", "")).exists()
    spares = list(runner.config.root.iterdir())
    assert [s.name.startswith(".spare-") for s in spares] == [True]
    streams = sorted(spares[0].iterdir())
    assert [(s.name, s.stat().st_size) for s in streams] == [(taskrun.STDERR, 0), (STDOUT, 0)]
    await runner.settle()
    assert list(runner.config.root.iterdir()) == []


async def test_a_stream_something_left_behind_still_holds_is_not_the_next_attempts(runner):
    """A process an attempt left behind that escaped the sweep (it emptied its environment
    and left the session) still holds its stdout: the next attempt writes to a new file,
    and what the leftover writes meanwhile is in neither result."""
    left = "setsid env -i /bin/sh -c 'sleep 1; echo late' & echo $!; sleep 0.2"
    first = await runner.run(spec("one", left))
    pid = int(first.stdout.head)
    try:
        second = await runner.run(spec("two", "sleep 1.5; echo mine"))
        assert second.outcome is Outcome.SUCCESS
        assert (second.stdout.head, second.stdout.tail) == ("mine\n", "")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_a_file_a_task_linked_in_place_of_its_stream_is_left_whole(runner, tmp_path):
    """A task that put a hard link to a file of its own where its stdout was: the spare does
    not keep it as the next attempt's stream (emptying it would empty the file)."""
    mine = tmp_path / "results.txt"
    mine.write_text("precious\n")
    await runner.run(spec("one", f'ln -f {mine} "$LEADTIME_SCRATCH/{STDOUT}"'))
    second = await runner.run(spec("two", "echo next"))
    assert second.stdout.head == "next\n"
    assert mine.read_text() == "precious\n"
    assert mine.stat().st_nlink == 1


async def test_a_kept_sandbox_moves_to_the_run_directory_and_leaves_nothing_on_the_node(tmp_path):
    """Under Slurm the root is the node's /tmp: a failed attempt's scratch moves to the run's
    directory (where its user reads it), and the result says where."""
    environ = {**os.environ, protocol.SECRET_ENV: SECRET.hex()}
    config = RunnerConfig(root=tmp_path / "node", keep_to=tmp_path / "run" / "kept")
    runner = Runner(config, Monitor(FAST), environ=environ)
    failed = spec("bad", "echo partial > part.dat; echo oops >&2; exit 1")
    result = await runner.run(failed)
    await runner.settle()
    kept = tmp_path / "run" / "kept" / sandbox_name("bad", 0)
    assert result.sandbox == str(kept)
    assert (kept / "part.dat").read_text() == "partial\n"
    assert (kept / taskrun.STDERR).read_text() == "oops\n"
    assert list((tmp_path / "node").iterdir()) == []


async def test_kept_sandboxes_past_the_budget_keep_only_their_streams_and_say_so(tmp_path):
    environ = {**os.environ, protocol.SECRET_ENV: SECRET.hex()}
    config = RunnerConfig(root=tmp_path / "node", keep_to=tmp_path / "kept", keep_budget_mb=1)
    runner = Runner(config, Monitor(FAST), environ=environ)
    big = "head -c 700000 /dev/zero > big.dat; echo out{n}; exit 1"
    for n in range(2):
        await runner.run(spec(f"t{n}", big.format(n=n)))
        await runner.settle()
    whole, cut = (tmp_path / "kept" / sandbox_name(f"t{n}", 0) for n in range(2))
    assert (whole / "big.dat").stat().st_size == 700000
    assert not (cut / "big.dat").exists()  # 1.4 MB of both would pass the 1 MB budget
    assert (cut / STDOUT).read_text() == "out1\n"
    note = (cut / taskrun.NOT_KEPT).read_text()
    assert "the rest of its scratch directory" in note and "1 MB" in note
    assert list((tmp_path / "node").iterdir()) == []


async def test_a_command_killed_by_its_own_signal_failed(runner):
    result = await runner.run(spec("segv", "kill -SEGV $$"))
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, -signal.SIGSEGV)


async def test_environment_and_sandbox(tmp_path):
    environ = {**os.environ, protocol.SECRET_ENV: SECRET.hex(), "KEEP_ME": "yes"}
    runner = Runner(
        RunnerConfig(root=tmp_path, keep_sandboxes="always"), Monitor(FAST), environ=environ
    )
    task = AttemptSpec("stage/7", 2, "env; echo cwd=$(pwd)", Resources(1.5, 2e6, 40), "cat")
    result = await runner.run(task)
    assert result.outcome is Outcome.SUCCESS
    sandbox = runner.sandbox(task)
    assert sandbox.parent == tmp_path and sandbox.name.endswith(".2")
    lines = (sandbox / STDOUT).read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert env["LEADTIME_TASK_ID"] == "stage/7"
    assert env["LEADTIME_ATTEMPT"] == "2"
    assert env["LEADTIME_CATEGORY"] == "cat"
    assert env["LEADTIME_CORES"] == "1.5"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "2"
    assert env["LEADTIME_MEMORY_MB"] == "2000000"
    assert env["LEADTIME_DISK_MB"] == "40"
    assert env["LEADTIME_SCRATCH"] == env["TMPDIR"] == str(sandbox)
    assert env["LEADTIME_WORKDIR"] == env["cwd"] == str(sandbox)  # no working directory given
    assert env["KEEP_ME"] == "yes"
    assert protocol.SECRET_ENV not in env


async def task_environment(
    root: Path, environ: dict[str, str], allocation: Resources, command: str = "env"
) -> dict:
    """The environment a task of ``allocation`` gets from a worker whose own is ``environ``
    (what ``command`` prints, ``env`` by default); the worker's root is left as it ends."""
    runner = Runner(RunnerConfig(root=root, keep_sandboxes="always"), Monitor(FAST), environ)
    task = AttemptSpec("t", 1, command, allocation)
    assert (await runner.run(task)).outcome is Outcome.SUCCESS
    lines = (runner.sandbox(task) / STDOUT).read_text().splitlines()
    shutil.rmtree(runner.sandbox(task))
    await runner.settle()
    return dict(line.split("=", 1) for line in lines if "=" in line)


async def test_a_tasks_own_srun_gets_the_tasks_share_in_a_slurm_job(tmp_path):
    """A worker's step (one task per node, holding each node's CPUs) hands its tasks srun
    variables of its shape and the job's memory per CPU: a task's `srun -n 2` would be told
    one task per node, 16 CPUs a task, and two kinds of memory (which srun refuses), and
    MPI launchers the pilot's nodes. In a Slurm job a task gets its own share of its own node
    instead, its step overlapping the others (srun's node from a host file, removed with the
    worker, in a pilot of several nodes); elsewhere nothing."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    pilot = {
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NODELIST": "n[1-2]",
        "SLURM_JOB_CPUS_PER_NODE": "16(x2)",
        "SLURM_CPUS_ON_NODE": "16",
        "SLURM_JOB_ID": "7",
        "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_CPUS_PER_TASK": "16",
        "SLURM_MEM_PER_CPU": "1000",
        "SLURM_MEM_PER_GPU": "100",
    }
    root = tmp_path / "in"
    show = 'env; echo "hosts=$(cat "$SLURM_HOSTFILE" | tr "\\n" " ")"'
    env = await task_environment(root, plain | pilot, Resources(2.5, 3000.7, 40), show)
    hostfile = str(root / ".slurm-hosts-3")
    assert env.pop("hosts") == "n2 n2 n2 "  # once a core: `srun`'s ranks, by default
    assert {k: v for k, v in env.items() if k.startswith("SLURM")} == {
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_NODELIST": "n2",
        "SLURM_NODELIST": "n2",
        "SLURM_JOB_CPUS_PER_NODE": "3",
        "SLURM_CPUS_ON_NODE": "3",
        "SLURM_DISTRIBUTION": "arbitrary",
        "SLURM_HOSTFILE": hostfile,
        "SLURM_JOB_ID": "7",
        "SLURM_OVERLAP": "1",
        "SLURM_NTASKS": "3",
        "SLURM_NPROCS": "3",
        "SLURM_NTASKS_PER_NODE": "3",
        "SLURM_TASKS_PER_NODE": "3",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_MEM_PER_NODE": "3000",
    }
    assert list(root.iterdir()) == []  # the host file went with the worker's end
    one = {**pilot, "SLURM_JOB_NODELIST": "n2", "SLURM_NODELIST": "n2", "SLURM_NNODES": "1"}
    one |= {"SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "2"}
    alone = await task_environment(tmp_path / "one", plain | one, Resources(2.5, 3000.7, 40))
    # a pilot of one node: its tasks' steps have nowhere else to go, and a job a task
    # submits is not bound to the node (sbatch reads SLURM_HOSTFILE)
    assert "SLURM_HOSTFILE" not in alone and "SLURM_DISTRIBUTION" not in alone
    assert alone["SLURM_JOB_NODELIST"] == "n2" and alone["SLURM_NTASKS"] == "3"
    outside = await task_environment(tmp_path / "out", plain, Resources(2.5, 3000.7, 40))
    assert not [k for k in outside if k.startswith("SLURM")]


async def test_a_python_without_posix_spawn_sessions_starts_tasks_with_subprocess(
    runner, tmp_path, monkeypatch
):
    """A Python built against a C library whose posix_spawn cannot start a session (glibc
    before 2.26) starts tasks with subprocess: in their working directory, a session of their
    own, their streams captured."""

    def no_setsid(*args, **kwargs):
        raise NotImplementedError("setsid is not supported on this platform")

    monkeypatch.setattr(os, "posix_spawn", no_setsid)
    monkeypatch.setattr(taskrun, "_SPAWN_SETSID", True)
    work = tmp_path / "work"
    work.mkdir()
    command = "echo cwd=$(pwd) pid=$$ sid=$(cut -d' ' -f6 /proc/$$/stat); echo oops >&2"
    for attempt in (0, 1):  # the second one goes straight to subprocess
        result = await runner.run(AttemptSpec("old", attempt, command, SMALL, workdir=str(work)))
        assert result.outcome is Outcome.SUCCESS
        said = dict(word.split("=") for word in result.stdout.head.split())
        assert said["cwd"] == str(work) and said["sid"] == said["pid"]
        assert result.stderr.head == "oops\n"
    assert not taskrun._SPAWN_SETSID


def test_sandbox_names_are_safe_and_distinct():
    assert sandbox_name("stage.12", 0) == "stage.12.0"
    assert "/" not in sandbox_name("a/b", 1)
    assert sandbox_name("a/b", 1) != sandbox_name("a_b", 1)
    assert not sandbox_name("..", 0).startswith(".")


async def test_templated_parameters_reach_the_task_verbatim(tmp_path):
    # Sandboxes kept: an injected `touch pwned` would leave its file in the task's sandbox (and
    # no removal runs in the background while the test looks).
    environ = {**os.environ, protocol.SECRET_ENV: SECRET.hex()}
    config = RunnerConfig(root=tmp_path / "sb", keep_sandboxes="always")
    runner = Runner(config, Monitor(FAST), environ=environ)
    hostile = ["x y; touch pwned", "$(touch pwned)", "`touch pwned`", 'it\'s "quoted"', "a\nb", ""]
    words = [render("{item}", stage="quote", index=0, item=value) for value in hostile]
    task = spec("quote", "printf '%s\\0' " + " ".join(words) + f" > {tmp_path}/out")
    result = await runner.run(task)
    assert result.outcome is Outcome.SUCCESS, result
    assert (tmp_path / "out").read_bytes().split(b"\0")[:-1] == [v.encode() for v in hostile]
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
async def test_a_task_is_pinned_to_its_cores(runner, tmp_path):
    cpu = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    task = spec("pin", f"grep Cpus_allowed_list /proc/self/status > {tmp_path}/cpus")
    assert (await runner.run(task, frozenset({cpu}))).outcome is Outcome.SUCCESS
    assert (tmp_path / "cpus").read_text().split()[-1] == str(cpu)
    assert os.sched_getaffinity(0) == before


def test_core_set_gives_whole_cores_their_own_and_shares_fractions():
    cores = CoreSet([0, 1, 2, 3])
    a = cores.take(2)
    b = cores.take(1)
    assert len(a) == 2 and len(b) == 1 and not a & b
    half = cores.take(0.5)
    other_half = cores.take(0.5)
    assert half == other_half and not half & (a | b)
    cores.give(a, 2)
    assert cores.take(2) == a
    assert cores.take(0) is None
    assert len(cores.take(16)) == 4


# --- capacity and options --------------------------------------------------------------------


def test_capacity_from_slurm(tmp_path):
    slurm = {"SLURM_CPUS_ON_NODE": "8", "SLURM_MEM_PER_NODE": "16000"}
    capacity = detect_capacity(slurm, tmp_path)
    assert (capacity.cores, capacity.memory) == (8, 16000)
    assert capacity.disk > 0
    per_cpu = {"SLURM_CPUS_ON_NODE": "4", "SLURM_MEM_PER_CPU": "1000"}
    assert detect_capacity(per_cpu, tmp_path).memory == 4000
    flags = detect_capacity(slurm, tmp_path, cores=2, memory=100, disk=10)
    assert flags == Resources(2, 100, 10)


def test_capacity_without_slurm_is_this_machine(tmp_path):
    capacity = detect_capacity({}, tmp_path)
    assert capacity.cores == len(os.sched_getaffinity(0))
    assert capacity.memory > 0


def test_bad_slurm_values_are_named(tmp_path):
    with pytest.raises(OptionsError, match="SLURM_CPUS_ON_NODE"):
        detect_capacity({"SLURM_CPUS_ON_NODE": "many"}, tmp_path)
    with pytest.raises(OptionsError, match="cores must be positive"):
        detect_capacity({}, tmp_path, cores=0)


def test_end_time_sources():
    assert detect_end_time({}, now=1000.0) is None
    assert detect_end_time({}, now=1000.0, time_limit_s=60) == 1060.0
    assert detect_end_time({"SLURM_JOB_START_TIME": "900"}, 1000.0, time_limit_s=60) == 960.0
    assert detect_end_time({"SLURM_JOB_END_TIME": "5000"}, 1000.0, time_limit_s=60) == 5000.0
    assert detect_end_time({"SLURM_JOB_END_TIME": "5000"}, 1000.0, end_time=7.0) == 7.0


def test_options_need_a_secret(tmp_path):
    with pytest.raises(OptionsError, match="no secret"):
        make_options("localhost:1234", root=tmp_path, environ={})
    with pytest.raises(OptionsError, match="HOST:PORT"):
        make_options("localhost", root=tmp_path, environ={protocol.SECRET_ENV: SECRET.hex()})


def test_options_from_flags_and_environment(tmp_path):
    environ = {protocol.SECRET_ENV: SECRET.hex(), "SLURM_JOB_ID": "77", "SLURM_CPUS_ON_NODE": "3"}
    options = make_options("node1:4000", root=tmp_path, memory=500, environ=environ)
    assert options.manager == ("node1", 4000)
    assert options.secret == SECRET
    assert (options.pilot_id, options.capacity.cores, options.capacity.memory) == ("77", 3, 500)
    assert SECRET.hex() not in repr(options)


def test_options_make_a_root_of_the_workers_own_and_nothing_when_refused(tmp_path):
    """A root that exists may be another worker's or another run's: the worker makes its
    own inside it. A refused option makes no directory at all."""
    environ = {protocol.SECRET_ENV: SECRET.hex()}
    fresh = tmp_path / "scratch" / "root"
    with pytest.raises(OptionsError, match="keep-budget"):
        make_options("h:1", root=fresh, keep_budget=-1, environ=environ)
    with pytest.raises(OptionsError, match="HOST:PORT"):
        make_options("h", root=fresh, environ=environ)
    assert not (tmp_path / "scratch").exists()
    assert make_options("h:1", root=fresh, environ=environ).root == fresh
    inside = make_options("h:1", root=fresh, worker_id="w", environ=environ).root
    assert inside.parent == fresh and inside.name.startswith("leadtime-w-")
    (tmp_path / "file").write_text("")
    with pytest.raises(OptionsError, match=r"sandbox root in .*file: Not a directory"):
        make_options("h:1", root=tmp_path / "file", environ=environ)


def test_main_reports_user_errors_without_a_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    assert main(["--manager", "localhost:1", "--root", str(tmp_path)]) == EXIT_USAGE
    assert "no secret" in capsys.readouterr().err


# --- agents and the manager ------------------------------------------------------------------


def options(address, root, worker_id="w1", capacity=None, **kw):
    return WorkerOptions(
        manager=address,
        secret=SECRET,
        root=root,
        worker_id=worker_id,
        capacity=capacity or Resources(3, 1000, 1000),
        kill_grace_s=0.5,
        monitor=FAST,
        **{"connect_timeout_s": 5.0, **kw},
    )


class Cluster:
    """A manager with in-process agents; joins and leaves recorded."""

    def __init__(self, tmp_path, **manager_options):
        self.tmp_path = tmp_path
        self.joined: asyncio.Queue = asyncio.Queue()
        self.left: asyncio.Queue = asyncio.Queue()
        self.manager = Manager(
            SECRET,
            heartbeat_s=0.1,
            timeout_s=0.6,
            on_join=self.joined.put_nowait,
            on_leave=lambda worker, reason: self.left.put_nowait((worker.id, reason)),
            **manager_options,
        )
        self.agents: list[asyncio.Task] = []

    async def __aenter__(self):
        await self.manager.start()
        return self

    async def __aexit__(self, *exc):
        for worker in list(self.manager.workers.values()):
            await worker.shutdown()
        await self.manager.close()
        await asyncio.gather(*self.agents, return_exceptions=True)

    async def agent(self, worker_id="w1", **kw):
        agent = Agent(options(self.manager.address, self.tmp_path / worker_id, worker_id, **kw))
        self.agents.append(asyncio.create_task(agent.serve()))
        worker = await asyncio.wait_for(self.joined.get(), 5)
        return agent, worker


async def until(condition, timeout):
    """Wait for ``condition()`` to hold, at most ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def timed(path, seconds=0.5):
    """A command that records when it ran."""
    return f"date +%s.%N >> {path}; sleep {seconds}; date +%s.%N >> {path}"


async def test_tasks_run_concurrently_within_capacity(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent(capacity=Resources(3, 1000, 1000))
        assert worker.capacity == Resources(3, 1000, 1000)
        tasks = [spec(f"t{i}", timed(tmp_path / f"t{i}")) for i in range(3)]
        results = await asyncio.gather(*(worker.run(t) for t in tasks))
        assert [r.outcome for r in results] == [Outcome.SUCCESS] * 3
        spans = [list(map(float, (tmp_path / f"t{i}").read_text().split())) for i in range(3)]
        assert max(start for start, _ in spans) < min(end for _, end in spans)


async def test_a_malformed_spec_is_refused_before_it_costs_the_connection(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent()
        with pytest.raises(ValueError, match="allocation"):
            await worker.run(spec("nan", "true", Resources(1, math.nan, 10)))
        with pytest.raises(ValueError, match="command"):
            await worker.run(spec("huge", "x" * (protocol.MAX_COMMAND + 1)))
        assert (await worker.run(spec("fine", "true"))).outcome is Outcome.SUCCESS


async def test_an_attempt_that_breaks_the_worker_fails_and_is_not_retried_as_lost(tmp_path):
    """A worker error is the attempt's failure, counted against the task's attempts: lost, it
    would be run again for ever (155,144 attempts in two minutes, once)."""
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent()

        async def broken(*args, **kwargs):
            raise RuntimeError("no such thing")

        agent.runner.run = broken
        result = await worker.run(spec("t", "true"))
        assert result.outcome is Outcome.FAILED
        assert "worker error: RuntimeError('no such thing')" in result.output_tail


async def test_attempts_sent_ahead_wait_and_start_in_the_order_they_came(tmp_path):
    """A full worker holds what it is sent until it has room, and starts it first come, first
    served; one larger than the worker is refused."""
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent(capacity=Resources(2, 1000, 1000))
        log = tmp_path / "order"
        sizes = {"busy": 2, "second": 1, "third": 2, "fourth": 1}
        runs = [
            worker.run(spec(name, f"echo {name} >> {log}; sleep 0.3", Resources(n, 100, 10)))
            for name, n in sizes.items()
        ]
        huge = await worker.run(spec("huge", "true", Resources(3, 100, 10)))
        assert huge.outcome is Outcome.FAILED
        assert "larger than the worker: cores 3 > 2" in huge.output_tail
        results = await asyncio.gather(*runs)
        assert [r.outcome for r in results] == [Outcome.SUCCESS] * 4
        # "fourth" fits beside "second" but waits behind "third": first come, first served.
        assert log.read_text().split() == list(sizes)
        assert all(r.peak.wall < 1.0 for r in results)  # each timed from its own start


async def test_an_attempt_waiting_is_cancelled_or_lost_with_its_worker(tmp_path):
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent(capacity=Resources(1, 1000, 1000))
        marker = tmp_path / "ran"
        busy = worker.run(spec("busy", "sleep 0.5"))
        cancelled = worker.run(spec("cancelled", f"touch {marker}"))
        dropped = worker.run(spec("dropped", f"touch {marker}"))
        await asyncio.sleep(0.2)
        assert list(agent.waiting) == [("cancelled", 0), ("dropped", 0)]
        cancelled.cancel()
        await asyncio.sleep(0.1)
        assert list(agent.waiting) == [("dropped", 0)]
        await worker.shutdown()
        assert (await busy).outcome is Outcome.LOST
        result = await dropped
        assert result.outcome is Outcome.LOST and "shut down" in result.output_tail
        assert not marker.exists()
        assert await cluster.agents[0] == 0


async def test_a_cancelled_head_of_the_queue_lets_what_fits_behind_it_start(tmp_path):
    """As the manager's copy of the queue assumes: the worker starts what waits as soon as
    room or the order allows it, a cancel included, not at the next attempt's end."""
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent(capacity=Resources(2, 1000, 1000))
        busy = worker.run(spec("busy", "sleep 1"))
        big = worker.run(spec("big", "true", Resources(2, 100, 10)))
        small = worker.run(spec("small", "true"))
        await asyncio.sleep(0.2)
        assert list(agent.waiting) == [("big", 0), ("small", 0)]
        big.cancel()
        assert (await asyncio.wait_for(small, 0.5)).outcome is Outcome.SUCCESS
        assert not busy.done()
        assert (await busy).outcome is Outcome.SUCCESS


async def test_a_draining_worker_runs_what_waits_then_leaves(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent(capacity=Resources(1, 1000, 1000))
        runs = [worker.run(spec(f"t{i}", "sleep 0.2")) for i in range(2)]
        await asyncio.sleep(0.1)
        reason = await worker.drain()
        assert [r.outcome for r in await asyncio.gather(*runs)] == [Outcome.SUCCESS] * 2
        assert reason.startswith("released") and await cluster.agents[0] == 0


async def test_many_short_tasks_on_two_workers(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, first = await cluster.agent("a")
        _, second = await cluster.agent("b")
        workers = [first, second]
        tasks = [spec(f"t{i}", f"echo {i}", Resources(0.02, 9, 1)) for i in range(200)]
        results = await asyncio.gather(*(workers[i % 2].run(t) for i, t in enumerate(tasks)))
        assert all(r.outcome is Outcome.SUCCESS for r in results)
        assert [r.task_id for r in results] == [t.task_id for t in tasks]


async def test_cancelling_a_run_kills_the_attempt(tmp_path):
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent()
        marker = tmp_path / "finished"
        run = worker.run(spec("long", f"sleep 2; touch {marker}"))
        await asyncio.sleep(0.2)
        assert agent.runner.running == 1
        run.cancel()
        for _ in range(100):
            if agent.runner.running == 0:
                break
            await asyncio.sleep(0.02)
        assert agent.runner.running == 0
        assert worker.running == 0 and not marker.exists()
        assert (await worker.run(spec("next", "true"))).outcome is Outcome.SUCCESS


async def test_drain_lets_running_tasks_finish(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent()
        running = worker.run(spec("t", "sleep 0.3"))
        await asyncio.sleep(0.1)
        reason = await worker.drain()
        assert (await running).outcome is Outcome.SUCCESS
        assert reason.startswith("released")
        assert await cluster.agents[0] == 0
        assert (await worker.run(spec("late", "true"))).outcome is Outcome.LOST
        assert await cluster.left.get() == ("w1", reason)


async def test_shutdown_kills_running_tasks_as_lost(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent()
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(0.2)
        await worker.shutdown()
        result = await running
        assert result.outcome is Outcome.LOST and not result.vanished
        assert "shut down" in result.output_tail
        assert await cluster.agents[0] == 0


async def test_a_task_killed_with_its_worker_is_lost_and_one_killed_alone_failed(tmp_path):
    """The batch system stopping a job signals the task and the worker at once; the task may
    die first. It is lost then, as if the worker had stopped it; a task killed alone failed."""
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent()
        alone = await worker.run(spec("alone", "kill -TERM $$"))
        assert (alone.outcome, alone.exit_code) == (Outcome.FAILED, -signal.SIGTERM)
        with_worker = worker.run(spec("job", "kill -TERM $$"))
        await asyncio.sleep(0.3)  # the task is dead; the worker's own signal comes late
        agent.shutdown("SIGTERM")
        result = await with_worker
        assert (result.outcome, result.exit_code) == (Outcome.LOST, -signal.SIGTERM)
        assert "[leadtime] stopped: worker shut down: SIGTERM" in result.output_tail


async def test_a_shell_whose_command_was_killed_with_its_worker_is_lost_too(tmp_path):
    """A shell tells that its command died of SIGTERM by exiting 143 (128 + 15): the task's
    own exit when Slurm stops a job. With the worker stopping it is lost, not failed."""
    command = "sh -c 'kill -TERM $$'; exit $?"
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent()
        alone = await worker.run(spec("alone", command))
        assert (alone.outcome, alone.exit_code) == (Outcome.FAILED, 128 + signal.SIGTERM)
        with_worker = worker.run(spec("job", command))
        await asyncio.sleep(0.3)
        agent.shutdown("SIGTERM")
        result = await with_worker
        assert (result.outcome, result.exit_code) == (Outcome.LOST, 128 + signal.SIGTERM)
        assert "[leadtime] stopped: worker shut down: SIGTERM" in result.output_tail


async def test_strangers_are_refused_and_the_run_goes_on(tmp_path):
    async with Cluster(tmp_path, handshake_timeout_s=1.0) as cluster:
        _, worker = await cluster.agent()
        running = worker.run(spec("during", "sleep 0.5"))
        host, port = cluster.manager.address

        await intrude((host, port), timeout=2)

        assert (await running).outcome is Outcome.SUCCESS
        assert (await worker.run(spec("after", "true"))).outcome is Outcome.SUCCESS
        assert list(cluster.manager.workers) == ["w1"]
        for _ in range(50):  # the intruder's own close is noticed a moment later
            if cluster.manager.rejected == 3:
                break
            await asyncio.sleep(0.02)
        assert cluster.manager.rejected == 3


async def test_a_worker_drains_before_its_pilot_ends(tmp_path):
    """A tenth of its time at most: a worker of a pilot shorter than the minute's margin
    drains before its end, not from its start."""
    async with Cluster(tmp_path) as cluster:
        end = clock.wall() + 4.0
        _, worker = await cluster.agent(end_time=end, drain_margin_s=60.0)
        assert worker.end_time == pytest.approx(clock.now() + 4.0, abs=0.2)
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(3.0)
        assert worker.accepting
        await until(lambda: worker.draining, 0.9)
        assert not worker.accepting
        assert (await worker.run(spec("late", "true"))).outcome is Outcome.LOST
        result = await running  # still running at the end
        assert result.outcome is Outcome.LOST and "time is up" in result.output_tail
        assert await cluster.agents[0] == 0
        assert (await cluster.left.get())[1] == "released: the pilot ends soon"


async def test_a_worker_that_began_to_leave_while_no_manager_listened_finishes_its_attempt(
    tmp_path,
):
    """The attempt runs to its end and its result reaches the manager that resumes the run,
    which is told the worker drains: else it would send it tasks, each refused and sent again
    at once."""
    manager_file = tmp_path / "manager"
    async with Cluster(tmp_path) as cluster:
        manager_file.write_text(f"127.0.0.1:{cluster.manager.address[1]}")
        agent, worker = await cluster.agent(manager_file=manager_file)
        running = worker.run(spec("slow", "sleep 1.5"))
        await asyncio.sleep(0.2)
        await cluster.manager.close()  # the manager dies
        await running
        agent.drain("the pilot ends soon")
        await asyncio.sleep(0.2)
        assert agent.runner.running == 1
        left = asyncio.Queue()
        resumed = Manager(
            SECRET,
            heartbeat_s=0.1,
            reattach_s=5.0,
            on_leave=lambda worker, reason: left.put_nowait((worker, reason)),
        )
        key = ("slow", 0)
        follow = followed(resumed.expect("w1"), key, clock.now())
        async with resumed:
            manager_file.write_text(f"127.0.0.1:{resumed.address[1]}")
            assert (await asyncio.wait_for(follow, 10)).outcome is Outcome.SUCCESS
            worker, reason = await asyncio.wait_for(left.get(), 5)
            assert worker.draining and reason == "released: the pilot ends soon"
        assert await cluster.agents[0] == 0


async def test_a_worker_reconnects_to_a_new_manager(tmp_path):
    """A manager that knows nothing of the attempt the worker kept running cancels it."""
    async with Cluster(tmp_path) as cluster:
        agent, worker = await cluster.agent()
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(0.2)
        port = cluster.manager.address[1]
        await cluster.manager.close()
        result = await running
        assert result.outcome is Outcome.LOST and not result.vanished
        assert agent.runner.running == 1  # the worker keeps it while it looks for a manager
        joined = asyncio.Queue()
        async with Manager(SECRET, port=port, heartbeat_s=0.1, on_join=joined.put_nowait):
            worker = await asyncio.wait_for(joined.get(), 5)
            assert (await worker.run(spec("next", "true"))).outcome is Outcome.SUCCESS
            await until(lambda: agent.runner.running == 0, 5)  # stopped, if not before `true`
            await worker.shutdown()
        assert await cluster.agents[0] == 0


async def test_a_worker_back_within_the_grace_keeps_its_attempt(tmp_path):
    """A dropped connection: the manager waits for the worker, whose attempt carries on and
    whose result arrives once it is back; nothing is lost, nothing runs twice."""
    async with Cluster(tmp_path, reattach_s=10.0) as cluster:
        agent, worker = await cluster.agent()
        done = tmp_path / "done"
        running = worker.run(spec("t", f"sleep 1; echo x >> {done}"))
        await asyncio.sleep(0.3)
        agent._channel.writer.transport.abort()  # the network drops the connection
        result = await asyncio.wait_for(running, 10)
        assert result.outcome is Outcome.SUCCESS
        assert done.read_text() == "x\n"
        assert cluster.left.empty()
        await worker.shutdown()


async def test_a_resuming_manager_takes_over_what_its_workers_ran(tmp_path):
    """The manager died: its worker keeps its attempts; a new manager that expects them gets
    the result of the one that ended meanwhile, follows the one still running, and the one
    the worker never had comes back lost."""
    manager_file = tmp_path / "manager"
    async with Cluster(tmp_path) as cluster:
        manager_file.write_text(f"127.0.0.1:{cluster.manager.address[1]}")
        _, worker = await cluster.agent(manager_file=manager_file)
        quick = worker.run(spec("quick", "sleep 0.3"))
        slow = worker.run(spec("slow", "sleep 1.5"))
        await asyncio.sleep(0.1)
        await cluster.manager.close()  # the manager dies
        await asyncio.gather(quick, slow)
        await asyncio.sleep(0.5)  # quick ends while no manager listens
        resumed = Manager(SECRET, heartbeat_s=0.1, reattach_s=5.0)
        now = clock.now()
        keys = (("quick", 0), ("slow", 0), ("never", 0))
        follows = [followed(resumed.expect("w1"), key, now) for key in keys]
        async with resumed:
            manager_file.write_text(f"127.0.0.1:{resumed.address[1]}")
            results = {r.task_id: r for r in await asyncio.wait_for(asyncio.gather(*follows), 10)}
            assert results["quick"].outcome is Outcome.SUCCESS
            assert results["slow"].outcome is Outcome.SUCCESS
            assert results["never"].outcome is Outcome.LOST
            assert "no longer ran it" in results["never"].output_tail
            await resumed.workers["w1"].shutdown()


async def test_a_resuming_manager_takes_over_an_attempt_still_waiting(tmp_path):
    """What a worker holds ahead is its own: a manager resuming the run follows it as it
    follows what runs, and it runs once."""
    manager_file = tmp_path / "manager"
    log = tmp_path / "ran"
    async with Cluster(tmp_path) as cluster:
        manager_file.write_text(f"127.0.0.1:{cluster.manager.address[1]}")
        agent, worker = await cluster.agent(
            capacity=Resources(1, 1000, 1000), manager_file=manager_file
        )
        runs = [
            worker.run(spec(name, f"sleep 0.8; echo {name} >> {log}")) for name in ("first", "next")
        ]
        await asyncio.sleep(0.2)
        await cluster.manager.close()  # the manager dies
        await asyncio.gather(*runs)
        assert list(agent.waiting) == [("next", 0)]
        resumed = Manager(SECRET, heartbeat_s=0.1, reattach_s=5.0)
        now = clock.now()
        keys = (("first", 0), ("next", 0))
        follows = [followed(resumed.expect("w1"), key, now) for key in keys]
        async with resumed:
            manager_file.write_text(f"127.0.0.1:{resumed.address[1]}")
            results = await asyncio.wait_for(asyncio.gather(*follows), 10)
            assert [r.outcome for r in results] == [Outcome.SUCCESS] * 2
            assert log.read_text().split() == ["first", "next"]
            await resumed.workers["w1"].shutdown()


async def test_a_worker_that_leaves_is_heard_gone_before_its_attempts_come_back_lost():
    """In that order, the engine does not take an attempt that waited on the worker for one
    that ran there when the running one's room frees (a node's crash would count against it)."""
    heard = []
    manager = Manager(SECRET, reattach_s=0.05, on_leave=lambda worker, why: heard.append(why))
    now = clock.now()
    for key in (("running", 0), ("waiting", 0)):
        manager.expect("w1").follow(key, now, lambda result: heard.append(result.task_id))
    await asyncio.sleep(0.3)
    assert heard == ["did not come back", "running", "waiting"]


async def test_a_worker_gives_up_without_a_manager(tmp_path):
    async with Cluster(tmp_path) as cluster:
        _, worker = await cluster.agent(connect_timeout_s=0.5)
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(0.2)
        await cluster.manager.close()
        assert (await running).outcome is Outcome.LOST
        assert await asyncio.wait_for(cluster.agents[0], 5) == EXIT_MANAGER_GONE


# --- worker processes ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_worker(address, tmp_path, *extra, env=None, secret_file=None):
    args = [
        "--manager",
        f"{address[0]}:{address[1]}",
        "--root",
        str(tmp_path / "worker"),
        "--cores",
        "2",
        "--memory",
        "1000",
        "--disk",
        "1000",
        "--sample-interval",
        "0.2",
        "--first-sample",
        "0.05",
        "--connect-timeout",
        "5",
        *extra,
    ]
    if secret_file is not None:
        args += ["--secret-file", str(secret_file)]
    environ = {k: v for k, v in os.environ.items() if k != protocol.SECRET_ENV}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator.agent.worker", *args, env={**environ, **(env or {})}
    )


@contextlib.asynccontextmanager
async def process_cluster(tmp_path, **kw):
    cluster = Cluster(tmp_path, **kw)
    async with cluster:
        process = await start_worker(
            cluster.manager.address, tmp_path, env={protocol.SECRET_ENV: SECRET.hex()}
        )
        try:
            worker = await asyncio.wait_for(cluster.joined.get(), 10)
            yield cluster, process, worker
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_a_killed_worker_process_loses_its_running_attempts(tmp_path):
    """Each attempt a vanished worker held is lost, vanished, naming the other tasks it held:
    any of them may have taken it down."""
    async with process_cluster(tmp_path, reattach_s=0.5) as (cluster, process, worker):
        assert worker.pid == process.pid
        assert (await worker.run(spec("first", "true"))).outcome is Outcome.SUCCESS
        running = [worker.run(spec(name, "sleep 30")) for name in ("t", "u")]
        await asyncio.sleep(0.3)
        process.send_signal(signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*running), 5)
        for result, other in zip(results, ("u", "t"), strict=True):
            assert result.outcome is Outcome.LOST and result.vanished  # it may be the cause
            assert result.beside == {other}
            assert "disconnected" in result.output_tail
        assert (await cluster.left.get())[0] == worker.id


async def test_a_killed_worker_s_attempt_is_lost_when_its_pilot_ends_and_says_so(tmp_path):
    """The pilot of a worker that vanished ends before the worker's absence is given up:
    its attempts are lost then, vanished, with both causes said in that order."""
    async with process_cluster(tmp_path, reattach_s=60) as (cluster, process, worker):
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(0.3)
        process.send_signal(signal.SIGKILL)
        await process.wait()
        for _ in range(500):  # its connection is seen closed
            if worker.id not in cluster.manager.workers:
                break
            await asyncio.sleep(0.01)
        await worker.shutdown("its pilot ended")
        result = await asyncio.wait_for(running, 5)
        assert result.outcome is Outcome.LOST and result.vanished
        assert result.output_tail.endswith(", then its pilot ended")


async def test_a_frozen_worker_misses_heartbeats_and_is_lost(tmp_path):
    async with process_cluster(tmp_path, reattach_s=0.5) as (cluster, process, worker):
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(0.3)
        process.send_signal(signal.SIGSTOP)
        try:
            result = await asyncio.wait_for(running, 5)
        finally:
            process.send_signal(signal.SIGKILL)
            process.send_signal(signal.SIGCONT)
        assert result.outcome is Outcome.LOST and result.vanished
        assert "missed heartbeats" in result.output_tail
        assert cluster.manager.workers == {}


async def test_sigterm_releases_a_worker_cleanly(tmp_path):
    async with process_cluster(tmp_path) as (cluster, process, worker):
        running = worker.run(spec("t", "sleep 30"))
        await asyncio.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        result = await asyncio.wait_for(running, 5)
        assert result.outcome is Outcome.LOST and not result.vanished  # it said why
        assert "SIGTERM" in result.output_tail
        assert await asyncio.wait_for(process.wait(), 5) == 0
        assert "released" in (await cluster.left.get())[1]


async def test_a_worker_with_a_secret_file_joins_and_a_wrong_one_is_refused(tmp_path):
    good = protocol.write_secret(tmp_path / "good", SECRET)
    bad = protocol.write_secret(tmp_path / "bad", bytes(32))
    async with Cluster(tmp_path) as cluster:
        intruder = await start_worker(cluster.manager.address, tmp_path, secret_file=bad)
        assert await asyncio.wait_for(intruder.wait(), 10) == EXIT_REFUSED
        assert cluster.manager.workers == {}
        process = await start_worker(cluster.manager.address, tmp_path, secret_file=good)
        worker = await asyncio.wait_for(cluster.joined.get(), 10)
        result = await worker.run(spec("t", "echo $LEADTIME_SECRET; exit 1"))
        assert SECRET.hex() not in result.output_tail
        await worker.shutdown()
        assert await asyncio.wait_for(process.wait(), 5) == 0


async def test_a_worker_leaves_nothing_on_the_nodes_scratch(tmp_path):
    """The sandbox root it made goes when it leaves; a failed attempt's scratch is in the
    run's directory, where the result said."""
    async with Cluster(tmp_path) as cluster:
        kept = tmp_path / "run" / "kept"
        process = await start_worker(
            cluster.manager.address, tmp_path, "--keep-to", str(kept), env=SECRET_ENVIRON
        )
        worker = await asyncio.wait_for(cluster.joined.get(), 10)
        result = await worker.run(spec("t", "echo oops >&2; exit 1"))
        assert result.sandbox == str(kept / "t.0")
        await worker.shutdown()
        assert await asyncio.wait_for(process.wait(), 5) == 0
        assert (kept / "t.0" / taskrun.STDERR).read_text() == "oops\n"
        assert not (tmp_path / "worker").exists()


async def test_a_killed_worker_leaves_no_sandbox_on_the_nodes_scratch(tmp_path):
    """SIGKILL of a worker (the OOM killer, a task that kills it) leaves its attempts'
    sandboxes behind: its sentinel removes them with the root the worker made, once its
    tasks are dead. In a root that existed, the worker made a directory of its own: that
    goes, and what else was in the root stays."""
    for made in (True, False):
        root = tmp_path / "worker"
        if not made:
            root.mkdir()
            (root / "t.0").mkdir()  # another's sandbox of the same name
            (root / "t.0" / "theirs").write_text("mine\n")
        async with Cluster(tmp_path) as cluster:
            kept = tmp_path / "run" / "kept"
            process = await start_worker(
                cluster.manager.address, tmp_path, "--keep-to", str(kept), env=SECRET_ENVIRON
            )
            worker = await asyncio.wait_for(cluster.joined.get(), 10)
            running = worker.run(spec("t", "sleep 30"))
            for _ in range(100):  # its sandbox is made
                if list(root.glob("**/t.0/leadtime.stdout")):
                    break
                await asyncio.sleep(0.05)
            (sandbox,) = (p.parent for p in root.glob("**/t.0/leadtime.stdout"))
            assert (sandbox.parent == root) is made
            process.send_signal(signal.SIGKILL)
            await process.wait()
            running.cancel()
        for _ in range(100):  # the sentinel works once the worker is dead
            if not sandbox.exists():
                break
            await asyncio.sleep(0.05)
        assert not sandbox.parent.exists()
        if not made:  # not the worker's to remove, nor what was in it
            assert [p.name for p in root.iterdir()] == ["t.0"]
            assert (root / "t.0" / "theirs").read_text() == "mine\n"
            shutil.rmtree(root)


@pytest.mark.parametrize("keep", ["failure", "never"])
async def test_a_killed_worker_without_keep_to_leaves_only_its_kept_sandboxes(tmp_path, keep):
    """Without ``--keep-to``, failed attempts' sandboxes are kept under the root: SIGKILL of
    the worker leaves them (and the attempt it cut short, as its own end would), while its
    sentinel removes the spare sandboxes, kept for the worker alone; where none is kept, the
    root goes whole."""
    root = tmp_path / "worker"
    async with Cluster(tmp_path) as cluster:
        process = await start_worker(
            cluster.manager.address, tmp_path, "--keep-sandboxes", keep, env=SECRET_ENVIRON
        )
        worker = await asyncio.wait_for(cluster.joined.get(), 10)
        assert (await worker.run(spec("bad", "echo oops >&2; exit 1"))).outcome is Outcome.FAILED
        running = worker.run(spec("cut", "sleep 30"))
        for _ in range(100):  # its sandbox is made
            if (root / "cut.0").exists():
                break
            await asyncio.sleep(0.05)
        assert (await worker.run(spec("ok", "true"))).outcome is Outcome.SUCCESS  # a spare
        assert any(p.name.startswith(taskrun.SPARE) for p in root.iterdir())
        process.send_signal(signal.SIGKILL)
        await process.wait()
        running.cancel()

    def left() -> list[str]:
        return sorted(p.name for p in root.iterdir()) if root.exists() else []

    expected = [] if keep == "never" else ["bad.0", "cut.0"]
    for _ in range(100):  # the sentinel works once the worker is dead
        if left() == expected:
            break
        await asyncio.sleep(0.05)
    assert left() == expected
    assert root.exists() is bool(expected)
    if expected:
        assert (root / "bad.0" / taskrun.STDERR).read_text() == "oops\n"


async def test_a_worker_process_without_a_manager_exits(tmp_path):
    address = ("127.0.0.1", free_port())
    process = await start_worker(
        address, tmp_path, "--connect-timeout", "0.5", env={protocol.SECRET_ENV: SECRET.hex()}
    )
    started = time.monotonic()
    assert await asyncio.wait_for(process.wait(), 10) == EXIT_MANAGER_GONE
    assert time.monotonic() - started < 5


def test_the_secret_cannot_be_given_on_the_command_line(capsys):
    assert main(["--manager", "localhost:1", "--secret", SECRET.hex()]) == EXIT_USAGE
    assert "No such option: --secret" in capsys.readouterr().err


async def test_children_are_reaped_on_sigchld_where_pidfds_are_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(taskrun, "_pidfd_works", lambda: False)  # a kernel older than 5.3
    runner = Runner(RunnerConfig(root=tmp_path), Monitor(FAST))
    tasks = [spec(f"ok{i}", "true") for i in range(30)]
    tasks += [spec("bad", "exit 4"), spec("slow", "sleep 30", Resources(1, 200, 50, 0.3))]
    results = {r.task_id: r for r in await asyncio.gather(*(runner.run(t) for t in tasks))}
    assert all(results[f"ok{i}"].outcome is Outcome.SUCCESS for i in range(30))
    assert (results["bad"].outcome, results["bad"].exit_code) == (Outcome.FAILED, 4)
    assert results["slow"].exhaustion.resource == "wall"
