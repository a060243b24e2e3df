"""The circuit breaker: a stage whose pilots keep failing at start stops the run.

A pilot fails at start when it ends, without the run having released it, before any
of its workers joined: a node that cannot run the worker, a file system that refuses
the pilot's log, a script the batch system kills at once. The planner would submit a
replacement every time, forever; the breaker counts such failures per stage and, after
``in_a_row`` of them with no pilot of the stage starting well in between, or
``per_minute`` within any minute, says stop, with the batch system's reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

IN_A_ROW = 5
"""Start failures of one stage in a row: a node failing once is bad luck, five is a cause."""

PER_MINUTE = 10
"""Start failures of one stage within 60 s, even with good starts in between."""


@dataclass
class Breaker:
    """Counts start failures per stage; :meth:`ended` says when to stop."""

    in_a_row: int = IN_A_ROW
    per_minute: int = PER_MINUTE
    _streak: dict[str, int] = field(default_factory=dict)
    _recent: dict[str, deque[float]] = field(default_factory=dict)

    def ended(
        self, stages: Sequence[str], *, started: bool, now: float, state: str, reason: str
    ) -> str | None:
        """A pilot for ``stages`` ended (not released by the run); ``started``: a worker of it
        joined. Returns why the run must stop, or None."""
        for stage in stages:
            if started:
                self._streak[stage] = 0
                continue
            streak = self._streak[stage] = self._streak.get(stage, 0) + 1
            recent = self._recent.setdefault(stage, deque())
            recent.append(now)
            while recent and recent[0] <= now - 60.0:
                recent.popleft()
            if streak >= self.in_a_row or len(recent) >= self.per_minute:
                many = f"{streak} in a row" if streak >= self.in_a_row else f"{len(recent)} in 60 s"
                why = f"{state}, {reason}" if reason else state
                return (
                    f"stage {stage}: {many} of its pilots ended before any worker started "
                    f"(the batch system says: {why}); stopped instead of submitting more"
                )
        return None
