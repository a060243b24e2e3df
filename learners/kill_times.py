"""When a real monitor kills an attempt that exceeds its memory or disk, and what it has seen then.

A trace that records only a task's peak cannot say when an attempt given less
would have been killed. This is what the real runs of the bucketing paper
(Phung & Thain, IPDPS 2024: the authors' TaskVine transaction logs of the five
synthetic workflows under Greedy and Exhaustive Bucketing, min-waste, max-throughput
and max-seen, 8,222 killed attempts) show, as quantiles:

- ``fraction``: the killed attempt's wall time over the wall time of the same task's
  successful attempt, per resource and per bin of allocation / true peak. Memory is
  exceeded within the first seconds whatever the allocation (median 0.034-0.067 of
  the run); disk fills up during the run, so a tighter allocation is killed later.
- ``reached``: where the value the monitor reported lies between the allocation
  (0) and the task's true peak (1).

``bench/sizing_kill_times.py`` recomputes the table from the logs (:func:`fit`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

RATIO_EDGES = (0.2, 0.4, 0.6, 0.8)
"""Upper edges of the allocation / peak bins but the last (0-0.2, ..., 0.8 and above)."""
LEVELS = (*(i / 10 for i in range(10)), 0.95, 0.99, 1.0)
"""The quantile levels of the tables: 0, 0.1, ..., 0.9, then 0.95, 0.99 and 1. A draw
interpolates between levels, so without the last two the top tenth of the draws spread
evenly from the 90% quantile to the largest kill: near-peak disk kills came after 2.1
times the task's run in 5.6% of the draws, against 0.4% (3 of 705) in the logs."""


@dataclass(frozen=True, slots=True)
class KillTimes:
    """Quantiles at :data:`LEVELS`: ``fraction[resource][bin]`` and ``reached[resource]``."""

    fraction: Mapping[str, tuple[tuple[float, ...], ...]]
    reached: Mapping[str, tuple[float, ...]]

    def draw(
        self, resource: str, allocation: float, peak: float, rng: np.random.Generator
    ) -> tuple[float, float]:
        """(share of the run at which the attempt is killed, value the monitor reports)."""
        ratio = allocation / peak if peak > 0 else 0.0
        table = self.fraction[resource][int(np.searchsorted(RATIO_EDGES, ratio, side="right"))]
        u_time, u_value = rng.random(2)
        fraction = float(np.interp(u_time, LEVELS, table))
        reached = float(np.interp(u_value, LEVELS, self.reached[resource]))
        return fraction, allocation + reached * max(peak - allocation, 0.0)


def fit(samples: Iterable[tuple[str, float, float, float]]) -> KillTimes:
    """The table from killed attempts: (resource, allocation / peak, wall time / successful
    wall time, (reported - allocation) / (peak - allocation)).

    An attempt killed for two resources counts for each; a bin without samples takes
    its resource's quantiles over all bins.
    """
    by: dict[str, list[tuple[float, float, float]]] = {}
    for resource, ratio, fraction, reached in samples:
        by.setdefault(resource, []).append((ratio, fraction, reached))
    fraction, reached = {}, {}
    for resource, rows in sorted(by.items()):
        values = np.array(rows)
        bins = np.searchsorted(RATIO_EDGES, values[:, 0], side="right")
        every = _quantiles(values[:, 1])
        fraction[resource] = tuple(
            _quantiles(values[bins == b, 1]) if (bins == b).any() else every
            for b in range(len(RATIO_EDGES) + 1)
        )
        reached[resource] = _quantiles(np.clip(values[:, 2], 0.0, 1.0))
    return KillTimes(fraction, reached)


def _quantiles(values: np.ndarray) -> tuple[float, ...]:
    return tuple(round(float(q), 4) for q in np.quantile(values, LEVELS))


# A row of quantiles at LEVELS: the tenths on one line, then 0.95, 0.99 and 1; per
# resource, a row a bin of allocation / peak.
# fmt: off
CALIBRATED = KillTimes(
    fraction={
        "disk": (
            (0.0227, 0.0342, 0.0672, 0.0675, 0.0679, 0.075, 0.1008, 0.1013, 0.1334, 0.1393,
             0.181, 0.2939, 0.4348),
            (0.034, 0.0678, 0.101, 0.1336, 0.1345, 0.1674, 0.1721, 0.2035, 0.267, 0.3043,
             0.369, 0.505, 1.0278),
            (0.0341, 0.1204, 0.1346, 0.1676, 0.2008, 0.2342, 0.2387, 0.3009, 0.3383, 0.4687,
             0.5572, 0.9327, 1.8722),
            (0.0341, 0.1347, 0.2013, 0.2678, 0.3319, 0.3684, 0.4674, 0.5987, 0.737, 1.0917,
             1.4078, 1.6973, 2.4049),
            (0.0344, 0.2013, 0.2994, 0.3671, 0.4363, 0.5283, 0.5997, 0.7306, 0.8639, 0.951,
             1.0971, 1.5974, 3.3327),
        ),
        "memory": (
            (0.0067, 0.0336, 0.034, 0.034, 0.0341, 0.0342, 0.0343, 0.0352, 0.0372, 0.0672,
             0.0678, 0.0707, 0.1682),
            (0.0117, 0.0339, 0.034, 0.0341, 0.0342, 0.0343, 0.0364, 0.0669, 0.0677, 0.0691,
             0.0722, 0.135, 0.304),
            (0.0117, 0.0339, 0.034, 0.0341, 0.0342, 0.0343, 0.0356, 0.0375, 0.0672, 0.0681,
             0.0729, 0.1415, 0.3345),
            (0.0226, 0.034, 0.0341, 0.0347, 0.0391, 0.0671, 0.0676, 0.0692, 0.0727, 0.101,
             0.1236, 0.2058, 0.3396),
            (0.015, 0.034, 0.0342, 0.0354, 0.0443, 0.0673, 0.0677, 0.0698, 0.0805, 0.109,
             0.2623, 0.9981, 1.0046),
        ),
    },
    reached={
        "disk":
            (0.0002, 0.0106, 0.0236, 0.0385, 0.0563, 0.0775, 0.109, 0.1604, 0.2644, 0.7384,
             1.0, 1.0, 1.0),
        "memory":
            (0.0003, 0.0513, 0.099, 0.16, 0.2601, 0.4334, 0.703, 0.9804, 0.9995, 1.0,
             1.0, 1.0, 1.0),
    },
)
"""The table of the bucketing paper's logs (``bench/sizing_kill_times.py``)."""
# fmt: on

MEDIANS: dict[str, tuple[float, ...]] = {
    r: tuple(float(np.interp(0.5, LEVELS, row)) for row in rows)
    for r, rows in CALIBRATED.fraction.items()
}
"""Median share of its run a killed attempt ran, per resource and bin of allocation / peak."""
KILL_SHARE: dict[str, float] = {r: medians[-1] for r, medians in MEDIANS.items()}
"""Median share of its run an attempt allocated near its peak runs before it is killed, per
resource (memory within seconds, disk as it fills)."""
BY_ALLOCATION: frozenset[str] = frozenset({"disk"})
"""Resources whose kill comes the later the closer the allocation lies to the task's peak: disk
fills during the run (median 0.075 of the run below a fifth of the peak, 0.528 from 0.8 of
it), while memory is exceeded within the first seconds whatever the allocation (0.034 to 0.067
of the run in every bin: the monitor's first or second sample)."""


def kill_share(resource: str, allocation: float, peak: float) -> float:
    """Median share of its run an attempt given ``allocation`` of ``resource``, whose task peaks
    at ``peak``, runs before it is killed: the median of the bin of allocation / peak for
    :data:`BY_ALLOCATION`, else that of an allocation near the peak (:data:`KILL_SHARE`); at
    the run's end for a resource the table does not know."""
    if resource not in BY_ALLOCATION:
        return KILL_SHARE.get(resource, 1.0)
    ratio = allocation / peak if peak > 0 else 0.0
    return MEDIANS[resource][int(np.searchsorted(RATIO_EDGES, ratio, side="right"))]
