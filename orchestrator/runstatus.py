"""What ``leadtime status RUN`` says of a run: all of it as one JSON document.

The document holds the run's figures exactly as ``leadtime run --json`` gives them (recorded at
the run's end, or computed from the store so far: :class:`RunRecord`), each stage's and each
pilot's entry there grown with what the store knows besides (counts by outcome, retries by
cause, job ids, requests, waits), the run's settings and its manager's liveness, the AWE of
each resource, and every attempt that did not succeed. ``status`` prints it as tables
(:func:`orchestrator.report.status_tables`); ``status --json`` prints it as it is. Times
relative to the run's start are in seconds (``*_s``); ``created``, ``ended`` and
``last_seen`` are Unix times.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from learners.metrics import Usage
from learners.resources import PACKED
from orchestrator.runrecord import (
    CoreUsage,
    RunRecord,
    StoreRow,
    category_use,
    failure_kind,
    stage_of,
)
from orchestrator.runs import OnWorker, RunState, last_seen, state

SETTINGS = ("workflow", "source", "backend", "cluster", "strategy", "sizer", "seed", "scale")
"""What the run was asked to do, from its row in the store."""
GEOMETRY = ("cores", "nodes", "memory_mb", "time_limit_s", "partition", "account", "qos")
"""What a pilot asked the batch system for."""


def run_status(record: RunRecord) -> dict[str, Any]:
    """Everything ``status RUN`` shows of ``record``'s run."""
    run = record.run
    figures = record.figures
    now = state(run)
    usage = CoreUsage.of(record)
    return {
        **figures,
        **{name: run.get(name) for name in SETTINGS},
        "state": str(now),
        "created": run.get("created"),
        "ended": run.get("ended"),
        "manager": run.get("manager"),
        "last_seen": last_seen(run) if now in (RunState.RUNNING, RunState.MANAGER_GONE) else None,
        "figures_recorded": record.recorded,
        "idle_core_hours": usage.idle_core_hours,
        "awe": awe(record),
        "stages": _stages(record, figures["stages"]),
        "pilots": _pilots(record, figures["pilots"]),
        "did_not_succeed": [_attempt(a) for a in record.failures()],
    }


def awe(record: RunRecord) -> dict[str, float | None]:
    """Absolute Workflow Efficiency of each resource over every attempt that ended (None where
    nothing was allocated)."""
    total = {r: Usage() for r in PACKED}
    for category in category_use(record):
        for r, u in category.usage.items():
            t = total[r]
            t.consumed += u.consumed
            t.allocated_ok += u.allocated_ok
            t.allocated_failed += u.allocated_failed
    return {r: None if math.isnan(u.awe) else u.awe for r, u in total.items()}


def _stages(record: RunRecord, recorded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = {s["stage"]: s for s in record.stages}
    failed_tasks = Counter(t["stage"] for t in record.tasks if t["state"] == "failed")
    outcomes = Counter((stage_of(a["task_id"]), a["outcome"]) for a in record.attempts)
    causes = record.failures_by_stage()
    pilots = record.pilot_figures()
    out = []
    for entry in recorded:
        name = entry["name"]
        row = rows.get(name, {})
        mine = [p for p in pilots if name in p.stages]
        first = min(
            (p for p in mine if p.start_t is not None), key=lambda p: p.start_t or 0.0, default=None
        )
        kinds = causes.get(name, Counter())
        out.append(
            {
                **entry,
                "state": row.get("state"),
                "done": row.get("tasks_done") or 0,
                "failed": failed_tasks[name],
                "running": outcomes[name, OnWorker.RUNNING],
                "waiting": outcomes[name, OnWorker.WAITING],
                "lost": kinds.get("lost", 0),
                "did_not_succeed": dict(kinds.most_common()),
                "pilots": [p.pilot_id for p in mine],
                "pilot": None if first is None else first.pilot_id,
                "predicted_wait_s": None if first is None else first.predicted_wait,
                "pilot_wait_s": None if first is None else first.wait,
            }
        )
    return out


def _pilots(record: RunRecord, recorded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = {p["pilot_id"]: p for p in record.pilots}
    out = []
    for entry in recorded:
        row = rows.get(entry["pilot_id"], {})
        request = row.get("request") or {}
        out.append(
            {
                **entry,
                "job_id": row.get("job_id"),
                "reason": row.get("reason") or None,
                "request": {k: request.get(k) for k in GEOMETRY if k in request},
                "fit": row.get("fit"),
            }
        )
    return out


def _attempt(a: StoreRow) -> dict[str, Any]:
    return {
        "task_id": a["task_id"],
        "attempt": a["attempt"],
        "outcome": a["outcome"],
        "kind": failure_kind(a),
        "cause": a.get("cause"),
        "worker": a.get("worker"),
        "pilot_id": a.get("pilot_id"),
        "allocation": finite(a.get("allocation")),
        "peak": finite(a.get("peak")),
        "start_s": a.get("start_t"),
        "end_s": a.get("end_t"),
    }


def finite(amounts: Mapping[str, float] | None) -> dict[str, float | None] | None:
    """An allocation or a peak for JSON: an unbounded wall time is null (JSON has no infinity)."""
    if amounts is None:
        return None
    return {r: v if v is None or math.isfinite(v) else None for r, v in amounts.items()}
