"""Terminal tables of a run's figures (rich)."""

from __future__ import annotations

from rich.table import Table

from orchestrator.summary import RunSummary


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.0f}"


def run_table(summary: RunSummary) -> Table:
    """Per stage: when it was ready, submitted, started and ended, and what it waited."""
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
            _s(s.ready_t),
            _s(s.submit_t),
            _s(s.start_t),
            _s(s.end_t),
            _s(s.wait),
        )
    table.caption = (
        f"makespan {summary.makespan_s:,.0f} s · TWT {summary.twt_s:,.0f} s · "
        f"PWT {summary.pwt_s:,.0f} s · {summary.core_hours:,.2f} core-hours · "
        f"OH {summary.oh_core_hours:,.2f} core-hours"
        + ("" if summary.hit_ratio is None else f" · hit ratio {summary.hit_ratio:.0%}")
    )
    table.caption_justify = "left"
    return table
