"""The naive baselines: a whole worker, and what the user asked for.

(Max seen, the third naive baseline of the bucketing paper, is cctools' ``max`` category
mode and lives with its siblings in :mod:`learners.sizing.tovar`.)
"""

from __future__ import annotations

from learners.resources import Resource
from learners.sizing.base import Record, TaskFeatures


class WholeWorker:
    """Every attempt gets a whole worker's worth (the bucketing paper's baseline: never fails,
    wastes most)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity

    def first(self, task: TaskFeatures) -> float:
        return self.capacity

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        return self.capacity

    def observe(self, value: float, record: Record) -> None:
        """Nothing to learn."""

    def exhausted(self, allocated: float, measured: float) -> None:
        """Nothing to learn."""


class UserRequest:
    """What the task requested (a whole worker when it requested nothing); retries double.

    The "user default" of the k-Segments and Ponder papers (Bader et al.): nf-core's
    requests, often far above the peaks.
    """

    def __init__(self, resource: Resource, capacity: float) -> None:
        self.resource = resource
        self.capacity = capacity

    def first(self, task: TaskFeatures) -> float:
        return task.requested.get(self.resource, self.capacity)

    def retry(self, task: TaskFeatures, allocated: float, measured: float) -> float:
        return 2 * allocated

    def observe(self, value: float, record: Record) -> None:
        """Nothing to learn."""

    def exhausted(self, allocated: float, measured: float) -> None:
        """Nothing to learn."""
