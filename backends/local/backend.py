"""Pilots as local processes on this machine: no queue, immediate start.

A pilot is ``nodes`` (default one) ``leadtime worker`` processes, each given
its share of the pilot's cores and memory, CPUs of its own (as a Slurm
cpuset would), the pilot's end time and its job id (its name) as the pilot id; the
processes connect to the run's manager like the workers of a Slurm pilot.
Nothing queues: a pilot starts the moment it is submitted, or the moment its
dependency is satisfied, with Slurm's meaning of ``after``, ``afterany``,
``afterok`` and ``afternotok`` (:func:`backends.base.dependency_status`);
while it waits it is PENDING with reason ``Dependency``. Running pilots are
not packed: their cores may add up to more than the machine has (they then
share its CPUs).

A pilot's job id is its name. While it runs, ``run_dir/<name>.pilot`` records its workers'
process ids, so that a manager resuming the run (:meth:`LocalBackend.reattach`) can follow
them when the manager that started them is gone (they outlive it, waiting for a manager).

A pilot's state follows its processes as Slurm's follows a batch job:
``release`` sends SIGTERM (the workers leave and exit 0: COMPLETED),
``cancel`` ends it CANCELLED, its time limit ends it TIMEOUT, and a worker
that exits non-zero on its own makes it FAILED once all have ended. A
process that ignores SIGTERM is killed, with every process it started,
after ``kill_grace_s``. :meth:`LocalBackend.close` kills whatever is left:
no worker outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil

from backends import clock
from backends.base import (
    JobInfo,
    JobState,
    PilotRequest,
    SubmitError,
    WorkerLaunch,
    WorkerPlace,
    dependency_status,
    node_share,
)
from backends.cores import CoreSet
from learners.resources import Resources

log = logging.getLogger(__name__)

MB = 2**20

Stop = Literal["release", "cancel", "timeout"]


def this_machine(work_dir: Path) -> Resources:
    """The cores this process may use, the machine's memory (MB), free disk under ``work_dir``."""
    return Resources(
        float(len(os.sched_getaffinity(0))),
        psutil.virtual_memory().total / MB,
        shutil.disk_usage(work_dir).free / MB,
    )


@dataclass(eq=False)
class _Pilot:
    job_id: str
    request: PilotRequest
    submit_time: float
    depends_on: tuple[_Pilot, ...] = ()
    state: JobState = JobState.PENDING
    reason: str = ""
    eligible_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    processes: list[asyncio.subprocess.Process] = field(default_factory=list)
    stop: Stop | None = None
    """Why it is being stopped, once it is."""
    start_error: str | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    runner: asyncio.Task[None] | None = None

    def info(self) -> JobInfo:
        return JobInfo(
            job_id=self.job_id,
            state=self.state,
            reason=self.reason,
            submit_time=self.submit_time,
            eligible_time=self.eligible_time,
            start_time=self.start_time,
            end_time=self.end_time,
        )


class LocalBackend:
    """Pilots as worker processes on this machine, each started by ``launch``, told its
    place (:class:`~backends.base.WorkerPlace`: the pilot's job id, its share of the
    pilot, the pilot's end, its root ``run_dir/<pilot>/<worker>``, removed with the pilot
    when nothing stays in it). A pilot's output goes to ``run_dir/<pilot>.out``. A pilot
    may ask for at most the machine's cores (any number with ``oversubscribe``) and its
    memory; one that leaves memory unset gets the machine's memory per core for each of its
    cores. Partition, account, QOS and extra sbatch options mean nothing here and are
    ignored.
    """

    name = "local"
    simulated = False
    queued = False
    true_wait = None
    node_count = 1

    def __init__(
        self,
        launch: WorkerLaunch,
        run_dir: str | Path,
        *,
        oversubscribe: bool = False,
        kill_grace_s: float = 10.0,
        node: Resources | None = None,
    ) -> None:
        self.launch = launch
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.oversubscribe = oversubscribe
        self.kill_grace_s = kill_grace_s
        self.node = node or this_machine(self.run_dir)
        """This machine, as far as pilots go: their cores, memory and disk."""
        self._pilots: dict[str, _Pilot] = {}
        self._cores = CoreSet(os.sched_getaffinity(0))
        """This machine's CPUs, as its running workers hold them."""
        self._cpus: dict[int, tuple[frozenset[int] | None, float]] = {}
        """The CPUs of each running worker and its cores, by process id."""
        self._updates: asyncio.Queue[JobInfo] = asyncio.Queue()
        self._closed = False

    # -- the protocol ------------------------------------------------------------------

    async def check(self, request: PilotRequest) -> None:
        cores = self.node.cores
        if request.cores < 1:
            raise SubmitError(f"a pilot needs at least one core, not {request.cores}", "cores")
        if request.cores > cores and not self.oversubscribe:
            raise SubmitError(
                f"pilot {request.name} asks for {request.cores} cores, but this machine has "
                f"{cores:g} (allow it with --oversubscribe)",
                "cores",
            )
        nodes = request.nodes or 1
        if request.cores % nodes:
            raise SubmitError(
                f"{request.cores} cores do not split evenly over {nodes} workers", "nodes"
            )
        if request.memory_mb is not None and request.memory_mb > self.node.memory:
            raise SubmitError(
                f"pilot {request.name} asks for {request.memory_mb} MB of memory, but this "
                f"machine has {self.node.memory:.0f} MB",
                "memory",
            )
        if not request.time_limit_s > 0:
            raise SubmitError(f"time limit must be positive, not {request.time_limit_s}", "time")

    async def expected_wait(
        self, request: PilotRequest, instead_of: str | None = None
    ) -> float | None:
        return 0.0  # no queue: a pilot starts when submitted (once its dependency is met)

    async def submit(self, request: PilotRequest) -> str:
        if self._closed:
            raise RuntimeError("the local backend is closed")
        await self.check(request)
        depends_on: tuple[_Pilot, ...] = ()
        if request.dependency is not None:
            unknown = [j for j in request.dependency.job_ids if j not in self._pilots]
            if unknown or not request.dependency.job_ids:
                raise SubmitError(
                    f"Job dependency problem: no job {', '.join(unknown) or 'ids'}", "dependency"
                )
            depends_on = tuple(self._pilots[j] for j in request.dependency.job_ids)
        if request.name in self._pilots:
            raise SubmitError(f"pilot {request.name!r} was submitted already", "name")
        now = clock.now()
        pilot = _Pilot(request.name, request, now, depends_on)
        self._pilots[pilot.job_id] = pilot
        self._test_dependency(pilot, now)
        return pilot.job_id

    async def cancel(self, job_id: str) -> None:
        self._end(self._pilot(job_id), "cancel")

    async def release(self, job_id: str) -> None:
        self._end(self._pilot(job_id), "release")

    def _end(self, pilot: _Pilot, why: Stop) -> None:
        """A pending pilot is cancelled; a running one is stopped for ``why``."""
        if pilot.state is JobState.PENDING:
            self._finish(pilot, JobState.CANCELLED)
        elif pilot.state is JobState.RUNNING:
            self._stop(pilot, why)

    async def info(self, job_id: str) -> JobInfo:
        return self._pilot(job_id).info()

    async def updates(self) -> AsyncIterator[JobInfo]:
        while True:
            yield await self._updates.get()

    async def cluster_name(self) -> str:
        return f"local:{socket.gethostname()}"

    async def largest_node(self, partitions: set[str | None]) -> Resources:
        """This machine: there are no partitions."""
        return self.node

    async def reattach(
        self, request: PilotRequest, job_id: str | None, submitted: float
    ) -> str | None:
        """Follow the workers of pilot ``request`` that an earlier manager started, from the
        record of their process ids; None when none of them runs any more (a local pilot
        starts with its submission: none can land later)."""
        record = self.run_dir / f"{request.name}.pilot"
        try:
            saved = json.loads(record.read_text())
        except (OSError, ValueError):
            return None
        processes = [
            p for p in (_Adopted.of(pid, started) for pid, started in saved["workers"]) if p
        ]
        if not processes:
            record.unlink(missing_ok=True)
            return None
        now = clock.now()
        start = clock.from_epoch(saved["start"])
        pilot = _Pilot(request.name, request, start, state=JobState.RUNNING)
        pilot.eligible_time = pilot.start_time = start
        pilot.processes = list(processes)  # type: ignore[arg-type]
        for process in processes:
            self._pin(process, process.cores)
        self._pilots[pilot.job_id] = pilot
        loop = asyncio.get_running_loop()
        pilot.timers.append(loop.call_at(max(now, start + request.time_limit_s), self._stop,
                                         pilot, "timeout"))  # fmt: skip
        pilot.runner = loop.create_task(self._follow(pilot))
        self._notify(pilot)
        return pilot.job_id

    async def close(self) -> None:
        """Kill every worker still running (and what it started); pending pilots never start."""
        self._closed = True
        for pilot in self._pilots.values():
            for timer in pilot.timers:
                timer.cancel()
            if pilot.state is JobState.PENDING:
                self._finish(pilot, JobState.CANCELLED)
            elif pilot.state is JobState.RUNNING:  # killed now, even if released before
                pilot.stop = "timeout" if pilot.stop == "timeout" else "cancel"
                for process in pilot.processes:
                    _kill_tree(process.pid)
        runners = [p.runner for p in self._pilots.values() if p.runner is not None]
        await asyncio.gather(*runners, return_exceptions=True)

    # -- beyond the protocol -----------------------------------------------------------

    def workers(self, job_id: str) -> list[int]:
        """The process ids of the pilot's workers that were started."""
        return [p.pid for p in self._pilot(job_id).processes]

    # -- inside ------------------------------------------------------------------------

    def _pilot(self, job_id: str) -> _Pilot:
        try:
            return self._pilots[job_id]
        except KeyError:
            raise KeyError(f"no local pilot {job_id!r}") from None

    def _test_dependency(self, pilot: _Pilot, now: float) -> None:
        """Start ``pilot`` if nothing holds it back; otherwise say why it waits."""
        status = "ok"
        if pilot.request.dependency is not None:
            kind = pilot.request.dependency.kind
            status = dependency_status(kind, (d.state for d in pilot.depends_on))
        if status == "ok" and not self._closed:
            pilot.eligible_time = now
            self._start(pilot, now)
            return
        reason = "Dependency" if status == "wait" else "DependencyNeverSatisfied"
        if pilot.reason != reason:
            pilot.reason = reason
            self._notify(pilot)

    def _dependency_changed(self, pilot: _Pilot, now: float) -> None:
        for waiter in self._pilots.values():
            if waiter.state is JobState.PENDING and pilot in waiter.depends_on:
                self._test_dependency(waiter, now)

    def _start(self, pilot: _Pilot, now: float) -> None:
        pilot.state, pilot.reason, pilot.start_time = JobState.RUNNING, "", now
        limit = pilot.request.time_limit_s
        loop = asyncio.get_running_loop()
        pilot.timers.append(loop.call_at(now + limit, self._stop, pilot, "timeout"))
        pilot.runner = loop.create_task(self._run(pilot))
        self._notify(pilot)
        self._dependency_changed(pilot, now)  # ``after`` waits only for the start

    async def _run(self, pilot: _Pilot) -> None:
        """Start the pilot's workers, wait for all of them, end the pilot as they ended."""
        request = pilot.request
        size = node_share(request.cores, request.nodes, request.memory_mb, self.node)
        assert pilot.start_time is not None
        end = clock.to_epoch(pilot.start_time + request.time_limit_s)
        env = {**os.environ, **self.launch.env}
        pilot_dir = self.run_dir / request.name
        try:
            with open(self.run_dir / f"{request.name}.out", "ab") as out:
                for i in range(request.nodes or 1):
                    worker_id = f"{request.name}.{i}"
                    root = pilot_dir / worker_id
                    place = WorkerPlace(pilot.job_id, worker_id, size, end, root)
                    command = self.launch.command(place)
                    process = await asyncio.create_subprocess_exec(
                        *command,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out,
                        stderr=asyncio.subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                    pilot.processes.append(process)
                    self._pin(process, size.cores)
                    if self._closed:  # stopped while its workers were starting
                        _kill_tree(process.pid)
                    elif pilot.stop is not None:
                        _signal(process.pid, signal.SIGTERM)
        except OSError as e:
            pilot.start_error = f"cannot start {self.launch.argv[0]}: {e}"
            log.error("pilot %s: %s", request.name, pilot.start_error)
            for process in pilot.processes:
                _kill_tree(process.pid)
        self._record(pilot)
        await self._follow(pilot)

    def _record(self, pilot: _Pilot) -> None:
        """Write down the running pilot's workers, for a manager that resumes the run."""
        workers = [[p.pid, _started(p.pid)] for p in pilot.processes if p.returncode is None]
        if not workers:
            return
        assert pilot.start_time is not None
        saved = {"workers": workers, "start": clock.to_epoch(pilot.start_time)}
        try:
            _write_atomically(self.run_dir / f"{pilot.request.name}.pilot", json.dumps(saved))
        except OSError as e:
            log.warning("pilot %s cannot be resumed: %s", pilot.request.name, e)

    async def _follow(self, pilot: _Pilot) -> None:
        """Wait for all of the pilot's workers, then end the pilot as they ended."""
        codes = await asyncio.gather(*(self._wait(p) for p in pilot.processes))
        with contextlib.suppress(OSError):
            (self.run_dir / f"{pilot.request.name}.pilot").unlink(missing_ok=True)
        # Its workers' roots: each removed its own, or its sentinel does (a worker killed
        # outright); nothing in them is meant to stay (kept sandboxes are in the run's kept/).
        shutil.rmtree(self.run_dir / pilot.request.name, ignore_errors=True)
        state = self._final_state(pilot, codes)
        if state is JobState.FAILED:  # the reason Slurm would give, in this machine's words
            pilot.reason = pilot.start_error or f"workers exited with {list(codes)}"
        self._finish(pilot, state)

    def _pin(self, process: asyncio.subprocess.Process | _Adopted, cores: float) -> None:
        """Give the worker CPUs of its own, the least used, as Slurm gives a job's step its
        cpuset: the worker pins its tasks within its CPUs, so workers must not share them.

        Set as the worker starts, long before it reads its CPUs (after its imports).
        """
        cpus = self._cores.take(cores)
        if cpus is not None:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(process.pid, cpus)
        self._cpus[process.pid] = (cpus, cores)

    async def _wait(self, process: asyncio.subprocess.Process | _Adopted) -> int | None:
        code = await process.wait()
        if process.pid in self._cpus:
            self._cores.give(*self._cpus.pop(process.pid))
        return code

    def _final_state(self, pilot: _Pilot, codes: Sequence[int | None]) -> JobState:
        if pilot.stop == "cancel":
            return JobState.CANCELLED
        if pilot.stop == "timeout":
            return JobState.TIMEOUT
        released = pilot.stop == "release"
        clean = all(  # None: an adopted worker's, unknown; it ended well if it was released
            code == 0 or (released and code in (-signal.SIGTERM, None)) for code in codes
        )
        if pilot.start_error or not clean:
            log.warning("pilot %s: workers exited with %s", pilot.request.name, list(codes))
            return JobState.FAILED
        return JobState.COMPLETED

    def _stop(self, pilot: _Pilot, why: Stop) -> None:
        """SIGTERM the workers; kill them (and what they started) after the grace."""
        if pilot.state is not JobState.RUNNING or pilot.stop in (why, "cancel", "timeout"):
            return  # a release gives way to a cancel or the time limit, never the reverse
        first = pilot.stop is None
        pilot.stop = why
        if not first:
            return
        for process in pilot.processes:
            _signal(process.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        pilot.timers.append(loop.call_later(self.kill_grace_s, self._kill, pilot))

    def _kill(self, pilot: _Pilot) -> None:
        if pilot.state is not JobState.RUNNING:
            return
        if pilot.stop == "release":
            log.warning("pilot %s ignored its release: killing it", pilot.request.name)
            pilot.stop = "cancel"
        for process in pilot.processes:
            if process.returncode is None:
                _kill_tree(process.pid)

    def _finish(self, pilot: _Pilot, state: JobState) -> None:
        for timer in pilot.timers:
            timer.cancel()
        now = clock.now()
        pilot.state, pilot.end_time = state, now
        if state is JobState.CANCELLED and pilot.start_time is None:
            pilot.reason = ""
        self._notify(pilot)
        self._dependency_changed(pilot, now)

    def _notify(self, pilot: _Pilot) -> None:
        self._updates.put_nowait(pilot.info())


class _Adopted:
    """A worker started by an earlier manager of the run: not our child, so it is followed
    by polling, and its exit code is unknown (None)."""

    POLL_S = 0.5

    def __init__(self, process: psutil.Process) -> None:
        self._process = process
        self.pid = process.pid
        self.returncode: int | None = None
        self.cores = float(len(process.cpu_affinity() or ()))

    @classmethod
    def of(cls, pid: int, started: float | None) -> _Adopted | None:
        """The worker ``pid`` if it still runs and is the process that was recorded."""
        try:
            process = psutil.Process(pid)
            if started is not None and abs(process.create_time() - started) > 1.0:
                return None  # its pid went to another process
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            return cls(process)
        except psutil.Error:
            return None

    async def wait(self) -> int | None:
        with contextlib.suppress(psutil.Error):
            while self._process.is_running() and self._process.status() != psutil.STATUS_ZOMBIE:
                await clock.sleep(self.POLL_S)
        self.returncode = 0
        return None


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal the process group ``pid`` leads (a worker and its helpers, not its tasks)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process group it started (its tasks lead their own)."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    groups = set()
    for process in descendants:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(process.pid))
    _signal(pid, signal.SIGKILL)  # first: a dying task must not be reported as a failure
    for group in groups - {pid, os.getpgrp()}:
        _signal(group, signal.SIGKILL)
