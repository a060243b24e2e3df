"""A backend is one options class, one function that opens it and one registration: a
backend of this file's own runs workflows through the engine, the CLI (its options among the
flags) and a run's record with no edit anywhere else."""

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar

import pytest

from backends import clock
from backends.base import JobInfo, JobState, NodeShare, PilotRequest, ResumeRefused, SubmitError
from backends.local import LocalOptions
from backends.options import RunSite, Seconds, Workers, option
from backends.registry import (
    BACKENDS,
    backend_options,
    options_json,
    options_of,
    register,
    unregister,
)
from backends.sim import MockOptions
from backends.sim.workload import ClusterSpec
from backends.slurm import SlurmOptions
from learners.resources import Resources
from orchestrator.session import RunConfig, config_json, config_of, run_simulated
from workflows.spec import example, load

NODE_MB = 4096.0


class Instant:
    """A cluster with no queue: a pilot starts on one node ``start_after`` seconds after its
    submission (its dependencies are not waited for) and ends at its time limit or its
    release."""

    name = "instant"
    simulated = True
    queued = False
    true_wait = None
    node_count = 1

    def __init__(self, cores: int, start_after: float = 0.0) -> None:
        self.node = Resources(cores, cores * NODE_MB, 1e6)
        self.start_after = start_after
        self._jobs: dict[str, JobInfo] = {}
        self._updates: asyncio.Queue[JobInfo] = asyncio.Queue()

    async def check(self, request: PilotRequest) -> None:
        if request.cores > self.node.cores:
            raise SubmitError(f"{request.cores} cores: a node has {self.node.cores}", "cores")

    async def expected_wait(
        self, request: PilotRequest, instead_of: str | None = None
    ) -> float | None:
        return 0.0

    async def submit(self, request: PilotRequest) -> str:
        await self.check(request)
        now, job_id = clock.now(), str(len(self._jobs) + 1)
        self._set(JobInfo(job_id, JobState.PENDING, "Resources", now, now, None))
        asyncio.get_running_loop().call_at(now + self.start_after, self._start, job_id, request)
        return job_id

    def _start(self, job_id: str, request: PilotRequest) -> None:
        info = self._jobs[job_id]
        if info.state is not JobState.PENDING:  # cancelled first
            return
        now = clock.now()
        memory = request.memory_mb or request.cores * NODE_MB
        share = NodeShare("n0", request.cores, int(memory))
        self._set(JobInfo(job_id, JobState.RUNNING, "", info.submit_time, info.eligible_time,
                          now, nodes=(share,)))  # fmt: skip
        loop = asyncio.get_running_loop()
        loop.call_at(now + request.time_limit_s, self._end, job_id, JobState.TIMEOUT)

    async def cancel(self, job_id: str) -> None:
        self._end(job_id, JobState.CANCELLED)

    async def release(self, job_id: str) -> None:
        self._end(job_id, JobState.COMPLETED)

    async def info(self, job_id: str) -> JobInfo:
        return self._jobs[job_id]

    async def updates(self) -> AsyncIterator[JobInfo]:
        while True:
            yield await self._updates.get()

    async def close(self) -> None:
        pass

    async def cluster_name(self) -> str:
        return f"instant:{self.node.cores:g}"

    async def largest_node(self, partitions: set[str | None]) -> Resources:
        return self.node

    async def reattach(self, request: PilotRequest, job_id: str | None, submitted: float):
        raise ResumeRefused("an instant cluster lives in memory")

    def _end(self, job_id: str, state: JobState) -> None:
        info = self._jobs[job_id]
        if not info.state.finished:
            self._set(JobInfo(job_id, state, "", info.submit_time, info.eligible_time,
                              info.start_time, clock.now(), info.nodes))  # fmt: skip

    def _set(self, info: JobInfo) -> None:
        self._jobs[info.job_id] = info
        self._updates.put_nowait(info)


@dataclass(frozen=True, kw_only=True)
class InstantOptions:
    name: ClassVar[str] = "instant"
    workers: ClassVar[Workers] = Workers.SIMULATED

    cores: int = option(28, "Instant: the cores of its one node.")
    start_after: Seconds = option(
        Seconds(0.0), "Instant: how long after its submission a pilot starts."
    )


def open_instant(options: InstantOptions, run: RunSite) -> Instant:
    return Instant(options.cores, options.start_after)


@pytest.fixture
def instant():
    register(InstantOptions, open_instant)
    yield InstantOptions
    unregister(InstantOptions.name)


def test_a_registered_backend_runs_a_workflow(instant):
    summary = run_simulated(load(example("blast"), scale=28), RunConfig(backend=instant()))
    assert summary.status == "done"
    assert summary.twt_s == 0  # nothing queues
    assert all(p.cores <= 28 for p in summary.pilots)


def test_its_options_are_kept_in_a_run_s_record_and_read_back(instant):
    config = RunConfig(strategy="per-stage", backend=instant(cores=14, start_after=30.0))
    data = json.loads(json.dumps(config_json(config)))
    assert data["backend"] == {"name": "instant", "cores": 14, "start_after": 30.0}
    assert config_of(data) == config


def test_the_cli_offers_it_and_refuses_the_flags_of_other_backends(instant, cli):
    blast = str(example("blast"))
    done = cli("run", blast, "--backend", "instant", "--strategy", "per-stage", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["status"] == "done"
    wrong = cli("run", blast, "--backend", "instant", "--oversubscribe", "--quiet")
    assert wrong.exit_code == 2
    assert "--oversubscribe is for --backend local" in wrong.output


def test_the_built_in_backends_options_survive_their_record():
    chosen = [
        MockOptions(trace="KTH", cluster=ClusterSpec(2, 4), offset=3.0),
        LocalOptions(worker_args=("--sample-interval", "0.2"), oversubscribe=True),
        SlurmOptions(sbatch_options=("--account=p",), bind="10.0.0.1"),
    ]
    assert {type(o) for o in chosen} == set(BACKENDS.values())
    for options in chosen:
        assert options_of(json.loads(json.dumps(options_json(options)))) == options
    with pytest.raises(ValueError, match="unknown backend 'nope'; choose one of mock"):
        backend_options("nope")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sbatch-option=--account=p"], "--sbatch-option is for --backend slurm"),
        (["--keep-sandboxes", "always"], "--keep-sandboxes is for --backend local or slurm"),
        (["--backend", "local", "--load", "0.5"], "--load is for --backend mock"),
        (["--backend", "slurm", "--trace", "KTH"], "--trace is for --backend mock"),
    ],
)
def test_a_backend_s_flag_given_to_another_is_a_one_line_error(cli, args, message):
    done = cli("run", str(example("blast")), "--quiet", *args)
    assert done.exit_code == 2
    assert message in done.output
    assert "Traceback" not in done.output


def test_a_duration_option_takes_a_duration_as_a_workflow_file_writes_one(instant, cli):
    shown = " ".join(cli("run", "--help").output.replace("│", " ").split())
    assert "--start-after DURATION Instant: how long after its submission a pilot starts." in shown
    blast = str(example("blast"))
    flags = ("--backend", "instant", "--strategy", "per-stage", "--json")
    waits = {}
    for given in ("2m", "120", "0:02:00"):
        done = cli("run", blast, *flags, "--start-after", given)
        assert done.exit_code == 0, done.output
        waits[given] = json.loads(done.output)["pilots"]
    assert {w["wait_s"] for w in waits["2m"]} == {120.0}
    assert waits["2m"] == waits["120"] == waits["0:02:00"]
    for bad, message in (
        ("soon", "--start-after: expected a duration such as 600 (seconds), 10m, 1h30m or "
                 "0:10:00, got 'soon'"),
        ("-5m", "--start-after: '-5m' is negative"),
    ):  # fmt: skip
        done = cli("run", blast, *flags, "--start-after", bad)
        assert done.exit_code == 2
        assert message in " ".join(done.output.split())
        assert "Traceback" not in done.output


def test_its_options_are_flags_of_the_cli(instant, cli):
    shown = " ".join(cli("run", "--help").output.replace("│", " ").split())
    assert "--cores INTEGER Instant: the cores of its one node. [default: 28]" in shown
    blast = str(example("blast"))
    small = cli(
        "run", blast, "--backend", "instant", "--cores", "14", "--strategy", "per-stage", "--quiet"
    )
    assert small.exit_code == 2  # blast's search stage asks for one pilot of 28 cores
    assert "28 cores: a node has 14" in " ".join(small.output.split())
    wrong = cli("run", blast, "--cores", "14", "--quiet")
    assert wrong.exit_code == 2
    assert "--cores is for --backend instant" in wrong.output
