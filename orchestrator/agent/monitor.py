"""Process-tree resource monitor and enforcer (Tovar et al., TPDS 2018, section 3.1).

A task is measured as a whole, over its process tree: memory is the RSS
summed over the tree, cores are CPU time over wall time (and the peak of
that ratio over a sliding window), disk is what it wrote where it may write
(its scratch directory and its declared outputs), wall time is wall time. Its
processes are those its leader started, the orphans still in its group, and
any other carrying its attempt's token (:mod:`orchestrator.agent.lineage`): a
daemon that left the session is still measured. The moment memory, disk or wall time goes above the
allocation the task's owner is told, and kills it.

:class:`Usage` is the pure part: it folds samples into peaks and a memory
series and says which limit a sample breaks. :class:`Monitor` is the shell:
one timer for all running tasks, one scan of the process table per tick.
Samples come fast in a task's first second (so a quick allocator is caught
early) and slow down to the interval; a task that ends before its first
sample costs nothing but a cancelled timer and is measured exactly from its
``wait4`` rusage by the caller. :class:`MemoryCgroups` adds the kernel's
``memory.max`` as a hard backstop where cgroup v2 is delegated to us.

A task's CPU use is what it got; each sample also reads how busy the CPUs it may run on
were (:class:`CpuTimes`), so that one crowded off them is known to have been starved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from resource import RUSAGE_SELF, getrusage

from backends import clock
from learners.resources import Exhaustion, Resources
from orchestrator.agent.lineage import Lineage

log = logging.getLogger(__name__)

MB = 2**20
"""Bytes in a MB as Slurm and cctools count them."""


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    interval_s: float = 1.0
    """Steady sampling interval, and the step of the memory series."""
    first_sample_s: float = 0.1
    """The first sample comes this soon (at most); intervals then double up to ``interval_s``."""
    window_s: float = 5.0
    """Peak cores are the largest CPU-time / wall-time ratio over a window this long."""
    record_series: bool = True
    max_series: int = 4096
    """A longer memory series is halved (pairs merged by max, step doubled)."""

    def __post_init__(self) -> None:
        if not 0 < self.first_sample_s <= self.interval_s:
            raise ValueError("need 0 < first_sample_s <= interval_s")
        if self.window_s <= 0 or self.max_series < 1:
            raise ValueError("window_s and max_series must be positive")

    @property
    def first_delay(self) -> float:
        """``interval_s`` halved until it is at most ``first_sample_s``.

        Powers-of-two fractions of one interval nest, so tasks started at
        different times still share ticks.
        """
        halvings = math.ceil(math.log2(self.interval_s / self.first_sample_s))
        return self.interval_s / 2 ** max(0, halvings)


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at a task: ``time`` seconds after its start."""

    time: float
    memory: float
    """MB, RSS summed over the process tree."""
    cpu: float
    """CPU seconds used by the tree so far."""
    disk: float
    """MB it wrote (scratch and declared outputs)."""
    cpus_busy: float | None = None
    """The share of the time since the previous sample the CPUs it may run on were busy
    (with it or anything else); None when unknown."""


SATURATED = 0.95
"""CPUs busy this share of the time had nothing left to give a task that wanted more."""
STARVED_USE = 0.8
"""A task on saturated CPUs that used less than this share of its cores was starved."""


def broken_limit(allocation: Resources, sample: Sample) -> Exhaustion | None:
    """The enforced resource ``sample`` is above ``allocation`` in, if any.

    Cores are not enforced (the task is pinned to its cores instead). A zero
    allocation of memory or disk means the resource was not sized, and is not
    enforced either.
    """
    for resource, value in (("memory", sample.memory), ("disk", sample.disk)):
        limit = allocation[resource]
        if limit > 0 and value > limit + 1e-9:
            return Exhaustion(resource, value)
    if sample.time > allocation.wall:
        return Exhaustion("wall", sample.time)
    return None


class Usage:
    """The peaks of one attempt, folded from its samples."""

    def __init__(self, allocation: Resources, config: MonitorConfig) -> None:
        self.allocation = allocation
        self.memory = 0.0
        self.disk = 0.0
        self.cpu = 0.0
        self.window_cores = 0.0
        self._window_s = config.window_s
        self._window: deque[tuple[float, float]] = deque([(0.0, 0.0)])
        self._series: list[float] | None = [] if config.record_series else None
        self._step = config.interval_s
        self._max_series = config.max_series
        self.over: Exhaustion | None = None
        """The limit the attempt's totals at its end break (:meth:`finish`): one it went over
        between samples, or too quickly for any."""
        self.starved = False
        """Its CPUs were saturated most of the time it was watched and it used well below its
        cores (:meth:`finish`): its use is what it got, not what it needed."""
        self._last_time = 0.0
        self._watched_s = 0.0
        self._saturated_s = 0.0

    def add(self, sample: Sample) -> Exhaustion | None:
        """Fold in ``sample``; the limit it breaks, if any."""
        self.memory = max(self.memory, sample.memory)
        self.disk = max(self.disk, sample.disk)
        self._add_cpu(sample.time, sample.cpu)
        if sample.cpus_busy is not None:
            span = sample.time - self._last_time
            self._watched_s += span
            if sample.cpus_busy >= SATURATED:
                self._saturated_s += span
        self._last_time = sample.time
        if self._series is not None:
            self._add_to_series(sample.time, sample.memory)
        return broken_limit(self.allocation, sample)

    def _add_cpu(self, time: float, cpu: float) -> None:
        # A tree's CPU time can drop when an orphan dies unseen; keep it monotone.
        self.cpu = cpu = max(cpu, self.cpu)
        window = self._window
        while len(window) > 1 and time - window[1][0] >= self._window_s:
            window.popleft()
        then, cpu_then = window[0]
        # Only whole windows: over short spans, clock-tick granularity inflates the ratio.
        if time - then >= self._window_s:
            self.window_cores = max(self.window_cores, (cpu - cpu_then) / (time - then))
        window.append((time, cpu))

    def _add_to_series(self, time: float, memory: float) -> None:
        series = self._series
        assert series is not None
        step = int(time / self._step)
        if step < len(series):
            series[step] = max(series[step], memory)
        else:
            # Steps no sample fell in (a late tick) get the larger neighbour.
            gap = max(series[-1], memory) if series else memory
            series.extend([gap] * (step - len(series)))
            series.append(memory)
        while len(series) > self._max_series:
            series[:] = [max(series[i : i + 2]) for i in range(0, len(series), 2)]
            self._step *= 2

    def finish(
        self, wall: float, cpu: float, max_rss: float, disk: float, spawner_rss: float = 0.0
    ) -> Resources:
        """Peaks at the end, given totals from the reaped process.

        ``cpu`` is its CPU seconds, ``disk`` the final size of what it wrote, and ``max_rss``
        the largest RSS (MB) any one process of the tree reached as ``wait4`` tells it. The
        kernel carries the high-water RSS of the process that forked the task over into the
        task's at ``exec`` (``spawner_rss``: the worker's, read after the spawn, so not below
        what was carried), so ``max_rss`` is the task's own only when it is above that;
        otherwise it is only an upper bound, used when no sample saw the task's memory (none
        was taken, or the one taken read a tree already exiting), and never to find a limit
        broken.
        """
        self.cpu = max(self.cpu, cpu)
        own_rss = max_rss if max_rss > spawner_rss else 0.0
        if own_rss or self.memory == 0:
            self.memory = max(self.memory, max_rss)
        self.disk = max(self.disk, disk)
        # Memory and disk only: wall time has its timer, and the wall measured after the
        # reaping would hold the reaping's delay against a task that ended in time.
        self.over = broken_limit(self.allocation, Sample(0.0, own_rss, self.cpu, disk))
        if self._series and max(self._series) < self.memory:
            # The exact peak came between samples; the series must not hide it.
            self._series[-1] = self.memory
        average = self.cpu / wall if wall > 0 else 0.0
        cores = max(self.window_cores, average)
        self.starved = (
            self._saturated_s > self._watched_s / 2 and cores < STARVED_USE * self.allocation.cores
        )
        return Resources(cores, self.memory, self.disk, wall)

    @property
    def series(self) -> tuple[tuple[float, ...], float] | None:
        """Memory (MB) per step and the step (s): the peak within each step."""
        if self._series is None:
            return None
        return tuple(self._series or [self.memory]), self._step


# --- the sampling shell ---------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Watch:
    """One task under the monitor's eye (the session ``pid`` leads)."""

    pid: int
    disk: Callable[[], int]
    """Bytes the task has written, where it may write."""
    cpus: frozenset[int]
    """The CPUs it may run on."""
    token: str | None
    """Its attempt's token: processes carrying it are its own wherever they went."""
    usage: Usage
    on_exceeded: Callable[[Exhaustion], None]
    start: float
    delay: float
    """Until the next sample: doubles from ``first_delay`` up to the interval."""
    active: bool = True
    next_sample: asyncio.TimerHandle | None = None
    wall_limit: asyncio.TimerHandle | None = None
    cpu_times: CpuTimes | None = None
    """The node's CPU times at its previous sample."""


class Monitor:
    """Samples every watched task on shared ticks and reports broken limits."""

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self.lineage = Lineage()
        """The tokens of the node's processes, as the ticks saw them."""
        self._due: list[Watch] = []

    def watch(
        self,
        pid: int,
        disk: Callable[[], int],
        allocation: Resources,
        on_exceeded: Callable[[Exhaustion], None],
        cpus: frozenset[int],
        start: float | None = None,
        token: str | None = None,
    ) -> Watch:
        """Watch the session ``pid`` leads (and the processes carrying ``token``), which
        started at ``start`` (default: now) on ``cpus``; ``disk`` measures what it wrote."""
        loop = asyncio.get_running_loop()
        watch = Watch(
            pid=pid,
            disk=disk,
            cpus=cpus,
            token=token,
            usage=Usage(allocation, self.config),
            on_exceeded=on_exceeded,
            start=clock.now() if start is None else start,
            delay=self.config.first_delay,
        )
        self._schedule(watch)
        if math.isfinite(allocation.wall):
            watch.wall_limit = loop.call_at(
                watch.start + allocation.wall, self._wall_reached, watch
            )
        return watch

    def unwatch(self, watch: Watch) -> None:
        watch.active = False
        for timer in (watch.next_sample, watch.wall_limit):
            if timer is not None:
                timer.cancel()

    def _schedule(self, watch: Watch) -> None:
        # The next multiple of the delay on the loop clock: watches share ticks.
        delay = watch.delay
        due = (math.floor(clock.now() / delay) + 1) * delay
        watch.next_sample = asyncio.get_running_loop().call_at(due, self._mark_due, watch)

    def _mark_due(self, watch: Watch) -> None:
        if not self._due:
            asyncio.get_running_loop().call_soon(self._tick)
        self._due.append(watch)

    def _tick(self) -> None:
        due, self._due = [w for w in self._due if w.active], []
        if not due:
            return
        table = _ProcessTable()
        self.lineage.look(table.started)
        times = CpuTimes.read()
        for watch in due:
            strays = self.lineage.of_attempt(watch.token) if watch.token else ()
            memory, cpu = table.usage(watch.pid, strays)
            now = clock.now()
            busy = times.busy_since(watch.cpu_times, watch.cpus) if times else None
            watch.cpu_times = times
            sample = Sample(now - watch.start, memory / MB, cpu, watch.disk() / MB, busy)
            exhaustion = watch.usage.add(sample)
            if exhaustion is not None:
                self._exceeded(watch, exhaustion)
            else:
                watch.delay = min(2 * watch.delay, self.config.interval_s)
                self._schedule(watch)

    def _wall_reached(self, watch: Watch) -> None:
        if watch.active:
            self._exceeded(watch, Exhaustion("wall", clock.now() - watch.start))

    def _exceeded(self, watch: Watch, exhaustion: Exhaustion) -> None:
        self.unwatch(watch)
        watch.on_exceeded(exhaustion)


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Each CPU's busy and total time so far (``/proc/stat``, in clock ticks)."""

    busy: dict[int, int]
    total: dict[int, int]

    @classmethod
    def read(cls, path: str = "/proc/stat") -> CpuTimes | None:
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        busy, total = {}, {}
        for line in lines:
            if line.startswith(b"cpu") and line[3:4].isdigit():
                name, *ticks = line.split()
                # user nice system idle iowait irq softirq steal (guest time is in user's)
                times = [int(t) for t in ticks[:8]]
                cpu = int(name[3:])
                total[cpu] = sum(times)
                busy[cpu] = total[cpu] - times[3] - (times[4] if len(times) > 4 else 0)
        return cls(busy, total)

    def busy_since(self, earlier: CpuTimes | None, cpus: frozenset[int]) -> float | None:
        """The share of the time since ``earlier`` that ``cpus`` were busy; None if unknown."""
        if earlier is None:
            return None
        spent = sum(self.total.get(c, 0) - earlier.total.get(c, 0) for c in cpus)
        if spent <= 0:
            return None
        return sum(self.busy.get(c, 0) - earlier.busy.get(c, 0) for c in cpus) / spent


class _ProcessTable:
    """Every process on the node at one moment: one read of each ``/proc/<pid>/stat``.

    A tick must see every process to find a task's orphans (re-parented to
    init, still in its process group); one small read per process gives its
    parent, group, CPU times and RSS together, several times cheaper than
    psutil's per-process objects.
    """

    def __init__(self) -> None:
        self.children: dict[int, list[int]] = defaultdict(list)
        self.groups: dict[int, list[int]] = defaultdict(list)
        self.stats: dict[int, list[bytes]] = {}
        self.started: dict[int, int] = {}
        """Each process's start time (clock ticks since boot): with its pid, its identity."""
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:  # gone since the listing
                continue
            # Fields after the command name, which may itself hold spaces and parentheses.
            fields = data[data.rindex(b")") + 2 :].split()
            pid = int(name)
            self.stats[pid] = fields
            self.started[pid] = int(fields[19])
            self.children[int(fields[1])].append(pid)
            self.groups[int(fields[2])].append(pid)

    def tree(self, leader: int, strays: Iterable[int] = ()) -> set[int]:
        """The session ``leader`` started: its descendants, orphans still in its group, and
        ``strays`` (processes known to be its own that left it) with their descendants."""
        seen: set[int] = set()
        stack = [leader, *self.groups.get(leader, ()), *strays]
        while stack:
            pid = stack.pop()
            if pid not in seen:
                seen.add(pid)
                stack.extend(self.children.get(pid, ()))
        return seen

    def usage(self, leader: int, strays: Iterable[int] = ()) -> tuple[float, float]:
        """The tree's memory in bytes and its CPU seconds (with reaped children's).

        Its memory is the RSS summed over its processes, or the high-water mark of one of
        them if that is more: a peak between two samples (a large array made and freed) is
        still the task's. The kernel's peak of the whole attempt, read when it ends, cannot
        tell it below the worker's own (it starts from the worker's at ``exec``).
        """
        rss = ticks = highest = 0
        for pid in self.tree(leader, strays):
            fields = self.stats.get(pid)
            if fields is not None:
                ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
                rss += int(fields[21])
                highest = max(highest, _high_water(pid))
        return max(rss * _PAGE, highest), ticks / _CLOCK_TICKS


def _high_water(pid: int) -> int:
    """Process ``pid``'s largest RSS since its ``exec``, bytes (``VmHWM``); 0 if unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:  # gone, or not ours to read
        return 0
    at = status.find(b"\nVmHWM:")
    if at < 0:  # a zombie, or a kernel thread
        return 0
    return int(status[at + 7 : status.index(b"\n", at + 1)].split()[0]) * 1024


_PAGE = os.sysconf("SC_PAGE_SIZE")


def high_water_rss() -> float:
    """This process's largest RSS so far (MB; Linux's ``VmHWM``): what a child it forks
    inherits as its own."""
    return getrusage(RUSAGE_SELF).ru_maxrss / 1024


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the kernel's backstop ------------------------------------------------------------------


class MemoryCgroups:
    """One cgroup v2 per task with ``memory.max`` at its allocation.

    The sampler kills a task within one tick of its crossing the limit; a
    fast allocator can outrun that and exhaust the node. Where our own cgroup
    v2 has the memory controller delegated to us, each task also gets a child
    cgroup whose ``memory.max`` the kernel enforces. Elsewhere :meth:`detect`
    returns ``None`` and only the sampler enforces.
    """

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def detect(cls) -> MemoryCgroups | None:
        """Set up per-task cgroups under our own, if the system lets us."""
        try:
            mount = _cgroup2_mount()
            lines = Path("/proc/self/cgroup").read_text().splitlines()
            own_path = next(line[3:] for line in lines if line.startswith("0::"))
            if mount is None or own_path in ("/", ""):
                return None
            own = mount / own_path.lstrip("/")
            if "memory" not in (own / "cgroup.controllers").read_text().split():
                return None
            # No process may stay in a cgroup that hands controllers down: step aside.
            agent = own / "leadtime-agent"
            agent.mkdir(exist_ok=True)
            (agent / "cgroup.procs").write_text(str(os.getpid()))
            (own / "cgroup.subtree_control").write_text("+memory")
        except (OSError, StopIteration) as e:
            log.info("cgroup v2 memory backstop unavailable (%s); sampling enforces alone", e)
            return None
        log.info("cgroup v2 memory backstop under %s", own)
        return cls(own)

    def create(self, name: str, memory_mb: float) -> Path | None:
        """A cgroup for one task, limited to ``memory_mb`` (unlimited when 0)."""
        path = self.base / f"leadtime-{name}"
        try:
            path.mkdir(exist_ok=True)
            limit = str(math.ceil(memory_mb * MB)) if memory_mb > 0 else "max"
            (path / "memory.max").write_text(limit)
            (path / "memory.oom.group").write_text("1")
        except OSError as e:
            log.warning("cannot set up cgroup %s: %s", path, e)
            return None
        with contextlib.suppress(OSError):  # without swap accounting memory.max still holds
            (path / "memory.swap.max").write_text("0")
        return path

    def add(self, cgroup: Path, pid: int) -> None:
        try:
            (cgroup / "cgroup.procs").write_text(str(pid))
        except OSError as e:
            log.warning("cannot move pid %d into %s: %s", pid, cgroup, e)

    def oom_killed(self, cgroup: Path) -> bool:
        """True when the kernel killed something in ``cgroup`` for its memory.max."""
        try:
            events = (cgroup / "memory.events").read_text().split()
        except OSError:
            return False
        counts = dict(zip(events[::2], events[1::2], strict=False))
        return int(counts.get("oom_kill", "0")) > 0

    def kill(self, cgroup: Path) -> None:
        """Kill every process left in ``cgroup``: none of them can have escaped it."""
        try:
            (cgroup / "cgroup.kill").write_text("1")  # Linux 5.14 and later
            return
        except OSError:
            pass
        with contextlib.suppress(OSError):
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)

    def remove(self, cgroup: Path) -> None:
        try:
            cgroup.rmdir()
        except OSError as e:
            log.debug("cannot remove cgroup %s: %s", cgroup, e)


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] == "cgroup2":
            return Path(fields[4])
    return None
