"""A run's figures: makespan, waits, core-hours, overhead and prediction hits.

Definitions (times in seconds from the run's start):
- makespan: from the run's start to the end of its last stage;
- TWT, total waiting time: the queue waits of its pilots as Slurm counts them
  (start minus eligible time; for a pilot cancelled while it waited, its end, which is when
  Slurm starts a cancelled pending job), summed;
- PWT, perceived waiting time: what the workflow itself waited, summed over
  stages: from a stage being ready to its first task starting;
- core-hours: cores held by every pilot from start to end;
- OH, overhead: core-hours pilots held before any stage they serve was ready
  (an allocation that started early), the cost proactive submission risks;
- hit ratio: predictions that did not over-predict the wait (Table 2 of the ASA paper).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class PilotFigures:
    pilot_id: str
    stages: tuple[str, ...]
    cores: int
    submit_t: float
    eligible_t: float | None
    start_t: float | None
    end_t: float | None
    predicted_wait: float | None = None
    hit: bool | None = None
    state: str = ""

    @property
    def wait(self) -> float | None:
        """Its time in the queue once eligible: to its start, or to its end if it was
        cancelled while it waited (a pilot replaced by one that starts now waited too); None
        if it never waited eligible (Slurm gives a job cancelled before its begin time the
        eligible time it would have had)."""
        if self.eligible_t is None:
            return None
        if self.start_t is not None:
            return self.start_t - self.eligible_t
        if self.end_t is None or self.end_t <= self.eligible_t:
            return None
        return self.end_t - self.eligible_t


@dataclass(frozen=True, slots=True)
class StageFigures:
    name: str
    ready_t: float | None
    submit_t: float | None
    start_t: float | None
    end_t: float | None
    tasks: int
    attempts: int

    @property
    def wait(self) -> float | None:
        if self.start_t is None or self.ready_t is None:
            return None
        return max(0.0, self.start_t - self.ready_t)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    workflow: str
    strategy: str
    status: str
    makespan_s: float
    twt_s: float
    pwt_s: float
    core_hours: float
    oh_core_hours: float
    hit_ratio: float | None
    error: str | None = None
    stages: tuple[StageFigures, ...] = field(default=())
    pilots: tuple[PilotFigures, ...] = field(default=())

    def as_json(self) -> dict:
        """The run's figures with per-stage ``submit_s``, ``start_s``, ``end_s``, ``wait_s``."""
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "strategy": self.strategy,
            "status": self.status,
            "error": self.error,
            "makespan_s": self.makespan_s,
            "twt_s": self.twt_s,
            "pwt_s": self.pwt_s,
            "core_hours": self.core_hours,
            "oh_core_hours": self.oh_core_hours,
            "hit_ratio": self.hit_ratio,
            "stages": [
                {
                    "name": s.name,
                    "ready_s": s.ready_t,
                    "submit_s": s.submit_t,
                    "start_s": s.start_t,
                    "end_s": s.end_t,
                    "wait_s": s.wait,
                    "tasks": s.tasks,
                    "attempts": s.attempts,
                }
                for s in self.stages
            ],
            "pilots": [{**asdict(p), "wait_s": p.wait} for p in self.pilots],
        }


def summarize(
    run_id: str,
    workflow: str,
    strategy: str,
    status: str,
    end_t: float,
    stages: Sequence[StageFigures],
    pilots: Sequence[PilotFigures],
    error: str | None = None,
) -> RunSummary:
    """The run's figures from its stages and pilots (times relative to the run's start)."""
    ready = {s.name: s.ready_t for s in stages}
    core_hours = overhead = 0.0
    for p in pilots:
        if p.start_t is None:
            continue
        end = end_t if p.end_t is None else p.end_t
        core_hours += p.cores * (end - p.start_t) / 3600
        first_ready = min((r for s in p.stages if (r := ready.get(s)) is not None), default=end)
        overhead += p.cores * max(0.0, min(first_ready, end) - p.start_t) / 3600
    waits = [w for p in pilots if (w := p.wait) is not None]
    judged = [p.hit for p in pilots if p.hit is not None]
    return RunSummary(
        run_id=run_id,
        workflow=workflow,
        strategy=strategy,
        status=status,
        makespan_s=end_t,
        twt_s=sum(waits),
        pwt_s=sum(w for s in stages if (w := s.wait) is not None),
        core_hours=core_hours,
        oh_core_hours=overhead,
        hit_ratio=sum(judged) / len(judged) if judged else None,
        error=error,
        stages=tuple(stages),
        pilots=tuple(pilots),
    )
