"""The pool's count of attempts per pilot agrees with its workers' slots, whatever happens."""

from hypothesis import given, settings
from hypothesis import strategies as st
from nodes import Node

from learners.resources import Resources
from orchestrator.pool import AHEAD_DEPTH, Pool

TASK = Resources(cores=1, memory=100, disk=10)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("jplr"), st.integers(0, 5)), max_size=60))
def test_a_pilot_is_busy_exactly_while_one_of_its_workers_runs_an_attempt(ops):
    pool = Pool()
    pilots = ("p0", "p1")
    placed: list[tuple[str, tuple[str, int]]] = []  # each attempt running: its worker, key
    for op, n in ops:
        worker_id = f"w{n}"
        if op == "j":  # joins (again: afresh, as a restarted worker)
            pool.join(Node(worker_id, pilots[n % 2]), pilots[n % 2], frozenset({"s"}))
            placed = [p for p in placed if p[0] != worker_id]
        elif op == "p" and (slot := pool.place("s", TASK, 0.0)) is not None:
            placed.append((slot.worker.id, ("s.0", len(placed))))
        elif op == "l":  # leaves with its attempts
            pool.leave(worker_id)
            placed = [p for p in placed if p[0] != worker_id]
        elif op == "r" and (mine := [p for p in placed if p[0] == worker_id]):
            pool.release(worker_id, mine[0][1], TASK)
            placed.remove(mine[0])
        running = {p: 0 for p in pilots}
        for w, _ in placed:
            running[pilots[int(w[1:]) % 2]] += 1
        assert {p: pool.busy(p) for p in pilots} == {p: running[p] > 0 for p in pilots}


SIZES = [Resources(cores=c, memory=m, disk=10) for c in (0.5, 1, 2, 3) for m in (100, 1500)]
CAPACITIES = [Resources(cores=c, memory=m, disk=4000) for c in (2, 4) for m in (2000, 4000)]
STAGE_SETS = [frozenset({"a"}), frozenset({"b"}), frozenset({"a", "b"})]


@settings(max_examples=500, deadline=None)
@given(
    st.booleans(),
    st.lists(
        st.tuples(st.sampled_from("jjpppldr"), st.integers(0, 7), st.integers(0, 7)), max_size=80
    ),
)
def test_placement_takes_the_fullest_worker_with_room_of_the_stage_s_own_pilots_first(share, ops):
    """The pool's ordered groups choose, and count a stage's slots, as a scan of every worker
    would; a placement ahead, only if no worker has room, on a worker that queues."""
    pool = Pool(share)
    joined: dict[str, tuple[Node, frozenset[str], Resources]] = {}  # in join order: worker, used
    draining: set[str] = set()
    placed: list[tuple[str, Resources]] = []
    for op, n, k in ops:
        worker_id, pilot = f"w{n}", f"p{n % 3}"
        if op == "j":
            node = Node(worker_id, pilot, CAPACITIES[k % 4], end_time=100.0 * (1 + k % 3))
            node.accepting = k != 7
            node.queues = n % 2 == 0
            pool.join(node, pilot, STAGE_SETS[n % 3])
            joined.pop(worker_id, None)
            joined[worker_id] = (node, STAGE_SETS[n % 3], Resources())
            placed = [p for p in placed if p[0] != worker_id]
        elif op == "l":
            pool.leave(worker_id)
            joined.pop(worker_id, None)
            placed = [p for p in placed if p[0] != worker_id]
        elif op == "d":
            pool.drain(pilot)
            draining.add(pilot)
        elif op == "r" and placed:
            worker_id, size = placed.pop(k % len(placed))
            pool.release(worker_id, ("a.0", k), size)
            node, stages, used = joined[worker_id]
            joined[worker_id] = (node, stages, used.minus(size))
        elif op == "p":
            stage, size, until = "ab"[k % 2], SIZES[(n + k) % len(SIZES)], 50.0 * (k % 5)
            usable = [
                node.capacity
                for node, stages, _ in joined.values()
                if node.pilot_id not in draining
                and node.end_time >= until
                and node.accepting
                and (share or stage in stages)
            ]
            slots = sum(
                int(min(c.cores // size.cores, c.memory // size.memory, c.disk // size.disk))
                for c in usable
            )
            assert pool.slots_for(stage, size, until) == slots
            fits = [
                ((stage not in stages, node.capacity.cores - used.cores), worker_id)
                for worker_id, (node, stages, used) in joined.items()
                if node.pilot_id not in draining
                and node.end_time >= until
                and node.accepting
                and (share or stage in stages)
                and size.fits_in(node.capacity.minus(used))
            ]
            ahead = [
                (
                    (stage not in stages, (1 + AHEAD_DEPTH) * node.capacity.cores - used.cores),
                    worker_id,
                )
                for worker_id, (node, stages, used) in joined.items()
                if node.pilot_id not in draining
                and node.end_time >= until
                and node.accepting
                and node.queues
                and (share or stage in stages)
                and size.fits_in(node.capacity)
                and size.fits_in(scaled(node.capacity, 1 + AHEAD_DEPTH).minus(used))
            ]
            queue = k % 3 == 0
            if not fits and queue:
                fits = ahead
            expected = min(fits, key=lambda f: f[0])[1] if fits else None  # the first of equals
            slot = pool.place(stage, size, until, queue)
            assert (slot and slot.worker.id) == expected
            if slot is not None:
                node, stages, used = joined[expected]
                joined[expected] = (node, stages, used.plus(size))
                placed.append((expected, size))


def scaled(capacity: Resources, k: int) -> Resources:
    return Resources(cores=k * capacity.cores, memory=k * capacity.memory, disk=k * capacity.disk)
