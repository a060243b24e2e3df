"""What a person sees of a run while it goes on.

On a terminal, a rich live view of stages, pilots and the planner's last decisions; the engine
calls it after each of its passes and it redraws at most ``max_hz`` times per *real* second,
so a simulated day of events costs a handful of redraws, not one per event. It shows each
stage's progress, its attempts running and those waiting on a busy worker, its attempts killed
(by resource), failed and lost, and the size its tasks get now from the sizer; each pilot's
predicted wait against the real one (so far, while it queues).
Elsewhere (a pipe, a file, a batch job's output), a log: each decision once, as a line, when it
is taken, and a stage's attempts that did not succeed, by cause, at a bounded rate.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from backends import clock
from backends.base import JobState
from learners.resources import RESOURCES
from orchestrator.human import amounts, count, duration, listing, megabytes, number, offset
from orchestrator.planner import Phase
from orchestrator.report import causes_text

if TYPE_CHECKING:
    from orchestrator.engine import Engine
    from orchestrator.runstate import PilotRun

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
    stages = Table(
        title="stages", title_justify="left", expand=True, box=None, collapse_padding=True
    )
    for column in ("stage", "state", "tasks", "", "running", "waiting", "killed", "failed", "lost",
                   "ready", "start", "end"):  # fmt: skip
        right = column not in ("stage", "state", "tasks", "", "killed")
        stages.add_column(column, justify="right" if right else "left", no_wrap=True)
    sizes = Table(title="tasks sized now", title_justify="left", box=None)
    for column in ("stage", *RESOURCES):
        sizes.add_column(column, justify="left" if column == "stage" else "right")
    for name, s in engine.state.stages.items():
        total = len(s.tasks)
        stages.add_row(
            name,
            Text(str(s.phase), style=PHASE_STYLE[str(s.phase)]),
            f"{s.done}/{total}",
            ProgressBar(total=max(total, 1), completed=s.done, width=10),
            _count(len(s.running)),
            _count(len(s.waiting)),
            Text(killed(s.causes), style="yellow"),
            _count(s.causes["failed"]),
            _count(s.causes["lost"]),
            offset(s.ready_t),
            offset(s.start_t),
            offset(s.end_t),
        )
        if s.last_allocation is not None and s.phase in (Phase.READY, Phase.RUNNING):
            size = s.last_allocation
            sizes.add_row(
                name,
                number(size.cores),
                megabytes(size.memory),
                megabytes(size.disk),
                duration(size.wall) if math.isfinite(size.wall) else "-",
            )
    pilots = Table(title="pilots", title_justify="left", expand=True, box=None)
    for column in ("pilot", "job", "cores", "state", "submitted", "predicted wait", "waited",
                   "prediction"):  # fmt: skip
        pilots.add_column(column)
    shown_pilots, hidden_pilots = _pilots_shown(list(engine.state.pilots.values()))
    for p in shown_pilots:
        info = p.info
        state = _pilot_state(p)
        if info is not None and info.reason and state == "pending":
            state += f" ({info.reason})"
        if p.released and p.live:
            state += ", released"
        pilots.add_row(
            p.pilot_id,
            p.job_id or "",
            str(p.request.cores),
            state,
            offset(p.submit_t),
            "" if p.predicted_wait is None else duration(p.predicted_wait),
            _waited(p),
            {True: "hit", False: Text("over-predicted", style="yellow"), None: ""}[p.hit],
        )
    if hidden_pilots:
        hidden = Counter(_pilot_state(p) for p in hidden_pilots)
        told = ", ".join(f"{n} {state}" for state, n in sorted(hidden.items()))
        pilots.add_row(Text(f"… {len(hidden_pilots)} more: {told}", style="dim"))
    notes = Text("\n".join(_line(t, text) for t, text in Condensed.of(engine.state.notes)[-6:]))
    shown = [head, stages, *([sizes] if sizes.rows else []), pilots]
    return Group(*shown, Text("decisions", style="bold"), notes)


PILOT_ROWS = 12
"""Pilots shown at most: the live ones first, then those that ended last (an elastic run may
hold a pilot per task slot); the rest are counted by state."""


def _pilots_shown(pilots: Sequence[PilotRun]) -> tuple[list[PilotRun], list[PilotRun]]:
    """The pilots the view lists, in the order they were submitted, and those it counts."""
    order = sorted(range(len(pilots)), key=lambda i: (not pilots[i].live, -i))
    shown = set(order[:PILOT_ROWS])
    return (
        [p for i, p in enumerate(pilots) if i in shown],
        [p for i, p in enumerate(pilots) if i not in shown],
    )


def _pilot_state(pilot: PilotRun) -> str:
    if pilot.info is None:
        return "submitting"
    return str(pilot.info.state).lower()


def killed(causes: Mapping[str, int]) -> str:
    """A stage's attempts killed for going past their allocation, by resource: those that
    neither failed nor were lost."""
    return causes_text({k: n for k, n in causes.items() if k not in ("failed", "lost") and n})


def _count(n: int) -> str:
    return str(n) if n else ""


def _waited(pilot: PilotRun) -> str:
    """A pilot's queue wait: what it was once it started, what it is so far while it queues
    for its cores (its dependency met)."""
    info = pilot.info
    if info is None or info.eligible_time is None:
        return ""
    if info.wait is not None:
        return duration(info.wait)
    if info.state is JobState.PENDING:
        return f"{duration(clock.now() - info.eligible_time)} so far"
    return ""


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
        return self

    def __exit__(self, *exc: object) -> None:
        if self._engine is not None:  # drawn from the first pass on: a refused run draws nothing
            self._live.update(render(self._engine), refresh=True)
            self._live.__exit__(None, None, None)

    def __call__(self, engine: Engine) -> None:
        if self._engine is None:
            self._live.__enter__()
        self._engine = engine
        now = clock.monotonic()
        if now - self._last >= self._period:
            self._last = now
            self.frames += 1
            self._live.update(render(engine), refresh=True)


@dataclass
class _Alike:
    """Notes said the same way of one pilot after another (a stage's units of one task each,
    let go as each one's task ends)."""

    shape: str
    since: float
    pilots: list[str] = field(default_factory=list)
    last: float = 0.0

    def summary(self) -> tuple[float, str]:
        more = count(len(self.pilots), "more pilot")
        return self.last, f"{more} the same way since {offset(self.since)}: {listing(self.pilots)}"


_OF_A_PILOT = re.compile(r"pilot (\S+): (.*)")


def _shape(what: str) -> str:
    """What a note says of a pilot, its numbers aside (moments and costs move by seconds)."""
    return re.sub(r"\d+(\.\d+)?", "#", what)


class Condensed:
    """The engine's notes as lines to read: a run of notes said alike of one pilot after
    another is its first note and then one line counting the others."""

    def __init__(self) -> None:
        self._alike: _Alike | None = None

    def add(self, t: float, text: str) -> list[tuple[float, str]]:
        """The lines that note ``text`` at ``t`` completes (none while it extends a run)."""
        of_a_pilot = _OF_A_PILOT.fullmatch(text)
        shape = _shape(of_a_pilot[2]) if of_a_pilot else None
        alike = self._alike
        if alike is not None and of_a_pilot and shape == alike.shape:
            alike.pilots.append(of_a_pilot[1])
            alike.last = t
            return []
        lines = [*self.end(), (t, text)]
        if shape is not None:
            self._alike = _Alike(shape, t)
        return lines

    def end(self) -> list[tuple[float, str]]:
        """The count of the run under way, if it has more than its first note."""
        alike, self._alike = self._alike, None
        return [alike.summary()] if alike is not None and alike.pilots else []

    @classmethod
    def of(cls, notes: Iterable[tuple[float, str]]) -> list[tuple[float, str]]:
        condensed = cls()
        lines = [line for t, text in notes for line in condensed.add(t, text)]
        return lines + condensed.end()


class DecisionLog:
    """Prints each decision of the engine once, as a line, when it is taken (a run of notes
    said alike of one pilot after another as its first and a count, :class:`Condensed`); and,
    for a stage whose attempts keep not succeeding, a line of its counts by cause and its
    tasks' size now, at most once per ``every_s`` of the run's time (and once more as the
    stage ends)."""

    def __init__(self, console: Console, every_s: float = 60.0) -> None:
        self._console = console
        self._printed = 0
        self._every_s = every_s
        self._told: dict[str, tuple[Counter[str], float]] = {}
        """Per stage, the counts last told, and when."""
        self._engine: Engine | None = None
        self._now = 0.0
        """The run's time at the engine's last pass."""
        self._condensed = Condensed()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._engine is not None:  # told at the run's end, which may be long after a pass
            self._notes(self._engine)  # taken as its pilots ended
            end = self._engine.state.end_t
            self._trouble(self._engine, self._now if end is None else end, final=True)
        self._print(self._condensed.end())
        if self._engine is not None:  # a line between the log and the figures, if a run began
            self._console.print()

    def __call__(self, engine: Engine) -> None:
        self._engine, self._now = engine, engine.now()
        self._notes(engine)
        self._trouble(engine, self._now)

    def _notes(self, engine: Engine) -> None:
        """The notes taken since the last printed."""
        fresh = min(engine.state.notes_total - self._printed, len(engine.state.notes))
        for t, text in list(engine.state.notes)[len(engine.state.notes) - fresh :]:
            self._note(t, text)
        self._printed = engine.state.notes_total

    def _trouble(self, engine: Engine, now: float, final: bool = False) -> None:
        for name, stage in engine.state.stages.items():
            told, when = self._told.get(name, (Counter(), -math.inf))
            due = final or not stage.phase.open or now - when >= self._every_s
            if stage.causes == told or not due:
                continue
            self._told[name] = (Counter(stage.causes), now)
            size, going = stage.last_allocation, stage.phase.open
            now_sized = size is not None and going
            sized = f"; its tasks are now sized {amounts(size.as_dict())}" if now_sized else ""
            n = sum(stage.causes.values())
            attempts = f"{count(n, 'attempt')} did not succeed" + (" so far" if going else "")
            self._say(now, f"stage {name}: {attempts} ({causes_text(stage.causes)}){sized}")

    def _note(self, t: float, text: str) -> None:
        self._print(self._condensed.add(t, text))

    def _say(self, t: float, text: str) -> None:
        self._print([*self._condensed.end(), (t, text)])

    def _print(self, lines: list[tuple[float, str]]) -> None:
        for t, text in lines:
            self._console.print(_line(t, text), highlight=False, markup=False, soft_wrap=True)
