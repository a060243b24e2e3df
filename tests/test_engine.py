"""The engine on the simulated cluster, on virtual time."""

import asyncio
import gzip
import time

import pytest

from backends import clock
from backends.base import BackendError, JobState
from backends.sim import MockOptions, MockSlurm
from backends.sim.workload import ClusterSpec
from learners.queue_wait import GEOMETRY_FIELDS
from orchestrator.engine import next_events
from orchestrator.planner import Phase
from orchestrator.session import RunConfig, execute, run_simulated
from orchestrator.simulate import SimulatedWorkers, task_truths
from orchestrator.store import Store
from orchestrator.waits import store_name
from workflows.spec import example, load, loads

IDLE = MockOptions(
    load=0, cluster=ClusterSpec(nodes=8, cores_per_node=28, memory_per_node_mb=128000)
)


def run(workflow, strategy, mock=IDLE, **config):
    return run_simulated(workflow, RunConfig(strategy=strategy, backend=mock, **config))


def critical_path(summary, workflow):
    """Stage ends respect ``after``: no stage starts before the stages it waits for end."""
    by_name = {s.name: s for s in summary.stages}
    for stage in workflow.stages:
        figures = by_name[stage.name]
        for before in stage.after:
            assert figures.ready_t >= by_name[before].end_t
        assert figures.start_t >= figures.ready_t
        assert figures.end_t > figures.start_t


@pytest.mark.parametrize("name", ["montage", "blast", "statistics"])
def test_per_stage_and_bigjob_on_the_examples(name):
    workflow = load(example(name), scale=28)
    per_stage = run(workflow, "per-stage")
    bigjob = run(workflow, "bigjob")
    for summary in (per_stage, bigjob):
        assert summary.status == "done"
        critical_path(summary, workflow)
        assert summary.twt_s == 0  # an idle cluster: every pilot starts at once
        assert summary.makespan_s == pytest.approx(max(s.end_t for s in summary.stages))
        assert all(s.attempts == s.tasks for s in summary.stages)  # declared sizes fit
        expected = sum(p.cores * (p.end_t - p.start_t) for p in summary.pilots) / 3600
        assert summary.core_hours == pytest.approx(expected)
    assert len(bigjob.pilots) == 1
    assert len(per_stage.pilots) == len(workflow.stages)
    assert bigjob.core_hours >= per_stage.core_hours
    # The same tasks on the same cores: the makespans agree to within a task or two.
    assert bigjob.makespan_s == pytest.approx(per_stage.makespan_s, rel=0.1)


def test_montage_does_not_scale_and_bigjob_pays_for_it():
    """Montage's tiles fill 24 cores: more cores buy no time, only core-hours (Table 1)."""
    workflow = {scale: load(example("montage"), scale=scale) for scale in (28, 112)}
    small, large = run(workflow[28], "bigjob"), run(workflow[112], "bigjob")
    assert large.makespan_s == pytest.approx(small.makespan_s, rel=0.05)
    assert large.core_hours > 3.5 * small.core_hours
    assert run(workflow[112], "per-stage").core_hours < 0.6 * large.core_hours


def test_a_ten_hour_workflow_runs_in_seconds():
    workflow = loads(
        """
        name = "long"
        [[stage]]
        name = "a"
        allocation = { cores = 8, time = "6h" }
        tasks = { command = "true", count = 8, cores = 1, memory = "1G", disk = "1G" }
        simulate = { duration = "18000" }
        [[stage]]
        name = "b"
        allocation = { cores = 8, time = "6h" }
        tasks = { command = "true", count = 8, cores = 1, memory = "1G", disk = "1G" }
        simulate = { duration = "18000" }
        """
    )
    real = time.monotonic()
    summary = run(workflow, "per-stage")
    assert summary.makespan_s == pytest.approx(10 * 3600, abs=1)
    assert time.monotonic() - real < 10


def test_tasks_are_sized_and_retried_larger():
    """The demo's simulation stage leaves memory to the sizer: some attempts are killed."""
    workflow = load(example("demo"))
    summary = run(workflow, "per-stage", sizer="greedy")
    assert summary.status == "done"
    simulate = next(s for s in summary.stages if s.name == "simulate")
    assert simulate.attempts > simulate.tasks


def test_the_store_holds_the_run():
    workflow = load(example("demo"))

    async def main():
        async with await Store.open(":memory:") as store:
            summary = await execute(workflow, RunConfig(strategy="per-stage", backend=IDLE), store)
            run_row = (await store.rows("runs"))[0]
            pilots = await store.rows("pilots", {"run_id": summary.run_id})
            attempts = await store.rows("attempts", {"run_id": summary.run_id})
            tasks = await store.rows("tasks", {"run_id": summary.run_id})
            waits = await store.rows("waits", {"run_id": summary.run_id})
            learner = await store.load_learner(store_name(run_row["cluster"], GEOMETRY_FIELDS))
            return summary, run_row, pilots, attempts, tasks, waits, learner

    summary, run_row, pilots, attempts, tasks, waits, learner = clock.run(main(), virtual=True)
    assert run_row["status"] == "done" and run_row["summary"]["makespan_s"] == summary.makespan_s
    assert {p["state"] for p in pilots} == {"COMPLETED"}
    assert all(p["job_id"] for p in pilots)
    assert len(tasks) == sum(s.tasks for s in summary.stages)
    assert {t["state"] for t in tasks} == {"done"}
    assert len(attempts) == sum(s.attempts for s in summary.stages)
    assert {a["outcome"] for a in attempts} <= {"success", "exhausted"}
    assert len(waits) == len(pilots)  # every observed wait fed the learner ...
    assert learner is not None  # ... and the learner was saved


def test_a_failed_node_loses_its_tasks_which_complete_elsewhere():
    workflow = loads(
        """
        name = "fragile"
        [[stage]]
        name = "work"
        allocation = { cores = 56, nodes = 2, time = "2h" }
        tasks = { command = "true", count = 56, cores = 1, memory = "1G", disk = "1G" }
        simulate = { duration = "600" }
        """
    )

    async def main():
        backend = MockSlurm(ClusterSpec(nodes=4, cores_per_node=28, memory_per_node_mb=128000))

        async def fail_later():
            await clock.sleep(300)
            job = next(iter(backend.simulator._jobs.values()))
            backend.fail_node(backend.simulator.node_names[job.placement[0][0]])

        async with await Store.open(":memory:") as store:
            asyncio.get_running_loop().create_task(fail_later())
            summary = await execute(
                workflow, RunConfig(strategy="per-stage"), store, backend=backend
            )
            attempts = await store.rows("attempts", {"run_id": summary.run_id})
        return summary, attempts

    summary, attempts = clock.run(main(), virtual=True)
    assert summary.status == "done"
    assert [p.state for p in summary.pilots] == ["NODE_FAIL", "COMPLETED"]
    lost = [a for a in attempts if a["outcome"] == "lost"]
    assert len(lost) == 56  # the failed node ends the whole job: every attempt is lost ...
    done = {a["task_id"] for a in attempts if a["outcome"] == "success"}
    assert {a["task_id"] for a in lost} <= done  # ... then done on the replacement pilot
    assert summary.makespan_s >= 900


def test_a_task_larger_than_any_worker_fails_its_stage_clearly():
    workflow = loads(
        """
        name = "greedy"
        [[stage]]
        name = "big"
        allocation = { cores = 2, memory = "4G", time = "1h" }
        tasks = { command = "true", count = 1, cores = 1 }
        simulate = { duration = "60", memory = "normal(9000, 1)" }
        """
    )
    summary = run(workflow, "per-stage", sizer="greedy")
    assert summary.status == "failed"
    assert summary.stages[0].end_t is not None
    assert all(JobState(p.state).finished for p in summary.pilots)


class FailingRelease(MockSlurm):
    """The simulated cluster, but the batch system fails the first release it is asked."""

    refused: str | None = None

    async def release(self, job_id: str) -> None:
        if self.refused is None:
            self.refused = job_id
            raise BackendError(f"slurmctld did not answer the release of job {job_id}")
        await super().release(job_id)


def test_a_release_that_fails_at_the_end_leaves_no_other_pilot_and_the_run_recorded():
    workflow = loads(
        """
        name = "chain"
        [[stage]]
        name = "big"
        allocation = { cores = 2, memory = "4G", time = "1h" }
        tasks = { command = "true", count = 1, cores = 1 }
        simulate = { duration = "60", memory = "normal(9000, 1)" }
        [[stage]]
        name = "next"
        after = ["big"]
        allocation = { cores = 2, time = "1h" }
        tasks = { command = "true", count = 2 }
        [[stage]]
        name = "last"
        after = ["next"]
        allocation = { cores = 2, time = "1h" }
        tasks = { command = "true", count = 2 }
        """
    )

    async def main():
        backend = FailingRelease(ClusterSpec(nodes=2, cores_per_node=28, memory_per_node_mb=8000))
        async with await Store.open(":memory:") as store:
            with pytest.raises(BackendError, match="did not answer"):
                config = RunConfig(strategy="asa", sizer="greedy")
                await execute(workflow, config, store, backend=backend)
            (run,) = await store.rows("runs")
            pilots = await store.rows("pilots", {"run_id": run["run_id"]})
        return backend, run, pilots

    backend, run, pilots = clock.run(main(), virtual=True)
    assert run["status"] == "failed" and run["ended"] is not None  # the big task fits no worker
    states = {p["job_id"]: p["state"] for p in pilots}
    # the pilot of "big" ran when its stage failed and its release failed: it is left; the
    # pilots of "next" and "last", pending on it, were cancelled all the same
    assert backend.refused == "1"
    assert states == {"1": "RUNNING", "2": "CANCELLED", "3": "CANCELLED"}


class CountedChecks(MockSlurm):
    """The simulated cluster, counting the test submissions it is asked."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checked: list[tuple[int, float | None, float]] = []

    async def check(self, request):
        self.checked.append((request.cores, request.memory_mb, request.time_limit_s))
        await super().check(request)


@pytest.mark.parametrize("strategy", ["elastic", "per-stage"])
def test_each_allocation_is_checked_once_before_anything_is_submitted(strategy):
    """Stages of one allocation need one test submission (``sbatch --test-only`` takes a
    while on a busy controller); elastic asks each stage's allocation and its unit."""
    stage = """
        [[stage]]
        name = "{name}"
        allocation = {{ cores = 2, memory = "1G", time = "10m" }}
        tasks = {{ command = "true", count = 4, cores = 1, memory = "50M", disk = "1M" }}
        simulate = {{ duration = "10", memory = "10", disk = "0.1" }}
        """
    workflow = loads('name = "same"' + "".join(stage.format(name=n) for n in "abc"))

    async def main():
        backend = CountedChecks(ClusterSpec(nodes=2, cores_per_node=28, memory_per_node_mb=8000))
        async with await Store.open(":memory:") as store:
            summary = await execute(workflow, RunConfig(strategy=strategy), store, backend=backend)
        return backend.checked, summary

    checked, summary = clock.run(main(), virtual=True)
    assert summary.status == "done", summary.error
    assert len(checked) == len(set(checked)) == (2 if strategy == "elastic" else 1)


def test_stage_phases_follow_the_dag():
    workflow = loads(
        """
        name = "diamond"
        [[stage]]
        name = "a"
        allocation = { cores = 4, time = "1h" }
        tasks = { command = "true", count = 4, cores = 1, memory = "1G", disk = "1G" }
        [[stage]]
        name = "b"
        after = ["a"]
        allocation = { cores = 4, time = "1h" }
        tasks = { command = "true", count = 4, cores = 1, memory = "1G", disk = "1G" }
        simulate = { duration = "300" }
        [[stage]]
        name = "c"
        after = ["a"]
        allocation = { cores = 4, time = "1h" }
        tasks = { command = "true", count = 4, cores = 1, memory = "1G", disk = "1G" }
        simulate = { duration = "100" }
        [[stage]]
        name = "d"
        after = ["b", "c"]
        allocation = { cores = 4, time = "1h" }
        tasks = { command = "true", count = 4, cores = 1, memory = "1G", disk = "1G" }
        """
    )
    summary = run(workflow, "per-stage")
    by = {s.name: s for s in summary.stages}
    assert by["b"].start_t == by["c"].start_t == pytest.approx(by["a"].end_t)
    assert by["d"].ready_t == pytest.approx(max(by["b"].end_t, by["c"].end_t))
    assert Phase.DONE == "done"


def write_ksegments_trace(directory, peaks, samples=100, interval=2.0):
    """A trace in k-Segments' format: memory rising linearly to each task's peak."""
    columns = (
        "task_idx,workflow,process,task_name,pid,tid,first_sample_utc,first_sample_epoch_s,"
        "n_mem_samples,peak_mem_mb,n_cpu_samples,peak_cpu_pct,files_input_num,"
        "files_input_total_size,files_output_num,files_output_total_size,max_cpus,max_mem,"
        "mem_file_missing"
    )
    rows = [columns]
    series = ["task_idx,t_s,mem_mb"]
    for i, peak in enumerate(peaks):
        rows.append(
            f"{i},w,proc,proc ({i}),{i},{i},-,0,{samples},{peak},{samples},100,1,"
            f"{1000 * (i + 1)},1,1,1,{16 << 30},0"
        )
        series += [f"{i},{j * interval},{peak * (j + 1) / samples}" for j in range(samples)]
    (directory / "w_tasks.csv").write_text("\n".join(rows) + "\n")
    with gzip.open(directory / "w_memory_series.csv.gz", "wt") as f:
        f.write("\n".join(series) + "\n")
    return directory / "w_tasks.csv"


def test_a_trace_driven_stage_is_killed_where_its_memory_series_crosses_the_limit(tmp_path):
    """Tasks replay a trace's records; an attempt over its memory dies where its series
    crosses the limit (a third of the way for a 3000 MB task under 1000 MB), not at the end."""
    trace = write_ksegments_trace(tmp_path, [500, 3000] * 6)
    workflow = loads(
        f"""
        name = "replayed"
        [[stage]]
        name = "replayed"
        allocation = {{ cores = 16, memory = "64G", time = "24h" }}
        tasks = {{ command = "true", count = 12 }}
        simulate = {{ trace = "{trace}" }}
        """
    )

    async def main():
        async with await Store.open(":memory:") as store:
            config = RunConfig(strategy="per-stage", sizer="greedy", backend=IDLE)
            summary = await execute(workflow, config, store)
            return summary, await store.rows("attempts", {"run_id": summary.run_id})

    summary, attempts = clock.run(main(), virtual=True)
    assert summary.status == "done"
    killed = [a for a in attempts if a["outcome"] == "exhausted"]
    assert {a["task_id"] for a in killed} == {f"replayed.{i}" for i in range(1, 12, 2)}
    assert {a["exhausted"] for a in killed} == {"memory"}
    # A rise to 3000 MB over 200 s crosses 1000 MB at sample 33 (66 s), 2000 MB at 66 (132 s).
    crossed = {1: 66.0, 2: 132.0}
    for a in killed:
        assert a["end_t"] - a["start_t"] == pytest.approx(crossed[a["attempt"]])


STOPPED = loads(
    """
    name = "stopped"
    [[stage]]
    name = "work"
    allocation = { cores = 4, time = "2h" }
    tasks = { command = "true", count = 8, cores = 1, memory = "1G", disk = "1G" }
    simulate = { duration = "600" }
    """
)


async def interrupted(store, moment, workers=None):
    """Run STOPPED and stop it (Ctrl-C) once ``moment`` is over; the store's run, attempts
    and pilots."""
    backend = MockSlurm(ClusterSpec(nodes=1, cores_per_node=28, memory_per_node_mb=128000))
    config = RunConfig(strategy="per-stage")
    run = asyncio.ensure_future(execute(STOPPED, config, store, backend=backend, workers=workers))
    await moment
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    (row,) = await store.rows("runs")
    return row, await store.rows("attempts"), await store.rows("pilots")


class Silent(SimulatedWorkers):
    """Simulated workers that never tell how their attempts ended when their pilot ends (a
    remote worker's last word can come after its job's end, or never)."""

    def ended(self, pilot, workers) -> None:
        pass


def test_an_interrupted_run_records_the_attempts_its_pilots_ended_as_stopped():
    """Nothing a stopped run leaves says "running": an attempt whose pilot ended and whose
    worker never told is recorded stopped with the run, so a resume does not wait for that
    worker."""

    async def main():
        async with await Store.open(":memory:") as store:
            silent = Silent(task_truths(STOPPED, 0))
            return await interrupted(store, clock.sleep(300), silent)  # four attempts running

    row, attempts, pilots = clock.run(main(), virtual=True)
    assert row["status"] == "interrupted"
    assert [p["state"] for p in pilots] == ["COMPLETED"]  # released
    assert [(a["outcome"], a["cause"], a["output_tail"]) for a in attempts] == 4 * [
        ("stopped", "stopped with the run (interrupted)", "[leadtime] its pilot ended with the run")
    ]


class SlowToPlace(Store):
    """A store whose write of the first attempts placed takes a minute (a loaded disk)."""

    placing: asyncio.Event

    async def flush(self) -> None:
        placed = any(t == "attempts" for t, _ in self._pending)
        if placed and not self.placing.is_set():
            self.placing.set()
            await clock.sleep(60)
        await super().flush()


def test_attempts_placed_but_not_sent_when_the_run_stops_are_recorded_stopped(monkeypatch):
    monkeypatch.setattr("orchestrator.recorder.GROUP_COMMIT_S", 0.0)  # every write, as a real run

    async def main():
        async with await SlowToPlace.open(":memory:") as store:
            store.placing = asyncio.Event()
            return await interrupted(store, store.placing.wait())  # while it records them

    row, attempts, _ = clock.run(main(), virtual=True)
    assert row["status"] == "interrupted"
    assert [(a["outcome"], a["output_tail"]) for a in attempts] == 4 * [
        ("stopped", "[leadtime] never sent: the run stopped")
    ]


def test_a_cancellation_that_comes_as_an_event_arrives_stops_the_wait():
    """Ctrl-C at the moment an event arrives: the run stops (Python 3.11's wait_for would
    return the event and the run would go on, to exit 0)."""

    async def main():
        queue = asyncio.Queue()
        waiting = asyncio.ensure_future(next_events(queue, 10.0))
        await asyncio.sleep(0)
        queue.put_nowait("an attempt ended")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return queue.qsize(), await next_events(queue, 0.0), await next_events(queue, 0.0)

    left, ready, then = clock.run(main(), virtual=False)
    assert (left, ready, then) == (1, ["an attempt ended"], [])  # the event is still there


def test_events_gathered_after_the_first_come_in_one_batch_and_a_cancellation_keeps_them():
    """While workers hold attempts ahead, the loop takes in what comes shortly after the
    first event with it; Ctrl-C meanwhile leaves them all queued, in order, for the run's
    end."""

    async def main():
        queue = asyncio.Queue()
        queue.put_nowait("first")
        gathering = asyncio.ensure_future(next_events(queue, 10.0, gather=0.05))
        await asyncio.sleep(0.01)
        queue.put_nowait("second")
        batch = await gathering
        queue.put_nowait("third")
        cancelled = asyncio.ensure_future(next_events(queue, 10.0, gather=10.0))
        await asyncio.sleep(0.01)
        queue.put_nowait("fourth")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return batch, await next_events(queue, 0.0)

    batch, left = clock.run(main(), virtual=False)
    assert batch == ["first", "second"]
    assert left == ["third", "fourth"]
