"""The incremental scheduler against a plain EASY backfill that rescans all at every event."""

import numpy as np
import pytest

from backends.sim.simulator import Simulator
from backends.sim.site import UserLimits
from backends.sim.workload import ClusterSpec, JobStream


def reference_starts(
    stream: JobStream, total: int, backfill: bool, limits: UserLimits | None = None
) -> list[float]:
    """EASY as the textbook states it, with no incremental state at all; with ``limits``,
    a job whose user already runs that many jobs or cores is passed over."""
    n = len(stream)
    submit, cores = stream.submit.tolist(), stream.cores.tolist()
    run, limit, user = stream.run.tolist(), stream.limit.tolist(), stream.user.tolist()
    start = [float("nan")] * n
    queue: list[int] = []
    running: list[int] = []
    arrived, now = 0, 0.0

    def allowed(j: int) -> bool:
        if limits is None:
            return True
        mine = [k for k in running if user[k] == user[j]]
        return len(mine) < limits.jobs and sum(cores[k] for k in mine) + cores[j] <= limits.cores

    while arrived < n or queue or running:
        ends = [start[j] + run[j] for j in running]
        now = min([*ends, submit[arrived] if arrived < n else float("inf")])
        running = [j for j in running if start[j] + run[j] > now]
        while arrived < n and submit[arrived] <= now:
            queue.append(arrived)
            arrived += 1
        free = total - sum(cores[j] for j in running)
        again = True
        while again:  # a backfilled job may bring the head's user to its limit: rescan
            again = False
            head = None
            for j in list(queue):
                if not allowed(j):
                    continue
                if cores[j] > free:
                    head = j
                    break
                queue.remove(j)
                start[j], free = now, free - cores[j]
                running.append(j)
            if head is None or not backfill:
                break
            freed, shadow, extra = 0, float("inf"), float("inf")
            for end in sorted({start[j] + limit[j] for j in running}):
                freed += sum(cores[j] for j in running if start[j] + limit[j] == end)
                if free + freed >= cores[head]:
                    shadow, extra = end, free + freed - cores[head]
                    break
            for j in list(queue[queue.index(head) + 1 :]):
                short = now + limit[j] <= shadow
                if cores[j] <= free and (short or cores[j] <= extra) and allowed(j):
                    queue.remove(j)
                    start[j], free = now, free - cores[j]
                    running.append(j)
                    if not short:
                        extra -= cores[j]
                    if not allowed(head):
                        again = True
                        break
    return start


def random_stream(seed: int, n: int, total: int) -> JobStream:
    rng = np.random.default_rng(seed)
    submit = np.sort(rng.integers(0, n * 20, n)).astype(float)  # bursts share seconds
    cores = np.minimum(rng.geometric(0.25, n), total)
    limit = rng.choice([60.0, 300.0, 900.0, 3600.0], n)
    run = np.minimum(np.round(limit * rng.uniform(0.05, 1.2, n)), limit)
    user = rng.integers(0, 4, n)
    return JobStream(submit, cores, run, limit, user)


@pytest.mark.parametrize("backfill", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_matches_reference_easy(seed, backfill):
    total = 16
    stream = random_stream(seed, 300, total)
    shape = ClusterSpec(nodes=4, cores_per_node=4) if seed % 2 else ClusterSpec(16, 1)
    sim = Simulator(shape, stream=stream, backfill=backfill)
    sim.run()
    expected = reference_starts(stream, total, backfill)
    assert sim.stream_starts.tolist() == expected


def test_matches_reference_over_queue_compactions():
    stream = random_stream(99, 2500, 16)  # thousands of slots die: the queue compacts
    sim = Simulator(ClusterSpec(16, 1), stream=stream)
    sim.run()
    assert sim.stream_starts.tolist() == reference_starts(stream, 16, backfill=True)


@pytest.mark.parametrize("seed", range(8))
def test_matches_reference_under_per_user_limits(seed):
    stream = random_stream(seed, 300, 16)
    limits = UserLimits(jobs=2, cores=max(6, int(stream.cores.max())))
    shape = ClusterSpec(nodes=4, cores_per_node=4) if seed % 2 else ClusterSpec(16, 1)
    sim = Simulator(shape, stream=stream, limits=limits)
    sim.run()
    expected = reference_starts(stream, 16, backfill=True, limits=limits)
    assert sim.stream_starts.tolist() == expected
    assert sim.stream_starts.tolist() != reference_starts(stream, 16, backfill=True)
