"""An online selector: per category, allocate with the sizer that would have done best so far.

Every candidate sizer sees every record. When a task's first attempt is allocated in a
category past its warm-up, the selector asks each candidate what it would give that task
then, and keeps the answers until the task's record comes; it scores each in the shadow:
per resource, the task's use over what the candidate would have allocated, a kill costing
the share of the run the real runs show (:func:`learners.kill_times.kill_share`, median: for
disk, which fills during the run, by how far below the task's peak the allocation lay) plus
the candidate's retry; cores below the use stretch the run, and the other resources are held
the longer for it. Records that ran no time score a candidate only until one that ran
comes. A record whose task's answers were not kept (started during the warm-up, or learnt
again from an earlier run) is scored with what each candidate would give it when the
record comes, having learnt every earlier one: more than it knew at the task's start,
where many tasks start before the records they are scored with (on Coffea's processing
category, 0.946 of memory AWE for deterministic Greedy Bucketing so scored, 0.830 sized at
each task's start). The warm-up's answers are not kept: the first candidate allocates then,
and every candidate's answers are its cold start, which says little of what it gives once
it has records (kept, they cost 0.006 of the mean AWE over the shared traces). A
candidate's score is its shadow AWE (the mean over resources) less its share of shadow
kills, so that a candidate buys efficiency with retries only where they are cheap. A real
kill counts as soon as it is known against every candidate whose kept answer gave no more
of the resource (its record does not count it again), or where none was kept, against the
candidate allocating the category at the time. Within the
retry budget the best score wins, beyond it the fewest kills.

The budget is the category's own (5% of its tasks), or more where the workflow's kills so
far leave room within :data:`WORKFLOW_BUDGET` of its tasks, shared over the category's
tasks still to finish: the goal's limit is per workflow, and a small category whose
resources go opposite ways (bioblast's Split: much memory and little disk, or the other way
round) wastes less when every task starts in bucketing's lower buckets and is retried once.
Candidates that buy efficiency with retries (bucketing) are chosen only within that room,
their kills priced by how much of it is left, and only once the category is past their
sampling phase (:data:`~learners.sizing.bucketing.SAMPLING` records): before, they give
cctools' default, doubled past each kill, not what they learnt (chosen so from its 5th
record, bioblast's Join category had 62 of its 126 tasks killed instead of 34, and the room
its Analysis category needed later was spent). A candidate that regresses on the input size
is chosen only in categories whose tasks report one: elsewhere it has nothing to regress
on, and its score differs from the others' by chance (on the bucketing paper's synthetic
workflows, switching on that chance cost up to 0.03 of memory AWE). Until a category has
:data:`WARMUP` scored records the first candidate allocates; retries, real and in the
shadow, follow the first candidate's rule (``budget``'s: from the records at or above what
the killed attempt reached), as a regression's own retry (Ponder's: its largest allocation,
a whole worker) costs more than the kill.

Scoring and learning wait until an allocation needs them, then take what came in the order
it came, so they end exactly as if done at once: a run whose every task declares its sizes
never pays for them, and its records still reach the history that later runs learn from.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from learners.kill_times import kill_share
from learners.resources import Resources
from learners.sizing.base import Exhaustion, Record, TaskFeatures, Unfittable
from learners.sizing.bucketing import SAMPLING
from learners.sizing.budget import BUDGET
from learners.sizing.composite import Composite
from learners.sizing.history import History

Answer = Resources | Unfittable
"""What a candidate allocates a task's first attempt, or why it cannot."""

WARMUP = 5
"""Records a category's shadow scores need before they choose."""
WORKFLOW_BUDGET = 0.075
"""Share of a workflow's tasks whose first attempt may be killed, over all its categories: the
10% a default may retry, less a margin for cold starts and second retries. A category may
choose a candidate that kills more than its own :data:`BUDGET` while the workflow's kills leave
room for it."""


@dataclass
class Use:
    """What a candidate's allocations would have consumed and allocated, per resource."""

    consumed: dict[str, float] = field(default_factory=dict)
    allocated: dict[str, float] = field(default_factory=dict)

    @property
    def awe(self) -> float | None:
        """The mean over resources of consumed over allocated; None before any allocation."""
        shares = [
            self.consumed[r] / a for r, a in self.allocated.items() if a > 0 and r in self.consumed
        ]
        return sum(shares) / len(shares) if shares else None

    def add(self, resource: str, consumed: float, allocated: float) -> None:
        self.consumed[resource] = self.consumed.get(resource, 0.0) + consumed
        self.allocated[resource] = self.allocated.get(resource, 0.0) + allocated


@dataclass
class Shadow:
    """One candidate's account in one category."""

    timed: Use = field(default_factory=Use)
    """Over the records that ran some time, each weighing its wall time (as AWE weighs it)."""
    untimed: Use = field(default_factory=Use)
    """Over the records that ran no time, each weighing one: what tells a candidate's
    efficiency only until a record that ran comes (bioblast's Split category ran 0 s in its
    first 105 records, while its longer tasks started)."""
    records: int = 0
    kills: int = 0

    @property
    def killed(self) -> float:
        """Kills per scored record."""
        return self.kills / max(self.records, 1)

    @property
    def awe(self) -> float:
        """The shadow AWE: over the records that ran some time, else over those that did not."""
        awe = self.timed.awe
        return (self.untimed.awe or 0.0) if awe is None else awe

    @property
    def score(self) -> float:
        """The shadow AWE less the share of kills, each kill at full price."""
        return self.priced(1.0)

    def priced(self, price: float) -> float:
        """The shadow AWE less the share of kills at ``price`` each."""
        return self.awe - price * self.killed

    def rank(self, allowed: float, price: float = 1.0) -> tuple[bool, float]:
        """Within ``allowed`` kills per record first, by the shadow AWE less the share of
        kills at ``price`` each; beyond, by fewer kills."""
        within = self.killed <= allowed
        return within, self.priced(price) if within else -self.killed

    def account(
        self,
        candidate: Composite,
        record: Record,
        retrier: Composite,
        answer: Answer | None = None,
        counted: bool = False,
    ) -> None:
        """What ``candidate``'s allocation for ``record``'s task would have cost, retried by
        ``retrier`` on a kill: ``answer``, what it gave at the task's start, or where None,
        what it gives now; ``counted``: its kill of the task was counted when it was seen."""
        self.records += 1
        task, peak = record.task, record.peak
        wall = peak.wall if math.isfinite(peak.wall) else 0.0
        use, weight = (self.timed, wall) if wall > 0 else (self.untimed, 1.0)
        alloc = _answer(candidate, task) if answer is None else answer
        if isinstance(alloc, Unfittable):
            self.kills += 1
            return
        packed = candidate.packed
        short = [r for r in packed if r != "cores" and peak[r] > alloc[r] + 1e-9]
        stretch = max(1.0, peak.cores / alloc.cores) if alloc.cores > 0 else 1.0
        retry = alloc
        if short:
            self.kills += not counted
            for r in short:
                try:
                    retry = retrier.allocate(task, retry, Exhaustion(r, alloc[r]))
                except Unfittable:
                    return
        for r in packed:
            used = min(peak[r], alloc[r]) if r == "cores" else peak[r]
            given = retry[r] * stretch
            if short:
                given += alloc[r] * max(kill_share(s, alloc[s], peak[s]) for s in short)
            held = stretch if r == "cores" else 1.0  # the others are held longer for nothing
            use.add(r, used * weight * held, given * weight)


def _answer(candidate: Composite, task: TaskFeatures) -> Answer:
    try:
        return candidate.allocate(task)
    except Unfittable as e:
        return e


@dataclass(slots=True)
class _Start:
    """What each candidate gave a task at its start, and whose kills of it a real kill counted."""

    answers: list[Answer]
    counted: list[bool]


@dataclass(frozen=True, slots=True)
class _Kill:
    """A real attempt killed, waiting to be learnt."""

    task: TaskFeatures
    allocation: Resources
    exhaustion: Exhaustion


class Selector:
    """A :class:`~learners.sizing.base.Sizer` choosing, per category, among ``candidates``."""

    def __init__(
        self,
        name: str,
        candidates: Sequence[Composite],
        *,
        by_input: Sequence[bool] = (),
        retrying: Sequence[bool] = (),
    ) -> None:
        if not candidates:
            raise ValueError("a selector needs candidates")
        for flags, what in ((by_input, "by_input"), (retrying, "retrying")):
            if flags and len(flags) != len(candidates):
                raise ValueError(f"{what} needs one flag per candidate")
        self.name = name
        self.candidates = tuple(candidates)
        self.by_input = tuple(by_input) or (False,) * len(self.candidates)
        """Which candidates regress on the input size: chosen only where tasks report one."""
        self.retrying = tuple(retrying) or (False,) * len(self.candidates)
        """Which candidates buy efficiency with retries (bucketing's lower buckets): chosen
        only within the kills a category is allowed, never as the one that kills least."""
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
        self._started: dict[str | int, _Start] = {}
        """Per task started and not recorded yet, each candidate's answer at its start."""
        self._records: Counter[str] = Counter()
        self._kills: Counter[str] = Counter()
        """Real records and kills per category, learnt."""
        self._restored: Counter[str] = Counter()
        """Records per category from an earlier run (:meth:`restore`): not this run's tasks.
        Counted as they come, learnt before anything of this run."""

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
        if self.candidates[0].declares_all(task):  # nothing learnt can change it
            return self.candidates[0].allocate(task, previous, exhaustion)
        self._learn()
        if exhaustion is not None:
            return self.candidates[0].allocate(task, previous, exhaustion)
        chosen = self._choice(task.category)
        shadows = self._shadows.get(task.category)
        if task.key is None or not shadows or shadows[0].records < WARMUP:
            return chosen.allocate(task)
        answers = [_answer(candidate, task) for candidate in self.candidates]
        self._started[task.key] = _Start(answers, [False] * len(answers))  # sized again: the latest
        answer = answers[self.candidates.index(chosen)]
        if isinstance(answer, Unfittable):
            raise answer
        return answer

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
        allowed = self._allowed(category)
        sampling = shadows[0].records < SAMPLING
        eligible = [
            i
            for i, shadow in enumerate(shadows)
            if (sized or not self.by_input[i])
            and not (
                self.retrying[i] and (sampling or allowed <= BUDGET or shadow.killed > allowed)
            )
        ]
        price = BUDGET / allowed  # a retrying candidate's kills, as scarce as the room left
        best = max(
            eligible,
            key=lambda i: (*shadows[i].rank(allowed, price if self.retrying[i] else 1.0), -i),
        )
        return self.candidates[best]

    def _allowed(self, category: str) -> float:
        """Kills per task ``category`` may spend: its own budget, or the room the workflow's
        kills so far leave within :data:`WORKFLOW_BUDGET` of its tasks, shared over the
        category's tasks still to finish (submitted and not recorded, where the executor
        tells; else over those recorded). The room is spent as the workflow kills, and the
        category falls back to its own budget. Shared over all of its tasks instead, the room
        of bioblast's Analysis category (7,504 tasks) was taken by the first 200 kills,
        while most of its tasks were still to run."""
        tasks = max(self.running.submitted(), self._records.total() - self._restored.total())
        recorded = self._records[category] - self._restored[category]
        submitted = self.running.submitted(category)
        left = submitted - recorded if submitted > recorded else max(recorded, 1)
        spent = self._kills.total()
        return max(BUDGET, (WORKFLOW_BUDGET * tasks - spent) / left)

    def _learn(self) -> None:
        """Score and learn what ended since the last time, in the order it ended."""
        unlearnt, self._unlearnt = self._unlearnt, []
        for event in unlearnt:
            match event:
                case Record(task=task):
                    if task.input_size is not None:
                        self._with_input.add(task.category)
                    self._records[task.category] += 1
                    shadows = self._accounts(task.category)
                    start = self._started.pop(task.key, None) if task.key is not None else None
                    for i, (shadow, candidate) in enumerate(
                        zip(shadows, self.candidates, strict=True)
                    ):
                        answer, counted = (
                            (start.answers[i], start.counted[i]) if start else (None, False)
                        )
                        shadow.account(candidate, event, self.candidates[0], answer, counted)
                        candidate.observe(event)
                case _Kill(task=task, allocation=allocation, exhaustion=exhaustion):
                    self._kills[task.category] += 1
                    shadows = self._accounts(task.category)
                    start = self._started.get(task.key) if task.key is not None else None
                    if start is None:
                        shadows[self.candidates.index(self._choice(task.category))].kills += 1
                    else:
                        self._count(start, shadows, allocation, exhaustion.resource)
                    for candidate in self.candidates:
                        candidate.observe_exhaustion(task, allocation, exhaustion)

    @staticmethod
    def _count(start: _Start, shadows: list[Shadow], killed: Resources, resource: str) -> None:
        """A real kill for ``resource`` of the task ``start`` tells, as soon as it comes,
        that each candidate that gave no more of it would have been killed too."""
        for i, answer in enumerate(start.answers):
            if isinstance(answer, Unfittable) or start.counted[i]:
                continue
            if answer[resource] <= killed[resource] + 1e-9:
                shadows[i].kills += 1
                start.counted[i] = True

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
            self._restored[record.task.category] += 1
            self.observe(record)
