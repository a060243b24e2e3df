"""Terminal tables of a run's figures (rich)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from backends.registry import simulated
from orchestrator import human
from orchestrator.compare import Row, normalised
from orchestrator.human import duration, offset, relative
from orchestrator.summary import RunSummary
from workflows.spec import Workflow


def run_view(summary: RunSummary) -> Group:
    """Per stage: when it was ready, submitted, started and ended (from the run's start), and
    what it waited; under it the run's figures, one line (a caption would fold at the table's
    width)."""
    table = Table(
        title=f"{summary.workflow} · {summary.strategy} · {summary.status} · run {summary.run_id}",
        title_justify="left",
    )
    for column in ("stage", "tasks", "attempts", "ready", "submit", "start", "end", "wait"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for s in summary.stages:
        table.add_row(
            s.name,
            str(s.tasks),
            str(s.attempts),
            offset(s.ready_t),
            offset(s.submit_t),
            offset(s.start_t),
            offset(s.end_t),
            duration(s.wait),
        )
    figures = (
        f"makespan {duration(summary.makespan_s)} · TWT {duration(summary.twt_s)} · "
        f"PWT {duration(summary.pwt_s)} · {summary.core_hours:,.2f} core-hours · "
        f"OH {summary.oh_core_hours:,.2f} core-hours"
        + ("" if summary.hit_ratio is None else f" · hit ratio {summary.hit_ratio:.0%}")
    )
    return Group(table, Text(figures))


def strategies_table(summaries: Sequence[RunSummary]) -> Table:
    """One workflow run by several strategies on the same cluster."""
    table = Table(title="the same workflow, the same queue", title_justify="left")
    for column in ("strategy", "makespan", "waited", "core-hours", "pilots"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for s in summaries:
        table.add_row(
            s.strategy,
            duration(s.makespan_s),
            duration(s.pwt_s),
            f"{s.core_hours:,.2f}",
            str(len(s.pilots)),
        )
    return table


def compare_tables(rows: Sequence[Row]) -> list[Table]:
    """Figures per workflow and scale, then normalised averages (Table 1 of the ASA paper)."""
    figures = Table(title="per workflow and scale (means over the runs)", title_justify="left")
    for column in ("workflow", "cores", "strategy", "TWT", "makespan", "CH", "PWT", "OH CH"):
        figures.add_column(
            column, justify="left" if column in ("workflow", "strategy") else "right"
        )
    figures.add_column("hit ratio", justify="right")
    last = None
    for r in sorted(rows, key=lambda r: (r.workflow, r.scale)):
        if last is not None and (r.workflow, r.scale) != last:
            figures.add_section()
        last = (r.workflow, r.scale)
        figures.add_row(
            r.workflow,
            str(r.scale),
            r.strategy + (f" ({r.failed} failed)" if r.failed else ""),
            duration(r.twt_s),
            duration(r.makespan_s),
            f"{r.core_hours:,.1f}",
            duration(r.pwt_s),
            f"{r.oh_core_hours:,.2f}",
            "-" if r.hit_ratio is None else f"{r.hit_ratio:.0%}",
        )
    norm = normalised(rows)
    overhead = {
        (w, s): float(
            np.mean([r.oh_core_hours for r in rows if (r.workflow, r.strategy) == (w, s)])
        )
        for w, s in norm
    }
    averages = Table(
        title="normalised averages over the scales (relative to the best strategy of each row)",
        title_justify="left",
    )
    for column in ("workflow", "strategy", "TWT", "makespan", "CH", "PWT", "OH CH (mean)"):
        averages.add_column(
            column, justify="left" if column in ("workflow", "strategy") else "right"
        )
    order = {s: i for i, s in enumerate(dict.fromkeys(r.strategy for r in rows))}
    last_workflow = None
    for (workflow, strategy), m in sorted(norm.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
        if last_workflow is not None and workflow != last_workflow:
            averages.add_section()
        last_workflow = workflow
        averages.add_row(
            workflow,
            strategy,
            *(relative(m[k]) for k in ("twt_s", "makespan_s", "core_hours", "pwt_s")),
            f"{overhead[workflow, strategy]:,.2f}",
        )
    return [figures, averages]


def workflow_lines(workflow: Workflow, workdir: Path, rundir: Path, every: bool) -> list[str]:
    """What ``leadtime validate`` shows of a workflow: each stage's pilot and tasks, and the
    commands and outputs of its first task (``every``: of all), filled in as a run in
    ``workdir`` whose own directory is ``rundir`` fills them, so a template can be checked
    before anything runs."""
    lines = []
    for stage in workflow.stages:
        t, a = stage.tasks, stage.allocation
        after = f", after {' and '.join(stage.after)}" if stage.after else ""
        pilot = "an automatic pilot" if a.auto else f"a pilot of {human.allocation(a)}"
        sized = human.amounts(t.declared) if t.declared else "sized by leadtime"
        lines.append(
            f"stage {stage.name}{after}: {human.count(t.size, 'task')} on {pilot}; "
            f"each task {sized}"
        )
        shown = stage.expand(str(workdir), str(rundir), first=None if every else 1)
        width = max((len(task.id) for task in shown), default=0)
        for task in shown:
            lines.append(f"  {task.id:<{width}}  {task.command}")
            if task.outputs:
                lines.append(f"  {'':<{width}}  outputs: {', '.join(task.outputs)}")
        if len(shown) < t.size:
            lines.append(f"  … {t.size - len(shown):,} more (--tasks shows every task)")
    return lines


def causes_text(causes: Mapping[str, int]) -> str:
    """Attempts that did not succeed, by kind: ``2 lost, 1 memory``."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(causes.items(), key=lambda kv: -kv[1]))


def taken_up_once_fixed(run_id: str) -> str:
    """How a run that failed is taken up again, as every command that tells of one says it."""
    return f"once its cause is fixed, `leadtime resume {run_id}` takes it up"


def state_text(state: str, seen: float | None, now: float) -> str:
    """A run's state as ``status`` says it: ``manager gone (last seen 2 h 5 min ago)``."""
    if state != "manager gone" or seen is None:
        return state
    return f"{state} (last seen {duration(now - seen)} ago)"


def status_tables(status: Mapping[str, Any], now: float) -> list[RenderableType]:
    """One run as ``status RUN`` shows it, from :func:`orchestrator.runstatus.run_status`
    (``now``: Unix time): what it ran and how it stands, its figures, its stages (counts,
    retries by cause, moments, waits), its pilots, and every attempt that did not succeed,
    with why."""
    shown = [_run_lines(status, now), _stage_counts(status), _stage_times(status)]
    if status["pilots"]:
        shown += [_pilot_table(status), _pilot_times(status)]
    if any(p.get("fit") for p in status["pilots"]):
        shown.append(_fits(status))
    if status["did_not_succeed"]:
        shown.append(_failed_table(status))
    return shown


def _run_lines(status: Mapping[str, Any], now: float) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.title = (
        f"run {status['run_id']} · {status['workflow']} · {status['strategy']} · "
        f"{status['backend']} · {status['state']}"
    )
    grid.title_justify = "left"
    grid.add_column(style="bold")
    grid.add_column()
    source = f" ({status['source']})" if status.get("source") else ""
    cluster = f" on {status['cluster']}" if status.get("cluster") else ""
    asked = [f"sizer {status['sizer']}", f"random seed: {status['seed']}"]
    if status.get("scale") is not None:
        asked.append(f"scale {status['scale']}")
    rows = [
        ("workflow", f"{status['workflow']}{source}"),
        ("backend", f"{status['backend']}{cluster}"),
        ("strategy", " · ".join([status["strategy"], *asked])),
        ("started", human.wall(status.get("created"))),
        ("ended", human.wall(status.get("ended"))),
        ("state", _liveness(status, now)),
        ("figures", _figures(status)),
        ("AWE", " · ".join(f"{r} {_share(v)}" for r, v in status["awe"].items())),
    ]
    if status.get("error"):
        more = len(status["error"].splitlines()) - 1
        hint = f" ({more} more lines in --json; `leadtime logs` shows a task's output)"
        rows.append(("error", headline(status["error"]) + (hint if more else "")))
    for name, value in rows:
        grid.add_row(name, Text(value))
    return grid


OUTPUT_LABELS = ("[stdout]", "[stderr]")
"""What heads each of a task's output tails in its error."""


def headline(error: str) -> str:
    """An error's first line, for one row of a table. A task's error goes on with the last
    lines of its output under their labels; where the first line ends at a label, the output's
    last line (where a failing program most often says why) completes it, under its own."""
    first, *more = error.splitlines() or [""]
    if not first.endswith(OUTPUT_LABELS):
        return first
    cut = first.rindex("[")
    label, said = first[cut:], None
    for line in map(str.strip, more):
        if line in OUTPUT_LABELS:
            label = line
        elif line:
            said = f"{label} {line}"
    return first if said is None else f"{first[:cut]}{said}"


def _liveness(status: Mapping[str, Any], now: float) -> str:
    state, seen, manager = status["state"], status.get("last_seen"), status.get("manager")
    said = state_text(state, seen, now)
    if state == "running" and manager:
        heard = "" if seen is None else f", heard from {duration(now - seen)} ago"
        said += f" (manager: process {manager['pid']} on {manager['host']}{heard})"
    elif state == "manager gone":
        run = status["run_id"]
        said += f": `leadtime resume {run}` takes it up, `leadtime cancel {run}` ends it"
    elif state in ("interrupted", "failed") and not simulated(status.get("backend") or ""):
        run = status["run_id"]
        resume = f"`leadtime resume {run}` takes it up"
        said += ": " + (taken_up_once_fixed(run) if state == "failed" else resume)
    if not status["figures_recorded"]:
        said += "; figures so far, from what the store holds"
    return said


def _figures(status: Mapping[str, Any]) -> str:
    idle = status["idle_core_hours"]
    held = status["core_hours"]
    return (
        f"makespan {duration(status['makespan_s'])} · TWT {duration(status['twt_s'])} · "
        f"PWT {duration(status['pwt_s'])} · {held:,.2f} core-hours"
        + (f" ({idle:,.2f} idle)" if held > 0 else "")
        + f" · OH {status['oh_core_hours']:,.2f} core-hours · hit ratio "
        + ("-" if status["hit_ratio"] is None else f"{status['hit_ratio']:.0%}")
    )


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _table(title: str, columns: Sequence[str], left: Collection[str], caption: str = "") -> Table:
    """A table of ``status``: columns not in ``left`` align right; ``caption`` says what they
    mean."""
    table = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        caption=caption or None,
        caption_justify="left",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right")
    return table


def _stage_counts(status: Mapping[str, Any]) -> Table:
    table = _table(
        "stages",
        ("stage", "state", "tasks", "done", "failed", "running", "waiting", "attempts", "lost",
         "did not succeed"),
        {"stage", "state", "did not succeed"},
        caption=(
            "failed: tasks that failed for good; waiting: attempts sent ahead to a busy worker, "
            "which starts them as it has room; lost: attempts whose worker went away; "
            "did not succeed: attempts killed for a resource, failed or lost, retried while the "
            "task had attempts left, or stopped with the run (failed or interrupted), run again "
            "by resume"
        ),
    )  # fmt: skip
    for s in status["stages"]:
        table.add_row(
            s["name"],
            str(s["state"] or "-"),
            *(
                str(s[k])
                for k in ("tasks", "done", "failed", "running", "waiting", "attempts", "lost")
            ),
            causes_text(s["did_not_succeed"]) or "-",
        )
    return table


def _stage_times(status: Mapping[str, Any]) -> Table:
    table = _table(
        "stage moments and waits",
        ("stage", "ready", "submitted", "started", "ended", "waited", "pilot",
         "predicted wait", "real wait"),
        {"stage", "pilot"},
        caption=(
            "moments from the run's start; waited: from ready to its first task starting; "
            "predicted and real wait: of the stage's first pilot to start, in the queue from "
            "eligible to start"
        ),
    )  # fmt: skip
    for s in status["stages"]:
        table.add_row(
            s["name"],
            *(offset(s[k]) for k in ("ready_s", "submit_s", "start_s", "end_s")),
            duration(s["wait_s"]),
            s["pilot"] or "-",
            duration(s["predicted_wait_s"]),
            duration(s["pilot_wait_s"]),
        )
    return table


def _pilot_table(status: Mapping[str, Any]) -> Table:
    table = _table(
        "pilots",
        ("pilot", "job", "stages", "request", "state", "predicted wait", "real wait",
         "prediction"),
        {"pilot", "job", "stages", "request", "state", "prediction"},
        caption=(
            "real wait: in the queue, from eligible (its dependency met) to start; a prediction "
            "hits unless it over-predicted the wait"
        ),
    )  # fmt: skip
    for p in status["pilots"]:
        state = str(p["state"] or "submitting").lower()
        if p.get("reason") and state == "pending":
            state += f" ({p['reason']})"
        table.add_row(
            p["pilot_id"],
            p["job_id"] or "-",
            ", ".join(p["stages"]),
            human.request(p["request"]),
            state,
            duration(p["predicted_wait"]),
            duration(p["wait_s"]),
            {True: "hit", False: "over-predicted", None: "-"}[p["hit"]],
        )
    return table


def _fits(status: Mapping[str, Any]) -> Table:
    """Why each automatic allocation's pilot is as wide and as long as it is."""
    table = _table("automatic allocations", ("pilot", "chosen"), {"pilot", "chosen"})
    for p in status["pilots"]:
        if p.get("fit"):
            table.add_row(p["pilot_id"], p["fit"])
    return table


def _pilot_times(status: Mapping[str, Any]) -> Table:
    table = _table(
        "pilot moments", ("pilot", "submitted", "eligible", "started", "ended"), {"pilot"}
    )
    for p in status["pilots"]:
        table.add_row(
            p["pilot_id"], *(offset(p[k]) for k in ("submit_t", "eligible_t", "start_t", "end_t"))
        )
    return table


def _failed_table(status: Mapping[str, Any]) -> Table:
    table = _table(
        "attempts that did not succeed",
        ("task", "attempt", "outcome", "why", "worker", "pilot", "ended"),
        {"task", "outcome", "why", "worker", "pilot"},
        caption=f"`leadtime logs {status['run_id']} TASK` shows an attempt's output",
    )
    for a in status["did_not_succeed"]:
        table.add_row(
            a["task_id"],
            str(a["attempt"]),
            str(a["outcome"]),
            a["cause"] or "-",
            a["worker"] or "",
            a["pilot_id"] or "",
            offset(a["end_s"]),
        )
    return table
