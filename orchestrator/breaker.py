"""The circuit breaker: a stage whose pilots keep failing stops the run.

A pilot fails when it ends, without the run having released it, having done nothing for
any of its stages: it ended before any of its workers joined (a node that cannot run the worker,
a file system that refuses the pilot's log, a script the batch system kills at once), or
no task finished on its workers (tasks that outlast the pilot's time limit; one that had a
pilot's whole time fails the run sooner, in ``runstate``).
The planner would submit a replacement every time, forever; the breaker counts failures
per stage and, after ``in_a_row`` of them with no useful pilot of the stage in between, or
``per_minute`` within any minute, says stop, with the batch system's reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

IN_A_ROW = 5
"""Failed pilots of one stage in a row: a node failing once is bad luck, five is a cause."""

PER_MINUTE = 10
"""Failed pilots of one stage within 60 s, even with useful ones in between."""


@dataclass
class Breaker:
    """Counts failed pilots per stage; :meth:`ended` says when to stop."""

    in_a_row: int = IN_A_ROW
    per_minute: int = PER_MINUTE
    _streak: dict[str, int] = field(default_factory=dict)
    _recent: dict[str, deque[float]] = field(default_factory=dict)

    def ended(
        self,
        stages: Sequence[str],
        *,
        joined: bool,
        finished: int,
        released: bool,
        now: float,
        state: str,
        reason: str,
    ) -> str | None:
        """A pilot of ``stages`` ended. ``joined``: a worker of it joined; ``finished``: the
        tasks that finished on its workers; ``released``: the run ended it. Returns why to
        stop, or None.

        Usefulness is the pilot's own, not its stages' progress meanwhile: many pilots of one
        stage (elastic units) end at one moment, each having done its share. A pilot that
        serves several stages (a big job, an elastic unit) was useful if it finished a task
        of any of them: one of its later stages cannot have begun while it ran."""
        useful = joined and finished > 0
        for stage in stages:
            if useful:
                self._streak[stage] = 0
            if useful or released:
                continue
            streak = self._streak[stage] = self._streak.get(stage, 0) + 1
            recent = self._recent.setdefault(stage, deque())
            recent.append(now)
            while recent[0] <= now - 60.0:
                recent.popleft()
            if streak >= self.in_a_row or len(recent) >= self.per_minute:
                many = f"{streak} in a row" if streak >= self.in_a_row else f"{len(recent)} in 60 s"
                how = "finishing any task" if joined else "any worker started"
                why = f"{state}, {reason}" if reason else state
                return (
                    f"stage {stage}: {many} of its pilots ended before {how} (the batch system "
                    f"says: {why}); stopped instead of submitting more"
                )
        return None
