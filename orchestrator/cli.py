"""The ``leadtime`` command line."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from backends import clock
from backends.base import BackendError, SubmitError
from backends.options import Workers, duration
from backends.registry import BACKENDS, simulated
from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from learners.queue_wait import GEOMETRY_FIELDS, Geometry, QueueWaitLearner
from learners.resources import Resources
from learners.sizing import COMPANION, DEFAULT_SIZER, MEMORY_ONLY, SIZERS, split_sizer
from learners.sizing.composite import SMALLEST
from orchestrator import backend_flags, human, runs, tasklogs
from orchestrator.agent import worker as agent
from orchestrator.backend_flags import Options
from orchestrator.command import App
from orchestrator.compare import compare as run_comparison
from orchestrator.dashboard import live_view
from orchestrator.elastic import DEFAULT_COST, Unit
from orchestrator.engine import Observer, Refused
from orchestrator.entry import loaded
from orchestrator.planner import STRATEGIES
from orchestrator.report import (
    compare_tables,
    headline,
    run_view,
    state_text,
    status_tables,
    strategies_table,
    taken_up_once_fixed,
    workflow_lines,
)
from orchestrator.runrecord import RunRecord
from orchestrator.runstatus import run_status
from orchestrator.runtrace import run_trace
from orchestrator.session import (
    TAKEN_UP,
    ResumeError,
    RunConfig,
    RunDirs,
    SetupError,
    cancelling,
    collect_less,
    execute,
    last_run,
    new_run_id,
    resumable,
    unreleased,
)
from orchestrator.session import cancel as cancel_run
from orchestrator.session import resume as resume_run
from orchestrator.store import Store, StoreError, default_path
from orchestrator.summary import RunSummary
from orchestrator.waits import DEFAULT_POLICY, POLICIES, cluster_of
from workflows.quantity import size_mb
from workflows.sizing_bench import (
    PAPER_WORKER,
    bench_sizing,
    format_sizing_table,
    sizing_rows,
    widened,
)
from workflows.spec import SpecError, Workflow, example, load
from workflows.traces import Trace, TraceError, load_trace

app = App(
    no_args_is_help=True,
    help=(
        "Staged workflows on Slurm: pilots acquired ahead of time by a learner of queue waits, "
        "held across stages and given back as the workflow narrows; tasks sized as they run."
    ),
)
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True)


def _version(show: bool) -> None:
    if show:
        try:
            out.print(f"leadtime {version('leadtime')}", highlight=False)
        except PackageNotFoundError:
            out.print("leadtime (not installed: no version)", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print leadtime's version and exit."
        ),
    ] = False,
) -> None:
    """The options of every command (the app's help says what leadtime does)."""
    loaded()


Db = Annotated[Path | None, typer.Option("--db", help="Store file (default: XDG data dir).")]
Seed = Annotated[int, typer.Option(help="Seed of every random draw (background load, tasks).")]
Scale = Annotated[
    int | None,
    typer.Option(min=1, help="Scaling factor of the workflow's cores (its `scale`)."),
]


def fail(message: str, code: int = 2, quoted: Sequence[str] = (), hint: str = "") -> NoReturn:
    """Print ``message`` on one line, then the ``quoted`` lines (a task's output) indented,
    then ``hint`` (what to do), and exit with ``code``.

    The message may quote the user's text: it is printed literally, never read as markup,
    and control characters come out escaped, so a file cannot drive the terminal.
    """
    err.print(Text.assemble(("error:", "bold red"), " ", _printable(message)), soft_wrap=True)
    for line in quoted:
        err.print(Text("  " + _printable(line)), soft_wrap=True)
    if hint:
        err.print(Text(_printable(hint)), soft_wrap=True)
    raise typer.Exit(code)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def load_workflow(path: Path, scale: int | None) -> Workflow:
    try:
        return load(path, scale=scale)
    except SpecError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")


def _choice(value: str, choices: Sequence[str], what: str) -> str:
    if value not in choices:
        fail(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
    return value


STRATEGY_PANEL = "Strategy"
LEARNER_PANEL = "Queue-wait learner"
"""Help panels of `run` and `compare`: what a flag tunes (a backend's flags: its own panel)."""

Strategy = Annotated[
    str,
    typer.Option(help=f"One of {', '.join(STRATEGIES)}.", rich_help_panel=STRATEGY_PANEL),
]
Policy = Annotated[
    str,
    typer.Option(
        help=f"Queue-wait learner policy: {', '.join(POLICIES)}.", rich_help_panel=LEARNER_PANEL
    ),
]
ALL_FIELDS = ",".join(GEOMETRY_FIELDS)
LearnBy = Annotated[
    str,
    typer.Option(
        help="Geometry fields that tell queue-wait learner states apart.",
        rich_help_panel=LEARNER_PANEL,
    ),
]
WaitEstimate = Annotated[
    str,
    typer.Option(
        help="The wait ASA plans with: auto (0.9 quantile with a dependency, median without), "
        "sample (the learner's draw) or a quantile such as 0.75.",
        rich_help_panel=LEARNER_PANEL,
    ),
]
Share = Annotated[
    bool,
    typer.Option(
        help="Tasks may use any pilot with room (the unified pool).",
        rich_help_panel=STRATEGY_PANEL,
    ),
]
IDLE_CANCEL = human.duration(RunConfig.idle_cancel_s)
"""``--idle-cancel``'s default, as the help shows it."""
IdleCancel = Annotated[
    str,
    typer.Option(
        "--idle-cancel",
        help="asa-naive: cancel and resubmit a pilot that would idle longer than this.",
        metavar="DURATION",
        rich_help_panel=STRATEGY_PANEL,
    ),
]
Cost = Annotated[
    float,
    typer.Option(
        "--cost",
        help="The seconds of makespan one core-hour is worth (lambda in makespan + lambda x "
        "core-hours): elastic holds or gives back idle nodes by it (0 holds every pilot to the "
        'end), and allocation = "auto" weighs a wider pilot\'s speed against its idle cores.',
        rich_help_panel=STRATEGY_PANEL,
    ),
]
UnitOption = Annotated[
    str,
    typer.Option(
        "--unit",
        help="elastic: the most cores one pilot holds: task (one task's cores: the narrowest, "
        "which the scheduler's backfill starts soonest), node (a node's, for partitions that "
        "allocate whole nodes), or a number of cores (whole tasks, at most a node).",
        rich_help_panel=STRATEGY_PANEL,
    ),
]
LearnerScope = Annotated[
    str | None,
    typer.Option(
        help="Share the queue-wait learner under this name across clusters (default: each "
        "cluster learns its own waits).",
        rich_help_panel=LEARNER_PANEL,
    ),
]


def _learn_by(text: str) -> tuple[str, ...]:
    fields = tuple(_csv(text, "learn-by"))
    for name in fields:
        _choice(name, GEOMETRY_FIELDS, "geometry field")
    return fields


def _sizer(name: str | None) -> dict[str, str]:
    """``--sizer``, checked before anything runs (RunConfig's keyword, or none for the default)."""
    if name is None:
        return {}
    try:
        split_sizer(name)
    except ValueError as e:
        fail(f"--sizer: {e}")
    return {"sizer": name}


def _seconds(flag: str, text: str, *, positive: bool = False) -> float:
    """A duration option's seconds (``10m``, ``1h30m``, ``0:10:00`` or seconds)."""
    try:
        seconds = duration(text)
    except ValueError as e:
        fail(f"{flag}: {e}")
    if positive and not seconds > 0:
        fail(f"{flag} {text}: expected a positive duration")
    return seconds


def _size(flag: str, text: str) -> float:
    """A size option's MB (``64G``, ``500M``, ``1.5GiB`` or MB), positive."""
    try:
        mb = size_mb(text)
    except ValueError:
        fail(f"{flag}: expected a size such as 64G, 500M or 64000 (MB), got {text!r}")
    if not mb > 0:
        fail(f"{flag} {text}: expected a positive size")
    return mb


def _cost(seconds: float) -> float:
    if not seconds >= 0:
        fail(f"--cost {seconds:g}: expected seconds of makespan per core-hour, 0 or more")
    return seconds


def _unit(text: str) -> Unit:
    """``--unit``: task, node or a number of cores."""
    if text in ("task", "node"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    fail(f"--unit {text}: expected task, node or a number of cores (1 or more)")


def _wait_estimate(text: str) -> str:
    if text in ("auto", "sample"):
        return text
    try:
        if 0 < float(text) <= 1:
            return text
    except ValueError:
        pass
    fail(f"--wait-estimate {text}: expected auto, sample or a quantile in (0, 1]")


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="Workflow file (TOML).")],
    scale: Scale = None,
    tasks: Annotated[
        bool, typer.Option("--tasks", help="Show every task's command and outputs.")
    ] = False,
    workdir: Annotated[
        Path | None,
        typer.Option(help="The working directory a run would have (as `run --workdir`)."),
    ] = None,
) -> None:
    """Check a workflow file; print what it contains: each stage's pilot and tasks, and its
    first task's command and outputs as a run fills them in. Exit code 2 when it is invalid."""
    workflow = load_workflow(file, scale)
    dirs = RunDirs.at(workdir or workflow.workdir, "RUN_ID")
    if problem := workflow.dirs_in_quotes(dirs.workdir, dirs.run_dir):
        fail(problem)
    count = sum(s.tasks.size for s in workflow.stages)
    out.print(
        f"{escape(_printable(str(file)))}: workflow [bold]{workflow.name}[/], "
        f"{human.count(len(workflow.stages), 'stage')}, {count:,} {human.plural(count, 'task')}: "
        "valid",
        soft_wrap=True,
    )
    for line in workflow_lines(workflow, dirs.workdir, dirs.run_dir, every=tasks):
        out.print(_printable(line), soft_wrap=True, markup=False, highlight=False)


@app.command()
@backend_flags.with_backend_flags(lambda: BACKENDS.values(), after="sizer")
def run(
    file: Annotated[Path, typer.Argument(help="Workflow file (TOML).")],
    backend: Annotated[
        str, typer.Option(help="mock (simulated cluster), local or slurm.")
    ] = "mock",
    strategy: Strategy = "elastic",
    sizer: Annotated[str | None, typer.Option(help="Task sizer (see `leadtime sizers`).")] = None,
    policy: Policy = DEFAULT_POLICY,
    learn_by: LearnBy = ALL_FIELDS,
    wait_estimate: WaitEstimate = "auto",
    share: Share = True,
    idle_cancel: IdleCancel = IDLE_CANCEL,
    cost: Cost = DEFAULT_COST,
    unit: UnitOption = "task",
    workdir: Annotated[
        Path | None,
        typer.Option(
            help="Where tasks run and their relative paths lead (default: the workflow's "
            "workdir, its file's directory); the run's own files go to WORKDIR/.leadtime/RUN_ID. "
            "For slurm, on a file system the compute nodes share."
        ),
    ] = None,
    learner_scope: LearnerScope = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Take up the last run of this workflow file where it stopped, if its "
            "manager died, it was interrupted or it failed (as `leadtime resume RUN`), with "
            "the file as it is now: a stage whose tasks changed runs again, with the stages "
            "after it; else start a new run.",
        ),
    ] = False,
    seed: Seed = 0,
    scale: Scale = None,
    db: Db = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No live dashboard.")] = False,
    **given: Any,
) -> None:
    """Run a workflow and print its figures."""
    workflow = load_workflow(file, scale)
    _choice(strategy, STRATEGIES, "strategy")
    _choice(policy, POLICIES, "policy")
    _choice(backend, tuple(BACKENDS), "backend")
    config = RunConfig(
        backend=_backend(BACKENDS[backend], given, seed=seed),
        strategy=strategy,
        seed=seed,
        scale=scale,
        policy=policy,
        learn_by=_learn_by(learn_by),
        wait_estimate=_wait_estimate(wait_estimate),
        share=share,
        idle_cancel_s=_seconds("--idle-cancel", idle_cancel, positive=True),
        cost=_cost(cost),
        workdir=workdir,
        learner_scope=learner_scope,
        **_sizer(sizer),
        unit=_unit(unit),
    )
    last = _last_run(db, workflow) if resume else None
    state = None if last is None else runs.state(last)
    if last is not None and state in TAKEN_UP:
        run_id = str(last["run_id"])
        how = {
            runs.RunState.FAILED: ", which failed,",
            runs.RunState.INTERRUPTED: ", which was interrupted,",
        }.get(state, "")
        err.print(f"resuming run {run_id}{how} of {file}", highlight=False, markup=False)
        summary = _resume(run_id, db, dashboard=not (quiet or json_), edited=workflow)
    else:
        if resume:
            err.print(
                f"no run of {file} in the store to resume: starting a new run"
                if last is None
                else f"nothing of {file} to resume (its last run, {last['run_id']}, is "
                f"{state}): starting a new run",
                highlight=False,
                markup=False,
            )
        summary = _run(workflow, config, db, dashboard=not (quiet or json_))
    if config.backend.workers is Workers.SIMULATED and not json_:
        err.print(
            f"a simulated run (--backend {backend}): a cluster replayed on virtual time, no "
            "task's command ran; --backend local or --backend slurm runs them",
            highlight=False,
            markup=False,
        )
    _report(summary, json_, taken_up=None if config.backend.workers.simulated else str(file))


def _backend(
    cls: type[Options],
    given: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    **values: Any,
) -> Options:
    """The chosen backend's options from the flags ``given`` (:mod:`backend_flags`)."""
    flags = backend_flags.backend_flags(BACKENDS.values(), defaults)
    try:
        return backend_flags.options(cls, given, flags, BACKENDS, **values)
    except ValueError as e:
        fail(str(e))


def _report(summary: RunSummary, json_: bool, *, taken_up: str | None = "FILE") -> None:
    """The figures of a run that ended, and its exit: 1 when it did not succeed; how to take
    it up once fixed, if it failed where ``resume`` can (``taken_up``: its workflow file)."""
    if json_:
        out.print_json(json.dumps(summary.as_json()))
    else:
        out.print(run_view(summary))
    if summary.status != "done":
        first, *quoted = (summary.error or "").splitlines() or [""]
        hint = (
            f"{taken_up_once_fixed(summary.run_id)} without running again what finished "
            f"(`leadtime run {taken_up} --resume` if you fixed the workflow file)"
            if taken_up is not None and summary.status == "failed"
            else ""
        )
        fail(f"run {summary.run_id} {summary.status}: {first}", code=1, quoted=quoted, hint=hint)


Start = Callable[[Store, Observer | None], Awaitable[RunSummary]]
"""A run to start (or resume) in a store, with a live view or none."""


def _run(workflow: Workflow, config: RunConfig, db: Path | None, *, dashboard: bool):
    run_id = new_run_id()
    return _start(
        lambda store, view: execute(workflow, config, store, observer=view, run_id=run_id),
        run_id,
        db,
        real=not config.backend.workers.simulated,
        dashboard=dashboard,
    )


def _start(
    start: Start, run_id: str, db: Path | None, *, real: bool, dashboard: bool
) -> RunSummary:
    new_store = db != Path(":memory:") and not (db or default_path()).exists()
    stopped_by: signal.Signals | None = None
    forced = False

    def stop(task: asyncio.Task, sig: signal.Signals) -> None:
        """The first SIGINT or SIGTERM stops the run, its pilots released; a second Ctrl-C
        leaves at once; a second SIGTERM changes nothing (its sender wants the release)."""
        nonlocal stopped_by, forced
        if stopped_by is None:
            stopped_by = sig
            task.cancel()
            if sig is signal.SIGINT:
                err.print(
                    f"interrupted: releasing the pilots of run {run_id} "
                    "(Ctrl-C again leaves now, without releasing them)",
                    highlight=False,
                    soft_wrap=True,
                )
        elif sig is signal.SIGINT and not forced:
            forced = True
            task.cancel()

    async def main():
        if real:  # SIGINT and SIGTERM end a real run with its pilots released, none left behind
            task = asyncio.current_task()
            assert task is not None
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, stop, task, sig)
        async with await Store.open(db) as store:
            if not dashboard:
                return await start(store, None)
            with live_view(out) as view:
                return await start(store, view)

    try:
        return clock.run(main(), virtual=not real)
    except StoreError as e:
        fail(str(e))
    except ResumeError as e:
        fail(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):
        sig = stopped_by or signal.SIGINT
        how = "interrupted" if sig is signal.SIGINT else f"stopped by {sig.name}"
        code = 128 + sig  # as a shell reports a command the signal ended
        if not real:
            fail(f"run {run_id} {how}: the simulated cluster lived in it; run it again", code)
        if sig is signal.SIGTERM and _read_store(db, lambda s: cancelling(s, run_id), False):
            fail(f"run {run_id} cancelled (leadtime cancel): its pilots were released", code)
        if not _recorded(db, run_id):  # stopped while the batch system checked its pilots
            if new_store:
                _remove_store(db or default_path())
            fail(f"run {run_id} {how} before it started: nothing was submitted", code)
        resume = f"leadtime resume {run_id} takes it up where it stopped"
        jobs = _read_store(db, lambda store: unreleased(store, run_id), []) if forced else []
        if jobs:
            left = f"job {jobs[0]}" if len(jobs) == 1 else f"jobs {', '.join(jobs)}"
            fail(
                f"run {run_id} {how}: {left} may still be queued or running (leadtime cancel "
                f"{run_id} cancels them; {resume})",
                code,
            )
        fail(f"run {run_id} {how}: its pilots were released ({resume})", code)
    except (Refused, SetupError) as e:
        if new_store:  # a run refused before it started leaves no store behind
            _remove_store(db or default_path())
        fail(str(e))
    except SubmitError as e:
        fail(f"the batch system refused a pilot: {e}" + (f" ({e.option})" if e.option else ""))
    except BackendError as e:
        fail(f"{e.system}: {e}")


T = TypeVar("T")


def _read_store(db: Path | None, read: Callable[[Store], Awaitable[T]], empty: T) -> T:
    """What ``read`` finds in the store (``empty`` if there is no store yet)."""
    path = db or default_path()
    if not path.exists():
        return empty

    async def main():
        async with await Store.open(path, readonly=True) as store:
            return await read(store)

    try:
        return clock.run(main(), virtual=False)
    except StoreError as e:
        fail(str(e))


def _last_run(db: Path | None, workflow: Workflow) -> dict[str, Any] | None:
    """The newest run in the store of ``workflow``'s file."""
    return _read_store(db, lambda store: last_run(store, workflow), None)


def _the_resumable(db: Path | None) -> str:
    """The one run of the store that can be resumed: refused if there is none, or several."""
    found = _read_store(db, resumable, [])
    if not found:
        last = _read_store(db, last_run, None)
        failed = last is not None and runs.state(last) is runs.RunState.FAILED
        fail(
            f"{db or default_path()}: no run to resume (none lost its manager or was "
            "interrupted); `leadtime status` lists the runs",
            hint=f"the last run, {last['run_id']} ({last['workflow']}), failed: "
            + taken_up_once_fixed(last["run_id"])
            if failed and not simulated(last.get("backend") or "")
            else "",
        )
    if len(found) > 1:
        fail(
            f"{len(found)} runs can be resumed: name one (leadtime resume RUN_ID)",
            quoted=[
                f"{r['run_id']}  {r['workflow']}  started {human.wall(r['created'])}" for r in found
            ],
        )
    run = found[0]
    err.print(f"resuming run {run['run_id']} of {run['workflow']}", highlight=False, markup=False)
    return str(run["run_id"])


def _resume(
    run_id: str, db: Path | None, *, dashboard: bool, edited: Workflow | None = None
) -> RunSummary:
    return _start(
        lambda store, view: resume_run(store, run_id, edited=edited, observer=view),
        run_id,
        db,
        real=True,
        dashboard=dashboard,
    )


@app.command()
def resume(
    run_id: Annotated[
        str | None,
        typer.Argument(
            help="The run (see `leadtime status`); without it, the store's one run whose "
            "manager died or that was interrupted."
        ),
    ] = None,
    db: Db = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No live dashboard.")] = False,
) -> None:
    """Take up a run where it stopped: its manager died, it was interrupted, or it failed.

    Nothing that finished runs again; pilots still queued or running are taken over, and
    their workers carry on with the tasks they were running. A failed run's tasks that did
    not finish get their attempts anew: fix what failed first (to take it up with its
    workflow file as edited since, `leadtime run FILE --resume`). Refused while the run's
    manager is alive.
    """
    _existing(db)
    if run_id is None:
        run_id = _the_resumable(db)
    _report(_resume(run_id, db, dashboard=not (quiet or json_)), json_)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run (see `leadtime status`).")],
    db: Db = None,
) -> None:
    """End a run for good: its manager stopped (on this host), or, if the manager is gone,
    every pilot of the run cancelled from the store's record."""
    path = _existing(db)

    async def main():
        async with await Store.open(path) as store:
            return await cancel_run(store, run_id)

    try:
        cancelled = clock.run(main(), virtual=False)
    except (StoreError, ResumeError) as e:
        fail(str(e))
    except BackendError as e:
        fail(f"{e.system}: {e}")
    jobs = f": cancelled {', '.join(cancelled)}" if cancelled else ""
    out.print(f"run {run_id} cancelled{jobs}", highlight=False, markup=False)


def _recorded(db: Path | None, run_id: str) -> bool:
    """Whether the store holds run ``run_id`` (a run stopped before it was recorded has
    nothing to take up); a store in memory is gone with the process, and says yes."""
    if db == Path(":memory:"):
        return True
    return bool(_read_store(db, lambda store: store.rows("runs", {"run_id": run_id}), []))


def _remove_store(path: Path) -> None:
    for part in (path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
        part.unlink(missing_ok=True)


app.command("worker")(agent.command)


DEMO_MOCK = MockOptions(trace="HPC2N", cluster=ClusterSpec.parse("9x28:128G"), offset=67_500_401.0)
"""HPC2N's queue as replayed (site queue model) on 9 nodes of 28 cores from 16 September 2004,
13:10 UTC on: busy enough that pilots wait an hour or two, not days."""


@app.command()
def demo(
    db: Db = None,
) -> None:
    """The demo workflow on a simulated cluster replaying HPC2N's queue: one big job, a pilot
    per stage, ASA and elastic side by side."""
    workflow = load_workflow(example("demo"), None)
    summaries = []
    for strategy in ("bigjob", "per-stage", "asa", "elastic"):
        config = RunConfig(strategy=strategy, backend=DEMO_MOCK)
        show = strategy == "elastic" and sys.stdout.isatty()
        summaries.append(_run(workflow, config, db, dashboard=show))
    out.print(run_view(summaries[-1]))
    out.print(strategies_table(summaries))
    out.print(
        "bigjob holds the widest stage's cores from start to end; per-stage asks for each "
        "stage's cores when it is ready and queues again each time; asa submits each stage "
        "ahead by the wait it predicts; elastic (the default) holds pilots of one task each "
        "across stages, acquired ahead and given back as the width falls: narrow pilots start "
        "in the gaps the scheduler's backfill leaves.",
        highlight=False,
    )


@app.command()
def status(
    run_id: Annotated[str | None, typer.Argument(help="A run (default: list the runs).")] = None,
    db: Db = None,
    all_: Annotated[
        bool,
        typer.Option(
            "--all",
            help=f"List every run (without it, the newest {RECENT_RUNS} and any older one "
            "still running or whose manager is gone).",
        ),
    ] = False,
    json_: Annotated[
        bool,
        typer.Option(
            "--json", help="Print all of it as JSON (times in seconds; every run when listing)."
        ),
    ] = False,
) -> None:
    """List the runs in the store, or show one: what it ran and how it stands, its figures,
    stages, pilots, and every attempt that did not succeed, with why."""
    if run_id is not None:
        status = run_status(_record(run_id, db))
        if json_:
            out.print_json(json.dumps(status))
            return
        for shown in status_tables(status, clock.wall()):
            out.print(shown)
        return

    async def main():
        async with await _existing_store(db) as store:
            return await store.rows("runs", order="created")

    try:
        rows = clock.run(main(), virtual=False)
    except StoreError as e:
        fail(str(e))
    if json_:
        listed = [{k: r.get(k) for k in LISTED} | {"state": str(runs.state(r))} for r in rows]
        out.print_json(json.dumps(listed))
        return
    if not rows:
        out.print(f"no runs in {_existing(db)}", highlight=False, markup=False)
        return
    listed = rows if all_ else _recent(rows)
    if len(listed) < len(rows):
        earlier = human.count(len(rows) - len(listed), "earlier run")
        out.print(f"{earlier} not listed (--all lists every run)", highlight=False)
    lines = [("run", "workflow", "backend", "strategy", "started", "state", "error")]
    for row in listed:
        lines.append(
            (
                row["run_id"],
                row["workflow"],
                row["backend"],
                row["strategy"],
                human.wall(row.get("created")),
                _state(row),
                headline(row.get("error") or ""),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.print("  ".join([*cells, line[-1]]).rstrip(), highlight=False, markup=False)


RECENT_RUNS = 20
"""Runs ``status`` lists without ``--all``: the newest (a store keeps every run it had)."""


def _recent(rows: list[dict]) -> list[dict]:
    """The newest :data:`RECENT_RUNS` of ``rows`` (oldest first), and any older one still
    running or whose manager is gone: what may hold pilots, or want a resume or a cancel."""
    cut = len(rows) - RECENT_RUNS
    live = (runs.RunState.RUNNING, runs.RunState.MANAGER_GONE)
    return [r for i, r in enumerate(rows) if i >= cut or runs.state(r) in live]


LISTED = ("run_id", "workflow", "backend", "strategy", "status", "created", "ended", "error")
"""What ``status --json`` says of each run when it lists them."""


def _record(run_id: str | None, db: Path | None) -> RunRecord:
    """The run ``run_id`` (the newest if None) as the store holds it; exit 2 when there is
    no such run."""

    async def main():
        async with await _existing_store(db) as store:
            return await RunRecord.load(store, run_id or await _newest_run_id(store, db))

    try:
        record = clock.run(main(), virtual=False)
    except StoreError as e:
        fail(str(e))
    if record is None:
        fail(f"no run {run_id} (`leadtime status` lists the runs)")
    return record


async def _newest_run_id(store: Store, db: Path | None) -> str:
    """The store's newest run, whatever became of it; exit 2 when it has none."""
    newest = await last_run(store)
    if newest is None:
        fail(f"{db or default_path()}: no run yet")
    return newest["run_id"]


@app.command()
def logs(
    run_id: Annotated[
        str | None,
        typer.Argument(help="A run (`leadtime status` lists them; default: the newest)."),
    ] = None,
    task: Annotated[
        str | None, typer.Argument(help="A task, e.g. project.12 (default: list the attempts).")
    ] = None,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Only this attempt of TASK.")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Print each attempt's output as it ends, until the run ends."
        ),
    ] = False,
    db: Db = None,
) -> None:
    """A task's stdout and stderr (their first and last bytes), why each attempt ended, its
    peak against its allocation, and where a failed attempt's scratch directory was kept;
    without TASK, every attempt of the run (the newest without RUN_ID) with its outcome and
    cause. A task named alone is one of the newest run."""

    async def main():
        nonlocal run_id, task
        async with await _existing_store(db) as store:
            run_id = run_id or await _newest_run_id(store, db)
            run = await tasklogs.run_row(store, run_id)
            nor = ""
            if run is None and task is None:  # a task of the newest run, named alone
                newest = await _newest_run_id(store, db)
                if (why := await tasklogs.unknown(store, newest, run_id)) is None:
                    run_id, task = newest, run_id
                    run = await tasklogs.run_row(store, run_id)
                else:
                    nor = f", nor a task of the newest run: {why}"
            if run is None:
                fail(f"no run {run_id}{nor} (`leadtime status` lists the runs)")
            if attempt is not None and task is None:
                fail("--attempt needs a TASK")
            rows = await tasklogs.attempts(store, run_id, task)
            if task is not None and not rows:
                if (why := await tasklogs.unknown(store, run_id, task)) is not None:
                    fail(why)
                if not follow:
                    return _note(f"task {task} of run {run_id} has not started yet")
            if attempt is not None and all(r["attempt"] != attempt for r in rows):
                fail(f"task {task} has no attempt {attempt} (it has {len(rows)})")
            if follow:
                return await _follow(store, run, task, rows)
            if task is None:
                out.print(tasklogs.attempts_table(rows, run_id))
                return None
            chosen = [r for r in rows if attempt is None or r["attempt"] == attempt]
            for log in await tasklogs.with_output(store, chosen):
                _show_attempt(log, run["backend"])
            return None

    try:
        clock.run(main(), virtual=False)
    except StoreError as e:
        fail(str(e))


async def _follow(store: Store, run: dict, task: str | None, rows: list[dict]) -> None:
    """A task's attempts so far, then each one as it ends; for a whole run, only those that
    end from now on (``leadtime logs RUN`` lists the others)."""
    state = runs.state(run)
    if state is not runs.RunState.RUNNING:
        _note(f"run {run['run_id']} is not going ({_state(run)}): nothing to follow")
    elif task is not None and not rows:
        _note(f"task {task} has not started yet: its attempts show here as they end")
    elif (note := tasklogs.running_note(rows)) is not None:
        _note(note)
    ended = [r for r in rows if r["outcome"] not in runs.ON_WORKER] if task is None else []
    if ended and state is runs.RunState.RUNNING:
        _note(f"{len(ended)} attempts ended before: `leadtime logs {run['run_id']}` lists them")
    final = await tasklogs.follow(
        store,
        run["run_id"],
        task,
        lambda log: _show_attempt(log, run["backend"]),
        seen=ended,
    )
    if state is runs.RunState.RUNNING:
        _note(f"run {run['run_id']} {final}")


def _note(text: str) -> None:
    err.print(text, highlight=False, markup=False, soft_wrap=True)


def _show_attempt(log: tasklogs.AttemptLog, backend: str) -> None:
    out.print(tasklogs.attempt_view(log, backend), soft_wrap=True, highlight=False)
    out.print()


@app.command()
def report(
    run_id: Annotated[
        str | None,
        typer.Argument(help="A run (`leadtime status` lists them; default: the newest)."),
    ] = None,
    out_file: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    db: Db = None,
) -> None:
    """Write a run's report: one HTML file with its timeline, queue waits, cores held and
    busy, task resource efficiency and failed attempts, that opens with no server or network."""
    pages = _html_pages()
    record = _record(run_id, db)
    _write_page(out_file, pages.run_page(record))
    written = f"wrote {out_file}: run {record.run['run_id']} of {record.run['workflow']}"
    out.print(written, highlight=False)


def _html_pages():
    """The HTML report's module; its plotting library is an optional extra."""
    try:
        from orchestrator import htmlreport
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "matplotlib":
            raise
        fail("the report draws its plots with matplotlib: pip install 'leadtime[report]'")
    return htmlreport


def _write_page(path: Path, page: str) -> None:
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        fail(f"--out {path}: {e.strerror or e}")


def _state(run: dict) -> str:
    """A run's state as ``status`` says it: ``manager gone (last seen 2 h 5 min ago)``."""
    return state_text(runs.state(run), runs.last_seen(run), clock.wall())


def _existing(db: Path | None) -> Path:
    """The store's path, which must exist: reading creates no store."""
    path = db or default_path()
    if not path.exists():
        fail(f"{path}: no store there")
    return path


async def _existing_store(db: Path | None) -> Store:
    """The store at ``db`` (or the default one), opened for reading: it must exist."""
    return await Store.open(_existing(db), readonly=True)


def _csv(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        fail(f"--{what}: give a comma-separated list")
    return items


COMPARED = {"trace": "HPC2N"}
"""What a comparison replays unless told."""


@app.command()
@backend_flags.with_backend_flags(
    lambda: [MockOptions], after="sizer", defaults=COMPARED, without={"offset"}
)
def compare(
    files: Annotated[list[Path], typer.Argument(help="Workflow files (TOML).")],
    backend: Annotated[
        str, typer.Option(help="Only mock: comparisons need a replayable queue.")
    ] = "mock",
    strategies: Annotated[
        str,
        typer.Option(help="Comma-separated strategies to compare (elastic-oracle only if named)."),
    ] = ",".join(s for s in STRATEGIES if s != "elastic-oracle"),
    scales: Annotated[
        str, typer.Option(help="Comma-separated scaling factors (cores).")
    ] = "28,56,112",
    runs: Annotated[int, typer.Option(min=1, help="Runs per workflow, scale and strategy.")] = 1,
    sizer: Annotated[str | None, typer.Option(help="Task sizer.")] = None,
    policy: Policy = DEFAULT_POLICY,
    learn_by: LearnBy = ALL_FIELDS,
    wait_estimate: WaitEstimate = "auto",
    gap: Annotated[
        str,
        typer.Option(metavar="DURATION", help="Trace time between the cells of a run's sequence."),
    ] = "1 h",
    share: Share = True,
    idle_cancel: IdleCancel = IDLE_CANCEL,
    cost: Cost = DEFAULT_COST,
    unit: UnitOption = "task",
    seed: Seed = 0,
    db: Annotated[
        Path | None,
        typer.Option("--db", help="Store whose learner the runs share (default: a fresh one)."),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No live dashboard per run.")] = False,
    report_file: Annotated[
        Path | None,
        typer.Option("--report", help="Also write the comparison as an HTML file, with plots."),
    ] = None,
    **given: Any,
) -> None:
    """Run strategies side by side under identical conditions (Table 1 of the ASA paper)."""
    if backend != "mock":
        fail("compare needs --backend mock: only a simulated queue replays identically")
    if report_file is not None:  # before hours of runs: can the report be written?
        _html_pages()
        if not report_file.parent.is_dir():
            fail(f"--report {report_file}: no directory {report_file.parent}")
    chosen = [_choice(s, STRATEGIES, "strategy") for s in _csv(strategies, "strategies")]
    try:
        cores = [int(c) for c in _csv(scales, "scales")]
    except ValueError:
        fail(f"--scales {scales}: expected whole numbers")
    _choice(policy, POLICIES, "policy")
    for path in files:
        load_workflow(path, None)
    mock = _backend(MockOptions, given, COMPARED, seed=seed)
    config = RunConfig(
        seed=seed,
        policy=policy,
        learn_by=_learn_by(learn_by),
        wait_estimate=_wait_estimate(wait_estimate),
        share=share,
        idle_cancel_s=_seconds("--idle-cancel", idle_cancel, positive=True),
        cost=_cost(cost),
        backend=mock,
        **_sizer(sizer),
        unit=_unit(unit),
    )
    mock = config.backend
    assert isinstance(mock, MockOptions)
    live = not (quiet or json_)

    async def main():
        async with await Store.open(db or ":memory:") as store:
            return await run_comparison(
                files,
                chosen,
                cores,
                runs,
                config,
                store,
                observer_for=(lambda *_: live_view(out)) if live else None,
                gap_s=_seconds("--gap", gap),
            )

    try:
        rows = clock.run(main(), virtual=True)
    except Refused as e:
        fail(str(e))
    except SubmitError as e:
        fail(f"the batch system refused a pilot: {e}" + (f" ({e.option})" if e.option else ""))
    if json_:
        out.print_json(json.dumps([r.as_json() for r in rows]))
    else:
        for table in compare_tables(rows):
            out.print(table)
    if report_file is not None:
        settings = {
            "workflows": ", ".join(str(f) for f in files),
            "strategies": ", ".join(chosen),
            "scales (cores)": ", ".join(map(str, cores)),
            "runs": str(runs),
            "queue": f"{mock.trace} replayed" if mock.trace else f"synthetic load {mock.load:g}",
            "queue order": f"by {mock.priority} time",
            "seed": str(seed),
        }
        if "cluster" in given:
            settings["cluster"] = given["cluster"]
        _write_page(report_file, _html_pages().compare_page(rows, settings))
        err.print(f"wrote {report_file}", highlight=False)


bench_app = App(no_args_is_help=True, help="Benchmarks that need no cluster.")
app.add_typer(bench_app, name="bench")


@bench_app.command("sizing")
def bench_sizing_command(
    trace: Annotated[
        Path | None, typer.Option(help="A task trace (formats: docs/traces.md).")
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Instead of a trace, a run of the store (`leadtime status` lists them): its "
            "tasks that succeeded, with what they used, each submitted when its stage became "
            "ready, their declared sizes as the user's request.",
        ),
    ] = None,
    db: Db = None,
    sizer: Annotated[
        str,
        typer.Option(
            help="Comma-separated sizers (see `leadtime sizers`); by default the default "
            "sizer beside the tasks' declared sizes (user)."
        ),
    ] = f"{DEFAULT_SIZER},user",
    workers: Annotated[int, typer.Option(min=1, help="Simulated workers.")] = 20,
    worker_cores: Annotated[
        float | None,
        typer.Option(help="Cores per worker (default: 16, doubled until the largest task fits)."),
    ] = None,
    worker_memory: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Memory per worker: 64G, 500M, or MB (default: 64G, doubled until the largest "
            "task fits).",
        ),
    ] = None,
    worker_disk: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Disk per worker: 64G, 500M, or MB (default: 64G, doubled until the largest "
            "task fits).",
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            help="Seed of the random draws: when a kill comes (where a trace records only "
            "peaks), and the randomised sizers' own."
        ),
    ] = 0,
    json_: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Replay a trace's tasks, or a run's, through sizers on simulated workers: AWE, waste,
    retries."""
    if (trace is None) == (run_id is None):
        fail("give a task trace (--trace FILE) or a run of the store (--run RUN), one of them")
    if worker_cores is not None and not worker_cores > 0:
        fail(f"--worker-cores {worker_cores:g}: expected a positive number of cores")
    given = {
        "cores": worker_cores,
        "memory": None if worker_memory is None else _size("--worker-memory", worker_memory),
        "disk": None if worker_disk is None else _size("--worker-disk", worker_disk),
    }
    try:
        replayed, left_out = (load_trace(trace), 0) if trace else _run_trace(run_id, db)
        fitted = widened(PAPER_WORKER, replayed)  # what a size left unsaid defaults to
        worker = Resources(**{r: given[r] or fitted[r] for r in ("cores", "memory", "disk")})
        results = bench_sizing(
            replayed, _csv(sizer, "sizer"), workers=workers, worker=worker, seed=seed
        )
    except (TraceError, ValueError, OSError) as e:
        fail(str(e))
    if json_:
        out.print_json(json.dumps(sizing_rows(results)))
        return
    tasks = human.count(len(replayed.tasks), "task")
    left = f" ({left_out:,} that did not succeed left out)" if left_out else ""
    out.print(
        f"{replayed.name}: {tasks}{left} on {human.count(workers, 'worker')} of "
        f"{worker.cores:g} cores, {human.megabytes(worker.memory)} of memory and "
        f"{human.megabytes(worker.disk)} of disk",
        highlight=False,
    )
    out.print(format_sizing_table(results), highlight=False)


def _run_trace(run_id: str, db: Path | None) -> tuple[Trace, int]:
    """Run ``run_id``'s tasks as a trace, and how many of them it leaves out (none succeeded);
    a note on stderr where their declared sizes are not known (the ``user`` baseline then
    gives each a whole worker)."""
    record = _record(run_id, db)
    trace, unknown = run_trace(record)
    if unknown:
        err.print(f"note: declared sizes not known, {unknown}", highlight=False)
    return trace, len(record.tasks) - len(trace.tasks)


@app.command()
def sizers() -> None:
    """The task sizers, and which one is the default."""
    default, companion = split_sizer(DEFAULT_SIZER)
    for name, what in SIZERS.items():
        mark = ""
        if name == default:
            mark = " (default" + (f", with {companion} for cores and disk)" if companion else ")")
        out.print(f"[bold]{name}[/]{mark}: {what}", highlight=False)
    out.print(
        f"A memory-only sizer ({', '.join(MEMORY_ONLY)}) sizes cores and disk with "
        f"{COMPANION}, or with the sizer named after a '+': e.g. ksegments+greedy. "
        f"None gives less than {SMALLEST['memory']:.0f} MB of memory or disk unless a task "
        "declares it.",
        highlight=False,
    )


learner_app = App(no_args_is_help=True, help="The queue-wait learner in the store.")
app.add_typer(learner_app, name="learner")


@learner_app.command("show")
def learner_show(
    geometry: Annotated[
        str | None, typer.Option(help="Only this geometry, e.g. cores=28,partition=batch.")
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="Only this cluster's (or learner scope's) learner, e.g. slurm:kebnekaise."
        ),
    ] = None,
    top: Annotated[int, typer.Option(min=1, help="Alternatives shown per geometry.")] = 5,
    learn_by: LearnBy = ALL_FIELDS,
    db: Db = None,
) -> None:
    """The learned wait distribution per cluster and geometry: top alternatives, observations,
    hit rate. Each cluster (a Slurm cluster, this machine, a simulated cluster) has its own."""
    key = _learn_by(learn_by)
    try:
        only = None if geometry is None else Geometry.parse(geometry)
    except ValueError as e:
        fail(f"--geometry: {e}")

    async def main():
        async with await _existing_store(db) as store:
            return await store.learners("queue_wait/")

    try:
        states = clock.run(main(), virtual=False)
    except StoreError as e:
        fail(str(e))
    learners = {
        cluster_of(name): QueueWaitLearner.from_dict(state)
        for name, state in states.items()
        if name.endswith("/" + "+".join(key)) and (cluster is None or cluster_of(name) == cluster)
    }
    if not learners:
        out.print("the learner has seen no waits yet" + (f" on {cluster}" if cluster else ""))
    for scope, learner in learners.items():
        _show_learner(scope, learner, only, top)


def _show_learner(scope: str, learner: QueueWaitLearner, only: Geometry | None, top: int) -> None:
    chosen = learner.geometries() if only is None else [only]
    for g in chosen:
        try:
            stats = learner.stats(g)
            alternatives = learner.distribution(g, top=top)
        except (KeyError, ValueError):
            fail(f"no waits learned on {scope} for geometry {g}")
        table = Table(title=f"{scope} · geometry {g}", title_justify="left")
        for column in ("wait", "probability", "cases scored", "mean loss"):
            table.add_column(column, justify="right")
        for a in alternatives:
            loss = "-" if a.mean_loss is None else f"{a.mean_loss:.2f}"
            table.add_row(human.duration(a.value), f"{a.probability:.3f}", str(a.tried), loss)
        hit = "-" if stats.hit_rate is None else f"{stats.hit_rate:.0%}"
        last = human.duration(stats.last_wait)
        out.print(table)
        out.print(  # under the table, not its caption: a caption folds at the table's width
            f"{human.count(stats.observations, 'wait')} observed, "
            f"{human.count(stats.rounds, 'round')}, hit rate {hit} over the last "
            f"{human.count(stats.recent, 'prediction')}, last wait {last}\n",
            highlight=False,
            markup=False,
        )


def main() -> None:
    collect_less()
    app(prog_name="leadtime")


if __name__ == "__main__":
    main()
