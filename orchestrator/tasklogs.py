"""What ``leadtime logs`` shows: a run's attempts, and what each one wrote.

Every attempt's result brings back the head and the tail of its stdout and stderr, with the
number of bytes cut between them (:class:`orchestrator.agent.attempt.Captured`), the host it ran on
and, when its scratch directory was kept, where; the store keeps them apart from the attempts'
rows (its ``outputs`` table), so only this reads them. A running attempt's output is in its
scratch directory on its node until it ends: this says so, and ``--follow`` prints each
attempt's output as it ends, reading the store at most once every :data:`FOLLOW_POLL_S`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from backends import clock
from backends.registry import simulated
from learners.resources import RESOURCES
from orchestrator.agent.attempt import OVER_AT_END, VERDICTS, Captured, worker_lines
from orchestrator.human import duration, megabytes, number, offset, plural
from orchestrator.runrecord import StoreRow
from orchestrator.runs import ON_WORKER, STOPPED, OnWorker, RunState, state
from orchestrator.store import Store

FOLLOW_POLL_S = 1.0
"""``--follow`` reads the store at most this often."""


@dataclass(frozen=True)
class AttemptLog:
    """One attempt as the store holds it: its row, and its output's (None when it has none)."""

    row: StoreRow
    output: StoreRow | None

    @property
    def key(self) -> tuple[str, int]:
        return self.row["task_id"], self.row["attempt"]


async def run_row(store: Store, run_id: str) -> StoreRow | None:
    found = await store.rows("runs", {"run_id": run_id})
    return found[0] if found else None


async def attempts(
    store: Store, run_id: str, task_id: str | None = None, since: float | None = None
) -> list[StoreRow]:
    """The run's attempts (of ``task_id`` only, if given; those whose result the manager
    had at or after ``since``, if given), in the order they started."""
    where = {"run_id": run_id} | ({} if task_id is None else {"task_id": task_id})
    return await store.rows(
        "attempts", where, order="start_t", since=None if since is None else {"result_t": since}
    )


async def with_output(store: Store, rows: Sequence[StoreRow]) -> list[AttemptLog]:
    """``rows`` with the output each attempt brought back."""
    logs = []
    for row in rows:
        key = {k: row[k] for k in ("run_id", "task_id", "attempt")}
        found = await store.rows("outputs", key)
        logs.append(AttemptLog(row, found[0] if found else None))
    return logs


async def unknown(store: Store, run_id: str, task_id: str) -> str | None:
    """Why the run has no task ``task_id``; None when it has (its attempts may not have
    started yet)."""
    stages = await store.rows("stages", {"run_id": run_id})
    stage, _, index = task_id.rpartition(".")
    for s in stages:
        if s["stage"] == stage and index.isdigit() and int(index) < (s["tasks_total"] or 0):
            return None
    known = ", ".join(_span(s["stage"], s["tasks_total"] or 1) for s in stages)
    return f"no task {task_id} in run {run_id}" + (f" (its tasks: {known})" if known else "")


def _span(stage: str, tasks: int) -> str:
    """A stage's task ids as a person reads them: ``fit.0`` or ``fit.0 to .11``."""
    return f"{stage}.0" if tasks == 1 else f"{stage}.0 to .{tasks - 1}"


def attempts_table(rows: Sequence[StoreRow], run_id: str) -> Table:
    """A run's tasks and their attempts, with each one's outcome and cause."""
    table = Table(title=f"attempts of run {run_id}", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("task", "attempt", "outcome", "why", "worker", "started", "ended", "took"):
        table.add_column(column, justify="right" if column in ("attempt", "took") else "left")
    first = {t: i for i, t in enumerate(dict.fromkeys(r["task_id"] for r in rows))}
    for r in sorted(rows, key=lambda r: (first[r["task_id"]], r["attempt"])):
        took = None if r["end_t"] is None or r["start_t"] is None else r["end_t"] - r["start_t"]
        table.add_row(
            r["task_id"],
            str(r["attempt"]),
            str(r["outcome"]),
            r.get("cause") or "",
            r.get("worker") or "",
            offset(r["start_t"]),
            offset(r["end_t"]),
            duration(took) if took is not None else "",
        )
    table.caption = f"`leadtime logs {run_id} TASK` shows a task's output"
    table.caption_justify = "left"
    return table


def attempt_view(log: AttemptLog, backend: str) -> Group:
    """One attempt: how it ended and why, its allocation against its peak, where its scratch
    directory was kept, and its stdout and stderr (head, the bytes cut, tail)."""
    row, output = log.row, log.output
    ended = row["outcome"] not in ON_WORKER
    head = Text(f"{row['task_id']} · attempt {row['attempt']} · {row['outcome']}", style="bold")
    lines: list[RenderableType] = [head]
    where = [f"worker {row.get('worker') or '-'}", f"pilot {row.get('pilot_id') or '-'}"]
    if node := row.get("node") or (output or {}).get("node"):  # an earlier version's: output's
        where.append(f"node {node}")
    where.append(f"started {offset(row['start_t']) or '-'}")
    if ended and row["end_t"] is not None and row["start_t"] is not None:
        where.append(f"ended {offset(row['end_t'])} ({duration(row['end_t'] - row['start_t'])})")
    lines.append(Text("  " + " · ".join(where)))
    if row["outcome"] == OnWorker.WAITING:
        lines.append(
            Text(
                "  waiting: sent ahead to its worker, which is busy and starts it once it has "
                "room; its output comes here when it ends (--follow waits for it)"
            )
        )
        return Group(*lines)
    if not ended:
        lines.append(
            Text(
                "  running: its stdout and stderr are in its scratch directory on its node "
                "(leadtime.stdout and leadtime.stderr under $LEADTIME_SCRATCH) and come here "
                "when it ends (--follow waits for them)"
            )
        )
        return Group(*lines)
    said = worker_lines(row.get("output_tail") or "")
    killed = not any(line.startswith(OVER_AT_END) for line in said)
    if row.get("exhausted"):
        lines.append(Text("  " + _exhausted(row, killed)))
    elif row.get("cause"):
        lines.append(Text(f"  why: {row['cause']}"))
    lines.append(_resources(row, killed))
    if row.get("starved"):
        got = _amount("cores", (row.get("peak") or {}).get("cores"))
        cores = (row.get("allocation") or {}).get("cores")
        given = f"{_amount('cores', cores)} {plural(cores or 0, 'core')}"
        lines.append(
            Text(
                f"  starved: its CPUs were busy through most of its run and it used {got} of "
                f"the {given} it was given; its category's cores are sized as if it had "
                "used them all (an oversubscribed node would otherwise shrink them further)"
            )
        )
    for line in said:
        if not line.startswith(VERDICTS):  # an exhaustion is said above
            lines.append(Text(f"  the worker: {line}"))
    if output and output.get("sandbox"):
        lines.append(Text(f"  scratch directory kept: {output['sandbox']}", style="bold"))
    if output is None and not node:  # no word from a worker (a worker says where it ran)
        lines.append(Text("  " + _no_output(row, backend), style="dim"))
        return Group(*lines)
    for name in ("stdout", "stderr"):  # an attempt without an output row wrote nothing
        lines += _stream(name, Captured(**((output or {}).get(name) or {})))
    return Group(*lines)


def _exhausted(row: StoreRow, killed: bool) -> str:
    """Why the attempt was exhausted: killed as it went over, or found over as it ended."""
    resource, measured = row["exhausted"], row.get("measured")
    allocated = (row.get("allocation") or {}).get(resource)
    if measured is not None and allocated is not None and measured <= allocated:
        what = f"{resource} reached its allocation of {_amount(resource, allocated)}"
    else:
        what = (
            f"{resource} reached {_amount(resource, measured)}, over its allocation of "
            f"{_amount(resource, allocated)}"
        )
    return f"killed: {what}" if killed else f"{what}, found as it ended (no sample caught it)"


def _resources(row: StoreRow, killed: bool) -> Table:
    """Allocation and peak of each resource (the peak of a killed attempt: up to its kill)."""
    allocation, peak = row.get("allocation") or {}, row.get("peak") or {}
    table = Table(box=None, padding=(0, 2), show_edge=False)
    table.add_column("  resource")
    table.add_column("allocated", justify="right")
    table.add_column("peak", justify="right")
    table.add_column("")
    for r in RESOURCES:
        mark = ("← killed" if killed else "← over") if r == row.get("exhausted") else ""
        table.add_row(f"  {r}", _amount(r, allocation.get(r)), _amount(r, peak.get(r)), mark)
    return table


def _amount(resource: str, value: float | None) -> str:
    if value is None:
        return "-"
    if resource == "wall":
        return "unbounded" if value == float("inf") else duration(value)
    return number(value) if resource == "cores" else megabytes(value)


def _no_output(row: StoreRow, backend: str) -> str:
    if simulated(backend):
        return "no output: tasks on the simulated cluster run no command"
    if row["outcome"] == "lost":
        return "no output came back: its worker went away before the attempt ended"
    if row["outcome"] == STOPPED:
        return "no output came back: the run ended before the attempt did"
    return "no output came back for this attempt"


def _stream(name: str, captured: Captured) -> list[RenderableType]:
    if not captured:
        return [Text(f"{name}: empty", style="dim")]
    if not captured.cut:
        return [Text(f"{name}:", style="bold"), Text(literal(captured.head + captured.tail))]
    return [
        Text(f"{name}: its first and last bytes", style="bold"),
        Text(literal(captured.head)),
        Text(f"[... {captured.cut:,} bytes cut ...]", style="yellow"),
        Text(literal(captured.tail)),
    ]


def literal(text: str) -> str:
    """A task's output as text that cannot drive the terminal: control characters other than
    newlines and tabs come out escaped (``\\x1b``), trailing newlines dropped."""
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text).rstrip(
        "\n"
    )


async def follow(
    store: Store,
    run_id: str,
    task_id: str | None,
    show: Callable[[AttemptLog], None],
    poll_s: float = FOLLOW_POLL_S,
    seen: Collection[StoreRow] = (),
) -> RunState:
    """Show each attempt of the run (of ``task_id``, if given) that ended, but those ``seen``,
    then each one as it ends, until the run is no longer going; the state it is in then.

    Paged by when the manager had each result, not by the attempts' ends: a result a worker
    kept through a lost connection ended before those the manager had meanwhile. A run whose
    manager records no such moment (an earlier version's) is read whole at each poll."""
    shown = {(r["task_id"], r["attempt"]) for r in seen}
    since = _last_result(seen)
    while True:
        run = await run_row(store, run_id)
        assert run is not None
        now = state(run)
        ended = [
            r
            for r in await attempts(store, run_id, task_id, since=since)
            if r["outcome"] not in ON_WORKER and r["end_t"] is not None
        ]
        fresh = sorted(
            (r for r in ended if (r["task_id"], r["attempt"]) not in shown),
            key=lambda r: (r["end_t"], r["task_id"], r["attempt"]),
        )
        for log in await with_output(store, fresh):
            show(log)
            shown.add(log.key)
        since = _last_result(ended, since)
        if now is not RunState.RUNNING:
            return now
        await clock.sleep(poll_s)


def _last_result(rows: Iterable[StoreRow], since: float | None = None) -> float | None:
    """When the manager had the last result of ``rows`` (``since`` if later, or none)."""
    heard = [r["result_t"] for r in rows if r.get("result_t") is not None]
    return max(heard + ([] if since is None else [since]), default=None)


def running_note(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """What ``--follow`` says of attempts still on their workers when it starts."""
    out = [r for r in rows if r["outcome"] in ON_WORKER]
    if not out:
        return None
    if len(out) == 1:
        r = out[0]
        if r["outcome"] == OnWorker.WAITING:
            return (
                f"{r['task_id']} attempt {r['attempt']} is waiting for room on worker "
                f"{r.get('worker')}: its output shows here when it ends"
            )
        return (
            f"{r['task_id']} attempt {r['attempt']} is running on worker {r.get('worker')}: "
            "its output is on that node until it ends, and shows here then"
        )
    waiting = sum(r["outcome"] == OnWorker.WAITING for r in out)
    where = (
        f"{len(out)} attempts are on their workers ({len(out) - waiting} running, {waiting} "
        "waiting for room)"
        if waiting
        else f"{len(out)} attempts are running"
    )
    return f"{where}: their output is on their nodes until they end, and shows here then"
