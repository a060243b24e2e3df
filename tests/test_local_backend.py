"""The local backend alone: real worker processes registering with a real manager."""

import asyncio
import os

import psutil
import pytest

from backends import clock
from backends.base import Dependency, JobState, PilotRequest, SubmitError, node_share
from backends.local.backend import LocalBackend
from learners.resources import Resources
from orchestrator.agent import protocol
from orchestrator.agent import worker as agent
from orchestrator.agent.attempt import AttemptSpec, Outcome
from orchestrator.manager import Manager

SECRET = bytes(range(7, 39))
FAST_SAMPLES = ("--sample-interval", "0.2", "--first-sample", "0.05")
NODE = Resources(cores=2, memory=8000, disk=5000)


class Local:
    """A manager, a local backend whose workers join it, and every job update seen."""

    def __init__(self, tmp_path, **backend_options):
        self.joined: asyncio.Queue = asyncio.Queue()
        self.manager = Manager(SECRET, heartbeat_s=0.2, on_join=self.joined.put_nowait)
        self.tmp_path = tmp_path
        self.options = backend_options
        self.seen: dict[str, list] = {}
        self._changed = asyncio.Event()

    async def __aenter__(self):
        host, port = await self.manager.start()
        secret = {protocol.SECRET_ENV: SECRET.hex()}
        launch = agent.launch(f"{host}:{port}", env=secret, args=FAST_SAMPLES)
        self.backend = LocalBackend(
            launch,
            self.tmp_path / "run",
            kill_grace_s=1.0,
            **{"node": NODE, **self.options},
        )
        self._pump = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *exc):
        await self.backend.close()
        await self.manager.close()
        self._pump.cancel()

    async def _follow(self):
        async for info in self.backend.updates():
            self.seen.setdefault(info.job_id, []).append(info)
            self._changed.set()

    async def state(self, job_id, state, timeout=10.0):
        """The job's info once it reaches ``state``."""
        async with asyncio.timeout(timeout):
            while True:
                infos = self.seen.get(job_id, [])
                if infos and infos[-1].state is state:
                    return infos[-1]
                self._changed.clear()
                await self._changed.wait()

    async def worker(self, timeout=10.0):
        return await asyncio.wait_for(self.joined.get(), timeout)


def request(name="p", cores=1, time=60.0, **kw):
    return PilotRequest(name=name, cores=cores, time_limit_s=time, **kw)


async def test_a_pilot_starts_at_once_and_its_workers_register(tmp_path):
    async with Local(tmp_path) as local:
        start = clock.now()
        assert not local.backend.queued and await local.backend.expected_wait(request("x")) == 0
        job = await local.backend.submit(request("two", cores=2, nodes=2, memory_mb=3000))
        info = await local.state(job, JobState.RUNNING)
        assert info.submit_time == info.eligible_time == info.start_time
        assert info.wait == 0 and info.start_time - start < 0.1
        workers = sorted([await local.worker(), await local.worker()], key=lambda w: w.id)
        assert [w.id for w in workers] == ["two.0", "two.1"]
        assert {w.pilot_id for w in workers} == {"two"}
        assert all(w.capacity == Resources(1, 1500, NODE.disk) for w in workers)
        assert all(w.end_time == pytest.approx(info.start_time + 60, abs=0.01) for w in workers)
        assert sorted(w.pid for w in workers) == sorted(local.backend.workers(job))
        cpus = [os.sched_getaffinity(w.pid) for w in workers]  # each its own, as a cpuset
        assert [len(c) for c in cpus] == [1, 1]
        assert cpus[0] != cpus[1] or len(os.sched_getaffinity(0)) == 1

        await local.backend.release(job)
        info = await local.state(job, JobState.COMPLETED)
        assert info.end_time > info.start_time
        assert not any(psutil.pid_exists(pid) for pid in local.backend.workers(job))
        assert "registered with the manager" in (tmp_path / "run" / "two.out").read_text()
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["two.out"]  # no roots


async def test_memory_left_unset_is_the_machine_share_of_the_cores(tmp_path):
    async with Local(tmp_path) as local:
        size = node_share(1, None, None, local.backend.node)
        assert size == Resources(1, NODE.memory / NODE.cores, NODE.disk)
        await local.backend.submit(request(cores=1))
        assert (await local.worker()).capacity == size


async def test_cancel(tmp_path):
    async with Local(tmp_path) as local:
        job = await local.backend.submit(request())
        await local.worker()
        await local.backend.cancel(job)
        info = await local.state(job, JobState.CANCELLED)
        assert not psutil.pid_exists(local.backend.workers(job)[0])
        await local.backend.cancel(job)  # a finished pilot stays as it ended
        assert (await local.backend.info(job)) == info


async def test_a_pilot_busy_at_its_time_limit_timed_out(tmp_path):
    async with Local(tmp_path) as local:
        job = await local.backend.submit(request(time=1.5))
        worker = await local.worker()
        running = worker.run(AttemptSpec("t", 1, "sleep 60", Resources(1)))
        info = await local.state(job, JobState.TIMEOUT)
        assert info.end_time - info.start_time == pytest.approx(1.5, abs=0.5)
        assert (await running).outcome is Outcome.LOST


async def test_an_idle_pilot_leaves_just_before_its_time_limit(tmp_path):
    """A worker drains a tenth of the limit before the end and leaves once idle."""
    limit = 10.0  # the drain's margin (1 s) leaves a loaded machine time to exit
    async with Local(tmp_path) as local:
        job = await local.backend.submit(request(time=limit))
        await local.worker()
        info = await local.state(job, JobState.COMPLETED, timeout=2 * limit)
        assert 0.85 * limit <= info.end_time - info.start_time < limit


async def test_a_pilot_whose_worker_dies_failed(tmp_path):
    async with Local(tmp_path) as local:
        job = await local.backend.submit(request())
        worker = await local.worker()
        os.kill(worker.pid, 9)
        await local.state(job, JobState.FAILED)


async def test_dependencies_hold_pilots_as_slurm_does(tmp_path):
    async with Local(tmp_path) as local:
        backend = local.backend
        first = await backend.submit(request("first"))
        await local.state(first, JobState.RUNNING)
        after_start = await backend.submit(request("s", dependency=Dependency("after", (first,))))
        ok = await backend.submit(request("ok", dependency=Dependency("afterok", (first,))))
        any_ = await backend.submit(request("any", dependency=Dependency("afterany", (ok,))))
        not_ok = await backend.submit(request("no", dependency=Dependency("afternotok", (first,))))
        await local.state(after_start, JobState.RUNNING)
        for job in (ok, any_, not_ok):
            info = await local.state(job, JobState.PENDING)
            assert info.reason == "Dependency" and info.eligible_time is None

        await backend.release(first)
        done = await local.state(first, JobState.COMPLETED)
        started = await local.state(ok, JobState.RUNNING)
        assert started.eligible_time == pytest.approx(done.end_time, abs=0.05)
        assert started.wait == pytest.approx(0, abs=0.01)
        assert (await backend.info(not_ok)).reason == "DependencyNeverSatisfied"
        assert (await backend.info(not_ok)).state is JobState.PENDING

        await backend.cancel(ok)  # afterany: any end will do
        await local.state(ok, JobState.CANCELLED)
        await local.state(any_, JobState.RUNNING)
        await backend.release(not_ok)  # a pending pilot released never starts
        assert (await local.state(not_ok, JobState.CANCELLED)).start_time is None


async def test_check_refuses_what_this_machine_cannot_give(tmp_path):
    async with Local(tmp_path) as local:
        check = local.backend.check
        with pytest.raises(SubmitError, match=r"3 cores.*has 2.*--oversubscribe") as e:
            await check(request(cores=3))
        assert e.value.option == "cores"
        with pytest.raises(SubmitError, match="9000 MB") as e:
            await check(request(memory_mb=9000))
        assert e.value.option == "memory"
        with pytest.raises(SubmitError) as e:
            await local.backend.submit(request(dependency=Dependency("afterok", ("404",))))
        assert e.value.option == "dependency"
        await check(request(cores=2, memory_mb=8000))
    async with Local(tmp_path, oversubscribe=True) as local:
        await local.backend.check(request(cores=64))


async def test_close_leaves_no_worker_nor_task_behind(tmp_path):
    async with Local(tmp_path) as local:
        job = await local.backend.submit(request())
        worker = await local.worker()
        marker = tmp_path / "task.pid"
        run = worker.run(AttemptSpec("t", 1, f"echo $$ > {marker}; exec sleep 60", Resources(1)))
        async with asyncio.timeout(10):
            while not marker.exists() or not marker.read_text().strip():
                await asyncio.sleep(0.05)
        task_pid = int(marker.read_text())
        await local.backend.close()
        assert (await local.state(job, JobState.CANCELLED)).end_time is not None
        assert (await run).outcome is Outcome.LOST
        for pid in (worker.pid, task_pid):
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
