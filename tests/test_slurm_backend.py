"""SlurmBackend against the real Slurm of ``scripts/slurm-local up`` (its default partition).

Every test names its jobs with a fresh prefix and cancels whatever carries it at the end,
pass or fail. The node declares 16 CPUs; background jobs take all of them to make pilots wait.
"""

import asyncio
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from shutil import which

import pytest

from backends import clock
from backends.base import (
    Dependency,
    JobInfo,
    JobState,
    NodeShare,
    PilotRequest,
    SubmitError,
    WorkerLaunch,
)
from backends.slurm.backend import Backoff, SlurmBackend, SlurmCommands, SlurmError
from backends.slurm.jobs import parse_scontrol, parse_squeue_json

pytestmark = pytest.mark.slurm

NODE_CPUS = 16
# A worker: says which part of the node it holds, then waits to be released. Its trap
# kills the sleep too: a SIGTERM that lands between the sleep's fork and exec is caught by
# the shell's inherited handler and lost, and the sleep would hold the step's output open
# (slurmstepd then waits 60 s before it abandons the I/O; seen once on Slurm 22.05).
SHARE = (
    "import os; from orchestrator.agent.worker import node_share_from_env as share; "
    "print(share(os.environ))"
)
WORKER = WorkerLaunch(
    (
        "bash",
        "-c",
        f"trap 'kill $! 2>/dev/null; echo released; exit 0' TERM; {sys.executable} -c '{SHARE}'; "
        "sleep 600 >/dev/null & wait",
    )
)


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


class Jobs:
    """Names for one test's jobs, every update the backend reports, and the cleanup."""

    def __init__(self, backend: SlurmBackend) -> None:
        self.backend = backend
        self.prefix = f"ltt-{uuid.uuid4().hex[:8]}"
        self.comment = f"test {self.prefix}"
        self.seen: dict[str, list[JobInfo]] = {}
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    def request(self, suffix: str, cores: int = 2, **fields) -> PilotRequest:
        fields.setdefault("time_limit_s", 300)
        return PilotRequest(
            name=f"{self.prefix}-{suffix}", cores=cores, comment=self.comment, **fields
        )

    def background(self, suffix: str, cpus: int, seconds: int) -> str:
        """A plain ``sbatch --wrap`` job holding ``cpus`` CPUs for ``seconds``."""
        out = sh(
            "sbatch", "--parsable", f"--job-name={self.prefix}-{suffix}", "--output=/dev/null",
            f"--ntasks={cpus}", "--mem-per-cpu=100", f"--wrap=sleep {seconds}",
        )  # fmt: skip
        return out.strip()

    async def _read(self) -> None:
        async for info in self.backend.updates():
            async with self._changed:
                self.seen.setdefault(info.job_id, []).append(info)
                self._changed.notify_all()

    async def until(
        self, job_id: str, done: Callable[[JobInfo], bool], timeout: float = 60
    ) -> JobInfo:
        """The first update of ``job_id`` for which ``done`` holds."""

        def found() -> JobInfo | None:
            return next((i for i in self.seen.get(job_id, ()) if done(i)), None)

        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(found), timeout)
        except TimeoutError:
            story = self.story(job_id)
            raise AssertionError(f"job {job_id} after {timeout:g} s: {story}") from None
        info = found()
        assert info is not None
        return info

    def story(self, job_id: str) -> str:
        """What the backend reported of ``job_id`` and what slurmctld says of it now."""
        seen = "; ".join(f"{i.state.name} ({i.reason})" for i in self.seen.get(job_id, ()))
        now = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60
        )
        return f"updates: {seen or 'none'}\nscontrol show job:\n{now.stdout}{now.stderr}"

    async def state(self, job_id: str, state: JobState, timeout: float = 60) -> JobInfo:
        return await self.until(job_id, lambda i: i.state is state, timeout)

    def queued(self) -> list[str]:
        """Ids of this test's jobs that slurmctld lists as pending or running."""
        lines = sh("squeue", "--noheader", "--format=%i %j %T").splitlines()
        return [
            job_id
            for job_id, name, state in (line.split() for line in lines)
            if name.startswith(self.prefix) and state in ("PENDING", "RUNNING", "COMPLETING")
        ]

    async def close(self) -> None:
        await self.backend.close()
        await self._reader
        ids = self.queued()
        if ids:
            subprocess.run(["scancel", *ids], check=False, timeout=60)


@pytest.fixture
async def jobs(tmp_path: Path):
    backend = SlurmBackend(
        WORKER,
        tmp_path / "run",
        poll_interval_s=0.5,
        release_resend_s=2,
        backoff=Backoff(first_s=1, max_s=4, give_up_s=120),
        commands=SlurmCommands(timeout_s=30),
    )
    jobs = Jobs(backend)
    yield jobs
    await jobs.close()


def output(jobs: Jobs, name: str, job_id: str) -> str:
    path = jobs.backend.run_dir / f"{name}-{job_id}.out"
    return path.read_text() if path.exists() else ""


async def output_shows(jobs: Jobs, name: str, job_id: str, text: str, timeout: float = 10) -> bool:
    for _ in range(int(timeout / 0.2)):
        if text in output(jobs, name, job_id):
            return True
        await asyncio.sleep(0.2)
    return False


async def started(backend: SlurmBackend, job_id: str) -> None:
    """Wait up to 60 s for the job of a backend of the test's own to leave PENDING (the node
    may still be freed of the previous test's jobs); it must then be RUNNING."""
    for _ in range(120):
        if (info := await backend.info(job_id)).state is not JobState.PENDING:
            break
        await asyncio.sleep(0.5)
    assert info.state is JobState.RUNNING, info


async def test_pilot_runs_one_worker_and_release_completes_it(jobs):
    request = jobs.request("pilot", cores=3, memory_mb=1500)
    asked = clock.now()
    job_id = await jobs.backend.submit(request)

    running = await jobs.state(job_id, JobState.RUNNING)
    host = running.nodes[0].node
    assert running.nodes == (NodeShare(host, cores=3, memory_mb=1500),)
    # Unix times cross to the loop's clock microseconds apart: moments compare to a millisecond
    assert asked - 1e-3 <= running.submit_time <= running.eligible_time <= running.start_time
    assert 0 <= running.wait < 10
    share = f"NodeShare(node='{host}', cores=3, memory_mb=1500)"
    assert await output_shows(jobs, request.name, job_id, share)

    released = clock.now()
    await jobs.backend.release(job_id)
    done = await jobs.state(job_id, JobState.COMPLETED)
    assert done.start_time == pytest.approx(running.start_time, abs=0.01)
    # Slurm's end time is whole seconds, cut down: not before we saw it running, though
    assert done.end_time >= released - 1e-3
    assert done.nodes == ()
    assert await output_shows(jobs, request.name, job_id, "released")
    assert (await jobs.backend.info(job_id)).state is JobState.COMPLETED


async def test_dependent_pilot_waits_for_release_then_starts(jobs):
    first = await jobs.backend.submit(jobs.request("first", cores=4, nodes=1))
    second = await jobs.backend.submit(
        jobs.request("second", cores=2, nodes=1, dependency=Dependency("afterok", (first,)))
    )
    await jobs.state(first, JobState.RUNNING)
    waiting = await jobs.until(second, lambda i: i.reason == "Dependency")
    assert waiting.state is JobState.PENDING
    assert waiting.eligible_time is None and waiting.start_time is None

    await jobs.backend.release(first)
    ended = await jobs.state(first, JobState.COMPLETED)
    started = await jobs.state(second, JobState.RUNNING)
    assert started.eligible_time >= ended.end_time - 1  # Slurm's times are whole seconds
    assert 0 <= started.wait < 30, jobs.story(second)
    assert started.nodes[0].cores == 2
    await jobs.backend.release(second)
    await jobs.state(second, JobState.COMPLETED)


async def test_pilot_waits_behind_background_jobs(jobs):
    jobs.background("load", cpus=NODE_CPUS, seconds=6)
    await asyncio.sleep(1)
    pilot = await jobs.backend.submit(jobs.request("pilot", cores=2))

    pending = await jobs.until(pilot, lambda i: i.reason in ("Resources", "Priority"))
    assert pending.state is JobState.PENDING and pending.eligible_time is not None
    running = await jobs.state(pilot, JobState.RUNNING)
    assert 3 <= running.wait <= 30, jobs.story(pilot)
    await jobs.backend.release(pilot)
    await jobs.state(pilot, JobState.COMPLETED)


async def test_cancel_pending_and_running(jobs):
    running = await jobs.backend.submit(jobs.request("running"))
    pending = await jobs.backend.submit(
        jobs.request("pending", dependency=Dependency("afterok", (running,)))
    )
    await jobs.state(running, JobState.RUNNING)
    await jobs.backend.cancel(pending)
    await jobs.backend.cancel(running)

    never_ran = await jobs.state(pending, JobState.CANCELLED)
    assert never_ran.start_time is None
    ran = await jobs.state(running, JobState.CANCELLED)
    assert ran.start_time is not None and ran.end_time >= ran.start_time
    assert jobs.queued() == []


async def test_release_of_pending_pilot_cancels_it(jobs):
    jobs.background("load", cpus=NODE_CPUS, seconds=30)
    pilot = await jobs.backend.submit(jobs.request("pilot"))
    await jobs.state(pilot, JobState.PENDING)
    await jobs.backend.release(pilot)
    assert (await jobs.state(pilot, JobState.CANCELLED)).start_time is None


async def test_worker_without_term_handler_still_ends_completed(jobs, tmp_path):
    backend = SlurmBackend(WorkerLaunch(("sleep", "600")), tmp_path / "bare", poll_interval_s=0.5)
    job_id = await backend.submit(jobs.request("bare"))
    try:
        await started(backend, job_id)
        await asyncio.sleep(2)  # its worker runs
        await backend.release(job_id)
        for _ in range(40):
            if (info := await backend.info(job_id)).state.finished:
                break
            await asyncio.sleep(0.5)
        assert info.state is JobState.COMPLETED
    finally:
        await backend.close()


async def test_lost_release_signal_is_sent_again(jobs, tmp_path):
    """A release signal sent before the job step exists is lost; the backend repeats it."""
    calls = tmp_path / "scancel-calls"
    drop_first_signal = tmp_path / "scancel"
    drop_first_signal.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {calls}\n'
        f"if [[ $1 == --signal=* && $(grep -c -- --signal {calls}) == 1 ]]; then exit 0; fi\n"
        'exec scancel "$@"\n'
    )
    drop_first_signal.chmod(0o755)
    backend = jobs.backend
    backend.commands = SlurmCommands(scancel=str(drop_first_signal))
    job_id = await backend.submit(jobs.request("pilot"))
    await jobs.state(job_id, JobState.RUNNING)
    await backend.release(job_id)
    await jobs.state(job_id, JobState.COMPLETED, timeout=20)
    assert calls.read_text().count("--signal=TERM") == 2


async def test_release_of_a_pilot_that_ended_unseen_is_done_and_its_end_reported(jobs, tmp_path):
    """Slurm answers "Invalid job id" to a signal for a job that has ended (a plain scancel it
    accepts), while the backend may still see the job running: its release is done, not an
    error (one ended that way stopped a run's shutdown and left its other pilots running)."""
    last, frozen = tmp_path / "squeue-last", tmp_path / "squeue-frozen"
    lagging = tmp_path / "squeue"
    lagging.write_text(
        f'#!/bin/bash\nif [[ -f {frozen} ]]; then cat {frozen}; else squeue "$@" | tee {last}; fi\n'
    )
    lagging.chmod(0o755)
    backend = jobs.backend
    backend.commands = SlurmCommands(squeue=str(lagging), timeout_s=30)
    job_id = await backend.submit(jobs.request("pilot"))
    await jobs.state(job_id, JobState.RUNNING)
    frozen.write_bytes(last.read_bytes())  # the backend's view stops here: the job runs
    sh("scancel", job_id)
    for _ in range(120):
        if "JobState=CANCELLED" in sh("scontrol", "show", "job", "-o", job_id):
            break
        await asyncio.sleep(0.5)
    refused = subprocess.run(["scancel", "--signal=TERM", job_id], capture_output=True, text=True)
    assert "invalid job id" in refused.stderr.lower()  # what Slurm answers the release
    await backend.release(job_id)
    frozen.unlink()
    assert (await jobs.state(job_id, JobState.CANCELLED)).end_time is not None


async def test_release_ignored_by_worker_ends_in_cancel(jobs, tmp_path):
    stubborn = WorkerLaunch(("bash", "-c", "trap '' TERM; sleep 600"))
    backend = SlurmBackend(
        stubborn, tmp_path / "stubborn", poll_interval_s=0.5, release_resend_s=1,
        release_timeout_s=3,
    )  # fmt: skip
    job_id = await backend.submit(jobs.request("stubborn"))
    try:
        await started(backend, job_id)
        await asyncio.sleep(1)
        await backend.release(job_id)
        await asyncio.sleep(2)
        assert (await backend.info(job_id)).state is JobState.RUNNING
        final = None
        async for info in backend.updates():
            if info.state.finished:
                final = info
                break
        assert final is not None and final.state is JobState.CANCELLED
    finally:
        await backend.close()


async def test_invalid_partition_is_rejected_and_nothing_queued(jobs):
    with pytest.raises(SubmitError) as rejected:
        await jobs.backend.submit(jobs.request("bad", partition="no-such-partition"))
    assert rejected.value.option == "--partition"
    assert "invalid partition" in str(rejected.value).lower()
    assert await jobs.backend.find(f"{jobs.prefix}-bad", jobs.comment) == []


async def test_unrecognized_extra_option_is_named(jobs):
    with pytest.raises(SubmitError) as rejected:
        await jobs.backend.submit(jobs.request("bad", extra=("--frobnicate=3",)))
    assert rejected.value.option == "--frobnicate"
    assert "unrecognized option" in str(rejected.value)


async def test_time_limit_beyond_partition_maximum_is_rejected(jobs):
    with pytest.raises(SubmitError) as rejected:
        await jobs.backend.submit(jobs.request("long", partition="short", time_limit_s=7200))
    assert rejected.value.option == "--time"


async def test_scontrol_fallback_reads_what_squeue_reads(jobs):
    job_id = await jobs.backend.submit(jobs.request("pilot"))
    await jobs.state(job_id, JobState.RUNNING)
    await jobs.backend.release(job_id)
    await jobs.state(job_id, JobState.COMPLETED)

    from_squeue = parse_squeue_json(sh("squeue", "--json"))[job_id]
    from_scontrol = parse_scontrol(sh("scontrol", "show", "job", "-o", job_id))
    assert from_scontrol.state is from_squeue.state is JobState.COMPLETED
    assert from_scontrol.name == from_squeue.name
    assert from_scontrol.user_id == from_squeue.user_id == os.getuid()
    for field in ("submit_time", "eligible_time", "start_time", "end_time"):
        assert getattr(from_scontrol, field) == getattr(from_squeue, field), field


async def test_controller_outage_is_waited_out_without_duplicates(jobs, caplog, slurm_local):
    tracked = await jobs.backend.submit(jobs.request("tracked"))
    await jobs.state(tracked, JobState.RUNNING)
    # Its worker runs before the outage (a step that meets one is the next test's).
    assert await output_shows(jobs, f"{jobs.prefix}-tracked", tracked, "NodeShare(")
    caplog.set_level(logging.WARNING, logger="backends.slurm.backend")
    sh(slurm_local, "stop-ctld")
    try:
        submission = asyncio.create_task(jobs.backend.submit(jobs.request("during")))
        await asyncio.sleep(30)
        assert not submission.done()
    finally:
        sh(slurm_local, "start-ctld")
    job_id = await asyncio.wait_for(submission, 60)

    assert "Unable to contact slurm controller" in caplog.text
    assert await jobs.backend.find(f"{jobs.prefix}-during", jobs.comment) == [job_id]
    await jobs.state(job_id, JobState.RUNNING)
    await jobs.backend.release(tracked)  # polling went on through the outage
    await jobs.state(tracked, JobState.COMPLETED)
    await jobs.backend.release(job_id)
    await jobs.state(job_id, JobState.COMPLETED)


async def test_a_step_that_meets_a_controller_outage_starts_once_the_controller_is_back(
    jobs, slurm_local, tmp_path, monkeypatch
):
    """The pilot's job starts; its srun asks for the step while slurmctld is down and gives up
    ("Unable to confirm allocation", exit 1): the batch script waits for the controller and
    tries again, so the worker starts and the pilot ends COMPLETED, not FAILED."""
    gate, bin_dir = tmp_path / "gate", tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"  # the batch script's srun waits for the outage, then is Slurm's
    srun.write_text(
        f'#!/bin/bash\nuntil [ -e {gate} ]; do sleep 0.2; done\nexec {which("srun")} "$@"\n'
    )
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # sbatch exports it
    name = f"{jobs.prefix}-outage"
    job_id = await jobs.backend.submit(jobs.request("outage"))
    await jobs.state(job_id, JobState.RUNNING)
    sh(slurm_local, "stop-ctld")
    try:
        gate.touch()
        assert await output_shows(jobs, name, job_id, "Unable to confirm allocation", timeout=60)
    finally:
        sh(slurm_local, "start-ctld")
    assert await output_shows(jobs, name, job_id, "NodeShare(", timeout=60), output(
        jobs, name, job_id
    )
    await jobs.backend.release(job_id)
    await jobs.state(job_id, JobState.COMPLETED)
    assert output(jobs, name, job_id).count("Unable to confirm allocation") == 1
    assert not (jobs.backend.run_dir / f"{name}-{job_id}.started").exists()


@pytest.mark.parametrize("loss", ["error", "hang"])
async def test_lost_sbatch_answer_is_found_again_by_name(jobs, tmp_path, loss):
    """sbatch submits but its answer never arrives: an error exit, or no exit in time."""
    calls = tmp_path / "sbatch-calls"
    lose_answer = {
        "error": 'echo "sbatch: error: Socket timed out on send/recv operation" >&2; exit 1',
        "hang": "exec sleep 60",
    }[loss]
    wrapper = tmp_path / "sbatch"
    wrapper.write_text(
        f'#!/bin/bash\necho call >> {calls}\nsbatch "$@" > /dev/null || exit\n{lose_answer}\n'
    )
    wrapper.chmod(0o755)
    jobs.backend.commands = SlurmCommands(sbatch=str(wrapper), timeout_s=3)
    request = jobs.request("lost")

    job_id = await jobs.backend.submit(request)

    assert calls.read_text().count("call") == 1
    assert await jobs.backend.find(request.name, request.comment) == [job_id]
    await jobs.state(job_id, JobState.RUNNING)
    await jobs.backend.release(job_id)
    await jobs.state(job_id, JobState.COMPLETED)


async def test_check_asks_slurm_and_queues_nothing(jobs):
    await jobs.backend.check(jobs.request("fine", cores=4, memory_mb=2000, nodes=1))
    for bad, option, words in (
        (jobs.request("part", partition="no-such-partition"), "--partition", "invalid partition"),
        (jobs.request("long", partition="short", time_limit_s=7200), "--time", "time limit"),
        (jobs.request("extra", extra=("--frobnicate=3",)), "--frobnicate", "unrecognized"),
        (jobs.request("wide", cores=4 * NODE_CPUS, nodes=1), "--cpus-per-task", "processors"),
    ):
        with pytest.raises(SubmitError) as rejected:
            await jobs.backend.check(bad)
        assert rejected.value.option == option
        assert words in str(rejected.value).lower()
    assert jobs.queued() == []
    assert not any(jobs.backend.run_dir.iterdir())  # no job ran, so no output file


async def test_node_size_is_the_largest_node_of_the_partitions(jobs):
    size = await jobs.backend.largest_node({None, "short"})
    # scripts/slurm-local's node, whose local disk (TmpDisk) Slurm is not told
    assert (size.cores, size.memory, size.disk) == (NODE_CPUS, 32000, 0)
    assert await jobs.backend.largest_node({"no-such-partition"}) is None


async def test_expected_wait_is_the_start_slurm_foresees_and_queues_nothing(jobs):
    idle = await jobs.backend.expected_wait(jobs.request("idle", cores=2))
    assert idle is not None and idle < 5
    load = sh(
        "sbatch", "--parsable", f"--job-name={jobs.prefix}-load", "--output=/dev/null",
        f"--ntasks={NODE_CPUS}", "--mem-per-cpu=100", "--time=10", "--wrap=sleep 600",
    ).strip()  # fmt: skip
    for _ in range(100):
        if sh("squeue", "-h", "-j", load, "-o", "%T").strip() == "RUNNING":
            break
        await asyncio.sleep(0.2)
    # Slurm foresees the node free when the load's 10-minute limit is up; the dependency of
    # the pilot asked about (on a job that does not exist) is left out of the question.
    waiting = jobs.request("pilot", cores=2, dependency=Dependency("afterok", ("999999",)))
    wait = await jobs.backend.expected_wait(waiting)
    assert wait is not None and 540 <= wait <= 610, wait
    assert await jobs.backend.expected_wait(jobs.request("bad", partition="nowhere")) is None
    assert jobs.queued() == [load]


async def test_expected_wait_in_place_of_a_pending_pilot_holds_it_only_for_the_question(jobs):
    """A load holds half the node for 10 minutes and a pilot of the whole node waits for it.
    Slurm foresees a 2-hour pilot of the free half after that pilot; asked in its place, it
    foresees it now. The pending pilot is held only while Slurm answers: it waits as before,
    not held, its priority back."""
    load = jobs.background("load", cpus=NODE_CPUS // 2, seconds=600)
    for _ in range(100):
        if sh("squeue", "-h", "-j", load, "-o", "%T").strip() == "RUNNING":
            break
        await asyncio.sleep(0.2)
    wide = await jobs.backend.submit(jobs.request("wide", cores=NODE_CPUS, time_limit_s=600))
    await jobs.until(wide, lambda i: i.reason in ("Resources", "Priority"))
    narrow = jobs.request("narrow", cores=NODE_CPUS // 2, time_limit_s=7200)
    behind = await jobs.backend.expected_wait(narrow)
    assert behind is not None and behind > 60, behind
    instead = await jobs.backend.expected_wait(narrow, instead_of=wide)
    assert instead is not None and instead < 5, instead
    state, reason, priority = sh("squeue", "-h", "-j", wide, "-o", "%T %r %Q").split()
    assert state == "PENDING" and "Held" not in reason and int(priority) > 0, jobs.story(wide)
    assert sorted(jobs.queued()) == sorted([load, wide])


async def test_a_pilot_left_held_by_a_manager_that_died_is_released_when_taken_over(jobs):
    """A manager that died while it held its pending pilot for a question to Slurm left it
    held; the run resumed takes it over and releases it, so that it can start."""
    jobs.background("load", cpus=NODE_CPUS, seconds=600)
    request = jobs.request("held", cores=2)
    pilot = await jobs.backend.submit(request)
    await jobs.until(pilot, lambda i: i.reason in ("Resources", "Priority"))
    sh("scontrol", "hold", pilot)
    assert "Held" in sh("squeue", "-h", "-j", pilot, "-o", "%r")
    assert await jobs.backend.reattach(request, pilot, clock.epoch_now()) == pilot
    state, reason = sh("squeue", "-h", "-j", pilot, "-o", "%T %r").split()
    assert state == "PENDING" and "Held" not in reason, jobs.story(pilot)


async def test_a_signal_to_a_job_that_just_ended_is_no_error(tmp_path: Path):
    """scancel may answer a signal for a job that has just ended with Slurm's "already done"
    as its exit status (229) and not a word: the release is done, not an error (seen in a
    user's run, which ended "error: Slurm: scancel --signal=TERM 3343 exited with status
    229" though every task had finished)."""
    quiet = tmp_path / "scancel"
    quiet.write_text("#!/bin/sh\nexit 229\n")
    quiet.chmod(0o755)
    refusing = tmp_path / "scancel-refusing"
    refusing.write_text("#!/bin/sh\nexit 1\n")
    refusing.chmod(0o755)
    for scancel, raises in ((quiet, False), (refusing, True)):
        backend = SlurmBackend(
            WORKER, tmp_path / "run", commands=SlurmCommands(scancel=str(scancel))
        )
        try:
            await backend._signal("3343")
        except SlurmError:
            assert raises
        else:
            assert not raises
        await backend.close()
