"""The queue-wait learner as a run uses it: one learner per store, saved after every observation.

Every workflow run against the same store shares the learner, as seed 004
keeps Algorithm 1's state across runs: what one run saw of the queue serves
the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from learners.queue_wait import Geometry, Prediction, QueueWaitLearner
from orchestrator.store import Store
from workflows.spec import Allocation

STORE_NAME = "queue_wait"
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
    dirty: bool = False

    @classmethod
    async def load(cls, store: Store, *, policy: str = DEFAULT_POLICY, seed: int = 0) -> QueueWaits:
        """The store's learner (a fresh one if it has none), run with ``policy``."""
        state = await store.load_learner(STORE_NAME)
        if state is None:
            return cls(QueueWaitLearner(policy=policy, seed=seed))
        return cls(QueueWaitLearner.from_dict(state, policy=policy))

    def predict(self, allocation: Allocation) -> tuple[float, Prediction]:
        prediction = self.learner.predict(geometry(allocation))
        return prediction.value, prediction

    def observe_wait(self, allocation: Allocation, prediction: Any, wait: float) -> bool | None:
        """Learn a wait; a hit is any prediction that did not over-predict it (seed 004 Table 2)."""
        observation = self.learner.observe(geometry(allocation), wait, prediction)
        self.dirty = True
        return None if observation.outcome is None else observation.outcome != "over"

    async def save(self, store: Store) -> None:
        if self.dirty:
            await store.save_learner(STORE_NAME, self.learner.to_dict())
            self.dirty = False
