"""The sizer's state as a run uses it: one per workflow in the store, saved as it learns.

What a run learnt of a workflow's tasks serves its next run, as the queue-wait
learner's state does (orchestrator/waits.py): the first tasks of a category start
from the records of the last run instead of from nothing. The sizer keeps its
state as plain data (``state()`` / ``restore()``); this module only moves it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from backends import clock
from learners.resources import Resources
from learners.sizing.composite import PRIOR_FLOOR
from orchestrator.store import Store
from workflows.spec import Allocation, Stage


@runtime_checkable
class Remembering(Protocol):
    """A sizer whose state can outlive a run."""

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


@dataclass
class SizingState:
    """Loads a workflow's sizer state into a sizer, and saves it when it changed.

    The state grows with what the sizer has seen, so it is saved at most every ``every_s``
    seconds of wall time (and once more when the run ends): a crash loses at most that much
    learning, never a task.
    """

    sizer: Remembering
    name: str
    saved: dict[str, Any] | None = None
    every_s: float = 2.0
    _due: float = field(default=-math.inf, repr=False)

    @classmethod
    async def load(
        cls, store: Store, workflow: str, sizer: object, every_s: float = 2.0
    ) -> SizingState | None:
        """The state of ``workflow`` restored into ``sizer`` (None: a sizer without state)."""
        if not isinstance(sizer, Remembering):
            return None
        name = store_name(workflow)
        state = await store.load_learner(name)
        if state is not None:
            sizer.restore(state)
        return cls(sizer, name, sizer.state(), every_s)

    async def save(self, store: Store, *, final: bool = False) -> None:
        now = clock.monotonic()
        if now < self._due and not final:
            return
        self._due = now + self.every_s
        state = self.sizer.state()
        if state != self.saved:
            await store.save_learner(self.name, state)
            self.saved = state


def store_name(workflow: str) -> str:
    """One sizer state per workflow in a store: ``sizing/<workflow>``."""
    return f"sizing/{workflow}"


UNKNOWN_DISK_SHARE_MB = 1024.0
"""A task's share of disk where the batch system does not tell its nodes' disk: a stage's first
tasks start side by side with this much each and grow on exhaustion, rather than each with a
share of a disk size made up, which may let only one of them fit on the real disk at a time."""


def stage_share(
    stage: Stage, worker: Resources, tasks: int, disk_known: bool = True
) -> dict[str, float]:
    """A task's share of its stage's allocation: the stage's nodes (``worker`` each) over the
    tasks that run at once, its ``tasks`` or fewer where what each takes at least (what it
    declares, and a core, as Slurm gives) fits fewer (112 tasks on 28 cores: 28 at once, each
    a 28th of the memory, not a 112th, which would start them all below what they may need);
    a stage's first tasks sized so all that fit run side by side."""
    nodes = _nodes(stage.allocation, worker)
    packed = ("cores", "memory", "disk")
    known = packed if disk_known else ("cores", "memory")
    least = {"cores": PRIOR_FLOOR["cores"], **stage.tasks.declared}
    fits = [nodes * (worker[r] // least[r]) for r in known if least.get(r, 0) > 0]
    count = max(1, min([tasks, *fits]))
    share = {r: worker[r] * nodes / count for r in packed}
    if not disk_known:
        share["disk"] = UNKNOWN_DISK_SHARE_MB
    return share


def _nodes(allocation: Allocation, worker: Resources) -> int:
    if allocation.nodes is not None:
        return allocation.nodes
    return max(1, -(-allocation.cores // max(int(worker.cores), 1)))
