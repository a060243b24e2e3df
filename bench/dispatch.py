"""Dispatch throughput: N no-op commands (``true``) on W local workers, leadtime against peers.

python bench/dispatch.py [--tasks N] [--workers W] [--repeat R] [--calls] [--json]
                         [--only leadtime|parsl|dask|hyperqueue]

leadtime runs a workflow of N ``true`` tasks through the real engine on the local backend
(one pilot of W workers of one core, each task declaring one core); Parsl runs N bash
apps on a HighThroughputExecutor with a LocalProvider and W workers; Dask distributed
runs N functions that run ``true`` with subprocess on a LocalCluster of W one-thread
worker processes; HyperQueue runs one job of N programs on a LocalCluster of its Python
API (its Rust server and W workers of one core, as ``hq server start`` and ``hq worker
start --cpus 1`` would run them; each task's stdout and stderr to files, its default).
Every system runs W tasks at a time (2 by default, one per core of a 2-core machine; more
than the cores shows the manager's side when the workers' is the bound), each ``true``
through ``/bin/sh -c``, and each runs in a fresh interpreter of its own.

Throughput is tasks over the time from the first task's start (leadtime: the first
attempt's start; peers: submitting all tasks to workers already up) to the last result
in hand (HyperQueue's client learns of its job's end by polling, once a second at most, so
its span may run up to a second long: under 3% of 10,000 tasks at its pace here);
``startup_s`` is the time before that (starting workers, and for leadtime also
submitting its pilot). ``manager_cpu_ms_per_task`` is the CPU time (user + system, all
threads) of leadtime's manager process over the whole run, divided by N; the workers'
CPU is not in it, but in ``workers_cpu_ms_per_task`` (its workers' processes and the
tasks' shells they start, as the manager reaps them), beside ``shell_cpu_ms``, what one
``/bin/sh -c true`` alone costs (started 1,000 times after the run). The manager collects
garbage as ``leadtime`` sets it, the peers as Python's defaults do. ``--calls`` also counts
the function calls leadtime's manager makes per task, in a second run under Python's
profiler (``manager_calls_per_task``): a measure of its work that the load of a shared
machine does not move, where its CPU time per task varies by a quarter from run to run.
leadtime's line gives its ratio to each peer. ``--repeat R`` runs every system R times, the
order turned by one system each round (a run can leave the machine slower for a while: on
this VM leadtime once ran at half its speed right after HyperQueue's run had removed its
20,000 output files), and reports each figure's median. The peers need ``pip install
'leadtime[bench]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

from backends import clock

SYSTEMS = ("leadtime", "parsl", "dask", "hyperqueue")
COMMAND = "true"
CORES = os.cpu_count() or 1
ROOT = Path(__file__).resolve().parent.parent
"""The checkout this benchmark is part of."""


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def shell_cpu_ms(times: int = 1000) -> float:
    """The CPU time one ``/bin/sh -c true`` takes, started as a worker starts a task's shell:
    the part of a task's cost no dispatcher can remove."""
    before = cpu_seconds(resource.RUSAGE_CHILDREN)
    for _ in range(times):
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", COMMAND], os.environ, setsid=True)
        os.waitpid(pid, 0)
    return 1000 * (cpu_seconds(resource.RUSAGE_CHILDREN) - before) / times


def measure_leadtime(tasks: int, workers: int, calls: bool = False) -> dict[str, object]:
    """leadtime's row; with ``calls``, only its manager's function calls per task, counted
    by the profiler (which slows the run: its times are not reported)."""
    from backends.local import LocalOptions
    from orchestrator.session import RunConfig, collect_less, execute
    from orchestrator.store import Store
    from workflows.spec import loads

    workflow = loads(
        textwrap.dedent(
            f"""
            name = "dispatch"
            [[stage]]
            name = "noop"
            allocation = {{ cores = {workers}, nodes = {workers}, time = "1h" }}
            [stage.tasks]
            command = "{COMMAND}"
            count = {tasks}
            cores = 1
            memory = "20M"
            disk = "1M"
            """
        )
    )
    with tempfile.TemporaryDirectory(prefix="leadtime-dispatch-") as tmp:
        config = RunConfig(
            strategy="per-stage",
            backend=LocalOptions(oversubscribe=workers > CORES),
            workdir=Path(tmp),
        )

        async def main():
            async with await Store.open(Path(tmp) / "store.db") as store:
                cpu, start = cpu_seconds(), clock.now()
                workers = cpu_seconds(resource.RUSAGE_CHILDREN)
                with profiling:
                    summary = await execute(workflow, config, store)
                cpu, wall = cpu_seconds() - cpu, clock.now() - start
                workers = cpu_seconds(resource.RUSAGE_CHILDREN) - workers
                attempts = await store.rows("attempts", {"run_id": summary.run_id})
            return summary, attempts, cpu, workers, wall

        profiling = cProfile.Profile() if calls else contextlib.nullcontext()
        collected = gc.get_threshold()
        collect_less()  # as the command line does; the peers measured after keep Python's
        try:
            summary, attempts, cpu, workers, wall = clock.run(main(), virtual=False)
        finally:
            gc.set_threshold(*collected)
    if summary.status != "done":
        raise RuntimeError(f"leadtime's run {summary.status}: {summary.error}")
    if calls:
        made = sum(entry.callcount for entry in profiling.getstats())
        return {"system": "leadtime", "tasks": tasks, "manager_calls_per_task": made / tasks}
    first = min(a["start_t"] for a in attempts)
    (stage,) = summary.stages
    span = stage.end_t - first  # the stage ends as its last result is in hand
    return {
        "system": "leadtime",
        "tasks": tasks,
        "tasks_per_s": tasks / span,
        "startup_s": first,
        "wall_s": wall,
        "attempts": len(attempts),
        "manager_cpu_ms_per_task": 1000 * cpu / tasks,
        "workers_cpu_ms_per_task": 1000 * workers / tasks,
        "shell_cpu_ms": shell_cpu_ms(),
    }


def measure_parsl(tasks: int, workers: int) -> dict[str, object]:
    import parsl
    from parsl.app.app import bash_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    @bash_app
    def noop(command: str = COMMAND) -> str:
        return command

    # HTEX starts its interchange and workers as commands of Parsl's installation.
    scripts = str(Path(sys.executable).parent)
    os.environ["PATH"] = f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="parsl-dispatch-") as tmp:
        executor = HighThroughputExecutor(
            label="htex",
            max_workers_per_node=workers,
            cores_per_worker=1,
            provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
        )
        start = clock.monotonic()
        parsl.load(Config(executors=[executor], run_dir=tmp, strategy="none"))
        try:
            noop().result()  # the workers are up
            t0 = clock.monotonic()
            futures = [noop() for _ in range(tasks)]
            failed = sum(f.exception() is not None for f in futures)
            span = clock.monotonic() - t0
        finally:
            parsl.dfk().cleanup()
    if failed:
        raise RuntimeError(f"{failed} Parsl tasks failed")
    return {
        "system": "parsl",
        "tasks": tasks,
        "tasks_per_s": tasks / span,
        "startup_s": t0 - start,
    }


def _run_true(_: object = None) -> int:
    return subprocess.run(COMMAND, shell=True, check=True).returncode


def measure_dask(tasks: int, workers: int) -> dict[str, object]:
    from dask.distributed import Client, LocalCluster

    start = clock.monotonic()
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(workers)
        client.submit(_run_true, pure=False).result()  # the workers are up
        t0 = clock.monotonic()
        codes = client.gather(client.map(_run_true, range(tasks), pure=False))
        span = clock.monotonic() - t0
    if any(codes):
        raise RuntimeError("some Dask tasks failed")
    return {
        "system": "dask",
        "tasks": tasks,
        "tasks_per_s": tasks / span,
        "startup_s": t0 - start,
    }


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What a peer prints to the process's standard output goes to its standard error, which
    leaves the rows alone on the output (HyperQueue's server writes a table of itself there,
    from Rust: past ``sys.stdout``)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def measure_hyperqueue(tasks: int, workers: int) -> dict[str, object]:
    from hyperqueue import Job, LocalCluster
    from hyperqueue.cluster import WorkerConfig

    with tempfile.TemporaryDirectory(prefix="hq-dispatch-") as tmp, stdout_to_stderr():
        start = clock.monotonic()
        with LocalCluster(server_dir=str(Path(tmp) / "server")) as cluster:
            for _ in range(workers):
                cluster.start_worker(WorkerConfig(cores=1))
            client = cluster.client()
            warm = Job(tmp)
            warm.program(["/bin/sh", "-c", COMMAND])
            client.wait_for_jobs([client.submit(warm)])  # the workers are up
            t0 = clock.monotonic()
            job = Job(tmp)
            for _ in range(tasks):
                job.program(["/bin/sh", "-c", COMMAND])
            done = client.wait_for_jobs([client.submit(job)], raise_on_error=False)
            span = clock.monotonic() - t0
    if not done:
        raise RuntimeError("some HyperQueue tasks failed")
    return {
        "system": "hyperqueue",
        "tasks": tasks,
        "tasks_per_s": tasks / span,
        "startup_s": t0 - start,
    }


MEASURES = {
    "leadtime": measure_leadtime,
    "parsl": measure_parsl,
    "dask": measure_dask,
    "hyperqueue": measure_hyperqueue,
}
NAMES = {"parsl": "Parsl", "dask": "Dask", "hyperqueue": "HyperQueue"}
MISSING = "not installed: pip install 'leadtime[bench]'"


def run_isolated(
    system: str, tasks: int, workers: int | None, calls: bool, root: Path = ROOT
) -> dict[str, object]:
    """One system's row, measured in a fresh interpreter (its CPU time its own) by the
    benchmark of the checkout at ``root``, its code first on the path (``bench/against.py``
    measures an earlier build so); ``workers`` None: as that benchmark sets them (builds
    before ``--workers`` ran two)."""
    only = ["--only", system, "--tasks", str(tasks), "--json"]
    only += [] if workers is None else ["--workers", str(workers)]
    only += ["--calls"] if calls else []
    path = os.environ.get("PYTHONPATH")
    done = subprocess.run(
        [sys.executable, str(root / "bench" / "dispatch.py"), *only],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), path]))},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return {"system": system, "tasks": tasks, "error": tail[0]}
    return json.loads(done.stdout)[0]


def measure_here(system: str, tasks: int, workers: int, calls: bool) -> dict[str, object]:
    try:
        row = MEASURES[system](tasks, workers)
        if calls:  # leadtime's: a second run, profiled
            row |= measure_leadtime(tasks, workers, calls=True)
        return row
    except ImportError as e:
        return {"system": system, "tasks": tasks, "error": f"{MISSING} ({e.name})"}


def rounds(tasks: int, workers: int, repeat: int, calls: bool) -> list[dict[str, object]]:
    """Every system ``repeat`` times, the order turned by one system each round: no system
    always follows the same one (a run leaves the machine busy a while after it, with the
    files it wrote and removed)."""
    rows = []
    for n in range(repeat):
        order = SYSTEMS[n % len(SYSTEMS) :] + SYSTEMS[: n % len(SYSTEMS)]
        for system in order:
            row = run_isolated(system, tasks, workers, calls and system == "leadtime")
            rows.append(row | {"round": n})
    return rows


def medians(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per system, the median of each figure over its rounds, with its throughput in each
    (``runs``); a system that failed every round, its first error."""
    out = []
    for system in SYSTEMS:
        mine = [r for r in rows if r["system"] == system]
        done = [r for r in mine if "error" not in r]
        if not done:
            out.append(mine[0])
            continue
        figures = [k for k, v in done[0].items() if isinstance(v, float)]
        row = {"system": system, "tasks": done[0]["tasks"]}
        row |= {k: statistics.median(r[k] for r in done) for k in figures}
        out.append(row | {"runs": [r["tasks_per_s"] for r in done]})
    return with_ratio(out)


def with_ratio(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """leadtime's row grown with its throughput over each peer's and the fastest peer's."""
    peers = {r["system"]: r.get("tasks_per_s") for r in rows if r["system"] != "leadtime"}
    peers = {system: speed for system, speed in peers.items() if speed is not None}
    for row in rows:
        if row["system"] == "leadtime" and peers and "tasks_per_s" in row:
            row["ratio_to_peer"] = {s: row["tasks_per_s"] / speed for s, speed in peers.items()}
            row["ratio_to_best_peer"] = row["tasks_per_s"] / max(peers.values())
    return rows


def show(rows: list[dict[str, object]]) -> None:
    for row in rows:
        if "error" in row:
            print(f"{row['system']:<10} {row['error']}")
            continue
        line = (
            f"{row['system']:<10} {row['tasks_per_s']:8.0f} tasks/s"
            f"   startup {row['startup_s']:5.2f} s"
        )
        runs = row.get("runs", [])
        if len(runs) > 1:
            line += f"   (median of {len(runs)} runs: {min(runs):.0f} to {max(runs):.0f})"
        if "manager_cpu_ms_per_task" in row:
            line += (
                f"   CPU per task: manager {row['manager_cpu_ms_per_task']:.3f} ms, workers "
                f"{row['workers_cpu_ms_per_task']:.2f} ms (a shell alone {row['shell_cpu_ms']:.2f})"
            )
        if "manager_calls_per_task" in row:
            line += f", {row['manager_calls_per_task']:.0f} calls/task"
        if "ratio_to_best_peer" in row:
            each = ", ".join(f"{r:.2f}x {NAMES[s]}" for s, r in row["ratio_to_peer"].items())
            line += f"\n{'':<10} {row['ratio_to_best_peer']:.2f}x the fastest peer ({each})"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2, help="workers, one core each")
    parser.add_argument("--only", choices=SYSTEMS, help="measure one system, in this process")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="also count leadtime's manager's function calls per task (a second, profiled run)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each system, in turned orders; medians"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.calls and args.only not in (None, "leadtime"):
        parser.error("--calls counts leadtime's calls: not with --only " + args.only)
    if args.only and args.repeat > 1:
        parser.error("--repeat turns the order of every system: not with --only")
    if args.only:
        rows = [measure_here(args.only, args.tasks, args.workers, args.calls)]
    else:
        rows = medians(rounds(args.tasks, args.workers, args.repeat, args.calls))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{args.tasks} tasks of `{COMMAND}` on {args.workers} local workers")
        show(rows)


if __name__ == "__main__":
    main()
