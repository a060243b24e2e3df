"""What a person sees of a run while it goes on.

On a terminal, a rich live view of stages, pilots and the planner's last decisions; the engine
calls it after each of its passes and it redraws at most ``max_hz`` times per *real* second,
so a simulated day of events costs a handful of redraws, not one per event. Elsewhere (a pipe,
a file, a batch job's output), a log: each decision once, as a line, when it is taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator import clock
from orchestrator.human import duration, offset
from orchestrator.report import causes_text

if TYPE_CHECKING:
    from orchestrator.engine import Engine

PHASE_STYLE = {
    "waiting": "dim",
    "ready": "yellow",
    "running": "cyan",
    "done": "green",
    "failed": "bold red",
}


def render(engine: Engine) -> Group:
    """The whole view of ``engine`` as it is now."""
    head = Text.assemble(
        ("leadtime ", "bold"),
        f"{engine.workflow.name} · {engine.options.strategy} · {engine.backend.name} · ",
        (offset(engine.now()), "bold"),
        f" · run {engine.run_id}",
    )
    stages = Table(title="stages", title_justify="left", expand=True, box=None)
    for column in ("stage", "state", "tasks", "", "did not succeed", "ready", "start", "end"):
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
            causes_text(s.causes),
            offset(s.ready_t),
            offset(s.start_t),
            offset(s.end_t),
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
            offset(p.submit_t),
            "" if p.predicted_wait is None else duration(p.predicted_wait),
            "" if wait is None else duration(wait),
        )
    notes = Text("\n".join(_line(t, text) for t, text in list(engine.notes)[-6:]))
    return Group(head, stages, pilots, Text("decisions", style="bold"), notes)


def _line(t: float, text: str) -> str:
    return f"{offset(t)}  {text}"


class View(Protocol):
    """A run's live view: called after every pass of the engine, closed when the run ends."""

    def __enter__(self) -> View: ...

    def __exit__(self, *exc: object) -> None: ...

    def __call__(self, engine: Engine) -> None: ...


def live_view(console: Console) -> View:
    """The dashboard on a terminal, the decision log anywhere else."""
    return Dashboard(console) if console.is_terminal else DecisionLog(console)


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


class DecisionLog:
    """Prints each decision of the engine once, as a line, when it is taken."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._printed = 0

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self._console.print()

    def __call__(self, engine: Engine) -> None:
        fresh = min(engine.notes_total - self._printed, len(engine.notes))
        for t, text in list(engine.notes)[len(engine.notes) - fresh :]:
            self._console.print(_line(t, text), highlight=False, markup=False)
        self._printed = engine.notes_total
