"""The queue-wait learner as a run uses it: one learner per cluster in a store, saved after
every observation.

Every workflow run against the same store on the same cluster shares the learner, as the ASA
paper (Souza et al.) keeps Algorithm 1's state across runs: what one run saw of the queue
serves the next. Waits seen on one cluster (a simulated one, a Slurm cluster) say nothing of
another's, so each cluster has its own; a *scope* named by the user may share one
deliberately; where nothing queues (local processes), :class:`NoQueue` stands in. Runs
sharing a store at the same time never lose each other's updates: an observation is saved by
reading the stored state, applying it, and writing the result in one transaction.

The learner draws a prediction from its distribution (Algorithm 1's action,
scored when the wait is seen). The planner may plan with that draw, or with a
quantile of the same distribution: the cost of a wrong wait is lopsided. A
pilot submitted too early with a dependency costs nothing (it cannot start
before the stages it waits for end), one submitted too late makes the
workflow wait; without a dependency, an early pilot idles. So ``asa`` plans
with a high quantile and ``asa-naive`` with the median, while the learner
itself learns exactly as Algorithm 1 does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from learners.queue_wait import (
    GEOMETRY_FIELDS,
    Alternative,
    Geometry,
    Prediction,
    QueueWaitLearner,
)
from orchestrator.planner import NO_QUEUE
from orchestrator.store import Store
from workflows.spec import Allocation

POLICIES = ("default", "tuned", "greedy")
DEFAULT_POLICY = "tuned"
"""Section 4.5 runs the tuned policy; the default policy needs ~800 waits to settle (bench)."""


def geometry(allocation: Allocation) -> Geometry:
    """The learner's key of an allocation: its cores, node count and partition."""
    return Geometry(cores=allocation.cores, nodes=allocation.nodes, partition=allocation.partition)


class NoQueue:
    """The waits where pilots do not queue (local processes): each pilot starts when it is
    submitted or when its dependency is met, so every wait is 0, known, and nothing is
    learned. It stands in for :class:`QueueWaits`."""

    def predict(self, allocation: Allocation) -> tuple[float, str]:
        return 0.0, NO_QUEUE

    def law(self, allocation: Allocation) -> tuple[tuple[float, float], ...]:
        return ((0.0, 1.0),)

    def outlook(self, allocation: Allocation) -> float:
        return 0.0

    def observe_wait(
        self, allocation: Allocation, prediction: Any, wait: float, planned: float | None = None
    ) -> None:
        """Nothing to learn, and no prediction to score: the wait seen is the pilot's start."""

    async def save(self, store: Store) -> None:
        """Nothing learned, nothing to save."""


@dataclass
class QueueWaits:
    """Predicts waits for the planner and learns the waits the engine observes."""

    learner: QueueWaitLearner
    name: str
    """The learner's name in the store: its cluster (or scope) and geometry key."""
    estimate: float | None = None
    """The quantile of the learned distribution the planner uses; None: the learner's draw."""
    synced: dict[str, Any] | None = None
    """The state as last read from or written to the store."""
    unsaved: list[tuple[Geometry, float, Prediction | None]] = field(default_factory=list)
    """Observations not yet in the store."""
    _laws: dict[Geometry, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """:meth:`law` per geometry until the learner learns: the elastic planner asks it of
    every unit on every pass, and a run of thousands of units' tasks learns few waits."""

    @classmethod
    async def load(
        cls,
        store: Store,
        cluster: str,
        *,
        policy: str = DEFAULT_POLICY,
        seed: int = 0,
        key: Sequence[str] = GEOMETRY_FIELDS,
        estimate: float | None = None,
    ) -> QueueWaits:
        """The store's learner of ``cluster`` for geometries told apart by ``key`` (a fresh
        one if it has none), run with ``policy``; the planner plans with the ``estimate``
        quantile."""
        name = store_name(cluster, key)
        state = await store.load_learner(name)
        if state is None:
            return cls(QueueWaitLearner(policy=policy, seed=seed, key=key), name, estimate)
        return cls(QueueWaitLearner.from_dict(state, policy=policy), name, estimate, state)

    def predict(self, allocation: Allocation) -> tuple[float, Prediction]:
        """The wait to plan with, and the learner's prediction to score when the wait is seen."""
        g = geometry(allocation)
        prediction = self.learner.predict(g)
        if self.estimate is None:
            return prediction.value, prediction
        return quantile(
            self.learner.distribution(g, top=len(self.learner.grid)), self.estimate
        ), prediction

    def law(self, allocation: Allocation) -> tuple[tuple[float, float], ...]:
        """The learned distribution of ``allocation``'s wait, shortest first: (wait in
        seconds, probability). It draws nothing (the elastic planner weighs costs by it)."""
        g = geometry(allocation)
        law = self._laws.get(g)
        if law is None:
            alternatives = self.learner.distribution(g, top=len(self.learner.grid))
            law = self._laws[g] = tuple(sorted((a.value, a.probability) for a in alternatives))
        return law

    def outlook(self, allocation: Allocation) -> float | None:
        """The wait ``allocation``'s geometry last had, None if it was never seen: what an
        automatic allocation weighs widths by. Unlike :meth:`predict` it draws nothing, so
        weighing many geometries changes no state; and it is the freshest evidence of the
        queue there is, where Algorithm 1's distribution takes many waits of a geometry to
        leave its prior."""
        return self.learner.stats(geometry(allocation)).last_wait

    def observe_wait(
        self, allocation: Allocation, prediction: Any, wait: float, planned: float | None = None
    ) -> bool | None:
        """Learn a wait. The plan hit unless it over-predicted the wait: planned above the
        alternative closest to it (Table 2 of the ASA paper), the grid being the tolerance."""
        g = geometry(allocation)
        self.learner.observe(g, wait, prediction)
        self._laws.clear()
        self.unsaved.append((g, wait, prediction))
        if planned is None:
            return None
        return bool(planned <= self.learner.grid[self.learner.closest(wait)])

    async def save(self, store: Store) -> None:
        """Write the new observations; if another run saved meanwhile, apply them to its
        state instead of overwriting it."""
        if not self.unsaved:
            return

        def update(stored: dict[str, Any] | None) -> dict[str, Any]:
            if stored == self.synced:  # nobody else wrote: our state is theirs plus ours
                return self.learner.to_dict()
            assert stored is not None
            merged = QueueWaitLearner.from_dict(stored, policy=self.learner.policy)
            for g, wait, prediction in self.unsaved:
                merged.observe(g, wait, prediction)
            self.learner = merged
            self._laws.clear()
            return merged.to_dict()

        self.synced = await store.update_learner(self.name, update)
        self.unsaved.clear()


def quantile(alternatives: Sequence[Alternative], q: float) -> float:
    """The smallest wait whose cumulative probability reaches ``q``."""
    cumulative = 0.0
    ordered = sorted(alternatives, key=lambda a: a.value)
    for a in ordered:
        cumulative += a.probability
        if cumulative >= q - 1e-12:
            return a.value
    return ordered[-1].value


def store_name(cluster: str, key: Sequence[str]) -> str:
    """One learner per cluster and geometry key in a store:
    ``queue_wait/slurm:kebnekaise/cores+nodes+partition``."""
    return f"queue_wait/{cluster}/" + "+".join(key)


def cluster_of(name: str) -> str:
    """The cluster (or scope) of a learner's :func:`store_name`."""
    return name.removeprefix("queue_wait/").rsplit("/", 1)[0]
