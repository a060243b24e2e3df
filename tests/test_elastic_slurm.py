"""The elastic strategy on the real Slurm of ``scripts/slurm-local up``: a pilot serves two
stages in a row, and a pilot no stage needs any more is given back while the run goes on."""

import textwrap
from dataclasses import replace

import pytest
from test_e2e_slurm import Cluster, slurm_config

from backends import clock
from orchestrator.session import execute
from orchestrator.store import Store
from orchestrator.summary import RunSummary
from workflows.spec import loads

pytestmark = pytest.mark.slurm

WORKFLOW = """
name = "elastic"
[[stage]]
name = "first"
allocation = { cores = 4, memory = "1G", time = "5m" }
tasks = { command = "sleep 2", count = 4, cores = 1, memory = "100M", disk = "10M" }
[[stage]]
name = "second"
allocation = { cores = 4, memory = "1G", time = "5m" }
tasks = { command = "sleep 2", count = 4, cores = 1, memory = "100M", disk = "10M" }
[[stage]]
name = "last"
allocation = { cores = 1, memory = "256M", time = "5m" }
tasks = { command = "sleep 8", count = 1, cores = 1, memory = "100M", disk = "10M" }
"""


def run(text: str, tmp_path, cluster, **config) -> tuple[RunSummary, list[dict], list[dict]]:
    """Workflow ``text`` run by elastic (with ``config``) on the local Slurm: its figures, its
    attempts' rows and its pilots'."""
    workflow = loads(textwrap.dedent(text), source=tmp_path / "wf.toml")
    chosen = replace(slurm_config(tmp_path, "elastic"), **config)

    async def main():
        async with await Store.open(tmp_path / "store.db") as store:
            summary = await execute(workflow, chosen, store, run_id=cluster.run_id)
            attempts = await store.rows("attempts", {"run_id": summary.run_id})
            rows = await store.rows("pilots", {"run_id": summary.run_id})
            return summary, attempts, rows

    return clock.run(main(), virtual=False)


@pytest.fixture
def cluster():
    cluster = Cluster()
    yield cluster
    cluster.clean()


@pytest.mark.parametrize(("unit", "cores"), [("task", [1, 1, 1, 1]), ("node", [1, 3])])
def test_a_pilot_serves_two_stages_and_one_goes_back_early(tmp_path, cluster, unit, cores):
    """Pilots of one task each (by default), or of a node's cores at most (1 and 3 CPUs),
    all submitted at the start without a dependency: the second stage's tasks run on the
    pilots of the first (none is submitted for it); the pilots the last, 1-CPU stage does not
    run on are given back before it ends; no job of the run is left in the queue."""
    summary, attempts, rows = run(WORKFLOW, tmp_path, cluster, unit=unit)
    assert summary.status == "done", summary.error
    pilots = {p.pilot_id: p for p in summary.pilots}
    assert sorted(p.cores for p in pilots.values()) == cores
    assert [r["request"]["dependency"] for r in rows] == [None] * len(cores)
    ran = {
        stage: {a["pilot_id"] for a in attempts if a["task_id"].startswith(stage + ".")}
        for stage in ("first", "second", "last")
    }
    assert ran["second"] <= set(pilots) and ran["second"] & ran["first"]
    assert all(p.submit_t < summary.stages[0].end_t for p in pilots.values())
    last = summary.stages[2]
    (runs_last,) = ran["last"]
    assert pilots[runs_last].cores == 1
    others = [p for p in pilots.values() if p.pilot_id != runs_last]
    assert all(p.end_t is not None and p.end_t < last.end_t - 2 for p in others)  # back early
    assert cluster.queued() == []


GROWING = """
name = "growing"
[[stage]]
name = "big"
allocation = { cores = 2, time = "5m" }
[stage.tasks]
command = "python3 -c 'import time; a = bytearray(1500 * 2**20); time.sleep(2)' && touch out{index}"
count = 2
cores = 1
outputs = ["out{index}"]
"""


def test_a_task_that_outgrows_the_default_memory_of_its_units_gets_units_sized_to_it(
    tmp_path, cluster
):
    """The stage leaves memory to the cluster's default: the local Slurm's DefMemPerCPU, 1,000
    MB, half its node's share per core (2,000 MB). Its tasks need 1,500 MB: killed on the
    units of the default, they ran again on units that asked for their memory; the run failed
    at the first kill ('needs more memory than a whole worker has, 1 GB'), the units' default
    taken for the node's share."""
    summary, attempts, rows = run(GROWING, tmp_path, cluster)
    assert summary.status == "done", summary.error
    assert all((tmp_path / f"out{i}").exists() for i in range(2))
    asked = {r["pilot_id"]: r["request"]["memory_mb"] for r in rows}
    done = [a for a in attempts if a["outcome"] == "success"]
    assert len(done) == 2
    for attempt in done:
        assert attempt["allocation"]["memory"] >= 1500
        assert asked[attempt["pilot_id"]] >= attempt["allocation"]["memory"]  # asked for it
    assert cluster.queued() == []
