"""A run of the store as a task trace: a workflow's own tasks replayed through the sizers.

``leadtime bench sizing --run RUN`` asks which sizer would have served *this* workflow
best, from what its tasks really used: each task that succeeded is replayed with its
successful attempt's peaks (cores as the monitor saw them, memory, disk, wall time),
submitted when its stage became ready, in its stage's category (or the one the workflow
names), and with the sizes its workflow declares as the user's request (the ``user``
baseline; the sizers replayed size them all). Tasks that never succeeded are left out:
nothing tells what they needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from learners.replay import TraceTask
from learners.resources import PACKED, Resources
from orchestrator.runrecord import RunRecord, stage_of
from workflows.spec import SpecError, loads
from workflows.traces import Trace, TraceError


def run_trace(record: RunRecord) -> tuple[Trace, str | None]:
    """``record``'s tasks that succeeded, in the order their successful attempts started, and
    why their declared sizes are not known, where they are not (the workflow's files changed).

    Raises :class:`TraceError` for a run with no task that succeeded.
    """
    run = record.run
    ready = {s["stage"]: s["ready_t"] or 0.0 for s in record.stages}
    categories = {t["task_id"]: t["category"] for t in record.tasks}
    declared, unknown = _declared(run)
    tasks = []
    for attempt in record.attempts:  # by start time
        if attempt["outcome"] != "success" or not attempt["peak"]:
            continue
        task_id = attempt["task_id"]
        stage = stage_of(task_id)
        peak = attempt["peak"]
        tasks.append(
            TraceTask(
                categories.get(task_id) or stage,
                Resources(*(float(peak[r]) for r in PACKED), float(peak["wall"])),
                requested=declared.get(stage, {}),
                submit=ready.get(stage, 0.0),
            )
        )
    if not tasks:
        raise TraceError(f"run {run['run_id']} has no task that succeeded: nothing to replay")
    return Trace(f"run {run['run_id']} of {run['workflow']}", tuple(tasks), PACKED), unknown


def _declared(run: Mapping[str, Any]) -> tuple[dict[str, dict[str, float]], str | None]:
    """Per stage, the sizes its tasks declare; or none, and why, where the run's workflow no
    longer reads (a file it lists changed) or the run kept none (started from Python)."""
    text = run.get("workflow_text")
    if not text:
        return {}, "the run kept no workflow file"
    try:
        workflow = loads(text, source=run.get("source") or "<string>", scale=run.get("scale"))
    except SpecError as e:
        return {}, f"its workflow no longer reads as it ran: {e}"
    sizes = {
        s.name: {r: v for r, v in s.tasks.declared.items() if r in PACKED} for s in workflow.stages
    }
    return sizes, None
