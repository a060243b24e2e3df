"""The agent a pilot runs on each node: ``leadtime worker --manager HOST:PORT``.

It learns its capacity from Slurm's environment (or flags), connects to the
manager, proves it belongs to the run, registers, heartbeats, and runs the
attempts it is sent, several at once within its capacity. The manager
decides placement and may send attempts ahead, while the worker is full: they
wait, in the order they came, until there is room (a worker of short tasks then
never idles while the manager answers). An attempt larger than the worker is
refused with a clear error. It leaves cleanly (exit code 0) when the manager asks,
on SIGTERM, or when its pilot's time is up (it stops taking tasks a margin
before).

If the manager vanishes (its host rebooted, its process was killed), the
worker keeps its attempts running, keeps their results, and keeps trying to
register, reading the manager's address again from ``--manager-file`` each
time: a manager resuming the run (``leadtime resume``) takes it and its
attempts over. After ``connect_timeout_s`` without a manager it kills its
attempts and exits, so a pilot nobody resumes ends by itself. Nothing a task
starts outlives the worker: if the worker itself is killed, its sentinel
kills what its tasks left (:mod:`orchestrator.agent.lineage`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Annotated

import psutil
import typer

from backends import clock
from backends.base import NodeShare, WorkerLaunch, WorkerPlace
from backends.cores import CoreSet
from learners.resources import PACKED, Resources
from orchestrator.agent import protocol
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Outcome, first_come, refused
from orchestrator.agent.lineage import Sentinel, adopt_orphans, new_token
from orchestrator.agent.monitor import MB, MemoryCgroups, Monitor, MonitorConfig
from orchestrator.agent.protocol import (
    AuthError,
    Channel,
    ProtocolError,
    Registration,
    Welcome,
    lost,
)
from orchestrator.agent.taskrun import (
    KEEP_BUDGET_MB,
    Keep,
    Runner,
    RunnerConfig,
    remove_own_files,
)
from orchestrator.command import App

log = logging.getLogger(__name__)

EXIT_RELEASED = 0
EXIT_USAGE = 2
EXIT_MANAGER_GONE = 3
EXIT_REFUSED = 4

RESEND_S = 60.0
"""Results sent this recently are sent again to a manager the worker registers with anew."""
RESULT_LINGER_S = 0.02
"""While attempts sent ahead wait here, a result waits up to this long for the next ones to
leave with it: the manager has given this worker work, and fewer, larger frames cost both
sides less (its loop gathers results twice as long). A worker's last result, with nothing
waiting behind it, leaves at once. 20 ms, not 10: 3 to 5% less of the manager's CPU a task
for tasks of a few milliseconds, the same throughput."""
OUTSIDE_SIGNAL_GRACE_S = 1.0
"""How long an attempt killed by a signal the worker did not send waits for the worker's own
stop: a batch system stopping a job (scancel, time limit) signals every process of it at once,
and the task may die before the worker hears of it."""
_STOPS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)
_STOP_SIGNALS = frozenset([-s for s in _STOPS] + [128 + s for s in _STOPS])
"""Exit codes of an attempt killed by a signal that stops a job: killed itself, or a shell
telling that its command was (128 + the signal: 143 for SIGTERM)."""


class OptionsError(ValueError):
    """A worker option or its environment is wrong (a user error)."""


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """Everything the agent needs; build it with :func:`make_options`."""

    manager: tuple[str, int] | None
    """The manager's address, unless ``manager_file`` tells it."""
    secret: bytes = field(repr=False)
    root: Path
    worker_id: str
    capacity: Resources
    pilot_id: str = ""
    end_time: float | None = None
    """Unix time the pilot ends, if known."""
    connect_timeout_s: float = 600.0
    """How long to keep trying to reach a manager (at start, or after losing it)."""
    manager_file: Path | None = None
    """A file holding the manager's ``HOST:PORT``, read again at each attempt to connect: a
    manager that resumes the run writes its own address there."""
    drain_margin_s: float = 60.0
    """Stop taking tasks this long before ``end_time``, or a tenth of the time left when the
    worker starts, if less (:data:`DRAIN_FRACTION`)."""
    keep_sandboxes: Keep = "failure"
    keep_to: Path | None = None
    """Where kept sandboxes go (the run's directory); None: they stay under ``root``."""
    keep_budget_mb: float = KEEP_BUDGET_MB
    own_root: bool = False
    """The worker made ``root``: it removes it when it leaves, if nothing stays there."""
    kill_grace_s: float = 1.0
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    cgroups: bool = True
    """Use cgroup v2 ``memory.max`` as a backstop where the system delegates it."""
    token: str = field(default_factory=new_token)
    """Every task of this worker carries it: what its sentinel kills (:mod:`.lineage`)."""


DRAIN_FRACTION = 0.1
"""The most of its time a worker spends draining: a pilot of a minute would otherwise drain
from its start and run nothing."""

MODULE = "orchestrator.agent.worker"
"""``python -m MODULE`` runs the agent (``leadtime worker``) without a console script."""


def launch(
    manager: str | Path,
    *,
    secret_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    keep_to: Path | None = None,
    args: Sequence[str] = (),
) -> WorkerLaunch:
    """How a pilot starts this agent: ``python -m``, by this process's interpreter (whatever
    the PATH; a virtual environment's works on any node that shares its file system), to
    the manager at ``manager`` (its ``HOST:PORT``, or a file holding it), with the run's
    secret in ``secret_file`` or ``env`` (never on the command line), its kept sandboxes
    moved to ``keep_to``, and ``args`` besides."""
    where = (
        ("--manager-file", str(manager)) if isinstance(manager, Path) else ("--manager", manager)
    )
    secret = () if secret_file is None else ("--secret-file", str(secret_file))
    keep = () if keep_to is None else ("--keep-to", str(keep_to))
    argv = (sys.executable, "-m", MODULE, *where, *secret, *keep, *args)
    return WorkerLaunch(argv, dict(env or {}), place_args)


def place_args(place: WorkerPlace) -> tuple[str, ...]:
    """The options that tell a worker its place, given where no batch system tells it
    (``repr``: the worker must get exactly the size the sizer was told)."""
    return (
        *("--pilot-id", place.pilot, "--worker-id", place.worker),
        *("--cores", repr(place.capacity.cores), "--memory", repr(place.capacity.memory)),
        *("--disk", repr(place.capacity.disk)),
        *("--end-time", repr(place.end_time)),
        *("--root", str(place.root)),
    )


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionsError(f"--manager must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class NotAJobStep(ValueError):
    """The worker was not started by srun: Slurm's environment tells nothing of its share."""


def node_share_from_env(environ: Mapping[str, str]) -> NodeShare:
    """The part of its node a worker that a pilot's batch script started holds.

    srun sets ``SLURM_CPUS_ON_NODE`` to the job's CPUs on this node (all of them, given
    ``--whole``), and ``SLURM_MEM_PER_NODE`` or ``SLURM_MEM_PER_CPU`` from ``--mem``,
    ``--mem-per-cpu`` or the cluster's default (memory 0 when neither is set).
    """
    cpus = _slurm_number(environ, "SLURM_CPUS_ON_NODE")
    if cpus is None:
        raise NotAJobStep("not inside a Slurm job step: SLURM_CPUS_ON_NODE is not set")
    memory = _slurm_number(environ, "SLURM_MEM_PER_NODE")
    if memory is None:
        memory = (_slurm_number(environ, "SLURM_MEM_PER_CPU") or 0.0) * cpus
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    return NodeShare(node, int(cpus), int(memory))


def detect_capacity(
    environ: Mapping[str, str],
    root: Path,
    cores: float | None = None,
    memory: float | None = None,
    disk: float | None = None,
) -> Resources:
    """Cores, memory (MB) and disk (MB): flags, else Slurm's environment, else this machine.

    Disk is the free space under the sandbox root.
    """
    try:
        share: NodeShare | None = node_share_from_env(environ)
    except NotAJobStep:
        share = None
    if cores is None:
        cores = float(share.cores if share else len(os.sched_getaffinity(0)))
    if memory is None:
        known = share.memory_mb if share else 0
        memory = float(known) if known else psutil.virtual_memory().available / MB
    if disk is None:
        disk = shutil.disk_usage(root).free / MB
    capacity = Resources(cores, memory, disk)
    for name in ("cores", "memory", "disk"):
        if not capacity[name] > 0:
            raise OptionsError(f"the worker's {name} must be positive, got {capacity[name]}")
    return capacity


def detect_end_time(
    environ: Mapping[str, str],
    now: float,
    end_time: float | None = None,
    time_limit_s: float | None = None,
) -> float | None:
    """When the pilot ends (Unix time): a flag, Slurm's environment, or start + time limit."""
    if end_time is not None:
        return end_time
    slurm_end = _slurm_number(environ, "SLURM_JOB_END_TIME")
    if slurm_end is not None:
        return slurm_end
    if time_limit_s is not None:
        start = _slurm_number(environ, "SLURM_JOB_START_TIME")
        return (now if start is None else start) + time_limit_s
    return None


def _slurm_number(environ: Mapping[str, str], name: str) -> float | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError as e:
        raise OptionsError(f"${name} is not a number: {value!r}") from e


def make_options(
    manager: str | None = None,
    *,
    manager_file: Path | None = None,
    secret_file: Path | None = None,
    root: Path | None = None,
    worker_id: str | None = None,
    pilot_id: str | None = None,
    cores: float | None = None,
    memory: float | None = None,
    disk: float | None = None,
    end_time: float | None = None,
    time_limit: float | None = None,
    connect_timeout: float = 600.0,
    drain_margin: float = 60.0,
    keep_sandboxes: Keep = "failure",
    keep_to: Path | None = None,
    keep_budget: float = KEEP_BUDGET_MB,
    sample_interval: float = 1.0,
    first_sample: float = 0.1,
    cgroups: bool = True,
    environ: Mapping[str, str] = os.environ,
) -> WorkerOptions:
    """Worker options from flag values (``None``: detect), for ``main`` and the CLI alike."""
    if manager is None and manager_file is None:
        raise OptionsError("give the manager's address: --manager HOST:PORT or --manager-file")
    try:
        secret = protocol.load_secret(secret_file, environ)
    except protocol.SecretError as e:
        raise OptionsError(str(e)) from e
    hostname = socket.gethostname()
    worker_id = worker_id or f"{hostname}-{os.getpid()}"
    if keep_sandboxes not in ("never", "failure", "always"):
        raise OptionsError("--keep-sandboxes must be never, failure or always")
    if not keep_budget >= 0:
        raise OptionsError(f"--keep-budget must be 0 or more MB, not {keep_budget}")
    try:
        monitor = MonitorConfig(interval_s=sample_interval, first_sample_s=first_sample)
    except ValueError as e:
        raise OptionsError(f"sampling: {e}") from e
    address = None if manager is None else parse_address(manager)
    end = detect_end_time(environ, clock.wall(), end_time, time_limit)
    if root is None:
        base = environ.get("SLURM_TMPDIR") or environ.get("TMPDIR") or tempfile.gettempdir()
        root = Path(base) / f"leadtime-{worker_id}"
    root = _own_root(root, worker_id)  # the last step: a refusal leaves nothing made
    try:
        capacity = detect_capacity(environ, root, cores, memory, disk)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return WorkerOptions(
        manager=address,
        manager_file=manager_file,
        secret=secret,
        root=root,
        worker_id=worker_id,
        capacity=capacity,
        pilot_id=pilot_id if pilot_id is not None else environ.get("SLURM_JOB_ID", ""),
        end_time=end,
        connect_timeout_s=connect_timeout,
        drain_margin_s=drain_margin,
        keep_sandboxes=keep_sandboxes,
        keep_to=keep_to,
        keep_budget_mb=keep_budget,
        own_root=True,
        monitor=monitor,
        cgroups=cgroups,
    )


def _own_root(root: Path, worker_id: str) -> Path:
    """A directory of the worker's own for its sandboxes, made now: ``root`` if it does not
    exist yet, else a new one inside it. A directory that exists may be another worker's
    or another run's: a sandbox of the same task name, a spare or a host file made or
    removed there could be theirs."""
    try:
        root.mkdir(parents=True)
        return root
    except FileExistsError:
        pass
    except OSError as e:
        raise OptionsError(f"cannot create the sandbox root {root}: {e.strerror}") from e
    try:
        return Path(tempfile.mkdtemp(prefix=f"leadtime-{worker_id}-", dir=root))
    except OSError as e:
        raise OptionsError(f"cannot create a sandbox root in {root}: {e.strerror}") from e


def shut_down(reason: str) -> str:
    """Why a worker's shutdown ended an attempt, whether the worker stopped it or the signal
    that stopped the worker (meant for the whole job) reached the task first."""
    return f"worker shut down: {reason}"


class Agent:
    """One worker: a connection to the manager and the attempts it runs."""

    def __init__(self, options: WorkerOptions, cgroups: MemoryCgroups | None = None) -> None:
        self.options = options
        self.capacity = options.capacity
        self.free = options.capacity
        affinity = sorted(os.sched_getaffinity(0))
        self.cores = CoreSet(affinity[: max(1, math.ceil(options.capacity.cores))])
        self.runner = Runner(
            RunnerConfig(
                root=options.root,
                keep_sandboxes=options.keep_sandboxes,
                keep_to=options.keep_to,
                keep_budget_mb=options.keep_budget_mb,
                kill_grace_s=options.kill_grace_s,
                worker_token=options.token,
            ),
            Monitor(options.monitor),
            cgroups=cgroups,
        )
        self.attempts: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.waiting: dict[tuple[str, int], AttemptSpec] = {}
        """Attempts sent ahead, in the order they came: each starts once it fits what is free."""
        self.leaving: str | None = None
        """Why the worker is leaving, once it is (it takes no new tasks then)."""
        self._channel: Channel | None = None
        self._unsent: dict[tuple[str, int], AttemptResult] = {}
        """Results that ended while no manager listened."""
        self._sent: deque[tuple[float, AttemptResult]] = deque()
        """Results sent in the last :data:`RESEND_S`: a manager that died may not have kept
        them, and one resuming the run asks for them again."""
        self._released = False
        self._shut = False
        """Shut down: its attempts were stopped, and it tells no manager more."""
        self._left = asyncio.Event()
        """Set once the worker is leaving."""

    async def serve(self) -> int:
        """Work until released (0), refused (4) or without a manager for too long (3)."""
        timers = self._end_timers()
        try:
            while self._needs_manager():
                try:
                    connection = await self._connect()
                except AuthError as e:
                    log.error("%s", e)
                    await self._stop_all("the manager refused this worker")
                    return EXIT_REFUSED
                except TimeoutError:
                    why = f"no manager for {self.options.connect_timeout_s:.0f} s"
                    log.error("%s; giving up", why)
                    await self._stop_all(why)
                    return EXIT_MANAGER_GONE
                if connection is None:
                    break
                await self._session(*connection)
                if self._released:
                    break
            await self._stop_all(self.leaving or "leaving")
            await self.runner.settle()
            return EXIT_RELEASED
        finally:
            for timer in timers:
                timer.cancel()

    def drain(self, reason: str) -> None:
        """Take no more tasks; leave once the running ones are done."""
        if self.leaving is None:
            self.leaving = reason
            self._left.set()
            log.info("draining: %s", reason)
            if self._channel is not None:
                self._channel.send("draining", reason=reason)
        self._leave_if_idle()

    def shutdown(self, reason: str) -> None:
        """Kill the running tasks and drop the waiting ones (all reported lost), and leave."""
        self.drain(reason)
        self._shut = True
        self._drop_waiting(shut_down(reason))
        self.runner.stop_all(shut_down(reason))

    # --- connection -------------------------------------------------------------------------

    async def _connect(self) -> tuple[Channel, Welcome] | None:
        """A registered connection, retrying with backoff; None if we left meanwhile."""
        deadline = clock.now() + self.options.connect_timeout_s
        delay = 0.05
        while self._needs_manager():
            try:
                host, port = self._address()
                async with asyncio.timeout(max(0.0, deadline - clock.now())):
                    reader, writer = await asyncio.open_connection(host, port)
                    channel = Channel(reader, writer)
                    try:
                        welcome = await protocol.offer(
                            channel, self.options.secret, self._registration()
                        )
                    except BaseException:
                        await channel.close()
                        raise
                log.info("registered with the manager at %s:%d as %s", host, port, self.id)
                return channel, welcome
            except AuthError:
                raise
            except (OSError, ProtocolError, asyncio.IncompleteReadError, OptionsError) as e:
                log.info("cannot register with the manager yet: %s", e)
            if clock.now() + delay > deadline:
                raise TimeoutError
            await clock.sleep(delay)
            delay = min(2 * delay, 5.0)
        return None

    def _needs_manager(self) -> bool:
        """Whether to look for a manager: until the worker leaves, and while it drains, for
        as long as it runs attempts or holds results no manager has heard (a drain that
        began while the manager was away lets what runs finish, for a resumed run)."""
        if self._released or self._shut:
            return False
        return not self.leaving or bool(self.attempts or self.waiting or self._unsent)

    def _address(self) -> tuple[str, int]:
        """Where the manager listens: ``--manager-file``'s address, or ``--manager``."""
        path = self.options.manager_file
        if path is not None:
            try:
                return parse_address(path.read_text().strip())
            except OSError as e:
                if self.options.manager is None:
                    raise OptionsError(f"cannot read {path}: {e.strerror}") from e
        assert self.options.manager is not None
        return self.options.manager

    @property
    def id(self) -> str:
        return self.options.worker_id

    def _registration(self) -> Registration:
        return Registration(
            worker_id=self.id,
            pilot_id=self.options.pilot_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            capacity=self.capacity,
            end_time=self.options.end_time,
        )

    async def _session(self, channel: Channel, welcome: Welcome) -> None:
        self._channel = channel
        self._catch_up(channel)
        heartbeat = asyncio.create_task(self._heartbeat(channel, welcome))
        try:
            while True:
                message = await channel.receive()
                kind = message["t"]
                if kind == "run":
                    for spec in protocol.specs(message):
                        self._start(spec)
                elif kind == "cancel":
                    for task_id, attempt in protocol.keys(message):
                        if self.waiting.pop((task_id, attempt), None) is None:
                            self.runner.stop(task_id, attempt, "cancelled by the manager")
                    self._start_waiting()  # a cancelled first one no longer holds the rest
                    self._leave_if_idle()
                elif kind == "drain":
                    self.drain("the manager asked")
                elif kind == "shutdown":
                    self.shutdown("the manager asked")
                elif kind != "hb":
                    raise ProtocolError(f"unexpected {kind!r} message from the manager")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            if not self._released:
                log.warning("lost the manager: %s", e or "connection closed")
        except ProtocolError as e:
            log.error("bad message from the manager: %s", e)
        finally:
            self._channel = None
            heartbeat.cancel()
            await channel.close()

    async def _heartbeat(self, channel: Channel, welcome: Welcome) -> None:
        reason = await channel.keep_alive(welcome.heartbeat_s, welcome.timeout_s)
        log.warning("the manager: %s", reason)

    def _end_timers(self) -> list[asyncio.TimerHandle]:
        end = self.options.end_time
        if end is None:
            return []
        loop = asyncio.get_running_loop()
        end_loop = clock.from_epoch(end)
        margin = min(self.options.drain_margin_s, DRAIN_FRACTION * (end_loop - loop.time()))
        return [
            loop.call_at(end_loop - margin, self.drain, "the pilot ends soon"),
            loop.call_at(end_loop, self.shutdown, "the pilot's time is up"),
        ]

    # --- attempts ---------------------------------------------------------------------------

    def _start(self, spec: AttemptSpec) -> None:
        key = spec.key
        if key in self.attempts or key in self.waiting:
            log.error("attempt %d of %s is already here; ignored", spec.attempt, spec.task_id)
            return
        if self.leaving:
            self._report(lost(spec.task_id, spec.attempt, 0.0, f"worker leaving: {self.leaving}"))
            return
        if not spec.allocation.fits_in(self.capacity):
            self._report(self._refused(spec))
            return
        self.waiting[key] = spec
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start the attempts sent ahead, in the order they came, while the first fits."""
        waiting = ((key, spec.allocation) for key, spec in self.waiting.items())
        started, self.free = first_come(waiting, self.free)
        for key in started:
            spec = self.waiting.pop(key)
            cpus = self.cores.take(spec.allocation.cores)
            self.attempts[key] = asyncio.create_task(self._run(spec, cpus))

    async def _run(self, spec: AttemptSpec, cpus: frozenset[int] | None) -> None:
        try:
            result = await self.runner.run(spec, cpus)
            if result.outcome is Outcome.FAILED and result.exit_code in _STOP_SIGNALS:
                result = await self._stopped_with_worker(result)
        except Exception as e:
            log.exception("attempt %d of %s", spec.attempt, spec.task_id)
            result = refused(spec, f"worker error: {e!r}")  # lost, it would run for ever
        finally:
            self.free = self.free.plus(spec.allocation)
            self.cores.give(cpus, spec.allocation.cores)
            del self.attempts[spec.key]
        self._report(result)
        self._start_waiting()
        self._leave_if_idle()

    async def _stopped_with_worker(self, result: AttemptResult) -> AttemptResult:
        """An attempt killed from outside as its worker is stopped is lost, not failed: the
        signal was meant for the whole job (cancelled, out of time), not for the task."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(OUTSIDE_SIGNAL_GRACE_S):
                await self._left.wait()
        if self.leaving is None:
            return result
        why = f"[leadtime] stopped: {shut_down(self.leaving)}\n"  # as if the worker stopped it
        return replace(result, outcome=Outcome.LOST, output_tail=why + result.output_tail)

    def _refused(self, spec: AttemptSpec) -> AttemptResult:
        a, capacity = spec.allocation, self.capacity
        short = ", ".join(
            f"{r} {a[r]:g} > {capacity[r]:g}" for r in PACKED if a[r] > capacity[r] + 1e-9
        )
        return refused(
            spec, f"worker {self.id} refused the attempt, larger than the worker: {short}"
        )

    def _report(self, result: AttemptResult) -> None:
        if self._channel is None:
            self._unsent[(result.task_id, result.attempt)] = result
            return
        linger = RESULT_LINGER_S if self.waiting else 0.0
        self._channel.post("result", protocol.result_item(result), linger)
        now = clock.now()
        self._sent.append((now, result))
        while self._sent and self._sent[0][0] < now - RESEND_S:
            self._sent.popleft()

    def _catch_up(self, channel: Channel) -> None:
        """Tell a manager we registered with what it may not know: the results of attempts
        that ended while no manager listened or shortly before, what still runs, and that
        we are leaving if we began to while none listened (else it would send us tasks, each
        refused and sent again at once)."""
        recent = {(r.task_id, r.attempt): r for t, r in self._sent if t >= clock.now() - RESEND_S}
        unsent, self._unsent = self._unsent, {}
        for result in {**recent, **unsent}.values():
            channel.post("result", protocol.result_item(result))
        here = [*self.attempts, *self.waiting]
        channel.send("attached", items=[protocol.key_item(*key) for key in here])
        if self.leaving is not None:
            channel.send("draining", reason=self.leaving)
            self._leave_if_idle()

    def _leave_if_idle(self) -> None:
        channel = self._channel
        busy = self.attempts or self.waiting
        if self.leaving is None or busy or channel is None or self._released:
            return
        self._released = True
        channel.send("bye", reason=self.leaving)
        channel.writer.close()

    def _drop_waiting(self, reason: str) -> None:
        waiting, self.waiting = self.waiting, {}
        for task_id, attempt in waiting:
            self._report(lost(task_id, attempt, 0.0, reason))

    async def _stop_all(self, reason: str) -> None:
        self._drop_waiting(reason)
        self.runner.stop_all(reason)
        if self.attempts:
            await asyncio.gather(*self.attempts.values(), return_exceptions=True)


async def serve(options: WorkerOptions) -> int:
    """Run this process as a worker until it is released; its exit code.

    SIGTERM (Slurm's warning at the time limit) and SIGINT release it cleanly.
    """
    agent = Agent(options, MemoryCgroups.detect() if options.cgroups else None)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, agent.shutdown, sig.name)
    try:
        return await agent.serve()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await agent.runner.settle()
        if options.own_root:  # nothing of this worker outlives it on the node's scratch
            with contextlib.suppress(OSError):
                options.root.rmdir()  # only if empty: a sandbox kept there stays


def command(
    manager: Annotated[
        str | None, typer.Option(metavar="HOST:PORT", help="The manager's address.")
    ] = None,
    manager_file: Annotated[
        Path | None,
        typer.Option(
            help="A file holding the manager's HOST:PORT, read again at each attempt to "
            "connect (a manager resuming the run writes its address there)."
        ),
    ] = None,
    secret_file: Annotated[
        Path | None, typer.Option(help="File (mode 600) holding the run's secret.")
    ] = None,
    root: Annotated[
        Path | None,
        typer.Option(
            help="Directory for task sandboxes, made by the worker (in one that exists, a "
            "directory of its own) and removed when it leaves, unless a sandbox is kept there "
            "(default: leadtime-WORKER_ID in $SLURM_TMPDIR, $TMPDIR or /tmp)."
        ),
    ] = None,
    worker_id: Annotated[str | None, typer.Option(help="Default: HOSTNAME-PID.")] = None,
    pilot_id: Annotated[str | None, typer.Option(help="Default: $SLURM_JOB_ID.")] = None,
    cores: Annotated[
        float | None, typer.Option(help="Default: $SLURM_CPUS_ON_NODE or the usable CPUs.")
    ] = None,
    memory: Annotated[
        float | None, typer.Option(help="MB; default: $SLURM_MEM_PER_NODE or what is available.")
    ] = None,
    disk: Annotated[
        float | None, typer.Option(help="MB; default: free space under --root.")
    ] = None,
    end_time: Annotated[
        float | None, typer.Option(help="Unix time at which the pilot ends.")
    ] = None,
    time_limit: Annotated[
        float | None, typer.Option(help="Seconds from the job's start to its end.")
    ] = None,
    connect_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to wait for a manager (at the start, or after losing it) before "
            "stopping the tasks and exiting."
        ),
    ] = 600.0,
    drain_margin: Annotated[
        float,
        typer.Option(
            help="Stop taking tasks this many seconds before the pilot ends (at most a tenth "
            "of the time left when the worker starts)."
        ),
    ] = 60.0,
    keep_sandboxes: Annotated[
        str, typer.Option(metavar="never|failure|always", help="Which attempts' sandboxes to keep.")
    ] = "failure",
    keep_to: Annotated[
        Path | None,
        typer.Option(
            help="Move kept sandboxes to this directory when their attempt ends (a run's "
            "pilots are given the run's directory, kept/); default: they stay under --root."
        ),
    ] = None,
    keep_budget: Annotated[
        float,
        typer.Option(
            help="MB of kept sandboxes moved to --keep-to at most; past it, only their "
            "stdout and stderr."
        ),
    ] = KEEP_BUDGET_MB,
    sample_interval: Annotated[
        float, typer.Option(help="Seconds between two samples of a task's resource use.")
    ] = 1.0,
    first_sample: Annotated[float, typer.Option(help="Seconds to a task's first sample.")] = 0.1,
    cgroups: Annotated[
        bool, typer.Option(help="Use a cgroup v2 memory limit per task where one is delegated.")
    ] = True,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Run tasks for a leadtime manager: the agent a pilot starts on each of its nodes.

    The run's secret comes from --secret-file or $LEADTIME_SECRET, never from the command line.
    """
    level = log_level.upper()
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "INFO",
        format="%(asctime)s leadtime-worker[%(process)d] %(levelname)s %(message)s",
    )
    try:
        options = make_options(
            manager,
            manager_file=manager_file,
            secret_file=secret_file,
            root=root,
            worker_id=worker_id,
            pilot_id=pilot_id,
            cores=cores,
            memory=memory,
            disk=disk,
            end_time=end_time,
            time_limit=time_limit,
            connect_timeout=connect_timeout,
            drain_margin=drain_margin,
            keep_sandboxes=keep_sandboxes,  # type: ignore[arg-type]
            keep_to=keep_to,
            keep_budget=keep_budget,
            sample_interval=sample_interval,
            first_sample=first_sample,
            cgroups=cgroups,
        )
    except OptionsError as e:
        print(f"leadtime worker: error: {e}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    code = EXIT_RELEASED
    # Before anything runs: no task outlives this process, nor its sandboxes a SIGKILL.
    sentinel = Sentinel(options.token, partial(_remove_leftovers, options))
    adopt_orphans()  # what a task leaves stays below us: a look at our children finds it
    try:
        with contextlib.suppress(KeyboardInterrupt):
            code = asyncio.run(serve(options))
    finally:
        sentinel.close()
    raise typer.Exit(code)


def _remove_leftovers(options: WorkerOptions) -> None:
    """What a worker killed outright left on the node's scratch, removed by its sentinel once
    its tasks are dead, as the worker's own end would have: its root (always its own, see
    :func:`make_options`) whole where no sandbox stays in it (kept ones go to ``--keep-to``,
    or none is kept); else its spares and host files, and the root if that empties it (a
    failed attempt's sandbox stays, as it would have)."""
    if options.keep_to is not None or options.keep_sandboxes == "never":
        shutil.rmtree(options.root, ignore_errors=True)
        return
    remove_own_files(options.root)
    with contextlib.suppress(OSError):
        options.root.rmdir()


app = App(add_completion=False)
app.command(name="worker")(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``leadtime worker`` with ``argv``; its exit code."""
    try:
        app(args=list(argv) if argv is not None else None, prog_name="leadtime worker")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    return EXIT_RELEASED


if __name__ == "__main__":
    sys.exit(main())
