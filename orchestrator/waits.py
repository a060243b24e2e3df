"""The queue-wait learner as a run uses it: one learner per store, saved after every observation.

Every workflow run against the same store shares the learner, as the ASA paper (Souza et al.)
keeps Algorithm 1's state across runs: what one run saw of the queue serves
the next.

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
from dataclasses import dataclass
from typing import Any

from learners.queue_wait import (
    GEOMETRY_FIELDS,
    Alternative,
    Geometry,
    Prediction,
    QueueWaitLearner,
)
from orchestrator.store import Store
from workflows.spec import Allocation

POLICIES = ("default", "tuned", "greedy")
DEFAULT_POLICY = "tuned"
"""Section 4.5 runs the tuned policy; the default policy needs ~800 waits to settle (bench)."""


def geometry(allocation: Allocation) -> Geometry:
    """The learner's key of an allocation: its cores, node count and partition."""
    return Geometry(cores=allocation.cores, nodes=allocation.nodes, partition=allocation.partition)


@dataclass
class QueueWaits:
    """Predicts waits for the planner and learns the waits the engine observes."""

    learner: QueueWaitLearner
    estimate: float | None = None
    """The quantile of the learned distribution the planner uses; None: the learner's draw."""
    dirty: bool = False

    @classmethod
    async def load(
        cls,
        store: Store,
        *,
        policy: str = DEFAULT_POLICY,
        seed: int = 0,
        key: Sequence[str] = GEOMETRY_FIELDS,
        estimate: float | None = None,
    ) -> QueueWaits:
        """The store's learner for geometries told apart by ``key`` (a fresh one if it has
        none), run with ``policy``; the planner plans with the ``estimate`` quantile."""
        state = await store.load_learner(store_name(key))
        if state is None:
            return cls(QueueWaitLearner(policy=policy, seed=seed, key=key), estimate)
        return cls(QueueWaitLearner.from_dict(state, policy=policy), estimate)

    def predict(self, allocation: Allocation) -> tuple[float, Prediction]:
        """The wait to plan with, and the learner's prediction to score when the wait is seen."""
        g = geometry(allocation)
        prediction = self.learner.predict(g)
        if self.estimate is None:
            return prediction.value, prediction
        return quantile(
            self.learner.distribution(g, top=len(self.learner.grid)), self.estimate
        ), prediction

    def observe_wait(
        self, allocation: Allocation, prediction: Any, wait: float, planned: float | None = None
    ) -> bool | None:
        """Learn a wait. The plan hit unless it over-predicted the wait: planned above the
        alternative closest to it (Table 2 of the ASA paper), the grid being the tolerance."""
        self.learner.observe(geometry(allocation), wait, prediction)
        self.dirty = True
        if planned is None:
            return None
        return bool(planned <= self.learner.grid[self.learner.closest(wait)])

    async def save(self, store: Store) -> None:
        if self.dirty:
            await store.save_learner(store_name(self.learner.key), self.learner.to_dict())
            self.dirty = False


def quantile(alternatives: Sequence[Alternative], q: float) -> float:
    """The smallest wait whose cumulative probability reaches ``q``."""
    cumulative = 0.0
    ordered = sorted(alternatives, key=lambda a: a.value)
    for a in ordered:
        cumulative += a.probability
        if cumulative >= q - 1e-12:
            return a.value
    return ordered[-1].value


def store_name(key: Sequence[str]) -> str:
    """One learner per geometry key in a store: ``queue_wait/cores+nodes+partition``."""
    return "queue_wait/" + "+".join(key)
