"""The site policies read from a log, and the simulator applying them, on hand-written schedules."""

import numpy as np
import pytest

from backends.sim.backend import MockSlurm
from backends.sim.simulator import Simulator
from backends.sim.site import (
    FairShare,
    QueueModel,
    SitePolicy,
    UserLimits,
    node_exclusive_procs,
    user_limits,
)
from backends.sim.swf import read_swf
from backends.sim.workload import ClusterSpec, JobStream, TraceReplay, replayable


def log(tmp_path, rows, max_nodes=None, max_procs=16):
    """An SWF log of (submit, wait, run, procs, user[, status]) rows, limits of 1000 s."""
    header = [f"; MaxProcs: {max_procs}"] + ([f"; MaxNodes: {max_nodes}"] if max_nodes else [])
    lines = []
    for i, (submit, wait, run, procs, user, *status) in enumerate(rows, 1):
        fields = [i, submit, wait, run, procs, -1, -1, procs, 1000, -1, *(status or [1]), user]
        lines.append(" ".join(map(str, [*fields, 1, -1, 1, -1, -1, -1])))
    path = tmp_path / "log.swf"
    path.write_text("\n".join(header + lines) + "\n")
    return read_swf(path)


def stream(*jobs, users=None):
    """Jobs of (submit, cores, run, limit)."""
    submit, cores, run, limit = (np.array(column) for column in zip(*jobs, strict=True))
    return JobStream(submit.astype(float), cores, run.astype(float), limit.astype(float), users)


def starts(sim):
    sim.run()
    return sim.stream_starts.tolist()


# ------------------------------------------------------------ reading the log


def test_node_exclusive_only_where_the_recorded_schedule_fits_whole_nodes(tmp_path):
    # 2 nodes of 4: two 1-processor jobs at once fit a node each
    exclusive = log(tmp_path, [(0, 0, 100, 1, 1), (0, 0, 100, 1, 2), (200, 0, 50, 5, 1)], 2, 8)
    assert node_exclusive_procs(exclusive) == 4
    # three 1-processor jobs at once: on whole nodes they would have needed 3 of 2
    shared = log(tmp_path, [(0, 0, 100, 1, 1), (0, 0, 100, 1, 2), (0, 0, 100, 1, 3)], 2, 8)
    assert node_exclusive_procs(shared) == 1
    assert node_exclusive_procs(log(tmp_path, [(0, 0, 100, 1, 1)], 8, 8)) == 1  # 1 per node
    assert node_exclusive_procs(log(tmp_path, [(0, 0, 100, 1, 1)], None, 8)) == 1  # no MaxNodes


def test_user_limits_are_the_most_any_user_ever_ran_at_once(tmp_path):
    rows = [
        (0, 0, 100, 1, 1),
        (10, 0, 100, 2, 1),
        (20, 5, 100, 4, 1),  # user 1: 3 jobs, 7 processors from 25 to 100
        (200, 0, 10, 1, 1),
        (300, 0, 50, 8, 2),  # user 2: one job of 8
        (300, 0, 50, 3, -1),  # unknown user: not a user's
        (300, 0, 50, 3, -1),
    ]
    trace = log(tmp_path, rows)
    assert user_limits(trace) == UserLimits(jobs=3, cores=8)
    assert user_limits(trace, node_procs=4) == UserLimits(jobs=3, cores=12)  # 4 + 4 + 4


def test_the_queue_models_read_the_log(tmp_path):
    rows = [(0, 0, 100, 1, 1), (0, 0, 100, 2, 2), (5, 30, -1, 4, 2, 5)]  # the last: cancelled
    trace = log(tmp_path, rows)
    assert SitePolicy.of(QueueModel.EASY, trace) == SitePolicy()
    site = SitePolicy.of("site", trace)
    assert site.limits == UserLimits(jobs=1, cores=2) and site.fair_share is None
    assert site.withdraw_cancelled and site.withdraws(trace).tolist() == [False, False, True]
    assert SitePolicy.of("fair-share", trace).fair_share == FairShare()
    with pytest.raises(ValueError):
        SitePolicy.of("fifo", trace)


# ------------------------------------------------------------ node granularity


def test_node_exclusive_jobs_hold_whole_nodes(tmp_path):
    trace = log(tmp_path, [(0, 0, 100, 1, 1), (0, 0, 100, 1, 2), (0, 0, 100, 1, 3)], 2, 8)
    site = SitePolicy(node_procs=4)
    jobs = JobStream.from_trace(trace, max_cores=8, site=site)
    assert jobs.cores.tolist() == [4, 4, 4]
    # on the log's machine the third job waits for a whole node; shared, all three run
    assert starts(Simulator(ClusterSpec(2, 4), stream=jobs)) == [0, 0, 100]
    shared = JobStream.from_trace(trace, max_cores=8)
    assert starts(Simulator(ClusterSpec(2, 4), stream=shared)) == [0, 0, 0]


# ------------------------------------------------------------ per-user limits


def test_a_users_job_limit_holds_its_job_back_while_others_pass():
    jobs = stream((0, 2, 100, 100), (1, 2, 50, 50), (2, 2, 10, 10), users=np.array([0, 0, 1]))
    sim = Simulator(ClusterSpec(1, 8), stream=jobs, limits=UserLimits(jobs=1, cores=8))
    assert starts(sim) == [0, 100, 2]  # the second job of user 0 waits for the first
    assert starts(Simulator(ClusterSpec(1, 8), stream=jobs)) == [0, 1, 2]


def test_a_users_core_limit_lets_a_smaller_job_of_the_same_user_by():
    jobs = stream((0, 3, 100, 100), (1, 2, 50, 50), (2, 1, 10, 10), users=np.array([0, 0, 0]))
    sim = Simulator(ClusterSpec(1, 8), stream=jobs, limits=UserLimits(jobs=10, cores=4))
    assert starts(sim) == [0, 100, 2]  # 3 + 2 > 4 cores; 3 + 1 fit


def test_a_job_held_by_its_users_limit_takes_no_reservation():
    # user 0 runs 2 cores; its 4-core job is held by the limit, so user 1's long job may start
    jobs = stream((0, 2, 100, 100), (1, 4, 50, 50), (2, 2, 500, 500), users=np.array([0, 0, 1]))
    limited = Simulator(ClusterSpec(1, 4), stream=jobs, limits=UserLimits(jobs=1, cores=4))
    assert starts(limited) == [0, 502, 2]
    assert starts(Simulator(ClusterSpec(1, 4), stream=jobs)) == [0, 100, 150]  # EASY: held back


def test_leadtimes_own_jobs_are_not_held_by_the_logs_limits():
    jobs = stream((0, 1, 100, 100), users=np.array([0]))
    sim = Simulator(ClusterSpec(1, 8), stream=jobs, limits=UserLimits(jobs=1, cores=1))
    sim.advance_to(1)
    pilots = [sim.submit(2, 60, run=60) for _ in range(3)]
    assert [p.start for p in pilots] == [1, 1, 1]


def test_rotated_copies_have_users_of_their_own():
    jobs = stream((0, 1, 10, 10), (5, 1, 10, 10), users=np.array([0, 1]))
    assert sorted(jobs.rotated_copies(3).user.tolist()) == [0, 1, 2, 3, 4, 5]


# ------------------------------------------------------------ fair share


def test_fair_share_puts_the_lighter_users_job_first():
    # user 1 runs the whole machine 1000-2000 s; user 0 ran it 0-1000 s, long decayed since.
    # At 2000 s both wait: user 1 submitted first, user 0's usage is the smaller.
    jobs = stream(
        (0, 4, 1000, 1000), (1000, 4, 1000, 1000), (1990, 4, 10, 10), (1995, 4, 10, 10),
        users=np.array([0, 1, 1, 0]),
    )  # fmt: skip
    fair = FairShare(half_life=100.0, calc_period=1.0)
    assert starts(Simulator(ClusterSpec(1, 4), stream=jobs))[2:] == [2000, 2010]  # FIFO
    assert starts(Simulator(ClusterSpec(1, 4), stream=jobs, fair_share=fair))[2:] == [2010, 2000]


def test_fair_share_usage_decays_with_its_half_life():
    # user 0 ran 1200 core-seconds until 300 s, user 1 400 until 600 s; both wait at 600 s
    jobs = stream(
        (0, 4, 300, 300), (500, 4, 100, 100), (550, 4, 10, 10), (560, 4, 10, 10),
        users=np.array([0, 1, 1, 0]),
    )  # fmt: skip
    forgetful = FairShare(half_life=50.0, calc_period=1.0)  # user 0's usage has decayed most
    assert starts(Simulator(ClusterSpec(1, 4), stream=jobs, fair_share=forgetful))[2:] == [610, 600]
    mindful = FairShare(half_life=1e6, calc_period=1.0)  # user 0 used three times as much
    assert starts(Simulator(ClusterSpec(1, 4), stream=jobs, fair_share=mindful))[2:] == [600, 610]


# ------------------------------------------------------------ withdrawn jobs


def test_a_cancelled_job_holds_its_place_in_the_queue_until_its_recorded_cancellation(tmp_path):
    rows = [
        (0, 0, 1000, 2, 1),
        (10, 500, -1, 4, 2, 5),  # cancelled at 510 without running; blocked the queue till then
        (20, 0, 2000, 2, 3),  # would run past the reservation of the cancelled job
    ]
    trace = log(tmp_path, rows, max_procs=4)
    site = SitePolicy(withdraw_cancelled=True)
    jobs = JobStream.from_trace(trace, max_cores=4, site=site)
    assert jobs.patience.tolist() == [np.inf, 500, np.inf] and jobs.run.tolist()[1] == 0
    sim = Simulator(ClusterSpec(1, 4), stream=jobs)
    first, cancelled, last = starts(sim)
    assert (first, last) == (0, 510) and np.isnan(cancelled)  # never started
    plain = JobStream.from_trace(trace, max_cores=4)  # without: the job is not replayed
    assert len(plain) == 2 and replayable(trace, 4).tolist() == [True, False, True]
    assert starts(Simulator(ClusterSpec(1, 4), stream=plain)) == [0, 20]


def test_a_withdrawn_job_the_simulator_starts_earlier_ends_at_once(tmp_path):
    trace = log(tmp_path, [(10, 500, -1, 4, 2, 5), (11, 0, 100, 4, 3)], max_procs=4)
    jobs = JobStream.from_trace(trace, max_cores=4, site=SitePolicy(withdraw_cancelled=True))
    assert starts(Simulator(ClusterSpec(1, 4), stream=jobs)) == [10, 11]  # left the cores at 10


# ------------------------------------------------------------ the simulated cluster


def test_a_mock_replays_its_log_under_the_models_policy():
    site = MockSlurm.from_trace("KTH", start_job=1000, warmup=3600)
    assert site.background.site == SitePolicy.of("site", site.background.trace)
    assert site.background.site.limits is not None
    easy = MockSlurm.from_trace("KTH", start_job=1000, warmup=3600, model="easy")
    assert easy.background.site == SitePolicy()
    assert isinstance(site.background, TraceReplay)
