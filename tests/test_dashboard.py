"""The live view shows trouble: attempts killed, failed and lost per stage, the size the sizer
gives each open stage's tasks now, pilots' predicted against real waits; off a terminal, the
decision log says the same at a bounded rate."""

import io
import re
from collections import Counter
from itertools import pairwise
from types import SimpleNamespace

import pytest
from rich.console import Console

from backends import clock
from orchestrator.cli import DEMO_MOCK
from orchestrator.dashboard import (
    PILOT_ROWS,
    Condensed,
    DecisionLog,
    _line,
    killed,
    live_view,
    render,
)
from orchestrator.engine import Engine
from orchestrator.human import duration, megabytes, offset
from orchestrator.planner import Phase
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from workflows.spec import example, load


def demo(observer) -> None:
    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="asa", backend=DEMO_MOCK)
            await execute(load(example("demo")), config, store, observer=observer)

    clock.run(main(), virtual=True)


def queued(engine: Engine) -> bool:
    """Simulate's pilot queues for its cores, its dependency met."""
    pilot = engine.state.pilots.get("simulate-1")
    info = None if pilot is None else pilot.info
    return info is not None and info.eligible_time is not None and info.start_time is None


def killing(engine: Engine) -> bool:
    """Simulate's tasks run, and some were killed for memory."""
    return engine.state.stages["simulate"].causes["memory"] > 0


@pytest.fixture(scope="module")
def frames():
    """A frame at each of the moments above (the first pass in each), and what the engine
    held then."""
    kept: list[tuple[str, dict]] = []
    moments = [queued, killing]

    def keep(engine: Engine) -> None:
        if len(kept) == len(moments) or not moments[len(kept)](engine):
            return
        console = Console(width=130, record=True, file=io.StringIO())
        console.print(render(engine))
        simulate = engine.state.stages["simulate"]
        pilot = engine.state.pilots["simulate-1"]
        facts = {
            "now": clock.now(),
            "causes": dict(simulate.causes),
            "size": simulate.last_allocation,
            "eligible": pilot.info.eligible_time,
            "wait": pilot.info.wait,
            "predicted": pilot.predicted_wait,
            "hit": pilot.hit,
            "running": len(simulate.running),
            "waiting": len(simulate.waiting),
        }
        kept.append((console.export_text(), facts))

    demo(keep)
    assert len(kept) == len(moments)
    return kept


def row(frame: str, first: str) -> str:
    return next(line for line in frame.splitlines() if line.split()[:1] == [first])


def cell(frame: str, first: str, column: str) -> str:
    """The right-justified ``column``'s cell in the row that starts with ``first``: what stands
    under the column's name."""
    header = next(line for line in frame.splitlines() if f" {column} " in f" {line} ")
    end = f" {header} ".index(f" {column} ") + len(column)
    return row(frame, first)[:end].rsplit(" ", 1)[-1]


def test_a_queued_pilot_shows_its_predicted_wait_and_how_long_it_has_waited_so_far(frames):
    frame, facts = frames[0]
    assert facts["wait"] is None and facts["eligible"] is not None
    pilot = row(frame, "simulate-1")
    assert "pending" in pilot and duration(facts["predicted"]) in pilot
    assert f"{duration(facts['now'] - facts['eligible'])} so far" in pilot


def test_a_started_pilot_shows_its_real_wait_and_whether_the_prediction_hit(frames):
    frame, facts = frames[1]
    pilot = row(frame, "simulate-1")
    assert "running" in pilot and duration(facts["wait"]) in pilot
    assert ("hit" if facts["hit"] else "over-predicted") in pilot


def test_a_stage_shows_its_kills_by_resource_and_the_size_its_tasks_get_now(frames):
    frame, facts = frames[1]
    assert facts["causes"].get("memory"), "the sizer learns memory by killing attempts"
    stage = row(frame, "simulate")
    assert killed(facts["causes"]) in stage and f"{facts['causes']['memory']} memory" in stage
    sized = frame.split("tasks sized now", 1)[1].split("pilots", 1)[0]
    size = facts["size"]
    assert row(sized, "simulate").split() == ["simulate", "1", *megabytes(size.memory).split(),
                                              *megabytes(size.disk).split(), "-"]  # fmt: skip
    assert "fetch" not in sized  # done: its tasks get no size now


def test_a_stage_shows_its_attempts_running_and_waiting_on_a_busy_worker(frames):
    frame, facts = frames[1]
    assert facts["running"] > 0
    assert cell(frame, "simulate", "running") == str(facts["running"])
    assert cell(frame, "simulate", "waiting") == (str(facts["waiting"]) if facts["waiting"] else "")
    assert cell(frame, "fetch", "running") == cell(frame, "fetch", "waiting") == ""  # done


def test_killed_counts_only_kills_by_resource():
    assert killed({"memory": 3, "wall": 1, "lost": 2, "failed": 4}) == "3 memory, 1 wall"
    assert killed({"lost": 2}) == ""


def test_off_a_terminal_a_stage_s_trouble_is_logged_at_a_bounded_rate_and_once_at_the_end():
    out = io.StringIO()
    ends: list[Engine] = []
    log = DecisionLog(Console(file=out, width=200), every_s=300)
    with log:

        def observe(engine):
            log(engine)
            ends[:] = [engine]

        demo(observe)
    told = r"^t\+(.+?)  stage simulate: (\d+) attempts? did not succeed(?: so far)? \((\d+) memory"
    lines = re.findall(told, out.getvalue(), re.M)
    assert len(lines) >= 2
    assert all(total == memory for _, total, memory in lines)  # all of them killed for memory
    counts = [int(n) for _, n, _ in lines]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)  # only when it changes
    assert counts[-1] == ends[0].state.stages["simulate"].causes["memory"]
    seconds = [_seconds(t) for t, _, _ in lines]
    gaps = [b - a for a, b in pairwise(seconds[:-1])]
    assert all(gap >= 300 - 1 for gap in gaps)  # the last line is the end's, whenever it comes
    assert "stage simulate: no wait learned yet" in out.getvalue()  # the decisions, as before


def test_a_stage_s_trouble_told_as_the_stage_ends_is_not_so_far():
    """Told first while the stage runs, then as it ends (not at the run's end, stages later):
    its count is final, and no size is what its tasks get now."""
    out = io.StringIO()
    ends: list[Engine] = []
    with (log := DecisionLog(Console(file=out, width=200), every_s=1e9)):

        def observe(engine):
            log(engine)
            ends[:] = [engine]

        demo(observe)
    told = [line for line in out.getvalue().splitlines() if "did not succeed" in line]
    assert len(told) == 2
    assert "did not succeed so far" in told[0] and "its tasks are now sized" in told[0]
    assert re.search(r"stage simulate: \d+ attempts did not succeed \(\d+ memory\)$", told[1])
    state = ends[0].state
    end = state.stages["simulate"].end_t
    assert end < state.end_t and told[1].startswith(f"{offset(end)}  ")


def test_a_decision_is_one_line_whatever_the_console_s_width():
    """A log is read with grep: a decision longer than the console is not folded."""
    out = io.StringIO()
    with (log := DecisionLog(Console(file=out, width=40), every_s=1e9)):
        demo(log)
    decisions = [line for line in out.getvalue().splitlines() if line.startswith("t+")]
    assert decisions and all(len(line) > 40 for line in decisions)
    assert not [line for line in out.getvalue().splitlines() if line and not line.startswith("t+")]


def _seconds(text: str) -> float:
    units = {"d": 86400, "h": 3600, "min": 60, "s": 1}
    parts = text.split()
    return sum(float(n) * units[u] for n, u in zip(parts[::2], parts[1::2], strict=True))


def test_an_elastic_run_s_many_pilots_are_listed_live_first_and_the_rest_counted():
    """Pilots of one task each: a 28-wide stage holds 28 of them. The view lists at most
    PILOT_ROWS, the live ones first, and counts the others by state."""
    frames = []

    def keep(engine: Engine) -> None:
        if len(engine.state.pilots) > PILOT_ROWS and not frames:
            live = sum(p.live for p in engine.state.pilots.values())
            console = Console(width=130, record=True, file=io.StringIO())
            console.print(render(engine))
            frames.append((console.export_text(), len(engine.state.pilots), live))

    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="elastic", backend=DEMO_MOCK)
            await execute(load(example("demo")), config, store, observer=keep)

    clock.run(main(), virtual=True)
    frame, pilots, live = frames[0]
    listed = [line for line in frame.splitlines() if re.match(r"^ ?all-\d+ ", line)]
    assert len(listed) == PILOT_ROWS
    hidden = re.search(r"… (\d+) more: (.*)", frame)
    assert hidden is not None and int(hidden[1]) == pilots - PILOT_ROWS
    if live >= PILOT_ROWS:  # every pilot listed is live
        assert all(" completed" not in line and " cancelled" not in line for line in listed)


def test_a_failed_run_s_last_tally_is_told_at_the_run_s_end_not_at_its_last_pass():
    """A task lost a minute after the last pass (its pilot's time limit) fails the run: the
    tally the log tells as the run ends carries the end's time, not the last pass's."""
    stage = SimpleNamespace(causes=Counter(), phase=Phase.RUNNING, last_allocation=None, end_t=None)
    state = SimpleNamespace(notes=[], notes_total=0, stages={"long": stage}, end_t=None)
    engine = SimpleNamespace(state=state, now=lambda: 0.2)
    out = io.StringIO()
    with (log := DecisionLog(Console(file=out, width=200), every_s=1e9)):
        log(engine)
        stage.causes["lost"], stage.phase, state.end_t = 1, Phase.FAILED, 61.0
    (told,) = [line for line in out.getvalue().splitlines() if "did not succeed" in line]
    assert told == "t+1 min 1 s  stage long: 1 attempt did not succeed (1 lost)"


def test_a_note_taken_after_the_last_pass_is_told_at_the_run_s_end():
    """A pilot cancelled as the run waits for its pilots to end is noted after the last pass:
    the log left that note out."""
    state = SimpleNamespace(notes=[], notes_total=0, stages={}, end_t=None)
    engine = SimpleNamespace(state=state, now=lambda: 10.0)
    out = io.StringIO()
    with (log := DecisionLog(Console(file=out, width=200), every_s=1e9)):
        state.notes.append((10.0, "pilot a-0: its stages are over: released"))
        state.notes_total += 1
        log(engine)
        state.notes.append((70.0, "pilot a-0: its job 7 did not end 1 min after ...: cancelled"))
        state.notes_total += 1
    assert out.getvalue().strip().splitlines() == [
        "t+10 s  pilot a-0: its stages are over: released",
        "t+1 min 10 s  pilot a-0: its job 7 did not end 1 min after ...: cancelled",
    ]


def test_notes_said_alike_of_one_pilot_after_another_are_one_line_and_a_count():
    """An elastic stage's units of one task each are let go one by one as their tasks end:
    a line each made a 24-wide montage run log 47 lines of releases."""
    state = SimpleNamespace(notes=[], notes_total=0, stages={}, end_t=None)
    engine = SimpleNamespace(state=state, now=lambda: 0.0)
    notes = [
        (474, "pilot all-2: idle until t+10 min 32 s: released (holding it costs 2 min 12 s)"),
        (477, "pilot all-18: idle until t+10 min 35 s: released (holding it costs 2 min 13 s)"),
        (480, "pilot all-7: idle until t+10 min 39 s: released (holding it costs 2 min 12 s)"),
        (493, "23 cores needed at t+10 min 51 s: submitting at t+10 min 41 s"),
        (500, "pilot all-3: no stage needs it again: released"),
        (501, "pilot all-4: no stage needs it again: released"),
        (502, "pilot all-5: cancelled"),
        (510, "pilot all-6: no stage needs it again: released"),
        (511, "pilot all-8: no stage needs it again: released"),
    ]
    out = io.StringIO()
    with (log := DecisionLog(Console(file=out, width=200), every_s=1e9)):
        for note in notes:
            state.notes.append(note)
            state.notes_total += 1
            log(engine)
    logged = out.getvalue().strip().splitlines()
    assert [_line(t, text) for t, text in Condensed.of(notes)] == logged  # and the live view
    assert logged == [
        "t+7 min 54 s  pilot all-2: idle until t+10 min 32 s: released (holding it costs 2 min "
        "12 s)",
        "t+8 min  2 more pilots the same way since t+7 min 54 s: all-18 and all-7",
        "t+8 min 13 s  23 cores needed at t+10 min 51 s: submitting at t+10 min 41 s",
        "t+8 min 20 s  pilot all-3: no stage needs it again: released",
        "t+8 min 21 s  1 more pilot the same way since t+8 min 20 s: all-4",
        "t+8 min 22 s  pilot all-5: cancelled",
        "t+8 min 30 s  pilot all-6: no stage needs it again: released",
        "t+8 min 31 s  1 more pilot the same way since t+8 min 30 s: all-8",
    ]


def test_a_view_no_run_reached_draws_nothing():
    """A run refused before its first pass (a resume of a run that ended, say) leaves its
    error alone on the terminal: no empty frame, no blank line."""
    for terminal in (True, False):
        out = io.StringIO()
        with live_view(Console(file=out, force_terminal=terminal)):
            pass
        assert out.getvalue() == ""
