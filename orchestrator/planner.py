"""When, how big, and after what each stage's pilot is submitted.

A planner is a small deterministic object: the engine shows it the stages
(phase, ready time, forecast end) and the live pilots, and it answers with
submissions and cancellations, plus the time it next wants to be asked.

- ``bigjob``: one pilot as large as the largest stage, for the whole workflow.
- ``per-stage``: a stage's pilot is submitted when the stage becomes ready.
- ``asa``: stage y's pilot is submitted at forecast_end(y-1) - predicted_wait(y)
  with ``afterok`` on the pilots of the stages it waits for (ASA, Souza et al.).
- ``asa-naive``: the same without a dependency; an early pilot that would idle
  longer than a threshold is cancelled and submitted again.
- ``oracle``: like ``asa``, but the wait is the simulator's true answer.
- ``elastic``: pilots of a node or less, held across stage boundaries, released early and
  acquired ahead without a dependency, by a cost (``orchestrator.elastic``).

A stage whose allocation is automatic (``allocation = "auto"``) gets its pilot's
geometry and time limit chosen when the planner first plans that pilot
(:class:`AutoFit`, ``orchestrator.autoalloc``); ``bigjob`` submits its fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from learners.queue_wait import Prediction
from learners.resources import Resources
from orchestrator.autoalloc import (
    NOW_S,
    Demand,
    Fit,
    Geometry,
    Instead,
    Node,
    WaitOf,
    choose,
    fitted,
    to_ask,
)
from orchestrator.human import count, duration, offset
from workflows.spec import Allocation


class Phase(StrEnum):
    WAITING = "waiting"
    """Some stage it comes after is not done yet."""
    READY = "ready"
    """Its tasks may run; none has started."""
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"

    @property
    def open(self) -> bool:
        """Still needs resources."""
        return self not in (Phase.DONE, Phase.FAILED)


ONE_CORE = Resources(cores=1)


@dataclass(frozen=True, slots=True)
class StageView:
    name: str
    after: tuple[str, ...]
    allocation: Allocation
    phase: Phase
    ready_t: float | None = None
    forecast: Callable[[], float | None] = lambda: None
    """When the stage is forecast to end (None while unknown), worked out when asked: a
    forecast looks at every task the stage runs, and most planners, most passes, ask none."""
    demand: Callable[[], Demand] | None = None
    """What the stage still has to run, for an automatic allocation (None: hand-written)."""
    width: int = 0
    """The cores its tasks not done yet can use at once, at most its allocation's."""
    wanted: int = 0
    """The cores its tasks not done yet could use at once, whatever its allocation."""
    task: Resources = ONE_CORE
    """What one of its tasks takes now: its latest attempt's allocation, or as declared (a
    resource neither tells is 0)."""
    duration: float = 0.0
    """How long its tasks ran on average so far (0: none yet), as placement expects a task
    to run: a worker whose pilot ends sooner takes none."""
    outgrown: bool = False
    """Its next task, ``task`` in size, waits for a worker larger than any there is (a
    planner that sizes pilots to their tasks brings one)."""

    @property
    def forecast_end(self) -> float | None:
        return self.forecast()


@dataclass(frozen=True, slots=True)
class PilotView:
    pilot_id: str
    stages: tuple[str, ...]
    started: bool
    busy: bool = False
    """Some worker of the pilot is running an attempt."""
    wait: float | None = None
    """Its queue wait, once it started."""
    allocation: Allocation | None = None
    ends: float | None = None
    """When its time limit ends it, once it started."""
    submitted: float = 0.0
    """When it was submitted."""
    memory: float | None = None
    """The memory its largest worker holds, once one joined (MB): where its allocation leaves
    memory to the scheduler's default, what that default gave."""

    @property
    def cores(self) -> int:
        return 0 if self.allocation is None else self.allocation.cores


@dataclass(frozen=True, slots=True)
class Submit:
    """Submit a pilot of ``allocation`` serving ``stages``, after the pilots ``after``."""

    stages: tuple[str, ...]
    allocation: Allocation
    after: tuple[str, ...] = ()
    predicted_wait: float | None = None
    prediction: Any = None
    """The learner's prediction object, handed back when the wait is observed."""
    fit: str | None = None
    """Why an automatic allocation is what it is, in words (None: written by hand)."""


@dataclass(frozen=True, slots=True)
class Cancel:
    pilot_id: str
    why: str


@dataclass(frozen=True, slots=True)
class Release:
    """Give back a running pilot no task runs on: its nodes go back to the cluster."""

    pilot_id: str
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Submit | Cancel | Release, ...] = ()
    wake_at: float | None = None
    notes: tuple[str, ...] = ()
    """The decisions in words, for the dashboard and the log."""


class Planner(Protocol):
    name: str
    fit: AutoFit | None
    """Chooses its automatic allocations (None: it submits them at their fallback)."""
    sized_to_tasks: bool
    """Its pilots are sized to the tasks they hold, memory included (up to their stage's share
    of a node): a task grown larger than the workers there are waits for one sized to it."""

    def decide(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> Plan: ...

    def allocations(self, stages: Sequence[StageView]) -> list[Submit]:
        """Every pilot it may submit, for the backend to check before the run starts."""
        ...


WaitOutlook = Callable[[Allocation], float | None]
"""The learned queue wait of an allocation's geometry, without drawing a prediction (None:
never learned)."""


ASK_AGAIN_S = 300.0
"""A stage whose choice is still to come has its widths asked about again after this long."""


@dataclass
class AutoFit:
    """Chooses automatic allocations on nodes like ``node``; a stage's choice is kept until
    its pilot is submitted, so its predicted wait and its submission agree. Before a choice,
    the engine asks the scheduler what it foresees of the widths :meth:`to_ask` lists."""

    node: Node
    outlook: WaitOutlook
    cost: float = 0.0
    """Seconds of makespan a core-hour is worth (``--cost``)."""
    _fits: dict[str, Fit] = field(default_factory=dict)
    _foreseen: dict[Geometry, float | None] = field(default_factory=dict)
    """The waits the scheduler foresaw, by pilot geometry."""
    _asked: dict[str, float] = field(default_factory=dict)
    """When each stage's widths were last asked about."""
    _weighed: dict[str, float] = field(default_factory=dict)
    """When each pending pilot of a ready stage was last weighed against the widths that
    start now (:meth:`replacements`)."""
    _weighing: dict[str, Instead] = field(default_factory=dict)
    """The pending pilots :meth:`to_ask_instead` asked about for this pass, and the widths
    that would replace each."""

    def allocation(self, view: StageView) -> tuple[Allocation, Fit | None]:
        """The pilot of ``view``'s stage, and the choice behind it (None: hand-written)."""
        if view.demand is None or not view.allocation.auto:
            return view.allocation, None
        if view.name not in self._fits:
            self._fits[view.name] = choose(
                view.demand(),
                self.node,
                view.allocation,
                self._wait_of(view.allocation),
                self.cost,
                self._foreseen.get,
            )
        fit = self._fits[view.name]
        return fitted(view.allocation, fit), fit

    def to_ask_instead(
        self, now: float, views: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> list[tuple[str, Allocation]]:
        """The pilots to ask the scheduler about now in place of a pending one, each with the
        pilot it would replace: of each pending pilot due to be weighed again
        (:meth:`replacements`), the widths that would replace it if they started now."""
        asking = []
        for pilot in pilots:
            view = self._ready_stage(pilot, views)
            if view is None or (waited := self._waited(now, view, pilot)) is None:
                continue
            self._weighed[pilot.pilot_id] = now
            base = view.allocation
            found = Instead.of(
                view.demand(), self.node, base, self._wait_of(base), self.cost, pilot.cores, waited
            )
            if found is None:
                continue
            self._weighing[pilot.pilot_id] = found
            asking += [
                (pilot.pilot_id, replace(base, nodes=n, cores=c, time_limit_s=t, memory_mb=m))
                for n, c, t, m in found.to_ask()
            ]
        return asking

    def to_ask(self, now: float, views: Iterable[StageView]) -> list[Allocation]:
        """The pilots to ask the scheduler about now: of each open automatic stage whose
        choice is still to come (at most once in :data:`ASK_AGAIN_S`), the widths that would
        be chosen if they started now."""
        asking = []
        for view in views:
            if (
                view.demand is None
                or not view.phase.open
                or view.name in self._fits
                or now < self._asked.get(view.name, -math.inf) + ASK_AGAIN_S
            ):
                continue
            demand = view.demand()
            if not demand.durations:  # the fallback weighs nothing: nothing to ask yet
                continue
            self._asked[view.name] = now
            base = view.allocation
            found = to_ask(demand, self.node, base, self._wait_of(base), self.cost)
            asking += [
                replace(base, nodes=n, cores=c, time_limit_s=t, memory_mb=m) for n, c, t, m in found
            ]
        return asking

    def replacements(
        self, now: float, views: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> tuple[list[Cancel], float | None]:
        """The pending pilots of ready automatic stages to cancel for a width the scheduler
        starts now (:meth:`~orchestrator.autoalloc.Instead.choose`; the choice is kept for the
        stage's next submission), and when a pilot is next weighed again.

        A pilot chosen ahead of its stage, on a forecast and the waits learned before, may
        meet another queue once the stage is ready. It is weighed again :data:`NOW_S` after
        the stage became ready (or after it was submitted, if later), then each time its wait
        since has doubled (the price of keeping it is its wait so far, so a shorter step
        would rarely decide otherwise), with the widths the engine asked the scheduler about
        just before, in its place (:meth:`to_ask_instead`)."""
        cancels: list[Cancel] = []
        wake: list[float] = []
        weighing, self._weighing = self._weighing, {}
        for pilot in pilots:
            view = self._ready_stage(pilot, views)
            if view is None:
                continue
            found = weighing.get(pilot.pilot_id)
            fit = None if found is None else found.choose(self._foreseen.get)
            if found is None or fit is None:
                wake.append(self._due(view, pilot))
                continue
            self._fits[view.name] = fit
            cancels.append(
                Cancel(
                    pilot.pilot_id,
                    f"still waits {duration(found.waited)} after stage {view.name} became ready, "
                    f"where {count(fit.cores, 'core')} start now: cancelled for them",
                )
            )
        return cancels, min(wake, default=None)

    def _ready_stage(self, pilot: PilotView, views: Mapping[str, StageView]) -> StageView | None:
        """The automatic stage ``pilot`` alone serves, if the pilot waits though the stage is
        ready (its tasks may run)."""
        view = views.get(pilot.stages[0]) if len(pilot.stages) == 1 else None
        if (
            view is None
            or pilot.started
            or view.demand is None
            or not view.allocation.auto
            or view.ready_t is None
            or view.phase not in (Phase.READY, Phase.RUNNING)
        ):
            return None
        return view

    def _due(self, view: StageView, pilot: PilotView) -> float:
        """When ``pilot`` is next weighed: :data:`NOW_S` after it began to wait for a ready
        stage, then each time its wait since has doubled."""
        since = _waits_since(view, pilot)
        last = self._weighed.get(pilot.pilot_id)
        return since + NOW_S if last is None else since + 2 * (last - since)

    def _waited(self, now: float, view: StageView, pilot: PilotView) -> float | None:
        """How long ``pilot`` has waited for its ready stage, if it is due to be weighed again
        now (None: not yet)."""
        return None if now < self._due(view, pilot) else now - _waits_since(view, pilot)

    def foreseen(self, allocation: Allocation, wait: float | None) -> None:
        """What the scheduler foresees of a pilot of ``allocation`` submitted now."""
        a = allocation
        self._foreseen[(a.nodes, a.cores, a.time_limit_s, a.memory_mb)] = wait

    def _wait_of(self, base: Allocation) -> WaitOf:
        def wait_of(nodes: int | None, cores: int) -> float | None:
            return self.outlook(replace(base, nodes=nodes, cores=cores))

        return wait_of

    def submitted(self, stage: str) -> Fit | None:
        """The choice behind ``stage``'s pilot, just submitted; its next pilot chooses anew."""
        return self._fits.pop(stage, None)


def _waits_since(view: StageView, pilot: PilotView) -> float:
    """When ``pilot`` began to wait for its stage, ready: the later of the two."""
    return max(view.ready_t or 0.0, pilot.submitted)


class _StageAllocations:
    """Planners that submit each stage's own allocation (chosen by ``fit`` when automatic)."""

    fit: AutoFit | None = None
    sized_to_tasks = False

    def allocations(self, stages: Sequence[StageView]) -> list[Submit]:
        return [Submit((v.name,), v.allocation) for v in stages]

    def _allocation(self, view: StageView) -> Allocation:
        return view.allocation if self.fit is None else self.fit.allocation(view)[0]

    def _replaced(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> tuple[list[Cancel], list[PilotView], float | None]:
        """The pending pilots to cancel for a width that starts now
        (:meth:`AutoFit.replacements`), the pilots left, and when to weigh again."""
        if self.fit is None:
            return [], list(pilots), None
        cancels, wake = self.fit.replacements(now, stages, pilots)
        gone = {c.pilot_id for c in cancels}
        return cancels, [p for p in pilots if p.pilot_id not in gone], wake

    def _submit(self, view: StageView, **more: Any) -> Submit:
        """``view``'s pilot, with the choice behind it in words when it was chosen."""
        allocation = self._allocation(view)
        fit = None if self.fit is None else self.fit.submitted(view.name)
        words = None if fit is None else fit.words(view.name)
        return Submit((view.name,), allocation, fit=words, **more)


def _unserved(stages: Mapping[str, StageView], pilots: Sequence[PilotView]) -> list[StageView]:
    served = {s for p in pilots for s in p.stages}
    return [v for v in stages.values() if v.phase.open and v.name not in served]


@dataclass
class PerStage(_StageAllocations):
    """Submit a stage's pilot once the stage is ready."""

    fit: AutoFit | None = None
    name: str = "per-stage"

    def decide(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> Plan:
        cancels, pilots, wake = self._replaced(now, stages, pilots)
        ready = [v for v in _unserved(stages, pilots) if v.phase != Phase.WAITING]
        submits = [self._submit(v) for v in ready]
        notes = []
        for v, action in zip(ready, submits, strict=True):
            notes += [f"stage {v.name}: ready, submitting now", *_fit_words(action)]
        return Plan((*cancels, *submits), wake, tuple(notes))


class BigJob:
    """One pilot of the largest stage's size for every stage still open."""

    name = "bigjob"
    fit = None
    sized_to_tasks = False

    def allocations(self, stages: Sequence[StageView]) -> list[Submit]:
        names = tuple(v.name for v in stages)
        return [Submit(names, big_allocation([v.allocation for v in stages], longest_path(stages)))]

    def decide(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> Plan:
        if not _unserved(stages, pilots):
            return Plan()
        remaining = [v for v in stages.values() if v.phase.open]
        allocation = big_allocation([v.allocation for v in remaining], longest_path(remaining))
        names = tuple(v.name for v in remaining)
        return Plan(
            (Submit(names, allocation),),
            notes=(f"big job: {allocation.cores} cores for {len(names)} stages",),
        )


def big_allocation(allocations: Sequence[Allocation], time_limit_s: float) -> Allocation:
    """The largest stage's geometry for ``time_limit_s``, with the most memory any stage asks.

    A stage that leaves memory to the scheduler's default share leaves it to the
    default for the big job too: its cores then bring at least what they did.
    """
    widest = max(allocations, key=lambda a: a.cores)
    memory = [a.memory_mb for a in allocations]
    most = None if None in memory else max(m for m in memory if m is not None)
    return replace(widest, memory_mb=most, time_limit_s=time_limit_s)


def longest_path(stages: Sequence[StageView]) -> float:
    """Sum of time limits along the longest chain of ``after``: the big job's time limit."""
    limit = {v.name: v.allocation.time_limit_s for v in stages}
    memo: dict[str, float] = {}

    def longest(name: str) -> float:
        if name not in memo:
            before = [longest(a) for a in stage_after[name] if a in limit]
            memo[name] = limit[name] + max(before, default=0.0)
        return memo[name]

    stage_after = {v.name: v.after for v in stages}
    return max(longest(v.name) for v in stages)


DUE = 1e-3
"""A submission time within a millisecond of now is due: rounding must not postpone it."""

WaitPredictor = Callable[[Allocation], tuple[float, Any]]
"""Predicted queue wait (seconds) of an allocation, and the prediction to hand back."""


@dataclass
class PlannedMoments:
    """Which planned moments are worth saying: the first, and one that moved by more than a
    minute and a quarter of the time that was left until it. A plan follows a forecast that
    moves with every result; said on every pass, it would bury the decisions."""

    said: dict[str, float] = field(default_factory=dict)

    def worth_saying(self, subject: str, at: float, now: float) -> bool:
        before = self.said.get(subject)
        if before is not None and abs(at - before) <= max(60.0, 0.25 * (before - now)):
            return False
        self.said[subject] = at
        return True


@dataclass
class Asa(_StageAllocations):
    """Proactive submission at forecast_end(after) - predicted_wait (ASA, Souza et al.).

    Each stage's prediction is drawn once and kept until its pilot is
    submitted. Without a dependency (``asa-naive``), a pilot that started early
    and would idle longer than ``idle_cancel_s`` is cancelled; its stage is
    submitted again at forecast_end - the wait that pilot just had, the
    freshest evidence of the queue there is.
    """

    predict: WaitPredictor
    dependency: bool = True
    idle_cancel_s: float = 600.0
    name: str = "asa"
    fit: AutoFit | None = None
    _predictions: dict[str, tuple[float, Any]] = field(default_factory=dict)
    _said: PlannedMoments = field(default_factory=PlannedMoments)

    def decide(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> Plan:
        replaced, pilots, again = self._replaced(now, stages, pilots)
        actions: list[Submit | Cancel] = [*replaced]
        notes: list[str] = []
        wake: list[float] = [] if again is None else [again]
        if not self.dependency:
            cancels = self._idle_early(now, stages, pilots)
            actions += cancels
            notes += [f"pilot {c.pilot_id}: {c.why}" for c in cancels]
            cancelled = {c.pilot_id for c in cancels}
            pilots = [p for p in pilots if p.pilot_id not in cancelled]
        live = {s: p for p in pilots for s in p.stages}
        unserved = _unserved(stages, pilots)
        due: dict[str, float] = {}
        for view in unserved:
            if view.phase != Phase.WAITING:
                due[view.name] = now
            elif (end := self._inputs_end(view, stages)) is not None:
                due[view.name] = end - self._prediction(view, now)[0]
        if self.dependency:
            due = _pulled_forward(due, stages)
        for view in unserved:
            if view.name not in due:
                continue
            after = self._after(view, stages, live)
            if now < due[view.name] - DUE or after is None:
                wake.append(due[view.name])
                continue
            wait, prediction = self._prediction(view, now)
            submit = self._submit(view, after=after, predicted_wait=wait, prediction=prediction)
            actions.append(submit)
            notes.append(
                f"stage {view.name}: {_wait_words(wait, prediction)}, submitting now"
                + (" after " + ", ".join(after) if after else "")
            )
            notes += _fit_words(submit)
            self._predictions.pop(view.name, None)
        for name, at in due.items():
            if now < at - DUE and self._said.worth_saying(name, at, now):
                wait, prediction = self._prediction(stages[name], now)
                notes.append(
                    f"stage {name}: {_wait_words(wait, prediction)}, submitting at {offset(at)}"
                )
        return Plan(
            tuple(actions), min((w for w in wake if w > now + DUE), default=None), tuple(notes)
        )

    def _prediction(self, view: StageView, now: float) -> tuple[float, Any]:
        if view.name not in self._predictions:
            self._predictions[view.name] = self.predict(self._allocation(view))
        return self._predictions[view.name]

    @staticmethod
    def _inputs_end(view: StageView, stages: Mapping[str, StageView]) -> float | None:
        """When the stages ``view`` waits for are forecast to end (None if unknown)."""
        ends = [stages[a].forecast_end for a in view.after if stages[a].phase.open]
        if any(e is None for e in ends):
            return None
        return max((e for e in ends if e is not None), default=None)

    def _after(
        self, view: StageView, stages: Mapping[str, StageView], live: Mapping[str, PilotView]
    ) -> tuple[str, ...] | None:
        """The pilots to depend on; None while one of them is not submitted yet."""
        if not self.dependency:
            return ()
        waits_for = [a for a in view.after if stages[a].phase.open]
        if any(a not in live for a in waits_for):
            return None
        return tuple(sorted({live[a].pilot_id for a in waits_for}))

    def _idle_early(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> list[Cancel]:
        cancels = []
        for pilot in pilots:
            if not pilot.started or pilot.busy:
                continue
            views = [stages[s] for s in pilot.stages]
            if any(v.phase != Phase.WAITING for v in views):
                continue
            known = [e for v in views if (e := self._inputs_end(v, stages)) is not None]
            if known and min(known) - now > self.idle_cancel_s:
                idle = min(known) - now
                cancels.append(
                    Cancel(pilot.pilot_id, f"started early, would idle {duration(idle)}: cancelled")
                )
                for v in views:
                    self._predictions[v.name] = (pilot.wait or 0.0, None)
        return cancels


def _fit_words(submit: Submit) -> list[str]:
    return [] if submit.fit is None else [submit.fit]


NO_QUEUE = "no queue"
"""The prediction of a wait where pilots do not queue: 0, known."""


def _wait_words(wait: float, prediction: Any) -> str:
    """The wait a stage is planned with, in words: learned, the prior's guess, or none."""
    if prediction == NO_QUEUE:
        return "no queue here (a pilot starts when submitted)"
    if isinstance(prediction, Prediction) and prediction.observations == 0:
        return (
            "no wait learned yet for its geometry here "
            f"(planning with {duration(wait)}, from the learner's prior)"
        )
    return f"predicted wait {duration(wait)}"


def _pulled_forward(due: Mapping[str, float], stages: Mapping[str, StageView]) -> dict[str, float]:
    """Each stage due no later than any stage after it: a pilot can only depend on
    pilots already submitted, so a stage that comes after must not wait for an
    earlier one whose own wait is predicted short."""
    successors: dict[str, list[str]] = {name: [] for name in stages}
    for view in stages.values():
        for before in view.after:
            successors[before].append(view.name)
    memo: dict[str, float] = {}

    def earliest(name: str) -> float:
        if name not in memo:
            own = due.get(name, float("inf"))
            memo[name] = min([own, *(earliest(s) for s in successors[name])])
        return memo[name]

    return {name: earliest(name) for name in due}


TrueWait = Callable[[Allocation], float]
"""The simulator's answer: how long a pilot of this allocation submitted now would wait."""


@dataclass
class Oracle(Asa):
    """ASA with the true wait, from a what-if replay of the simulated queue: a lower bound.

    A what-if replay costs a fork of the simulator, so a stage's true wait is
    recomputed only when ``refresh_s`` have passed since the last one.
    """

    true_wait: TrueWait | None = None
    refresh_s: float = 300.0
    name: str = "oracle"
    _asked: dict[str, float] = field(default_factory=dict)

    def _prediction(self, view: StageView, now: float) -> tuple[float, Any]:
        assert self.true_wait is not None
        if view.name not in self._predictions or now - self._asked[view.name] >= self.refresh_s:
            self._predictions[view.name] = (self.true_wait(self._allocation(view)), None)
            self._asked[view.name] = now
        return self._predictions[view.name]


STRATEGIES = ("bigjob", "per-stage", "asa", "asa-naive", "oracle", "elastic", "elastic-oracle")


def make_planner(
    strategy: str,
    *,
    predict: WaitPredictor | None = None,
    true_wait: TrueWait | None = None,
    idle_cancel_s: float = 600.0,
    fit: AutoFit | None = None,
    law: Callable[[Allocation], Sequence[tuple[float, float]]] | None = None,
    node: Resources | None = None,
    cost: float | None = None,
    unit: int | str = "task",
    nodes: int | None = None,
) -> Planner:
    """The planner for ``strategy`` (one of :data:`STRATEGIES`); ``fit`` chooses automatic
    allocations (without it, or for ``bigjob`` and ``elastic``, they keep their fallback).
    ``elastic`` plans with the learned wait distribution ``law``, on nodes like ``node``,
    by ``cost`` (lambda: seconds of makespan a core-hour is worth; None: its default), in
    pilots of at most ``unit`` cores (task: one task's; node: a node's), on a partition of
    ``nodes`` nodes where known."""
    if strategy == "bigjob":
        return BigJob()
    if strategy == "per-stage":
        return PerStage(fit)
    if strategy in ("asa", "asa-naive"):
        if predict is None:
            raise ValueError(f"strategy {strategy} needs a queue-wait predictor")
        naive = strategy == "asa-naive"
        return Asa(
            predict, dependency=not naive, idle_cancel_s=idle_cancel_s, name=strategy, fit=fit
        )
    if strategy == "oracle":
        if true_wait is None:
            raise ValueError("strategy oracle needs the simulator's true waits (--backend mock)")
        return Oracle(lambda _: (0.0, None), true_wait=true_wait, fit=fit)
    if strategy in ("elastic", "elastic-oracle"):
        from orchestrator.elastic import DEFAULT_COST, Elastic, TrueLaw  # they build on this

        if predict is None or law is None or node is None:
            raise ValueError(f"strategy {strategy} needs a queue-wait learner and the node's size")
        if strategy == "elastic-oracle":
            if true_wait is None:
                raise ValueError(
                    "strategy elastic-oracle needs the simulator's true waits (--backend mock)"
                )
            law = TrueLaw(true_wait)
        cost = DEFAULT_COST if cost is None else cost
        return Elastic(predict, law, node, cost, name=strategy, unit=unit, nodes=nodes)
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
