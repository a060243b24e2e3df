"""Where jobs run: free cores and memory per node, and best-fit placement as Slurm does it.

Slurm's node selection takes the tightest set of nodes that holds the whole
request, or else the largest set and repeats for the rest; per node that is:
the fullest node that can hold the rest, else the emptiest node. It keeps whole
nodes free for jobs that need them and spreads a job over few nodes. Nodes are
kept in buckets by free cores, so a placement costs a few steps per node used,
not a pass over the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

import numpy as np

EPS = 1e-6

Placement = tuple[list[int], list[int]]  # node indices, cores on each


class Nodes:
    """Free cores and memory of identical nodes; failed nodes have nothing free."""

    def __init__(self, count: int, cores: int, memory_mb: float) -> None:
        self.cores = cores
        self.memory = float(memory_mb)
        self.free_cores = [cores] * count
        self.free_mem = [self.memory] * count
        self.up = [True] * count
        self.free_total = count * cores  # free cores on nodes that are up
        self._levels: list[dict[int, None]] = [{} for _ in range(cores + 1)]
        self._levels[cores] = dict.fromkeys(range(count))

    def best_fit(self, count: int) -> Placement | None:
        """``count`` cores wherever they are free (memory not considered)."""
        return best_fit(count, self._levels)

    def take(self, placement: Placement, mem_per_core: float) -> None:
        levels, free, mem = self._levels, self.free_cores, self.free_mem
        for node, k in zip(*placement, strict=True):
            f = free[node]
            del levels[f][node]
            free[node] = f = f - k
            if f:
                levels[f][node] = None
            mem[node] -= k * mem_per_core
            self.free_total -= k

    def give(self, placement: Placement, mem_per_core: float) -> None:
        levels, free, mem = self._levels, self.free_cores, self.free_mem
        for node, k in zip(*placement, strict=True):
            f = free[node]
            if f:
                del levels[f][node]
            free[node] = f = f + k
            levels[f][node] = None
            mem[node] += k * mem_per_core
            self.free_total += k

    def fail(self, node: int) -> None:
        """Take a node (with no jobs left on it) away."""
        if not self.up[node]:
            return
        f = self.free_cores[node]
        if f:
            del self._levels[f][node]
        self.free_total -= f
        self.free_cores[node], self.free_mem[node], self.up[node] = 0, 0.0, False

    def restore(self, node: int) -> None:
        if self.up[node]:
            return
        self.free_cores[node], self.free_mem[node], self.up[node] = self.cores, self.memory, True
        self._levels[self.cores][node] = None
        self.free_total += self.cores

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Free cores and memory per node as arrays, for placements under constraints."""
        return np.array(self.free_cores, np.int64), np.array(self.free_mem)


def best_fit(count: int, levels: Sequence[Iterable[int]]) -> Placement | None:
    """``count`` cores from nodes bucketed by free cores (``levels[f]``: nodes with ``f``).

    The fullest node that holds all the rest ends the search; while none does,
    the emptiest nodes are taken whole.
    """
    pools: dict[int, Iterator[int]] = {}
    nodes: list[int] = []
    cores: list[int] = []
    need, top = count, len(levels) - 1
    while True:
        for level in range(need, top + 1):
            pool = pools.get(level)
            if pool is None:
                pool = pools[level] = iter(levels[level])
            node = next(pool, None)
            if node is not None:
                nodes.append(node)
                cores.append(need)
                return nodes, cores
        top = min(top, need - 1)  # no node left can hold the rest
        while top:
            pool = pools.get(top)
            if pool is None:
                pool = pools[top] = iter(levels[top])
            whole = list(islice(pool, (need - 1) // top))  # leaves 1..top cores to place
            if whole:
                break
            top -= 1
        else:
            return None
        nodes += whole
        cores += [top] * len(whole)
        need -= top * len(whole)


def place(
    count: int,
    nodes: int | None,
    mem_per_core: float,
    free_cores: np.ndarray,
    free_mem: np.ndarray,
) -> Placement | None:
    """Best fit within per-node limits: exactly ``nodes`` nodes if given, and memory."""
    if nodes is not None:
        per = count // nodes
        ok = np.flatnonzero((free_cores >= per) & (free_mem >= per * mem_per_core - EPS))
        if ok.size < nodes:
            return None
        chosen = ok[np.argsort(free_cores[ok], kind="stable")[:nodes]]
        return chosen.tolist(), [per] * nodes
    cap = free_cores
    if mem_per_core > 0:
        cap = np.minimum(cap, ((free_mem + EPS) // mem_per_core).astype(np.int64))
    cap = np.maximum(cap, 0)
    if int(cap.sum()) < count:
        return None
    caps = cap.tolist()
    levels: list[list[int]] = [[] for _ in range(max(caps) + 1)]
    for node in np.flatnonzero(cap).tolist():
        levels[caps[node]].append(node)
    return best_fit(count, levels)
