"""An online selector: per category, allocate with the sizer that would have done best so far.

Every candidate sizer sees every record. Before it learns from a record, the selector
asks each candidate what it would have given that task and scores the answer in the
shadow: per resource, the task's use over what the candidate would have allocated, a
kill costing the share of the run the real runs show (:mod:`learners.kill_times`,
median) plus the candidate's retry; cores below the use stretch the run. A
candidate's score is its shadow AWE (the mean over resources) less its share of
shadow kills, so that a candidate buys efficiency with retries only where they are
cheap. A real kill counts against the candidate allocating the category at the time:
the shadow scores a candidate with the records that came after the task started, the
kill shows what it did with the records it had. Within the retry budget the best
score wins, beyond it the fewest kills. A candidate that regresses on the input size
is chosen only in categories whose tasks report one: elsewhere it has nothing to regress
on, and its score differs from the others' by chance (on the bucketing paper's synthetic
workflows, switching on that chance cost up to 0.03 of memory AWE). Until a category has
:data:`WARMUP` scored records the first candidate allocates; retries, real and in the
shadow, follow the first candidate's rule (``budget``'s: from the records above what the
killed attempt reached), as a regression's own retry (Ponder's: its largest allocation, a
whole worker) costs more than the kill.

Scoring and learning wait until an allocation needs them, then take what came in the order
it came, so they end exactly as if done at once: a run whose every task declares its sizes
never pays for them, and its records still reach the history that later runs learn from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from learners.kill_times import KILL_SHARE
from learners.resources import Resources
from learners.sizing.base import Exhaustion, Record, TaskFeatures, Unfittable
from learners.sizing.budget import BUDGET
from learners.sizing.composite import Composite
from learners.sizing.history import History

WARMUP = 5
"""Records a category's shadow scores need before they choose."""


@dataclass
class Shadow:
    """One candidate's account in one category."""

    consumed: dict[str, float] = field(default_factory=dict)
    allocated: dict[str, float] = field(default_factory=dict)
    records: int = 0
    kills: int = 0

    @property
    def killed(self) -> float:
        """Kills per scored record."""
        return self.kills / max(self.records, 1)

    @property
    def score(self) -> float:
        shares = [
            self.consumed[r] / a for r, a in self.allocated.items() if a > 0 and r in self.consumed
        ]
        awe = sum(shares) / len(shares) if shares else 0.0
        return awe - self.killed

    @property
    def rank(self) -> tuple[bool, float]:
        """Within the retry budget first, by score; beyond it, by fewer kills."""
        within = self.killed <= BUDGET
        return within, self.score if within else -self.killed

    def account(self, candidate: Composite, record: Record, retrier: Composite) -> None:
        """What ``candidate``'s allocation for ``record``'s task would have cost, retried by
        ``retrier`` on a kill."""
        self.records += 1
        task, peak = record.task, record.peak
        wall = peak.wall if math.isfinite(peak.wall) else 0.0
        try:
            alloc = candidate.allocate(task)
        except Unfittable:
            self.kills += 1
            return
        packed = candidate.packed
        short = [r for r in packed if r != "cores" and peak[r] > alloc[r] + 1e-9]
        stretch = max(1.0, peak.cores / alloc.cores) if alloc.cores > 0 else 1.0
        retry = alloc
        if short:
            self.kills += 1
            for r in short:
                try:
                    retry = retrier.allocate(task, retry, Exhaustion(r, alloc[r]))
                except Unfittable:
                    return
        for r in packed:
            used = min(peak[r], alloc[r]) if r == "cores" else peak[r]
            self.consumed[r] = self.consumed.get(r, 0.0) + used * wall * stretch
            given = retry[r] * wall * stretch
            if short:
                given += alloc[r] * wall * max(KILL_SHARE.get(s, 0.0) for s in short)
            self.allocated[r] = self.allocated.get(r, 0.0) + given


@dataclass(frozen=True, slots=True)
class _Kill:
    """A real attempt killed, waiting to be learnt."""

    task: TaskFeatures
    allocation: Resources
    exhaustion: Exhaustion


class Selector:
    """A :class:`~learners.sizing.base.Sizer` choosing, per category, among ``candidates``."""

    def __init__(
        self, name: str, candidates: Sequence[Composite], *, by_input: Sequence[bool] = ()
    ) -> None:
        if not candidates:
            raise ValueError("a selector needs candidates")
        if by_input and len(by_input) != len(candidates):
            raise ValueError("by_input needs one flag per candidate")
        self.name = name
        self.candidates = tuple(candidates)
        self.by_input = tuple(by_input) or (False,) * len(self.candidates)
        """Which candidates regress on the input size: chosen only where tasks report one."""
        self._with_input: set[str] = set()
        """Categories some of whose records reported an input size."""
        self.resources = self.candidates[0].resources
        self.worker = self.candidates[0].worker
        self.running = self.candidates[0].running
        """The attempts the executor runs, as the candidates see them."""
        self.history = History()
        self._shadows: dict[str, list[Shadow]] = {}
        self._unlearnt: list[Record | _Kill] = []
        """What ended since the candidates last learnt, oldest first."""

    @property
    def shadows(self) -> dict[str, list[Shadow]]:
        """Each category's candidates' accounts, up to the latest record."""
        self._learn()
        return self._shadows

    def chosen(self, category: str) -> Composite:
        """The candidate with the best shadow score in ``category`` (the first while warming up)."""
        self._learn()
        return self._choice(category)

    def allocate(
        self,
        task: TaskFeatures,
        previous: Resources | None = None,
        exhaustion: Exhaustion | None = None,
    ) -> Resources:
        if all(r in task.declared for r in self.resources):  # nothing learnt can change it
            return self.candidates[0].allocate(task, previous, exhaustion)
        self._learn()
        if exhaustion is not None:
            return self.candidates[0].allocate(task, previous, exhaustion)
        return self._choice(task.category).allocate(task, previous, exhaustion)

    def ready(self, task: TaskFeatures) -> bool:
        """As the first candidate says (it allocates a category's first tasks); what it has
        not learnt yet can only make it ready, so it learns only to say no."""
        first = self.candidates[0]
        if first.ready(task):
            return True
        self._learn()
        return first.ready(task)

    def observe(self, record: Record) -> None:
        self.history.add(record)
        self._unlearnt.append(record)

    def observe_exhaustion(
        self, task: TaskFeatures, allocation: Resources, exhaustion: Exhaustion
    ) -> None:
        self._unlearnt.append(_Kill(task, allocation, exhaustion))

    def _choice(self, category: str) -> Composite:
        shadows = self._shadows.get(category)
        if not shadows or shadows[0].records < WARMUP:
            return self.candidates[0]
        sized = category in self._with_input
        eligible = [i for i in range(len(shadows)) if sized or not self.by_input[i]]
        best = max(eligible, key=lambda i: (*shadows[i].rank, -i))
        return self.candidates[best]

    def _learn(self) -> None:
        """Score and learn what ended since the last time, in the order it ended."""
        unlearnt, self._unlearnt = self._unlearnt, []
        for event in unlearnt:
            match event:
                case Record(task=task):
                    if task.input_size is not None:
                        self._with_input.add(task.category)
                    shadows = self._accounts(task.category)
                    for shadow, candidate in zip(shadows, self.candidates, strict=True):
                        shadow.account(candidate, event, self.candidates[0])
                        candidate.observe(event)
                case _Kill(task=task, allocation=allocation, exhaustion=exhaustion):
                    shadows = self._accounts(task.category)
                    shadows[self.candidates.index(self._choice(task.category))].kills += 1
                    for candidate in self.candidates:
                        candidate.observe_exhaustion(task, allocation, exhaustion)

    def _accounts(self, category: str) -> list[Shadow]:
        return self._shadows.setdefault(category, [Shadow() for _ in self.candidates])

    def capacity(self, task: TaskFeatures) -> Resources:
        return self.candidates[0].capacity(task)

    def state(self) -> dict[str, Any]:
        """What the sizer learnt, as plain data (its latest records)."""
        return self.history.state()

    def restore(self, state: Mapping[str, Any]) -> None:
        """Learn again what :meth:`state` kept (from an earlier run of the same workflow)."""
        for record in History.records(state):
            self.observe(record)
