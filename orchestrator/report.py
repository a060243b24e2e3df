"""Terminal tables of a run's figures (rich)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from rich.table import Table

from orchestrator.compare import Row, normalised
from orchestrator.human import duration, offset, relative
from orchestrator.summary import RunSummary


def run_table(summary: RunSummary) -> Table:
    """Per stage: when it was ready, submitted, started and ended (from the run's start), and
    what it waited."""
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
    table.caption = (
        f"makespan {duration(summary.makespan_s)} · TWT {duration(summary.twt_s)} · "
        f"PWT {duration(summary.pwt_s)} · {summary.core_hours:,.2f} core-hours · "
        f"OH {summary.oh_core_hours:,.2f} core-hours"
        + ("" if summary.hit_ratio is None else f" · hit ratio {summary.hit_ratio:.0%}")
    )
    table.caption_justify = "left"
    return table


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


def causes_text(causes: Mapping[str, int]) -> str:
    """Attempts that did not succeed, by kind: ``2 lost, 1 memory``."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(causes.items(), key=lambda kv: -kv[1]))


StoreRow = Mapping[str, Any]
"""A row of the store, as :meth:`Store.rows` gives it."""


def status_tables(
    run: StoreRow, stages: Sequence[StoreRow], attempts: Sequence[StoreRow], state: str
) -> list[Table]:
    """One run from the store (``state``: its status, its manager's liveness included): its
    stages, with their retries by cause, and every attempt that did not succeed, with why."""
    head = Table(
        title=f"run {run['run_id']} · {run['workflow']} · {run['strategy']} · {run['backend']}"
        f" · {state}",
        title_justify="left",
    )
    for column in ("stage", "state", "tasks", "done", "attempts", "did not succeed"):
        head.add_column(column, justify="left" if column in ("stage", "state") else "right")
    by_stage: dict[str, list[StoreRow]] = {}
    for a in attempts:
        by_stage.setdefault(a["task_id"].rsplit(".", 1)[0], []).append(a)
    for stage in stages:
        mine = by_stage.get(stage["stage"], [])
        kinds = Counter(
            a["exhausted"] or a["outcome"]
            for a in mine
            if a["outcome"] not in ("success", "running")
        )
        head.add_row(
            stage["stage"],
            str(stage["state"]),
            str(stage["tasks_total"]),
            str(stage["tasks_done"]),
            str(len(mine)),
            causes_text(kinds) or "-",
        )
    if run.get("error"):
        head.caption = f"error: {run['error']}"
        head.caption_justify = "left"
    failed = [a for a in attempts if _unsuccessful(a)]
    if not failed:
        return [head]
    lost = Table(title="attempts that did not succeed", title_justify="left")
    for column in ("task", "attempt", "outcome", "why", "worker", "pilot", "ended"):
        lost.add_column(column, justify="right" if column in ("attempt", "ended") else "left")
    for a in sorted(failed, key=lambda a: (a["end_t"] or 0.0, a["task_id"])):
        lost.add_row(
            a["task_id"],
            str(a["attempt"]),
            str(a["outcome"]),
            a.get("cause") or "-",
            a.get("worker") or "",
            a.get("pilot_id") or "",
            offset(a["end_t"]),
        )
    return [head, lost]


def _unsuccessful(attempt: StoreRow) -> bool:
    return attempt["outcome"] not in ("success", "running")
