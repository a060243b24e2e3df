"""The simulated Slurm cluster against schedules worked out by hand."""

import asyncio
import math

import numpy as np
import pytest

from backends import clock
from backends.base import Dependency, JobState, PilotRequest, SubmitError
from backends.sim.backend import MockSlurm
from backends.sim.simulator import Simulator
from backends.sim.workload import ClusterSpec, JobStream

S = JobState


def cluster(nodes=1, cores=4, **options) -> Simulator:
    return Simulator(ClusterSpec(nodes=nodes, cores_per_node=cores), **options)


def after(kind, *jobs) -> Dependency:
    return Dependency(kind, tuple(str(j.id) for j in jobs))


def spans(*jobs):
    return [(j.start, j.end) for j in jobs]


# ------------------------------------------------------------------ ordering


def test_fifo_without_backfill_keeps_submit_order():
    sim = cluster(backfill=False)
    a = sim.submit(3, 100, run=100)
    b = sim.submit(4, 50, run=50)
    c = sim.submit(1, 10, run=10)  # fits beside A, but B is first
    assert sim.reason(b) == "Resources" and sim.reason(c) == "Priority"
    sim.run()
    assert spans(a, b, c) == [(0, 100), (100, 150), (150, 160)]


def test_easy_backfills_a_job_ending_before_the_shadow_time():
    sim = cluster()
    a = sim.submit(3, 100, run=100)
    b = sim.submit(4, 50, run=50)
    c = sim.submit(1, 10, run=10)
    sim.run()
    assert spans(a, b, c) == [(0, 100), (100, 150), (0, 10)]


def test_backfill_never_delays_the_head_reservation():
    sim = cluster()
    a = sim.submit(2, 100, run=100)
    head = sim.submit(4, 50, run=50)  # shadow time 100, no cores to spare then
    long = sim.submit(2, 200, run=200)  # fits now, would hold 2 cores past 100
    short = sim.submit(2, 90, run=60)  # ends by 90 <= 100: may go
    assert (long.state, short.state) == (S.PENDING, S.RUNNING)
    sim.run()
    assert spans(a, head, long, short) == [(0, 100), (100, 150), (150, 350), (0, 60)]


def test_backfill_may_use_cores_the_reservation_does_not_need():
    sim = cluster(cores=8)
    sim.submit(4, 100, run=100)
    head = sim.submit(6, 50, run=50)  # at 100: 8 free, 2 to spare
    spare = sim.submit(2, 1000, run=1000)  # runs past 100 on the 2 spare cores
    late = sim.submit(2, 1000, run=1000)  # the spare cores are taken
    assert (spare.state, late.state) == (S.RUNNING, S.PENDING)
    assert sim.reason(head) == "Resources" and sim.reason(late) == "Priority"
    sim.run()
    assert spans(head, spare, late) == [(100, 150), (0, 1000), (150, 1150)]


def test_reservation_uses_requested_not_actual_end_times():
    """A runs 10 s of its 100 s limit: the scheduler cannot know, B is refused."""
    sim = cluster()
    sim.submit(2, 100, run=10)
    head = sim.submit(4, 50, run=50)
    b = sim.submit(2, 150, run=20)
    sim.run()
    assert spans(head, b) == [(10, 60), (60, 80)]


def test_tail_arrivals_are_backfilled_like_a_full_pass():
    sim = cluster(cores=8)
    sim.submit(4, 100, run=100)
    head = sim.submit(6, 50, run=50)
    sim.advance_to(5)
    late = sim.submit(2, 1000, run=1000)  # arrives alone: tested against the reservation
    sim.advance_to(7)
    too_many = sim.submit(1, 1000, run=1000)
    assert late.start == 5 and too_many.state is S.PENDING
    sim.run()
    assert head.start == 100 and too_many.start == 150


# -------------------------------------------------------------- dependencies


def test_afterok_waits_for_completion():
    sim = cluster(cores=8)
    a = sim.submit(4, 100, run=50)
    b = sim.submit(4, 100, run=10, dependency=after("afterok", a))
    assert sim.reason(b) == "Dependency" and b.eligible is None
    sim.run()
    assert (b.eligible, b.start, b.state) == (50, 50, S.COMPLETED)


def test_afterok_on_a_failed_job_is_never_satisfied_and_stays_pending():
    sim = cluster(cores=8)
    a = sim.submit(4, 100, run=500)  # times out at 100
    b = sim.submit(4, 100, dependency=after("afterok", a))
    sim.run()
    assert a.state is S.TIMEOUT
    assert (b.state, sim.reason(b)) == (S.PENDING, "DependencyNeverSatisfied")


def test_kill_invalid_depend_cancels_and_cascades():
    sim = cluster(cores=8, kill_invalid_depend=True)
    a = sim.submit(4, 100, run=50)
    b = sim.submit(4, 100, dependency=after("afternotok", a))
    c = sim.submit(4, 100, run=5, dependency=after("afternotok", b))
    sim.run()
    assert (b.state, b.reason, b.end) == (S.CANCELLED, "DependencyNeverSatisfied", 50)
    assert (c.state, c.eligible, c.start) == (S.COMPLETED, 50, 50)  # cancelled is "not ok"


@pytest.mark.parametrize(
    ("run", "limit", "state"), [(None, 60, S.TIMEOUT), (500, 60, S.TIMEOUT), (30, 60, S.COMPLETED)]
)
def test_afternotok_and_afterany(run, limit, state):
    sim = cluster(cores=8)
    a = sim.submit(4, limit, run=run)
    notok = sim.submit(2, 100, run=1, dependency=after("afternotok", a))
    anyend = sim.submit(2, 100, run=1, dependency=after("afterany", a))
    sim.run()
    assert a.state is state
    assert anyend.start == a.end
    if state is S.COMPLETED:
        assert (notok.state, sim.reason(notok)) == (S.PENDING, "DependencyNeverSatisfied")
    else:
        assert notok.start == a.end == limit


def test_after_waits_for_the_start_or_cancellation():
    sim = cluster()
    sim.submit(4, 100, run=100)
    a = sim.submit(4, 100, run=100)  # starts at 100
    b = sim.submit(1, 100, run=1, dependency=after("after", a))
    x = sim.submit(4, 10, run=10)
    c = sim.submit(1, 100, run=1, dependency=after("after", x))
    sim.advance_to(20)
    assert b.state is S.PENDING and b.reason == "Dependency"
    sim.cancel(x)  # cancelled while pending: satisfies `after`
    assert c.eligible == 20 and c.state is S.PENDING  # eligible, queued behind A
    sim.run()
    assert b.eligible == 100
    assert b.start == c.start == 200  # A holds every core until 200


def test_dependency_on_several_jobs_needs_all():
    sim = cluster(cores=8)
    a = sim.submit(2, 100, run=10)
    b = sim.submit(2, 100, run=30)
    c = sim.submit(2, 100, run=1, dependency=after("afterok", a, b))
    sim.run()
    assert c.eligible == 30


def test_dependency_on_unknown_job_is_rejected():
    sim = cluster()
    with pytest.raises(SubmitError, match="dependency") as e:
        sim.submit(1, 10, dependency=Dependency("afterok", ("999",)))
    assert e.value.option == "dependency"


def test_dependency_already_satisfied_at_submission():
    sim = cluster()
    a = sim.submit(1, 10, run=5)
    sim.advance_to(8)
    b = sim.submit(1, 10, run=1, dependency=after("afterok", a))
    assert (b.eligible, b.start) == (8, 8)


def test_submit_priority_keeps_place_eligible_priority_does_not():
    """A pilot submitted early with a dependency: ahead of later jobs under
    ``submit`` priority, behind them under ``eligible`` priority."""

    def schedule(priority):
        sim = cluster(cores=8, priority=priority)
        sim.submit(4, 100, run=100)  # A
        x = sim.submit(4, 60, run=50)
        pilot = sim.submit(4, 100, run=100, dependency=after("afterok", x))
        sim.advance_to(10)
        b = sim.submit(4, 100, run=100)
        sim.run()
        return pilot, b

    pilot, b = schedule("submit")
    assert (pilot.eligible, pilot.start, b.start) == (50, 50, 100)
    pilot, b = schedule("eligible")
    assert (pilot.eligible, pilot.start, b.start) == (50, 100, 50)


# ---------------------------------------------------------- limits, cancel, failure


def test_time_limit_kills_and_frees_cores():
    sim = cluster()
    pilot = sim.submit(4, 100)  # runs until released or killed
    long = sim.submit(4, 50, run=80)
    nxt = sim.submit(4, 50, run=10)
    sim.run()
    assert (pilot.state, pilot.end, pilot.reason) == (S.TIMEOUT, 100, "TimeLimit")
    assert (long.state, long.end) == (S.TIMEOUT, 150)
    assert (nxt.state, nxt.start, nxt.end) == (S.COMPLETED, 150, 160)


def test_release_completes_a_running_job():
    sim = cluster()
    pilot = sim.submit(4, 100)
    sim.advance_to(30)
    sim.release(pilot)
    assert (pilot.state, pilot.end) == (S.COMPLETED, 30)
    assert sim.free_cores() == 4


def test_cancel_pending_and_running():
    sim = cluster()
    running = sim.submit(4, 100, run=100)
    pending = sim.submit(4, 100, run=100)
    behind = sim.submit(4, 100, run=10)
    sim.advance_to(10)
    sim.cancel(pending)
    assert (pending.state, pending.start, pending.end) == (S.CANCELLED, None, 10)
    assert sim.reason(behind) == "Resources"
    sim.advance_to(20)
    sim.cancel(running)
    assert (running.state, running.end) == (S.CANCELLED, 20)
    assert (behind.state, behind.start) == (S.RUNNING, 20)
    sim.cancel(running)  # already over: nothing happens
    assert running.end == 20


def test_node_failure_kills_its_jobs_and_takes_it_away():
    sim = cluster(nodes=2, cores=2)
    on_first = sim.submit(2, 1000, nodes=1, run=1000)
    on_second = sim.submit(2, 1000, nodes=1, run=1000)
    name = sim.node_names[on_first.shares()[0][0]]
    sim.fail_node(name, at=100, duration=400)
    whole = sim.submit(4, 100, run=10)
    sim.advance_to(100)
    assert (on_first.state, on_first.end, on_first.reason) == (S.NODE_FAIL, 100, "NodeDown")
    assert on_second.state is S.RUNNING and not sim.node_up(name)
    small = sim.submit(2, 100, run=10)
    assert small.state is S.PENDING and sim.free_cores() == 0  # the failed node is gone
    sim.cancel(on_second)
    assert small.start == 100  # the head cannot run before the node returns: no reservation
    sim.run()
    assert whole.start == 500  # needs both nodes: waits for the return
    assert sim.node_up(name)


def test_fail_node_rejects_unknown_nodes_and_the_past():
    sim = cluster()
    with pytest.raises(ValueError, match="no node"):
        sim.fail_node("nope")
    sim.advance_to(10)
    with pytest.raises(ValueError, match="already"):
        sim.fail_node(sim.node_names[0], at=5)


# ----------------------------------------------------------------- geometry


def test_pinned_job_needs_whole_free_nodes():
    sim = cluster(nodes=2, cores=4)
    a = sim.submit(2, 100, run=100)  # best fit: node 1
    spread = sim.submit(2, 50, nodes=2, run=50)  # one core on each node
    assert sorted(c for _, c, _ in spread.shares()) == [1, 1]
    pinned = sim.submit(4, 100, nodes=1, run=10)  # 4 cores free in total, no node has 4
    assert pinned.state is S.PENDING and sim.free_cores() == 4
    flexible = sim.submit(3, 40, run=40)  # ends before pinned's shadow (50): backfills
    assert flexible.state is S.RUNNING
    sim.run()
    assert pinned.start == 50 and a.end == 100
    _, cores, memory = pinned.shares()[0]
    assert cores == 4 and memory == 4 * 4096


def nodes_of(job):
    return {node: cores for node, cores, _ in job.shares()}


def test_flexible_jobs_take_the_fullest_node_that_holds_them():
    sim = cluster(nodes=3, cores=4)
    a = sim.submit(3, 100)  # node 1: 1 core left
    b = sim.submit(2, 100)  # node 2: 2 left
    c = sim.submit(2, 100)  # node 2 again, not node 3
    d = sim.submit(1, 100)  # node 1's last core
    assert [nodes_of(j) for j in (a, b, c, d)] == [{0: 3}, {1: 2}, {1: 2}, {0: 1}]
    assert sim.submit(4, 100, nodes=1).state is S.RUNNING  # node 3 stayed whole


def test_a_job_larger_than_any_node_takes_the_emptiest_first():
    sim = cluster(nodes=3, cores=4)
    sim.submit(4, 10, nodes=1, run=10)  # node 1, gone at 10
    sim.submit(3, 100, nodes=1)  # node 2
    sim.submit(2, 100, nodes=1)  # node 3
    sim.advance_to(10)  # free: 4, 1, 2
    assert nodes_of(sim.submit(5, 100)) == {0: 4, 1: 1}
    assert nodes_of(sim.submit(2, 100)) == {2: 2}


def test_pinned_reservation_holds_its_node_against_long_backfill():
    sim = cluster(nodes=3, cores=4)
    sim.submit(4, 1000, nodes=1)  # node 1 full
    sim.submit(3, 50, nodes=1, run=50)  # node 2: 1 free until 50
    sim.submit(2, 1000, nodes=1)  # node 3: 2 free
    pinned = sim.submit(4, 100, nodes=1, run=100)  # reserved: node 2 at 50
    first = sim.submit(1, 1000, run=1000)  # best fit would pick node 2: must not
    second = sim.submit(1, 1000, run=1000)
    third = sim.submit(1, 1000, run=1000)  # only node 2's core is left
    used = [i for job in (first, second) for i, _, _ in job.shares()]
    assert used == [2, 2]  # node 3
    assert third.state is S.PENDING
    sim.run()
    assert pinned.start == 50


def test_memory_starved_cores_do_not_count_for_the_reservation():
    sim = Simulator(ClusterSpec(nodes=2, cores_per_node=4, memory_per_node_mb=8000))
    sim.submit(1, 1000, memory_mb=7000)  # node 1: 3 cores left with 1000 MB
    sim.submit(2, 100, nodes=1, run=100)  # node 2: 2 free until 100
    head = sim.submit(4, 100, run=100)  # 5 cores free, only 2 usable: reserved node 2 at 100
    long = sim.submit(1, 1000, run=1000)  # would fit on node 2 now, and delay the head
    assert long.state is S.PENDING
    sim.run()
    assert head.start == 100 and long.start == 200


def test_a_memory_hungry_arrival_cannot_starve_the_reserved_head():
    sim = Simulator(ClusterSpec(nodes=2, cores_per_node=4, memory_per_node_mb=8000))
    sim.submit(2, 100, nodes=1, run=100)  # node 1: 2 cores, 4000 MB free until 100
    sim.submit(4, 1000, nodes=1)  # node 2 full
    head = sim.submit(3, 100, run=100)  # at 100 on node 1, with 6000 of its 8000 MB
    hungry = sim.submit(1, 1000, memory_mb=4000, run=1000)  # 1 core is spare, its memory not
    assert hungry.state is S.PENDING
    sim.run()
    assert head.start == 100 and hungry.start == 200


def test_a_dependency_satisfied_during_a_pass_is_scheduled_in_it():
    sim = cluster()
    sim.submit(2, 100, run=20)
    sim.submit(4, 100, run=100)  # blocked head
    sim.submit(2, 50, run=50)  # backfilled: no core left
    a = sim.submit(1, 10, run=10)
    b = sim.submit(1, 10, run=10, dependency=after("after", a))
    sim.advance_to(20)  # a backfills, which frees b, which backfills too
    assert (a.start, b.eligible, b.start) == (20, 20, 20)


def test_memory_binds_placement_and_reservation():
    sim = Simulator(ClusterSpec(nodes=2, cores_per_node=4, memory_per_node_mb=8000))
    big = sim.submit(1, 100, memory_mb=6000, run=100)  # one core, most of node 1's memory
    sim.submit(4, 1000, nodes=1, run=1000)  # all of node 2
    small = sim.submit(2, 50, memory_mb=3000, run=50)  # 3 cores free, memory for one
    assert small.state is S.PENDING and sim.free_cores() == 3
    tiny = sim.submit(1, 1000, run=1000)  # default 2000 MB: fits beside small's reservation
    assert tiny.state is S.RUNNING
    sim.run()
    assert big.end == 100 and small.start == 100


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"cores": 9, "time_limit": 10}, "cores"),
        ({"cores": 0, "time_limit": 10}, "cores"),
        ({"cores": 2, "time_limit": 0}, "time"),
        ({"cores": 6, "time_limit": 10, "nodes": 3}, "nodes"),
        ({"cores": 3, "time_limit": 10, "nodes": 2}, "nodes"),
        ({"cores": 8, "time_limit": 10, "nodes": 1}, "nodes"),
        ({"cores": 1, "time_limit": 10, "memory_mb": 10**6}, "mem"),
    ],
)
def test_impossible_requests_are_rejected(kwargs, option):
    sim = cluster(nodes=2, cores=4)
    with pytest.raises(SubmitError) as e:
        sim.submit(**kwargs)
    assert e.value.option == option


# --------------------------------------------------------------- background


def test_background_stream_replays_with_recorded_runtimes():
    stream = JobStream(
        submit=np.array([0.0, 0.0, 5.0]),
        cores=np.array([4, 4, 1]),
        run=np.array([100.0, 20.0, 10.0]),
        limit=np.array([100.0, 50.0, 1000.0]),
    )
    sim = Simulator(ClusterSpec(nodes=1, cores_per_node=4), stream=stream)
    sim.run()
    assert sim.stream_starts.tolist() == [0.0, 100.0, 120.0]


def test_stream_jobs_and_submitted_jobs_share_the_queue():
    stream = JobStream(np.array([10.0]), np.array([4]), np.array([50.0]), np.array([60.0]))
    sim = Simulator(ClusterSpec(nodes=1, cores_per_node=4), stream=stream)
    pilot = sim.submit(4, 100)  # at 0
    sim.run()
    assert pilot.end == 100 and sim.stream_starts[0] == 100


def test_the_scheduler_foresees_ends_at_time_limits_and_no_new_arrivals():
    """Slurm's ``sbatch --test-only`` plans with what it knows: running and queued jobs end at
    their limits, and no job arrives that has not. The what-if replay knows the true ends."""
    stream = JobStream(
        submit=np.array([0.0, 0.0, 20.0]),
        cores=np.array([4, 8, 4]),
        run=np.array([100.0, 20.0, 10.0]),
        limit=np.array([1000.0, 50.0, 10.0]),
    )
    sim = Simulator(ClusterSpec(nodes=2, cores_per_node=4), stream=stream)
    sim.advance_to(10.0)  # the first job holds a node; the second, of both nodes, waits
    # a pilot ending before the waiting job's reservation (at 1000) fills the free node now
    assert sim.expected_wait(4, 500.0) == 0.0
    # a longer one starts after the waiting job, which is foreseen at 1000 to 1050
    assert sim.expected_wait(4, 2000.0) == 1040.0
    assert sim.what_if_wait(4, 2000.0) == 110.0  # the first job really ends at 100
    sim.run()  # asking changed nothing here
    assert sim.stream_starts.tolist() == [0.0, 100.0, 20.0]


def test_the_backend_foresees_a_wait_and_none_for_a_pilot_it_would_refuse():
    async def main():
        mock = MockSlurm(ClusterSpec(nodes=1, cores_per_node=4))
        await mock.submit(PilotRequest("load", cores=4, time_limit_s=3600))
        behind = PilotRequest("p", cores=2, time_limit_s=90)
        return await mock.expected_wait(behind), await mock.expected_wait(
            PilotRequest("wide", cores=8, time_limit_s=60)
        )

    assert clock.run(main(), virtual=True) == (3600.0, None)


def test_the_foresight_of_a_replacement_leaves_out_the_pilot_it_replaces():
    """A 4-core job holds one of two nodes for an hour; our pilot of both nodes waits for it
    with the reservation. A pilot of a node and two hours cannot backfill before it, but in
    its place (the wide one cancelled) it starts now."""

    async def main():
        mock = MockSlurm(ClusterSpec(nodes=2, cores_per_node=4))
        await mock.submit(PilotRequest("load", cores=4, time_limit_s=3600))
        wide = await mock.submit(PilotRequest("wide", cores=8, time_limit_s=3600))
        narrow = PilotRequest("narrow", cores=4, time_limit_s=7200)
        return await mock.expected_wait(narrow), await mock.expected_wait(narrow, wide)

    assert clock.run(main(), virtual=True) == (7200.0, 0.0)


# --------------------------------------------------------- asyncio adapter


def test_adapter_delivers_updates_in_order_with_times():
    async def main():
        mock = MockSlurm(ClusterSpec(nodes=2, cores_per_node=4))
        t0 = clock.now()
        a = await mock.submit(PilotRequest("a", cores=8, time_limit_s=3 * 3600))
        b = await mock.submit(
            PilotRequest(
                "b", cores=4, nodes=1, time_limit_s=7 * 3600 - 30,
                dependency=Dependency("afterany", (a,)),
            )
        )  # fmt: skip
        seen = []
        async for info in mock.updates():
            seen.append(info)
            if info.job_id == a and info.state is S.RUNNING:
                await clock.sleep(3600)
                await mock.release(a)
            if info.job_id == b and info.state.finished:
                final = await mock.info(b)
                break
        await mock.close()
        return a, b, seen, final, clock.now() - t0

    a, b, seen, final, elapsed = clock.run(main(), virtual=True)
    clock_times = [(i.submit_time, i.eligible_time, i.start_time, i.end_time) for i in seen]
    assert [(i.job_id, i.state, i.reason) for i in seen] == [
        (a, S.PENDING, "Priority"),
        (a, S.RUNNING, ""),
        (b, S.PENDING, "Dependency"),
        (a, S.COMPLETED, ""),
        (b, S.PENDING, "Priority"),
        (b, S.RUNNING, ""),
        (b, S.TIMEOUT, "TimeLimit"),
    ]
    assert clock_times == [
        (0, 0, None, None),
        (0, 0, 0, None),
        (0, None, None, None),
        (0, 0, 0, 3600),
        (0, 3600, None, None),
        (0, 3600, 3600, None),
        (0, 3600, 3600, 8 * 3600),  # the limit is rounded up to whole minutes
    ]
    assert elapsed == 8 * 3600
    assert (final.eligible_time, final.start_time, final.wait) == (3600, 3600, 0)
    assert len(final.nodes) == 1 and final.nodes[0].cores == 4


def test_adapter_starts_at_the_loop_time_and_simulates_ten_hours():
    """Forty pilots over ten hours of background load, on virtual time."""

    async def main():
        await clock.sleep(1000)  # the mock's clock starts where the loop is
        stream_mock = MockSlurm.from_trace("KTH", start_job=10_000, warmup=86400)
        ids = []
        for i in range(40):
            ids.append(await stream_mock.submit(PilotRequest(f"p{i}", cores=8, time_limit_s=1800)))
            await clock.sleep(900)
        ended = {}
        async for info in stream_mock.updates():
            if info.state.finished:
                ended[info.job_id] = info
                if len(ended) == len(ids):
                    break
        await stream_mock.close()
        return ids, ended, clock.now()

    ids, ended, now = clock.run(main(), virtual=True)
    assert set(ended) == set(ids)
    for info in ended.values():
        assert info.state is S.TIMEOUT and info.end_time - info.start_time == 1800
        assert info.start_time >= info.eligible_time == info.submit_time >= 1000
    assert now >= 1000 + 10 * 3600


def test_adapter_without_background_is_an_empty_cluster():
    async def main():
        mock = MockSlurm()
        job = await mock.submit(PilotRequest("a", cores=32, time_limit_s=60))
        info = await mock.info(job)
        with pytest.raises(SubmitError) as e:
            await mock.submit(PilotRequest("b", cores=1, time_limit_s=60, partition="gpu"))
        with pytest.raises(KeyError):
            await mock.info("12345")
        mock.fail_node(info.nodes[0].node)
        failed = await mock.info(job)
        await mock.close()
        return info, failed, e.value.option

    info, failed, option = clock.run(main(), virtual=True)
    assert info.state is S.RUNNING and info.wait == 0
    assert failed.state is S.NODE_FAIL
    assert option == "partition"


def test_adapter_cancels_pending_pilots():
    async def main():
        mock = MockSlurm(ClusterSpec(nodes=1, cores_per_node=4))
        first = await mock.submit(PilotRequest("a", cores=4, time_limit_s=600))
        second = await mock.submit(PilotRequest("b", cores=4, time_limit_s=600))
        await asyncio.sleep(10)
        await mock.cancel(second)
        await mock.release(first)
        return await mock.info(first), await mock.info(second)

    first, second = clock.run(main(), virtual=True)
    assert (first.state, first.end_time) == (S.COMPLETED, 10)
    assert (second.state, second.start_time, second.end_time) == (S.CANCELLED, None, 10)
    assert math.isclose(first.wait, 0)
