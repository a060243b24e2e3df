"""leadtime, Parsl and dask-jobqueue side by side on the local Slurm, under the same load.

    python bench/slurm_side_by_side.py [--repeat N] [--json]

Needs ``scripts/slurm-local up`` and ``pip install -e '.[bench]'`` (Parsl, dask-jobqueue).
The same 2-stage workflow of real programs runs through leadtime with strategy per-stage,
asa and elastic (the default; a fresh learner, as a first run has), through Parsl's
HighThroughputExecutor with a SlurmProvider block sized for the larger stage, and through
dask-jobqueue's SLURMCluster scaled to one job of that size (the usual set-up of both: one
pilot for the whole workflow; the second stage's tasks depend on the first's). Every run
starts on an empty node with the same background load: a job taking all 16 CPUs of the node
at the workflow's start (so every first pilot queues), and another one submitted a few
seconds later, while the first stage runs (it queues behind the first stage's pilot, and a
pilot submitted after it waits for it).

Makespan: from the workflow's start (background load submitted) to the end of its last task.
Core-hours: what Slurm says each system's jobs held, CPUs x (end - start), whole seconds.
Ratios are each system's over the better peer's (the lower makespan, the lower core-hours
of Parsl and dask-jobqueue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from backends import clock
from backends.slurm import SlurmOptions
from orchestrator.session import RunConfig, execute
from orchestrator.store import Store
from workflows.spec import Workflow, loads

T = TypeVar("T")
BIN = Path(sys.executable).parent
"""Where this environment's scripts are (Parsl's interchange.py and process_worker_pool.py)."""
NODE_CPUS = 16
STAGE_A = {"cores": 4, "memory_gb": 4, "tasks": 12, "seconds": 2.0, "mb": 60}
STAGE_B = {"cores": 2, "memory_gb": 2, "tasks": 2, "seconds": 3.0, "mb": 60}
LOAD = ((0.0, 6), (4.0, 10))
"""Background jobs of the whole node: (submitted at s from the start, running s)."""
TASK = (
    "{python} -c 'import sys, time; b = bytearray({mb} * 2**20); time.sleep({seconds}); "
    'open(sys.argv[1], "w").write(str(len(b)))\' {out}'
)


def command(stage: dict, out: str) -> str:
    return TASK.format(python=sys.executable, mb=stage["mb"], seconds=stage["seconds"], out=out)


def workflow(root: Path) -> Workflow:
    stages = []
    for name, stage, after in (("a", STAGE_A, ""), ("b", STAGE_B, 'after = ["a"]')):
        task = command(stage, f"{root}/{name}-{{index}}").replace('"', '\\"')
        stages.append(
            f"""
[[stage]]
name = "{name}"
{after}
allocation = {{ cores = {stage["cores"]}, memory = "{stage["memory_gb"]}G", time = "10m" }}
[stage.tasks]
command = "{task}"
count = {stage["tasks"]}
cores = 1
memory = "200M"
disk = "10M"
"""
        )
    return loads('name = "side-by-side"\n' + "".join(stages))


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str
    cpus: int
    start: float | None
    end: float | None


def jobs(names: str) -> list[Job]:
    """The jobs slurmctld remembers whose name contains ``names``."""
    found = []
    out = sh("squeue", "--noheader", "--states=all", "--format=%i|%j|%C|%S|%e|%T")
    for line in out.splitlines():
        job_id, name, cpus, start, end, state = line.split("|")
        if names not in name:
            continue
        started = start not in ("N/A", "Unknown") and state != "PENDING"
        found.append(
            Job(
                job_id,
                name,
                int(cpus),
                datetime.fromisoformat(start).timestamp() if started else None,
                datetime.fromisoformat(end).timestamp() if started and end[:1].isdigit() else None,
            )
        )
    return found


def core_hours(held: list[Job]) -> float:
    return sum(j.cpus * (j.end - j.start) / 3600 for j in held if j.start is not None and j.end)


async def background(tag: str) -> None:
    """Submit this run's background jobs on schedule, from now."""
    start = clock.now()
    for at, seconds in LOAD:
        await clock.sleep_until(start + at)
        await asyncio.to_thread(
            sh, "sbatch", f"--job-name=bench-load-{tag}", "--output=/dev/null",
            f"--ntasks={NODE_CPUS}", "--mem-per-cpu=100", f"--wrap=sleep {seconds}",
        )  # fmt: skip


async def loaded(tag: str, work: Awaitable[T]) -> T:
    """``work``, with the background load starting with it."""
    load = asyncio.create_task(background(tag))
    try:
        return await work
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)


async def empty_node() -> None:
    """Until no job at all is pending or running: every run starts alike."""
    while await asyncio.to_thread(sh, "squeue", "--noheader", "--states=PENDING,RUNNING"):
        await clock.sleep(1.0)


@dataclass(frozen=True)
class Row:
    system: str
    run: int
    makespan_s: float
    core_hours: float
    jobs: int


async def run_leadtime(strategy: str, run: int, root: Path) -> Row:
    run_id = f"bench{uuid.uuid4().hex[:8]}"
    config = RunConfig(
        strategy=strategy,
        backend=SlurmOptions(bind="127.0.0.1", poll_interval_s=0.5),
        workdir=root,
    )
    async with await Store.open(":memory:") as store:
        summary = await loaded(run_id, execute(workflow(root), config, store, run_id=run_id))
    if summary.status != "done":
        raise RuntimeError(f"leadtime {strategy}: run {summary.status}: {summary.error}")
    held = await asyncio.to_thread(jobs, f"lt-{run_id}-")
    return Row(
        f"leadtime {strategy}",
        run,
        round(summary.makespan_s, 1),
        round(core_hours(held), 5),
        len(held),
    )


async def run_parsl(run: int, root: Path) -> Row:
    label = f"bench{uuid.uuid4().hex[:8]}"
    makespan = await loaded(label, asyncio.to_thread(parsl_workflow, label, root))
    for _ in range(60):  # the block's end, once cleanup cancelled it
        blocks = await asyncio.to_thread(jobs, f"parsl.{label}.")
        if all(b.end is not None and b.end <= clock.wall() for b in blocks):
            break
        await clock.sleep(1.0)
    return Row("parsl htex", run, round(makespan, 1), round(core_hours(blocks), 5), len(blocks))


def parsl_workflow(label: str, root: Path) -> float:
    """The workflow through Parsl, in this thread; its makespan."""
    import parsl
    from parsl.app.app import bash_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import SlurmProvider

    cores = max(STAGE_A["cores"], STAGE_B["cores"])
    provider = SlurmProvider(
        partition="debug",
        nodes_per_block=1,
        cores_per_node=cores,
        mem_per_node=max(STAGE_A["memory_gb"], STAGE_B["memory_gb"]),
        init_blocks=1,
        min_blocks=0,
        max_blocks=1,
        walltime="00:10:00",
        exclusive=False,
        worker_init=f"export PATH={BIN}:$PATH",
    )
    executor = HighThroughputExecutor(
        label=label,
        address="127.0.0.1",
        interchange_launch_cmd=[str(BIN / "interchange.py")],
        max_workers_per_node=cores,
        cores_per_worker=1,
        provider=provider,
    )
    config = Config(executors=[executor], run_dir=str(root / "parsl"), strategy="none")

    @bash_app
    def task(cmd: str, inputs=()):
        return cmd

    start = clock.monotonic()
    dfk = parsl.load(config)
    try:
        a = [task(command(STAGE_A, f"{root}/pa-{i}")) for i in range(STAGE_A["tasks"])]
        b = [task(command(STAGE_B, f"{root}/pb-{i}"), inputs=a) for i in range(STAGE_B["tasks"])]
        for future in b:
            future.result()
        return clock.monotonic() - start
    finally:
        dfk.cleanup()
        parsl.clear()


async def run_dask(run: int, root: Path) -> Row:
    previous = signal.getsignal(signal.SIGINT)
    import dask_jobqueue  # noqa: F401  (in the main thread: its import sets a SIGINT handler)

    signal.signal(signal.SIGINT, previous)
    label = f"dask-bench{uuid.uuid4().hex[:8]}"
    makespan = await loaded(label, asyncio.to_thread(dask_workflow, label, root))
    for _ in range(60):  # the job's end, once the cluster closed
        held = [j for j in await asyncio.to_thread(jobs, label) if j.name == label]
        if all(j.end is not None and j.end <= clock.wall() for j in held):
            break
        await clock.sleep(1.0)
    return Row("dask-jobqueue", run, round(makespan, 1), round(core_hours(held), 5), len(held))


def dask_workflow(label: str, root: Path) -> float:
    """The workflow through dask-jobqueue, in this thread; its makespan."""
    from dask.distributed import Client
    from dask_jobqueue import SLURMCluster

    def shell(cmd: str, *after: object) -> None:
        """``cmd`` through the shell, once the tasks ``after`` are done (defined here: Dask's
        workers get it by value, not from a module they cannot import)."""
        subprocess.run(cmd, shell=True, check=True)

    cores = max(STAGE_A["cores"], STAGE_B["cores"])
    start = clock.monotonic()
    with (
        SLURMCluster(
            queue="debug",
            cores=cores,
            processes=cores,
            memory=f"{max(STAGE_A['memory_gb'], STAGE_B['memory_gb'])}GB",
            walltime="00:10:00",
            job_name=label,
            python=sys.executable,
            scheduler_options={"host": "127.0.0.1"},
            log_directory=str(root / "dask"),
        ) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(jobs=1)
        a = [
            client.submit(shell, command(STAGE_A, f"{root}/da-{i}"), pure=False)
            for i in range(STAGE_A["tasks"])
        ]
        b = [
            client.submit(shell, command(STAGE_B, f"{root}/db-{i}"), *a, pure=False)
            for i in range(STAGE_B["tasks"])
        ]
        client.gather(b)
        return clock.monotonic() - start


PEERS = ("parsl htex", "dask-jobqueue")
SYSTEMS = ("parsl", "dask-jobqueue", "per-stage", "asa", "elastic")


async def side_by_side(repeat: int, root: Path) -> list[Row]:
    rows: list[Row] = []
    for run in range(repeat):
        for system in SYSTEMS:
            await empty_node()
            if system == "parsl":
                rows.append(await run_parsl(run, root))
            elif system == "dask-jobqueue":
                rows.append(await run_dask(run, root))
            else:
                rows.append(await run_leadtime(system, run, root))
            print(f"# {rows[-1]}", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each system")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="leadtime-bench-", dir=Path.cwd()) as scratch:
        rows = clock.run(side_by_side(args.repeat, Path(scratch)), virtual=False)
    report(rows, as_json=args.json)


def report(rows: list[Row], *, as_json: bool) -> None:
    def mean(system: str, field: str) -> float:
        values = [getattr(r, field) for r in rows if r.system == system]
        return sum(values) / len(values)

    peer_makespan = min(mean(p, "makespan_s") for p in PEERS)
    peer_ch = min(mean(p, "core_hours") for p in PEERS)
    if as_json:
        out = [asdict(r) for r in rows]
        for r in out:
            r["makespan_ratio"] = round(r["makespan_s"] / peer_makespan, 3)
            r["core_hours_ratio"] = round(r["core_hours"] / peer_ch, 3)
        print(json.dumps(out, indent=2))
        return
    a, b = STAGE_A, STAGE_B
    print(
        f"workflow: a = {a['tasks']} tasks x {a['seconds']:g} s on {a['cores']} cores, "
        f"b = {b['tasks']} tasks x {b['seconds']:g} s on {b['cores']} cores; background: "
        + ", ".join(f"{NODE_CPUS} CPUs for {s} s at t+{at:g} s" for at, s in LOAD)
    )
    print(f"{'system':<20}{'makespan s':>12}{'core-hours':>12}{'jobs':>6}{'ms ratio':>10}"
          f"{'ch ratio':>10}")  # fmt: skip
    for system in dict.fromkeys(r.system for r in rows):
        makespan, ch = mean(system, "makespan_s"), mean(system, "core_hours")
        jobs_ = mean(system, "jobs")
        print(
            f"{system:<20}{makespan:>12.1f}{ch:>12.4f}{jobs_:>6.0f}"
            f"{makespan / peer_makespan:>10.2f}{ch / peer_ch:>10.2f}"
        )


if __name__ == "__main__":
    main()
