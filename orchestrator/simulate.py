"""Simulated tasks and workers: what a task really needs, and a worker that honours it.

Each task's truth (duration and peaks) is drawn once from its stage's
``[simulate]`` distributions with a generator seeded by (seed, stage, task),
so every strategy of a comparison meets exactly the same tasks; or it is the
record of a real task trace (``trace = PATH``), task *i* taking record *i*
(cycling), memory time series included where the trace has them.

A simulated worker enforces allocations as the real monitor does, by the rule
the sizing replay follows too (:func:`learners.attempt_end.attempt_end`):
memory, disk and wall time are limits (exceeding one kills the attempt: at the
end of its run under the slow-peaks assumption of Tovar et al. (TPDS 2018), or
where its memory series crosses the limit); cores are not a limit, so a task
given fewer cores than it uses runs proportionally longer.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

import numpy as np

from backends import clock
from backends.sim.backend import DISK_MB
from learners.attempt_end import Kills, MemorySeries, attempt_end
from learners.replay import TraceTask
from learners.resources import Resources
from learners.sizing.base import Exhaustion
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Outcome
from orchestrator.pool import Told
from workflows.spec import Simulation, Task, Workflow
from workflows.synthetic import Distribution
from workflows.traces import load_trace


@dataclass(frozen=True, slots=True)
class TaskTruth:
    """What a simulated task needs; ``peak.wall`` is its duration on enough cores."""

    peak: Resources
    input_size: float | None = None
    memory_series: MemorySeries | None = None


DEFAULT_TRUTH = Resources(cores=1.0, memory=100.0, disk=10.0, wall=60.0)
"""What a task needs when its stage's ``[simulate]`` table says nothing of a resource."""


def task_truths(workflow: Workflow, seed: int) -> dict[str, TaskTruth]:
    """Every task's truth, reproducible from ``seed`` whatever the order of runs."""
    truths = {}
    for stage in workflow.stages:
        tasks = stage.expand()
        sim = stage.simulate
        if sim is not None and sim.trace is not None:
            records = load_trace(sim.trace).tasks
            for task in tasks:
                truths[task.id] = _recorded(records[task.index % len(records)])
            continue
        for task in tasks:
            truths[task.id] = _truth(sim, task, task.index / len(tasks), seed)
    return truths


def _recorded(record: TraceTask) -> TaskTruth:
    """A trace's task as a truth; what the trace did not measure takes the defaults."""
    measured = {r: v for r, v in record.peak.as_dict().items() if v > 0}
    peak = Resources(**{**DEFAULT_TRUTH.as_dict(), **measured})
    return TaskTruth(peak, record.input_size, record.series)


def _truth(sim: Simulation | None, task: Task, position: float, seed: int) -> TaskTruth:
    if sim is None:
        return TaskTruth(DEFAULT_TRUTH)
    rng = np.random.default_rng([seed, zlib.crc32(task.stage.encode()), task.index])

    def draw(dist: Distribution | None, default: float) -> float:
        return default if dist is None else dist.sample(rng, position)

    peak = Resources(
        cores=max(draw(sim.cores, DEFAULT_TRUTH.cores), 0.01),
        memory=draw(sim.memory, DEFAULT_TRUTH.memory),
        disk=draw(sim.disk, DEFAULT_TRUTH.disk),
        wall=draw(sim.duration, DEFAULT_TRUTH.wall),
    )
    size = None if sim.input_size is None else sim.input_size.sample(rng, position)
    return TaskTruth(peak, input_size=size)


@dataclass(frozen=True, slots=True)
class SimulatedEnd:
    """How a simulated attempt ends: when, how, and what it used."""

    duration: float
    outcome: Outcome
    used: Resources
    exhaustion: Exhaustion | None = None


SLOW_PEAKS = Kills("slow")
"""Without a memory series, a simulated attempt is killed at the end of its run."""


def simulate_attempt(truth: TaskTruth, allocation: Resources) -> SimulatedEnd:
    """How an attempt of a task with this truth ends within ``allocation``."""
    need = truth.peak
    ended = attempt_end(need, allocation, SLOW_PEAKS, series=truth.memory_series)
    used = Resources(need.cores, need.memory, need.disk, ended.end)
    if not ended.exhausted:
        return SimulatedEnd(ended.end, Outcome.SUCCESS, used)
    first = ended.exhausted[0]
    if first.resource != "wall":
        used = used.with_(first.resource, first.measured)
    return SimulatedEnd(ended.end, Outcome.EXHAUSTED, used, first)


@dataclass(slots=True)
class _Running:
    told: Told
    timer: asyncio.TimerHandle
    start: float


class SimWorker:
    """One node of a running simulated pilot."""

    accepting = True
    """Until its pilot ends: a simulated pilot ends exactly at its end time."""
    queues = False

    def __init__(
        self,
        worker_id: str,
        pilot_id: str,
        capacity: Resources,
        end_time: float,
        truths: dict[str, TaskTruth],
    ) -> None:
        self.id = worker_id
        self.pilot_id = pilot_id
        self.capacity = capacity
        self.end_time = end_time
        self._truths = truths
        self._running: dict[tuple[str, int], _Running] = {}

    def start(self, spec: AttemptSpec, told: Told) -> None:
        """``told`` the attempt's end when its simulated run is over."""
        truth = self._truths[spec.task_id]
        end = simulate_attempt(truth, spec.allocation)
        series = truth.memory_series if end.outcome == Outcome.SUCCESS else None
        result = AttemptResult(
            spec.task_id,
            spec.attempt,
            end.outcome,
            end.used,
            exit_code=0 if end.outcome == Outcome.SUCCESS else None,
            exhaustion=end.exhaustion,
            memory_series=None if series is None else tuple(series.mb.tolist()),
            sample_interval_s=None if series is None else series.interval,
        )
        loop = asyncio.get_running_loop()
        key = spec.key
        now = clock.now()
        timer = loop.call_at(now + end.duration, self._finish, key, result)
        self._running[key] = _Running(told, timer, now)

    def stop(self, key: tuple[str, int]) -> None:
        running = self._running.pop(key, None)
        if running is not None:
            running.timer.cancel()

    def _finish(self, key: tuple[str, int], result: AttemptResult) -> None:
        self._running.pop(key).told(result)

    def lose(self) -> None:
        """The node's pilot ended: every running attempt is lost."""
        now = clock.now()
        running, self._running = self._running, {}
        for (task_id, attempt), run in running.items():
            run.timer.cancel()
            run.told(AttemptResult(task_id, attempt, Outcome.LOST, Resources(wall=now - run.start)))


class SimulatedWorkers:
    """Worker source of simulated pilots: one worker per node share, at the pilot's start."""

    def __init__(self, truths: dict[str, TaskTruth]) -> None:
        self.truths = truths

    def started(self, pilot, info) -> list[SimWorker]:
        end = (info.start_time or clock.now()) + pilot.request.time_limit_s
        return [
            SimWorker(
                f"{pilot.pilot_id}/{share.node}",
                info.job_id,
                Resources(share.cores, share.memory_mb, DISK_MB),
                end,
                self.truths,
            )
            for share in info.nodes
        ]

    def ended(self, pilot, workers) -> None:
        for worker in workers:
            worker.lose()
