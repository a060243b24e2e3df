"""What a worker is asked to run and what it reports back.

The same two types cross the manager-worker protocol and come out of the
simulated workers, so the pool and the engine never know which world they
are in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from learners.resources import Exhaustion, Resources


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    """The command exited non-zero (or was killed by a signal it raised itself)."""
    EXHAUSTED = "exhausted"
    """Killed for exceeding its allocation of ``exhaustion.resource``."""
    LOST = "lost"
    """Its worker left before it ended (its pilot ended or was cancelled, the worker died):
    says nothing about the task's needs."""


@dataclass(slots=True)
class AttemptSpec:
    """One attempt of one task on one worker, within ``allocation``.

    Not changed once made, but not ``frozen``: a frozen dataclass is several times dearer
    to make, and the manager makes one of these and one :class:`AttemptResult` per attempt.
    """

    task_id: str
    attempt: int
    command: str
    allocation: Resources
    category: str = ""
    workdir: str = ""
    """The directory the command runs in (the workflow's working directory); empty: its
    scratch directory."""
    outputs: tuple[str, ...] = ()
    """Paths or glob patterns, relative to ``workdir``, that the attempt must create."""

    @property
    def key(self) -> tuple[str, int]:
        """The attempt, as both sides name it: (task id, attempt number)."""
        return (self.task_id, self.attempt)


@dataclass(frozen=True, slots=True)
class Captured:
    """What an attempt wrote to one of its output streams, kept bounded: its first and its
    last bytes, and how many bytes between them were left out (a person reading a task's
    output wants how it started and how it ended)."""

    head: str = ""
    tail: str = ""
    """Its last bytes; when nothing was cut, what follows ``head``."""
    cut: int = 0
    """Bytes left out between ``head`` and ``tail``."""

    def __bool__(self) -> bool:
        return bool(self.head or self.tail or self.cut)

    def as_json(self) -> dict[str, str | int]:
        return {"head": self.head, "tail": self.tail, "cut": self.cut}


@dataclass(slots=True)
class AttemptResult:
    """How an attempt ended and what it used (``peak.wall`` is its wall time); not changed
    once made (not ``frozen``, as :class:`AttemptSpec`)."""

    task_id: str
    attempt: int
    outcome: Outcome
    peak: Resources
    exit_code: int | None = None
    exhaustion: Exhaustion | None = None
    memory_series: tuple[float, ...] | None = None
    sample_interval_s: float | None = None
    output_tail: str = ""
    """Why the worker stopped it (its ``[leadtime]`` lines) and the last lines of its stdout
    and stderr, reported when it did not succeed."""
    stdout: Captured = Captured()
    stderr: Captured = Captured()
    node: str = ""
    """The host it ran on, where its scratch directory stayed."""
    sandbox: str = ""
    """Its scratch directory on ``node``, when it was kept after the attempt ended."""
    starved: bool = False
    """Its CPUs were saturated through most of its run and it used well below the cores it
    was given: its cores are what it got, not what it needed (:meth:`sizing_peak`)."""
    vanished: bool = False
    """LOST as its worker vanished without a word while holding it (the manager's verdict,
    never sent by a worker): the task may have taken the worker down."""
    beside: frozenset[str] = frozenset()
    """With ``vanished``: the other tasks the worker held, any of which may have taken it
    down instead."""

    def sizing_peak(self, allocation: Resources) -> Resources:
        """The peak a sizer learns from: a starved attempt counts as having used the cores it
        was given, so that crowded CPUs (an oversubscribed node) do not shrink the next
        attempts' cores, crowding them more."""
        if self.starved and allocation.cores > self.peak.cores:
            return self.peak.with_("cores", allocation.cores)
        return self.peak

    def output(self) -> dict[str, Any] | None:
        """Its output and kept scratch directory, as the store keeps them; None when it has
        neither (most attempts of a quiet task: no row is written for them)."""
        if not (self.stdout or self.stderr or self.sandbox):
            return None
        return {  # an empty stream is none at all
            "stdout": self.stdout.as_json() if self.stdout else None,
            "stderr": self.stderr.as_json() if self.stderr else None,
            "sandbox": self.sandbox or None,
        }


def first_come(
    waiting: Iterable[tuple[tuple[str, int], Resources]], free: Resources
) -> tuple[list[tuple[str, int]], Resources]:
    """Which of the attempts ``waiting`` on a worker start now, and what is free after them:
    they start in the order they came, while the first fits what is ``free``. The worker
    agent starts its attempts so; the manager replays it (:mod:`orchestrator.workerqueue`)."""
    started = []
    for key, allocation in waiting:
        if not allocation.fits_in(free):
            break
        free = free.minus(allocation)
        started.append(key)
    return started, free


def refused(spec: AttemptSpec, why: str) -> AttemptResult:
    """An attempt the worker could not run (it never started, or running it raised), and why
    (in the words its output tail gives): failed, so counted against the task's attempts."""
    return AttemptResult(
        task_id=spec.task_id,
        attempt=spec.attempt,
        outcome=Outcome.FAILED,
        peak=Resources(wall=0.0),
        output_tail=f"[leadtime] {why}",
    )


def cause(result: AttemptResult, allocation: Resources) -> str | None:
    """Why an attempt did not succeed, in a few words (None when it did): ``memory 812 MB >
    500 MB``, ``memory reached its limit, 500 MB`` (a kill that saw no more than the limit),
    ``exit code 3``, ``worker left: disconnected``."""
    if result.outcome is Outcome.SUCCESS:
        return None
    if result.outcome is Outcome.EXHAUSTED and result.exhaustion is not None:
        e = result.exhaustion
        unit = " s" if e.resource == "wall" else " MB"
        limit = allocation[e.resource]
        if e.measured <= limit:
            return f"{e.resource} reached its limit, {_shown(limit)}{unit}"
        used, allowed = _apart(e.measured, limit)
        return f"{e.resource} {used}{unit} > {allowed}{unit}"
    said = next(iter(worker_lines(result.output_tail)), None)
    if said is not None and not said.startswith(VERDICTS):
        return said
    if result.outcome is Outcome.FAILED and result.exit_code is not None:
        return f"exit code {result.exit_code}"
    return str(result.outcome)


def _shown(v: float, digits: int = 3) -> str:
    """``v`` as a person reads it: a whole number from ``10 ** (digits - 1)`` on, else
    ``digits`` significant digits."""
    return f"{v:,.0f}" if abs(v) >= 10 ** (digits - 1) else f"{v:.{digits}g}"


def _apart(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` (which differ) by :func:`_shown`, with more digits while the two would
    read the same (3.23 and 3.2 MB, not 3 and 3)."""
    digits = 3
    while _shown(a, digits) == _shown(b, digits) and digits < 9:
        digits += 1
    return _shown(a, digits), _shown(b, digits)


def cause_kind(result: AttemptResult) -> str:
    """The kind of an attempt's end, for counting: lost, memory, disk, wall, failed or success."""
    if result.outcome is Outcome.EXHAUSTED and result.exhaustion is not None:
        return result.exhaustion.resource
    return str(result.outcome)


def worker_lines(output_tail: str) -> list[str]:
    """The worker's own lines in an attempt's output tail, without their mark."""
    return [line[len(_OURS) :] for line in output_tail.splitlines() if line.startswith(_OURS)]


_OURS = "[leadtime] "
"""How the worker's own lines in a task's output tail begin."""
OVER_AT_END = "over its allocation as it ended"
"""The worker's word for an attempt whose totals at its end broke a limit no sample caught
(its own line says it where a kill says ``killed``)."""
VERDICTS = ("killed:", OVER_AT_END)
"""How the worker's line telling an exhaustion begins: what the record tells already."""
