"""Run one attempt: a shell command in the working directory, in its own session and cores.

The command runs as ``/bin/sh -c COMMAND`` in the workflow's working directory (where
relative paths lead, as in a batch script), leading a new session (so the whole tree can be
killed as one process group), pinned to the cores it was given. Each attempt has a private
scratch directory, ``<root>/<task>.<attempt>/`` (``$LEADTIME_SCRATCH`` and ``$TMPDIR``), which
holds its stdout and stderr and is removed when it ends (kept after a failure, by default:
moved to the run's directory, within a budget, where the node's scratch would keep it from
its user and fill up); the head and tail of both streams go back in its result, whatever
its outcome.
The :class:`~orchestrator.agent.monitor.Monitor` watches it; when it breaks a limit the group
gets SIGTERM, then SIGKILL after a grace. When it ends, what it left running gets the same
(an ``srun`` ends its step on SIGTERM), wherever it went (:mod:`orchestrator.agent.lineage`,
and its cgroup where there is one), and its declared outputs are checked, or removed if it
did not succeed (:mod:`orchestrator.agent.footprint`).

A child's exit is noticed through a pidfd (SIGCHLD on kernels before 5.3),
with no thread per child, and the child is reaped only once what it left has had its
grace: whatever is left of its process group is signalled while the group's id cannot yet
be reused.
``wait4`` then gives the exact CPU time and peak RSS, which is all a task
shorter than the first sample gets.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import hashlib
import itertools
import logging
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from backends import clock
from learners.resources import Exhaustion, Resources
from orchestrator.agent import footprint
from orchestrator.agent.attempt import (
    OVER_AT_END,
    AttemptResult,
    AttemptSpec,
    Captured,
    Outcome,
    refused,
)
from orchestrator.agent.footprint import Footprint
from orchestrator.agent.lineage import ATTEMPT_TOKEN, WORKER_TOKEN, new_token
from orchestrator.agent.monitor import MB, MemoryCgroups, Monitor, high_water_rss
from orchestrator.agent.protocol import MAX_TAIL, OUTPUT_HEAD, OUTPUT_TAIL, SECRET_ENV

log = logging.getLogger(__name__)

STDOUT = "leadtime.stdout"
STDERR = "leadtime.stderr"
STREAMS = (STDOUT, STDERR)
Keep = Literal["never", "failure", "always"]
KEEP_BUDGET_MB = 1024.0
"""What a worker moves of kept sandboxes to the run's directory, at most, by default."""
SPARE_SANDBOXES = 8
"""Emptied sandboxes kept for the next attempts: renaming a directory costs a fraction of
making and removing one, which matters for tasks of a few milliseconds."""
NOT_KEPT = "leadtime.not-kept"
SPARE = ".spare-"
HOSTS = ".slurm-hosts-"
"""The prefixes of what a worker keeps under its root for itself: spare sandboxes and the
host files of multi-core tasks."""
_IGNORED_BY_PYTHON = (signal.SIGPIPE, signal.SIGXFSZ)
"""Signals Python ignores, which a task would inherit ignored: it gets them back at their
defaults (as ``subprocess`` does with ``restore_signals``)."""
_SPAWN_SETSID = True
"""This Python's ``posix_spawn`` starts a session (else a task starts with ``subprocess``)."""


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    root: Path
    """Sandboxes are made under this directory."""
    keep_sandboxes: Keep = "failure"
    """Which sandboxes stay after their attempt: never, those that did not succeed, always."""
    keep_to: Path | None = None
    """Where kept sandboxes go when their attempt ends (the run's directory, on a file system
    the user reaches); None: they stay under ``root``."""
    keep_budget_mb: float = KEEP_BUDGET_MB
    """At most this much of kept sandboxes moves to ``keep_to``; past it, only their stdout
    and stderr (while they fit), and a note of what was left out."""
    tail_lines: int = 20
    kill_grace_s: float = 1.0
    """Between SIGTERM and SIGKILL when a task is stopped."""
    shell: str = "/bin/sh"
    worker_token: str = ""
    """Every task of this worker carries it (:mod:`orchestrator.agent.lineage`)."""
    node: str = field(default_factory=socket.gethostname)
    """This host, where kept sandboxes stay unless moved to ``keep_to``."""


def sandbox_name(task_id: str, attempt: int) -> str:
    """A file name for the attempt: its task id where safe, else made safe and unique."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)[:120]
    if safe != task_id or safe.startswith("."):
        safe = f"{safe.lstrip('.')}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}"
    return f"{safe}.{attempt}"


@dataclass(slots=True)
class _Running:
    pid: int
    exited: asyncio.Future
    """Done the moment its leader exits; not reaped until :func:`_reap` (its pid and group
    id are not reused meanwhile)."""
    token: str
    """Its attempt's token: every process it starts carries it."""
    exhaustion: Exhaustion | None = None
    lost: str | None = None
    """Why it was stopped, if it was stopped for another reason than a limit."""
    missing: list[str] | None = None
    """Declared outputs it did not create, though it exited 0."""
    over_at_end: bool = False
    """``exhaustion`` was found in its totals when it ended, not while it ran."""
    kill_timer: asyncio.TimerHandle | None = None


class Runner:
    """Runs attempts under ``config.root``, watched by ``monitor``."""

    def __init__(
        self,
        config: RunnerConfig,
        monitor: Monitor,
        environ: Mapping[str, str] = os.environ,
        cgroups: MemoryCgroups | None = None,
    ) -> None:
        self.config = config
        self.monitor = monitor
        self.cgroups = cgroups
        self._in_slurm_job = "SLURM_JOB_ID" in environ
        """Tasks get their own defaults for ``srun`` (:func:`srun_defaults`)."""
        self._node = environ.get("SLURMD_NODENAME")
        self._nodes = int(environ.get("SLURM_JOB_NUM_NODES") or 1)
        """The pilot's nodes: where it has several, a task's ``srun`` is told its node."""
        self._hostfiles: dict[int, Path] = {}
        """Per count of cores, a task's ``SLURM_HOSTFILE``: this node, once a core."""
        dropped = {SECRET_ENV, *(SRUN_MEMORY_PER_UNIT if self._in_slurm_job else ())}
        self._environ = {
            os.fsencode(k): os.fsencode(v) for k, v in environ.items() if k not in dropped
        }
        self._shell = os.fsencode(config.shell)
        self._running: dict[tuple[str, int], _Running] = {}
        self._removals: set[asyncio.Future] = set()
        self._keep_budget = config.keep_budget_mb * MB
        self._spares: list[Path] = []
        """Emptied sandboxes (:data:`SPARE` N under the root), each the next attempt's to take."""
        self._spare_ids = itertools.count()
        self._keep_lock = threading.Lock()
        self._affinity = frozenset(os.sched_getaffinity(0))
        config.root.mkdir(parents=True, exist_ok=True)

    @property
    def running(self) -> int:
        return len(self._running)

    def sandbox(self, spec: AttemptSpec) -> Path:
        """The attempt's scratch directory."""
        return self.config.root / sandbox_name(*spec.key)

    async def run(self, spec: AttemptSpec, cpus: frozenset[int] | None = None) -> AttemptResult:
        """Run ``spec`` to its end, pinned to ``cpus`` (or the worker's own cores)."""
        key = spec.key
        if key in self._running:
            raise ValueError(f"attempt {spec.attempt} of {spec.task_id} is already running")
        sandbox = self.sandbox(spec)
        self._make(sandbox)
        workdir = Path(spec.workdir) if spec.workdir else sandbox
        if not workdir.is_dir():
            self._clean(sandbox, None, success=False)
            return refused(spec, f"no working directory {workdir} on this node")
        footprint.prepare(workdir, spec.outputs)  # stale or half-written ones: not this one's
        cgroup = self.cgroups.create(sandbox.name, spec.allocation.memory) if self.cgroups else None
        token = new_token()
        start = clock.now()
        try:
            pid = self._spawn(spec, sandbox, workdir, token, cpus)
        except OSError as e:
            self._clean(sandbox, cgroup, success=False)
            return refused(spec, f"cannot start {self.config.shell}: {e}")
        # Read after the spawn: the high-water mark the task inherited at exec is not above it.
        spawner_rss = high_water_rss()
        running = self._running[key] = _Running(pid, _reaper().track(pid), token)
        if cgroup is not None and self.cgroups is not None:
            self.cgroups.add(cgroup, pid)
        wrote = Footprint(sandbox, workdir, spec.outputs)
        watch = self.monitor.watch(
            pid,
            wrote.bytes,
            spec.allocation,
            lambda e: self._exceeded(running, e),
            cpus or self._affinity,
            start,
            token,
        )
        try:
            try:
                await asyncio.shield(running.exited)
            finally:
                wall = clock.now() - start
                self.monitor.unwatch(watch)
            await self._wind_down(running)
        finally:
            del self._running[key]
            if running.kill_timer is not None:
                running.kill_timer.cancel()
            try:
                reaped = _reap(running)
            finally:
                self._end(running, cgroup)
        assert reaped is not None  # None: it had not exited, we were cancelled
        status, rusage = reaped
        peak = watch.usage.finish(
            wall,
            cpu=rusage.ru_utime + rusage.ru_stime,
            max_rss=rusage.ru_maxrss * 1024 / MB,
            disk=wrote.bytes() / MB,
            spawner_rss=spawner_rss,
        )
        exit_code = os.waitstatus_to_exitcode(status)
        over = watch.usage.over
        outcome, exhaustion = self._classify(spec, running, exit_code, peak, over, cgroup)
        absent = footprint.missing(workdir, spec.outputs) if outcome is Outcome.SUCCESS else []
        if absent:
            outcome, running.missing = Outcome.FAILED, absent
        if outcome is not Outcome.SUCCESS:
            footprint.remove(workdir, spec.outputs)
        series = watch.usage.series
        result = AttemptResult(
            task_id=spec.task_id,
            attempt=spec.attempt,
            outcome=outcome,
            peak=peak,
            exit_code=exit_code,
            exhaustion=exhaustion,
            memory_series=series[0] if series else None,
            sample_interval_s=series[1] if series else None,
            output_tail="" if outcome is Outcome.SUCCESS else self._tail(spec, sandbox, running),
            stdout=capture(sandbox / STDOUT),
            stderr=capture(sandbox / STDERR),
            node=self.config.node,
            starved=watch.usage.starved,
        )
        kept = self._clean(sandbox, cgroup, success=outcome is Outcome.SUCCESS)
        return result if kept is None else replace(result, sandbox=str(kept))

    def stop(self, task_id: str, attempt: int, reason: str) -> bool:
        """Kill a running attempt; its :meth:`run` returns LOST with ``reason``."""
        running = self._running.get((task_id, attempt))
        if running is None or _has_exited(running):
            return False  # it ended by itself first: its own outcome stands
        if running.exhaustion is None:  # a broken limit, found first, stays the cause
            running.lost = running.lost or reason
        self._terminate(running)
        return True

    def stop_all(self, reason: str) -> None:
        for task_id, attempt in list(self._running):
            self.stop(task_id, attempt, reason)

    # --- inside ---------------------------------------------------------------------------

    async def _wind_down(self, running: _Running) -> None:
        """The attempt's leader exited: what it left running gets SIGTERM and the grace to end
        before it is killed, as Slurm treats a job's processes at its end (an ``srun`` left
        running ends its step on SIGTERM; killed outright, its step would run on until the
        pilot ends)."""
        _signal_group(running.pid, signal.SIGTERM)  # not reaped: the group is still its own
        left = self.monitor.lineage.terminate(running.token, leaders=_reaper().tracked)
        if left:
            await _until_gone(left, self.config.kill_grace_s)

    def _end(self, running: _Running, cgroup: Path | None) -> None:
        """The attempt's leader is gone: so is everything it started, wherever it went."""
        if cgroup is not None and self.cgroups is not None:
            self.cgroups.kill(cgroup)
        leaders = _reaper().tracked
        if running.pid in leaders:  # not reaped (we were cancelled): its own may not be ours yet
            leaders = None
        strays = self.monitor.lineage.sweep(running.token, leaders=leaders)
        if strays:
            log.info("killed %d process(es) an attempt left behind", strays)

    def _spawn(
        self,
        spec: AttemptSpec,
        sandbox: Path,
        workdir: Path,
        token: str,
        cpus: frozenset[int] | None,
    ) -> int:
        """Start the attempt's shell; its pid.

        ``posix_spawn`` takes no working directory (before Python 3.13), so the worker enters
        the task's for the moment of the spawn."""
        env = self._environment(spec, sandbox, workdir, token)
        streams = [_create(sandbox / STDOUT)]
        try:
            streams.append(_create(sandbox / STDERR))
            with self._pinned(cpus), _inside(workdir):
                return _start_shell(self._shell, spec.command, env, streams[0], streams[1])
        finally:
            for fd in streams:
                os.close(fd)

    @contextlib.contextmanager
    def _pinned(self, cpus: frozenset[int] | None) -> Iterator[None]:
        """Spawn on ``cpus``: a child inherits the affinity of the thread that forks it."""
        if not cpus or cpus == self._affinity:  # already ours: pinning would move us for nothing
            yield
            return
        os.sched_setaffinity(0, cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, self._affinity)

    def _environment(
        self, spec: AttemptSpec, sandbox: Path, workdir: Path, token: str
    ) -> dict[bytes, bytes]:
        """The attempt's environment, encoded as the kernel takes it (the worker's own is
        encoded once, not at every spawn)."""
        a = spec.allocation
        cores = max(1, math.ceil(a.cores - 1e-9))  # whole CPUs, as the task is pinned to
        threads = str(cores)
        scratch = str(sandbox)
        own = {
            "LEADTIME_TASK_ID": spec.task_id,
            "LEADTIME_ATTEMPT": str(spec.attempt),
            "LEADTIME_CATEGORY": spec.category,
            "LEADTIME_CORES": _plain(a.cores),
            "LEADTIME_MEMORY_MB": _plain(a.memory),
            "LEADTIME_DISK_MB": _plain(a.disk),
            "LEADTIME_WORKDIR": str(workdir),
            "LEADTIME_SCRATCH": scratch,
            ATTEMPT_TOKEN: token,
            WORKER_TOKEN: self.config.worker_token,
            "TMPDIR": scratch,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
        }
        if self._in_slurm_job:
            own |= srun_defaults(
                cores, a.memory, self._node, self._hostfile if self._nodes > 1 else None
            )
        return {**self._environ, **{os.fsencode(k): os.fsencode(v) for k, v in own.items()}}

    def _exceeded(self, running: _Running, exhaustion: Exhaustion) -> None:
        if running.exhaustion is None and running.lost is None:
            running.exhaustion = exhaustion
            self._terminate(running)

    def _terminate(self, running: _Running) -> None:
        """SIGTERM the group now, SIGKILL after the grace unless it is gone."""
        if running.exited.done() or running.kill_timer is not None:
            return
        _signal_group(running.pid, signal.SIGTERM)
        running.kill_timer = asyncio.get_running_loop().call_later(
            self.config.kill_grace_s, self._kill, running
        )

    @staticmethod
    def _kill(running: _Running) -> None:
        if not running.exited.done():  # once reaped, its group id may be someone else's
            _signal_group(running.pid, signal.SIGKILL)

    def _classify(
        self,
        spec: AttemptSpec,
        running: _Running,
        exit_code: int,
        peak: Resources,
        over: Exhaustion | None,
        cgroup: Path | None,
    ) -> tuple[Outcome, Exhaustion | None]:
        """How the attempt ended. One that went over its allocation is EXHAUSTED however it
        exited, whether a sample caught it running or only its totals at the end did: the
        same task is judged the same, however quick it was."""
        if running.lost is not None:
            return Outcome.LOST, None
        if running.exhaustion is not None:
            return Outcome.EXHAUSTED, running.exhaustion
        if cgroup is not None and self.cgroups is not None and self.cgroups.oom_killed(cgroup):
            return Outcome.EXHAUSTED, Exhaustion("memory", max(peak.memory, spec.allocation.memory))
        if over is not None:
            running.exhaustion, running.over_at_end = over, True
            return Outcome.EXHAUSTED, over
        if exit_code == 0:
            return Outcome.SUCCESS, None
        return Outcome.FAILED, None

    def _tail(self, spec: AttemptSpec, sandbox: Path, running: _Running) -> str:
        """The last lines of stdout and stderr (and why the task was stopped)."""
        parts = []
        if running.missing:
            shown = ", ".join(repr(p) for p in running.missing)
            parts.append(f"[leadtime] exited 0 but did not create its declared output {shown}")
        elif running.lost is not None:
            parts.append(f"[leadtime] stopped: {running.lost}")
        elif running.exhaustion is not None:
            e = running.exhaustion
            unit = " s" if e.resource == "wall" else " MB"
            limit = spec.allocation[e.resource]
            how = OVER_AT_END if running.over_at_end else "killed"
            parts.append(
                f"[leadtime] {how}: {e.resource} reached {e.measured:.6g}{unit}"
                f" (allocation {limit:.6g}{unit})"
            )
        for name in STREAMS:
            lines = _last_lines(sandbox / name, self.config.tail_lines)
            if lines:
                parts.append(f"[{name.split('.')[-1]}]\n{lines}")
        return "\n".join(parts)[-MAX_TAIL:]

    async def settle(self) -> None:
        """Wait for sandbox removals and moves still under way; remove the spare sandboxes."""
        while self._removals:
            await asyncio.gather(*self._removals)
        spares, self._spares = self._spares, []
        for spare in spares:
            shutil.rmtree(spare, ignore_errors=True)
        hostfiles, self._hostfiles = self._hostfiles, {}
        for hostfile in hostfiles.values():
            hostfile.unlink(missing_ok=True)

    def _hostfile(self, cores: int) -> Path:
        """The ``SLURM_HOSTFILE`` of a task of ``cores``: this node, once a core (written
        once a worker, under its root)."""
        path = self._hostfiles.get(cores)
        if path is None:
            assert self._node is not None
            path = self.config.root / f"{HOSTS}{cores}"
            path.write_text(f"{self._node}\n" * cores)
            self._hostfiles[cores] = path
        return path

    def _make(self, sandbox: Path) -> None:
        """Make ``sandbox`` empty, from a spare one where there is one."""
        if sandbox.exists():
            shutil.rmtree(sandbox)
        while self._spares:
            with contextlib.suppress(OSError):  # gone: try the next, or make one
                os.rename(self._spares.pop(), sandbox)
                return
        sandbox.mkdir()

    def _clean(self, sandbox: Path, cgroup: Path | None, *, success: bool) -> Path | None:
        """Remove the sandbox unless it is to be kept; where it is kept."""
        keep = self.config.keep_sandboxes
        place = None
        if keep == "never" or (keep == "failure" and success):
            if not self._empty_if_flat(sandbox):
                self._off_loop(shutil.rmtree, sandbox, True)
        else:
            keep_to = self.config.keep_to
            place = sandbox if keep_to is None else keep_to / sandbox.name
            if place != sandbox:
                self._off_loop(self._move, sandbox, place)
            if not success:
                log.info("kept the sandbox %s", place)
        if cgroup is not None and self.cgroups is not None:
            self.cgroups.remove(cgroup)
        return place

    def _empty_if_flat(self, sandbox: Path, most: int = 16) -> bool:
        """Empty ``sandbox`` here if it holds only a few plain files (often just the task's
        stdout and stderr), and keep it as a spare or remove it: handing it to a thread costs
        more than these unlinks. False: it is left for a thread's rmtree.

        A spare keeps the streams that no process holds open, emptied, for the next attempt:
        making and removing two files an attempt is most of a worker's file system work, and
        after tens of thousands made and removed, ext4 can take several times as long to make one.
        """
        try:
            with os.scandir(sandbox) as entries:
                found = list(itertools.islice(entries, most + 1))
            if len(found) > most or not all(e.is_file(follow_symlinks=False) for e in found):
                return False
            kept = len(self._spares) < SPARE_SANDBOXES
            for entry in found:
                if not (kept and entry.name in STREAMS and _emptied_if_unheld(entry.path)):
                    os.unlink(entry.path)
            if kept:
                spare = self.config.root / f"{SPARE}{next(self._spare_ids)}"
                os.rename(sandbox, spare)
                self._spares.append(spare)
            else:
                os.rmdir(sandbox)
        except OSError:  # anything odd: the thread's rmtree copes with it
            return False
        return True

    def _off_loop(self, work, *args) -> None:
        """Removing or moving a big sandbox (or any, on a slow disk) takes a while."""
        done = asyncio.get_running_loop().run_in_executor(None, work, *args)
        self._removals.add(done)
        done.add_done_callback(self._removals.discard)

    def _move(self, sandbox: Path, place: Path) -> None:
        """Move a kept sandbox to ``place``: whole while the budget allows, else its stdout and
        stderr that fit, with a note of what was left out; nothing stays on the node unless
        the move fails."""
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            if self._spend(footprint.directory_size(sandbox)):
                shutil.move(sandbox, place)
                return
            place.mkdir()
            left = []
            for name in STREAMS:
                stream = sandbox / name
                size = stream.stat().st_size if stream.exists() else 0
                if size and self._spend(size):
                    shutil.move(stream, place / name)
                elif size:
                    left.append(f"{name} ({size / MB:.1f} MB)")
            left.insert(0, "the rest of its scratch directory")
            budget = f"{self.config.keep_budget_mb:g} MB"
            note = f"Not kept, over the worker's budget of {budget} (--keep-budget): "
            (place / NOT_KEPT).write_text(note + ", ".join(left) + ".\n")
        except OSError as e:
            log.warning("the sandbox %s stays on this node, not moved to %s: %s", sandbox, place, e)
            return
        shutil.rmtree(sandbox, ignore_errors=True)

    def _spend(self, size: int) -> bool:
        """Take ``size`` bytes of the keep budget, if it has them (moves run on threads)."""
        with self._keep_lock:
            if size > self._keep_budget:
                return False
            self._keep_budget -= size
            return True


SRUN_MEMORY_PER_UNIT = ("SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU")
"""The job's memory per CPU or GPU, which ``srun`` would take with a task's memory per node
(it refuses both at once): left out of a task's environment."""


def remove_own_files(root: Path) -> None:
    """Remove what a worker kept under ``root`` for itself (:data:`SPARE`, :data:`HOSTS`), as
    :meth:`Runner.settle` does at its end: for the sentinel of a worker killed outright."""
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith((SPARE, HOSTS)):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


def srun_defaults(
    cores: int, memory_mb: float, node: str | None, hostfile: Callable[[int], Path] | None
) -> dict[str, str]:
    """The defaults an ``srun`` or an MPI launcher that a task runs takes from its environment
    (Slurm's input variables), in a pilot: a step of the task's share on ``node``, its node,
    as in a job of ``--ntasks=cores --mem=memory`` of its own there. The task would inherit
    the worker's step's, one task per node of the pilot holding each node's CPUs: an
    ``srun -n 2`` would be told one task per node and every node, or in a pilot of whole
    nodes 16 CPUs a task.

    The step overlaps the others: the worker, not Slurm, shares the pilot out among
    its tasks, and Slurm, which sees the worker's step hold every CPU and all memory, would
    start the steps of tasks running side by side one after the other (on Slurm 22.05, a
    second step of one CPU in a job of four waited for the first to end).

    ``SLURM_TASKS_PER_NODE`` is where MPI launchers count their slots: with the worker's
    step's, one a node, ``mpirun -n 2`` in a task of 2 cores found too few (Open MPI 4.1:
    "There are not enough slots available"). They take the nodes from ``SLURM_JOB_NODELIST``:
    with the pilot's, a task's ``mpirun`` on its second node started its ranks on the first.

    ``srun`` takes no node list from its environment but the host file of the ``arbitrary``
    distribution, given ``hostfile`` (the node once a core, for a task of ``cores``): without
    it, in a pilot of two nodes, a task's ``srun`` on the second started its step on the
    first (Slurm 22.05). The worker gives one only in a pilot of several nodes: ``sbatch``
    reads ``SLURM_HOSTFILE`` too, so a job a task submits would be bound to the task's node,
    and an ``srun`` with more ranks than the task's cores is refused ("Too few NodeNames")."""
    n = str(cores)
    defaults = {
        "SLURM_OVERLAP": "1",
        "SLURM_NTASKS": n,
        "SLURM_NPROCS": n,
        "SLURM_NTASKS_PER_NODE": n,
        "SLURM_TASKS_PER_NODE": n,
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
    }
    if memory_mb >= 1:
        defaults["SLURM_MEM_PER_NODE"] = str(math.floor(memory_mb))
    if node is not None:
        defaults |= {
            "SLURM_JOB_NODELIST": node,
            "SLURM_NODELIST": node,
            "SLURM_JOB_CPUS_PER_NODE": n,
            "SLURM_CPUS_ON_NODE": n,
        }
        if hostfile is not None:
            defaults |= {"SLURM_DISTRIBUTION": "arbitrary", "SLURM_HOSTFILE": str(hostfile(cores))}
    return defaults


def _plain(value: float) -> str:
    """A number as a shell user expects it: ``1.5``, ``4000``, never ``4e+03``."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _start_shell(shell: bytes, command: str, env: dict[bytes, bytes], out: int, err: int) -> int:
    """Start ``shell -c command`` in a session of its own, its stdin /dev/null, its stdout and
    stderr ``out`` and ``err``; its pid.

    ``posix_spawn`` costs a fraction of ``subprocess``'s for a task of milliseconds. The task
    inherits no descriptor but its streams: Python opens every other one non-inheritable. A
    Python built without its ``setsid`` (against a C library older than glibc 2.26, as some
    HPC distributions of Python are) starts tasks with ``subprocess`` instead.
    """
    global _SPAWN_SETSID
    argv = [shell, b"-c", os.fsencode(command)]
    if _SPAWN_SETSID:
        try:
            return os.posix_spawn(
                shell,
                argv,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out, 1),
                    (os.POSIX_SPAWN_DUP2, err, 2),
                ],
                setsid=True,
                setsigdef=_IGNORED_BY_PYTHON,
            )
        except NotImplementedError:
            _SPAWN_SETSID = False
    child = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
    )
    child.returncode = 0  # the reaper waits for it (with its rusage), never Popen
    return child.pid


@contextlib.contextmanager
def _inside(directory: Path) -> Iterator[None]:
    """This process works in ``directory`` until the block ends (a child started meanwhile
    starts there), then where it was, even if that was removed meanwhile."""
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(directory)
        try:
            yield
        finally:
            os.fchdir(here)
    finally:
        os.close(here)


def _create(path: Path) -> int:
    """A new empty file at ``path`` for a child's output stream (a descriptor, not a Python
    file object: the child only needs the descriptor)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)


def _emptied_if_unheld(path: str) -> bool:
    """Empty the file at ``path`` if no process holds it open; whether it did.

    A process the task left behind (one that emptied its environment escapes the sweep) may
    still hold its stream, and would write into the next attempt's. Linux grants a write
    lease only on a file nobody else has open; where there are none (NFS, or leases turned
    off), the file is not reused. Nor is one with another name (a task may have linked a
    file of its own there): that file is left whole. The lease is held for these few calls:
    no one is signalled when an opener breaks it (the break would send SIGIO, which ends a
    process by default), and that opener waits until it is given up.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        fcntl.fcntl(fd, fcntl.F_SETOWN, 0)
        try:
            found = os.fstat(fd)
            if found.st_nlink != 1:
                return False
            if found.st_size:
                os.ftruncate(fd, 0)
        finally:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def capture(path: Path, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> Captured:
    """The first ``head`` and last ``tail`` bytes of the file at ``path`` as text, and how
    many bytes between them were left out; all of it when it holds no more than both.

    Where it is cut, the head ends and the tail starts on a whole line if the kept bytes hold
    a line break, else on a whole character (text is UTF-8; anything else comes out as
    U+FFFD); what that leaves out counts as cut.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return Captured()
    try:
        size = os.fstat(fd).st_size
        if size == 0:  # most tasks write nothing to one stream or the other
            return Captured()
        first = os.pread(fd, head, 0)
        last = os.pread(fd, tail, max(len(first), size - tail))
    except OSError:
        return Captured()
    finally:
        os.close(fd)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    if size <= len(first) + len(last):
        return Captured(decoder.decode(first), decoder.decode(last, final=True), 0)
    if b"\n" in first:
        first = first[: first.rindex(b"\n") + 1]
    start = decoder.decode(first)  # a character split at the end waits in the decoder
    first = first[: len(first) - len(decoder.getstate()[0])]
    line = last.find(b"\n")
    if 0 <= line < len(last) - 1:
        last = last[line + 1 :]
    else:  # no line to start on: start on a character (skip UTF-8 continuation bytes)
        last = last[next((i for i, b in enumerate(last[:4]) if b & 0xC0 != 0x80), 0) :]
    return Captured(start, last.decode(errors="replace"), size - len(first) - len(last))


def _last_lines(path: Path, lines: int, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


# --- reaping ---------------------------------------------------------------------------------


class _Reaper:
    """Learns which task leaders exited, and reaps them.

    A pidfd per child (Linux >= 5.3) wakes the loop when that child exits;
    older kernels fall back to scanning our children on SIGCHLD. Neither
    needs a thread per child. A leader that exited stays a zombie until :meth:`reap`: its pid
    and process group id cannot be taken by another process meanwhile, so what is left of its
    group is still its own to signal.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: dict[int, asyncio.Future] = {}
        """Children not exited yet, and the future each exit resolves."""
        self._exited: set[int] = set()
        """Children exited, not reaped yet."""
        self._abandoned: set[int] = set()
        """Children nobody waits for: reaped as soon as they exit."""
        self._pidfds = _pidfd_works()
        if not self._pidfds:
            loop.add_signal_handler(signal.SIGCHLD, self._check_all)
            # A burst of exits can fill the loop's wakeup pipe; that loses nothing here
            # (every SIGCHLD checks every child), so do not warn about it.
            signal.set_wakeup_fd(signal.set_wakeup_fd(-1), warn_on_full_buffer=False)

    @property
    def tracked(self) -> set[int]:
        """Leaders of attempts not yet reaped (our children, never an attempt's leftovers)."""
        return self._waiting.keys() | self._exited

    def track(self, pid: int) -> asyncio.Future:
        """A future done when our child ``pid`` exits (``ChildProcessError`` if someone else
        reaped it); then :meth:`reap` it."""
        future = self._waiting[pid] = self._loop.create_future()
        if self._pidfds:
            fd = os.pidfd_open(pid)
            self._loop.add_reader(fd, self._pidfd_readable, pid, fd)
        else:
            self._check(pid)
        return future

    def reap(self, pid: int) -> tuple[int, resource.struct_rusage]:
        """Kill what is left of exited ``pid``'s process group, and reap it: its wait status
        and resource usage."""
        self._exited.discard(pid)
        _signal_group(pid, signal.SIGKILL)
        _, status, rusage = os.wait4(pid, 0)
        return status, rusage

    def abandon(self, pid: int) -> None:
        """Nobody waits for ``pid`` any more: reaped as soon as it exits."""
        if pid in self._exited:
            with contextlib.suppress(ChildProcessError):
                self.reap(pid)
        elif pid in self._waiting:
            self._abandoned.add(pid)

    def _pidfd_readable(self, pid: int, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        self._settle(pid)

    def _check_all(self) -> None:
        for pid in list(self._waiting):
            self._check(pid)

    def _check(self, pid: int) -> None:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                self._settle(pid)
        except ChildProcessError as e:  # someone else reaped it
            self._settle(pid, e)

    def _settle(self, pid: int, error: ChildProcessError | None = None) -> None:
        future = self._waiting.pop(pid)
        if error is None:
            self._exited.add(pid)
        if pid in self._abandoned:
            self._abandoned.discard(pid)
            self.abandon(pid)
        elif future.done():
            return
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(None)


def _reap(running: _Running) -> tuple[int, resource.struct_rusage] | None:
    """Kill what is left of the attempt's process group and reap its leader: its wait status
    and resource usage. None for a leader that has not exited (we were cancelled): it is
    killed, and reaped when it exits."""
    reaper = _reaper()
    if not running.exited.done():
        _signal_group(running.pid, signal.SIGKILL)
        reaper.abandon(running.pid)
        return None
    running.exited.result()  # someone else reaped it: its ChildProcessError
    return reaper.reap(running.pid)


async def _until_gone(pids: list[int], timeout: float) -> None:
    """Wait until the processes ``pids`` have exited, at most ``timeout`` s."""
    loop = asyncio.get_running_loop()
    exits: dict[int, asyncio.Future] = {}

    def exited(fd: int) -> None:
        loop.remove_reader(fd)
        exits[fd].set_result(None)

    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # gone already
            except (AttributeError, OSError):  # a kernel without pidfds: the whole grace
                await clock.sleep(timeout)
                return
            exits[fd] = loop.create_future()
            loop.add_reader(fd, exited, fd)
        if exits:
            await asyncio.wait(exits.values(), timeout=timeout)
    finally:
        for fd in exits:
            loop.remove_reader(fd)
            os.close(fd)


def _has_exited(running: _Running) -> bool:
    """Whether the attempt's leader has exited, reaped or not yet (its exit still unread)."""
    if running.exited.done():
        return True
    try:
        return os.waitid(os.P_PID, running.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped meanwhile
        return True


def _pidfd_works() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


_reapers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Reaper] = (
    weakref.WeakKeyDictionary()
)


def _reaper() -> _Reaper:
    loop = asyncio.get_running_loop()
    reaper = _reapers.get(loop)
    if reaper is None:
        reaper = _reapers[loop] = _Reaper(loop)
    return reaper
