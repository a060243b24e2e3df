"""The pool's count of attempts per pilot agrees with its workers' slots, whatever happens."""

from hypothesis import given, settings
from hypothesis import strategies as st
from nodes import Node

from learners.resources import Resources
from orchestrator.pool import Pool

TASK = Resources(cores=1, memory=100, disk=10)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("jplr"), st.integers(0, 5)), max_size=60))
def test_a_pilot_is_busy_exactly_while_one_of_its_workers_runs_an_attempt(ops):
    pool = Pool()
    pilots = ("p0", "p1")
    placed: list[str] = []  # the worker of each attempt running
    for op, n in ops:
        worker_id = f"w{n}"
        if op == "j":  # joins (again: afresh, as a restarted worker)
            pool.join(Node(worker_id, pilots[n % 2]), pilots[n % 2], frozenset({"s"}))
            placed = [w for w in placed if w != worker_id]
        elif op == "p" and (slot := pool.place("s", TASK, 0.0)) is not None:
            placed.append(slot.worker.id)
        elif op == "l":  # leaves with its attempts
            pool.leave(worker_id)
            placed = [w for w in placed if w != worker_id]
        elif op == "r" and worker_id in placed:
            pool.release(worker_id, TASK)
            placed.remove(worker_id)
        running = {p: 0 for p in pilots}
        for w in placed:
            running[pilots[int(w[1:]) % 2]] += 1
        assert {p: pool.busy(p) for p in pilots} == {p: running[p] > 0 for p in pilots}
