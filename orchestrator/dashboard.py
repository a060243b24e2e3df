"""A rich live view of a run: stages, pilots, and the planner's last decisions.

The engine calls the dashboard after each of its passes; the dashboard
redraws at most ``max_hz`` times per *real* second, so a simulated day of
events costs a handful of redraws, not one per event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator import clock

if TYPE_CHECKING:
    from orchestrator.engine import Engine

PHASE_STYLE = {
    "waiting": "dim",
    "ready": "yellow",
    "running": "cyan",
    "done": "green",
    "failed": "bold red",
}


def _t(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:,.0f}"


def render(engine: Engine) -> Group:
    """The whole view of ``engine`` as it is now."""
    head = Text.assemble(
        ("leadtime ", "bold"),
        f"{engine.workflow.name} · {engine.options.strategy} · {engine.backend.name} · ",
        (f"t+{engine.now():,.0f} s", "bold"),
        f" · run {engine.run_id}",
    )
    stages = Table(title="stages", title_justify="left", expand=True, box=None)
    for column in ("stage", "state", "tasks", "", "ready", "start", "end"):
        stages.add_column(
            column, justify="right" if column in ("ready", "start", "end") else "left"
        )
    for name, s in engine.stages.items():
        total = len(s.tasks)
        stages.add_row(
            name,
            Text(str(s.phase), style=PHASE_STYLE[str(s.phase)]),
            f"{s.done}/{total}",
            ProgressBar(total=max(total, 1), completed=s.done, width=30),
            _t(s.ready_t),
            _t(s.start_t),
            _t(s.end_t),
        )
    pilots = Table(title="pilots", title_justify="left", expand=True, box=None)
    for column in ("pilot", "job", "cores", "state", "submitted", "predicted wait", "wait"):
        pilots.add_column(column)
    for p in engine.pilots.values():
        info = p.info
        state = "submitting" if info is None else str(info.state).lower()
        if info is not None and info.reason and state == "pending":
            state += f" ({info.reason})"
        if p.released and p.live:
            state += ", released"
        wait = info.wait if info else None
        pilots.add_row(
            p.pilot_id,
            p.job_id or "",
            str(p.request.cores),
            state,
            f"t+{p.submit_t:,.0f}",
            _t(p.predicted_wait),
            _t(wait),
        )
    notes = Text("\n".join(f"t+{t:,.0f}  {text}" for t, text in list(engine.notes)[-6:]))
    return Group(head, stages, pilots, Text("decisions", style="bold"), notes)


class Dashboard:
    """Redraws ``render(engine)`` at a bounded real rate while a run goes on."""

    def __init__(self, console: Console | None = None, max_hz: float = 8.0) -> None:
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._period = 1.0 / max_hz
        self._last = float("-inf")
        self._engine: Engine | None = None
        self.frames = 0
        """Redraws so far."""

    def __enter__(self) -> Dashboard:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._engine is not None:
            self._live.update(render(self._engine), refresh=True)
        self._live.__exit__(None, None, None)

    def __call__(self, engine: Engine) -> None:
        self._engine = engine
        now = clock.monotonic()
        if now - self._last >= self._period:
            self._last = now
            self.frames += 1
            self._live.update(render(engine), refresh=True)
