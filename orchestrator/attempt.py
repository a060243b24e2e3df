"""What a worker is asked to run and what it reports back.

The same two types cross the manager-worker protocol and come out of the
simulated workers, so the pool and the engine never know which world they
are in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from learners.resources import Resources
from learners.sizing.base import Exhaustion


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    """The command exited non-zero (or was killed by a signal it raised itself)."""
    EXHAUSTED = "exhausted"
    """Killed for exceeding its allocation of ``exhaustion.resource``."""
    LOST = "lost"
    """Its worker vanished; says nothing about the task's needs."""


@dataclass(frozen=True, slots=True)
class AttemptSpec:
    """One attempt of one task on one worker, within ``allocation``."""

    task_id: str
    attempt: int
    command: str
    allocation: Resources
    category: str = ""


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """How an attempt ended and what it used (``peak.wall`` is its wall time)."""

    task_id: str
    attempt: int
    outcome: Outcome
    peak: Resources
    exit_code: int | None = None
    exhaustion: Exhaustion | None = None
    memory_series: tuple[float, ...] | None = None
    sample_interval_s: float | None = None
    output_tail: str = ""
    """Last lines of the task's stdout/stderr, reported when it did not succeed."""
