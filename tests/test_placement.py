"""Node bookkeeping and best-fit placement stay consistent under any sequence of operations."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.sim.placement import Nodes, best_fit, place


def check(nodes: Nodes, count: int) -> None:
    up_free = [f for f, up in zip(nodes.free_cores, nodes.up, strict=True) if up]
    assert nodes.free_total == sum(up_free)
    for level, bucket in enumerate(nodes._levels):
        assert all(nodes.free_cores[n] == level and nodes.up[n] for n in bucket)
    assert sum(len(b) for b in nodes._levels[1:]) == sum(1 for f in up_free if f)


@settings(max_examples=200, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 8)),
    ops=st.lists(st.tuples(st.sampled_from("tgfr"), st.integers(1, 40)), max_size=40),
)
def test_nodes_stay_consistent(shape, ops):
    count, cores = shape
    nodes = Nodes(count, cores, 1000.0 * cores)
    running = []
    for op, n in ops:
        if op == "t":
            placement = nodes.best_fit(n)
            assert (placement is None) == (n > nodes.free_total)
            if placement is None:
                continue
            idx, k = placement
            assert sum(k) == n and len(set(idx)) == len(idx)
            assert all(0 < c <= nodes.free_cores[i] for i, c in zip(idx, k, strict=True))
            if any(f >= n for f in nodes.free_cores):  # one node holds it: the fullest such
                assert k == [n] and nodes.free_cores[idx[0]] == min(
                    f for f in nodes.free_cores if f >= n
                )
            nodes.take(placement, 1000.0)
            running.append(placement)
        elif op == "g" and running:
            nodes.give(running.pop(n % len(running)), 1000.0)
        elif op == "f":
            node = n % count
            for placement in [p for p in running if node in p[0]]:
                running.remove(placement)
                nodes.give(placement, 1000.0)
            nodes.fail(node)
        elif op == "r":
            nodes.restore(n % count)
        check(nodes, count)
        assert all(m >= -1e-6 for m in nodes.free_mem)


def test_best_fit_spills_over_the_emptiest_nodes():
    levels = [[], [5, 6], [3], [], [1, 2]]  # node 5 and 6 have 1 free, node 3 has 2, ...
    assert best_fit(9, levels) == ([1, 2, 5], [4, 4, 1])
    assert best_fit(2, levels) == ([3], [2])
    assert best_fit(12, levels) == ([1, 2, 3, 5, 6], [4, 4, 2, 1, 1])
    assert best_fit(13, levels) is None


def test_place_respects_memory_and_node_counts():
    cores = np.array([4, 4, 2])
    mem = np.array([1000.0, 8000.0, 8000.0])
    assert place(3, None, 2000.0, cores, mem) == ([1], [3])  # node 0 lacks memory
    assert place(8, None, 2000.0, cores, mem) is None  # 4 + 2 usable cores
    assert place(4, 2, 2000.0, cores, mem) == ([2, 1], [2, 2])  # fullest nodes first
    assert place(8, 2, 2000.0, cores, mem) is None  # node 1 lacks memory for 4 cores
