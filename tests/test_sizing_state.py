"""A sizer's state outlives a run: its records, kept in the store per workflow."""

from __future__ import annotations

import pytest

from backends import clock
from learners.resources import Resources
from learners.sizing import Record, TaskFeatures, make_sizer
from learners.sizing.history import KEPT, History
from orchestrator.sizing_state import (
    UNKNOWN_DISK_SHARE_MB,
    SizingState,
    stage_share,
    store_name,
)
from orchestrator.store import Store
from workflows.spec import loads

WORKER = Resources(16, 64000, 64000)


def records(n: int, category: str = "align") -> list[Record]:
    return [
        Record(TaskFeatures(category, 1e9 + i), Resources(2, 1000 + 10 * i, 500, 60), (1.0, 2.0), 2)
        for i in range(n)
    ]


@pytest.mark.parametrize("name", ["select", "budget", "ksegments", "greedy", "max-seen"])
def test_a_restored_sizer_allocates_as_the_one_that_learnt(name):
    learnt = make_sizer(name, worker=WORKER)
    for r in records(30):
        learnt.observe(r)
    fresh = make_sizer(name, worker=WORKER)
    fresh.restore(learnt.state())
    task = TaskFeatures("align", 2e9)
    assert fresh.allocate(task) == learnt.allocate(task)


def test_the_history_keeps_the_latest_records_of_each_category():
    history = History()
    for r in [*records(KEPT + 10), *records(3, "index")]:
        history.add(r)
    kept = list(History.records(history.state()))
    assert len(kept) == KEPT + 3
    assert kept[0].peak.memory == 1000 + 10 * 10  # the ten oldest went
    assert list(History.records({"version": 0, "categories": {}})) == []


def test_the_store_carries_the_state_to_the_next_run_of_the_workflow():
    async def main():
        async with await Store.open(":memory:") as store:
            first = make_sizer("select", worker=WORKER)
            state = await SizingState.load(store, "wf", first)
            assert state is not None
            for r in records(10):
                first.observe(r)
            await state.save(store)
            saved = await store.load_learner(store_name("wf"))
            second = make_sizer("select", worker=WORKER)
            await SizingState.load(store, "wf", second)
            other = make_sizer("select", worker=WORKER)
            await SizingState.load(store, "another", other)
            return saved, first, second, other

    saved, first, second, other = clock.run(main(), virtual=False)
    assert len(saved["categories"]["align"]) == 10
    task = TaskFeatures("align")
    assert second.allocate(task) == first.allocate(task)
    assert other.allocate(task) == Resources(16, 64000, 64000)  # nothing known: a whole worker


def test_the_state_is_saved_at_most_every_interval_and_when_the_run_ends():
    async def main():
        async with await Store.open(":memory:") as store:
            sizer = make_sizer("select", worker=WORKER)
            state = await SizingState.load(store, "wf", sizer, every_s=3600)
            assert state is not None
            counts = []

            async def kept() -> int:
                return len((await store.load_learner(store_name("wf")))["categories"]["align"])

            for r in records(3):
                sizer.observe(r)
                await state.save(store)  # the first: saved; the next two: not yet due
                counts.append(await kept())
            await state.save(store, final=True)
            return [*counts, await kept()]

    assert clock.run(main(), virtual=False) == [1, 1, 1, 3]


def test_a_task_share_is_the_stage_allocation_over_the_tasks_that_run_at_once():
    workflow = loads(
        """
        name = "w"
        [[stage]]
        name = "s"
        allocation = { cores = 8, nodes = 2, time = "5m" }
        tasks = { command = "true", count = 16 }
        """
    )
    (stage,) = workflow.stages
    # each takes a core at least, as Slurm gives: 8 of the 16 run at once, on 2 nodes
    share = stage_share(stage, Resources(4, 8000, 80000), 16)
    assert share == {"cores": 1.0, "memory": 2000.0, "disk": 20000.0}
    # a node whose disk the batch system does not tell: each task starts with 1 GB
    unknown = stage_share(stage, Resources(4, 8000, 1_000_000), 16, disk_known=False)
    assert unknown == {"cores": 1.0, "memory": 2000.0, "disk": UNKNOWN_DISK_SHARE_MB}
    # 6 tasks: each a 6th, as all run at once
    assert stage_share(stage, Resources(4, 8000, 80000), 6)["memory"] == 16000 / 6


def test_a_task_share_is_over_the_tasks_their_declared_sizes_let_run_at_once():
    """16 tasks of one core on 2 nodes of 4 cores run 8 at a time: each has an 8th of the
    memory, not a 16th (which would start them all below what they may need); the disk they
    declare bounds them too, unless the batch system does not tell the nodes' disk."""
    workflow = loads(
        """
        name = "w"
        [[stage]]
        name = "s"
        allocation = { cores = 8, nodes = 2, time = "5m" }
        tasks = { command = "true", count = 16, cores = 1, disk = "30G" }
        """
    )
    (stage,) = workflow.stages
    node = Resources(4, 8000, 80000)
    # 30 GB each: 2 a node, 4 at once
    assert stage_share(stage, node, 16) == {"cores": 2.0, "memory": 4000.0, "disk": 40000.0}
    unknown = stage_share(stage, Resources(4, 8000, 0), 16, disk_known=False)
    assert unknown == {"cores": 1.0, "memory": 2000.0, "disk": UNKNOWN_DISK_SHARE_MB}
    assert stage_share(stage, node, 3)["memory"] == 16000 / 3  # fewer tasks than fit
