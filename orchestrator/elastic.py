"""``elastic``: one allocation planned across stage boundaries, grown and shrunk a unit at a time.

A *unit* is a pilot of one task's cores by default (``--unit``: of a node's, or of a number of
cores, whole tasks in any case). The width a run holds is a set of units, so growing it submits
only the width added and shrinking it gives back a whole unit, a plain cancel of one job, while
the others run on. Every unit serves every stage of its place (partition, account, QOS) that
runs while it lives (the pool lets a worker take any stage's task): a unit is reused across
stage boundaries. A narrow unit is also the one the scheduler's backfill starts soonest, in
the gaps a wide job cannot use.

From the stages' widths (what their remaining tasks can use at once, at most their
allocation) and their forecast starts and ends, the planner draws the width the run needs over
time, and on each pass

- keeps the units that width needs now, and lets go of those too small for any task left;
- weighs, for each idle unit not needed now, holding it until it is needed next (its idle
  core-hours) against releasing it and acquiring it again (the expected delay and early start
  of a new one), by the cost ``makespan + lambda x core-hours``;
- gives back, by the same cost, an idle unit of which the width needs only part (a narrow
  stage whose own unit is gone), for a unit as wide as that part;
- acquires ahead, with no dependency (so it ages in the queue under any priority), the width it
  will need: the units of a width of ``W`` cores needed at ``t`` are submitted at ``t - L``,
  ``L`` the quantile ``1 / (1 + lambda W / 3600)`` of their learned wait. That is the
  newsvendor's choice: a unit of ``c`` cores late by a second delays the run by about
  ``c / W`` of a second (the other units work meanwhile), early by a second it idles
  ``lambda c / 3600`` seconds' worth of core-hours;
- cancels pending units no longer needed.

``lambda = 0`` holds everything from the start (Big Job's makespan); a large ``lambda``
releases every idle unit and submits each when it is needed (Per-Stage's core-hours).
"""

from __future__ import annotations

import functools
import itertools
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from backends import clock
from learners.resources import Resources
from orchestrator.human import count, duration, offset, per_pilot
from orchestrator.planner import (
    DUE,
    Cancel,
    Phase,
    PilotView,
    Plan,
    PlannedMoments,
    Release,
    StageView,
    Submit,
    WaitPredictor,
    longest_path,
)
from workflows.spec import Allocation

DEFAULT_COST = 3000.0
"""lambda, in seconds of makespan a core-hour is worth (see docs/elastic.md for the curve)."""

MAX_UNITS = 100
"""Units a place holds at most while its width is at its widest: a wider width gets units of
several tasks each (a site caps the jobs a user may queue; Nextflow's Slurm executor keeps at
most 100 jobs queued by default, its ``queueSize``)."""

CHURN_S = 60.0
"""A unit is given back for a gap only if the gap is longer than this: one given back and
acquired again sooner saves less than a new pilot's start costs (its workers joining, the
scheduler's cycle), and a certain wait of zero would otherwise have it go and come back
forever."""

Unit = int | Literal["task", "node"]
"""How wide a unit is at most: one task's cores, a node's, or a number of cores."""

WaitLaw = Callable[[Allocation], Sequence[tuple[float, float]]]
"""The learned distribution of an allocation's queue wait: (wait in seconds, probability)."""


@dataclass
class TrueLaw:
    """The simulator's true wait as a certain law (``elastic-oracle``: what exact waits would
    give). A what-if replay forks the simulator, so the wait of a unit's width is asked again
    only when ``refresh_s`` of the run's time have passed."""

    true_wait: Callable[[Allocation], float]
    refresh_s: float = 300.0
    clock: Callable[[], float] = clock.now
    _known: dict[int, tuple[float, float]] = field(default_factory=dict)

    def __call__(self, allocation: Allocation) -> list[tuple[float, float]]:
        now = self.clock()
        known = self._known.get(allocation.cores)
        if known is None or now - known[0] >= self.refresh_s:
            known = self._known[allocation.cores] = (now, self.true_wait(allocation))
        return [(known[1], 1.0)]


@dataclass(frozen=True, slots=True)
class Span:
    """A stage's width over the time it is forecast to run (``end`` inf: until the run ends)."""

    stage: str
    start: float
    end: float
    width: int


@dataclass(frozen=True)
class Profile:
    """The width the run needs over time, a step function of the stages' spans."""

    spans: tuple[Span, ...]
    points: tuple[float, ...]
    """Where the width may change, from now on (now first)."""
    widths: tuple[int, ...]
    """The width needed at each point."""

    @classmethod
    def of(cls, now: float, spans: Sequence[Span], also: Iterable[float] = ()) -> Profile:
        """The profile of ``spans``, its points also at the moments ``also`` (where a unit
        held ends: the width there is acquired again)."""
        ends = (t for s in spans for t in (s.start, s.end))
        times = sorted({now} | {t for t in itertools.chain(ends, also) if now < t < math.inf})
        return cls(tuple(spans), tuple(times), tuple(_need(spans, t) for t in times))

    def need(self, t: float) -> int:
        return _need(self.spans, t)

    def levels(self, since: float) -> set[int]:
        """The widths needed from ``since`` on: where a new width is cut into units, so that
        each unit can be released where the width falls to its lower edge."""
        return {self.need(t) for t in self.points if t >= since}

    def stages_from(self, t: float) -> tuple[str, ...]:
        """The stages running at ``t`` or later: those a unit needed at ``t`` serves."""
        return tuple(s.stage for s in self.spans if s.end > t)


def _need(spans: Iterable[Span], t: float) -> int:
    """The width the stages running at ``t`` need together."""
    return sum(s.width for s in spans if s.start <= t < s.end)


def lead(law: Sequence[tuple[float, float]], k: float) -> float:
    """How long before it is needed a unit is submitted: the ``1 / (1 + k)`` quantile of its
    wait, ``k`` the cost of a second early relative to a second late."""
    q = 1.0 / (1.0 + k)
    cumulative = 0.0
    for wait, p in law:
        cumulative += p
        if cumulative >= q - 1e-12:
            return wait
    return law[-1][0]


def acquire_cost(law: Sequence[tuple[float, float]], k: float, lead_s: float) -> float:
    """Expected cost (seconds of makespan) of a unit submitted ``lead_s`` before it is
    needed: its delay where it waits longer, ``k`` per second it idles where it starts early."""
    cost = 0.0
    for wait, p in law:
        if wait > lead_s:
            cost += p * (wait - lead_s)
        elif wait < lead_s:
            cost += p * k * (lead_s - wait)
    return cost


def again_cost(law: Sequence[tuple[float, float]], k: float, within: float) -> float:
    """Expected cost of acquiring a unit again that is needed ``within`` seconds: submitted at
    its best lead, or now where that is later than the lead."""
    return acquire_cost(law, k, min(lead(law, k), within))


def split(low: int, high: int, cuts: set[int], size: int, task: int = 1) -> list[int]:
    """The units that grow a width from ``low`` to ``high`` cores: cut at ``cuts``, each of
    at most ``size`` cores, a multiple of ``task``'s (``size`` is one): whole tasks fit."""
    edges = [low, *sorted(c for c in cuts if low < c < high), high]
    units: list[int] = []
    for a, b in itertools.pairwise(edges):
        whole, rest = divmod(b - a, size)
        units += [size] * whole + ([-(-rest // task) * task] if rest else [])
    return units


@dataclass
class Kept:
    """The units a pass keeps, each until its fate: the cores they hold at each of a
    profile's points. Every unit kept counts now, whatever its fate; later, only those kept
    until then, so a width needed after a unit goes is acquired again, and kept once
    acquired. Kept as sums per point, as every unit's fate reads them all."""

    now: float
    points: Sequence[float]
    held: list[int] = field(init=False)
    """The cores held at each point."""

    def __post_init__(self) -> None:
        self.held = [0] * len(self.points)

    def reach(self, until: float) -> int:
        """The points a unit kept until ``until`` holds: those before it, and now."""
        points = self.points
        return max(bisect_left(points, until), bisect_right(points, self.now + DUE))

    def above(self, widths: Sequence[int]) -> list[int]:
        """At each point, the width needed (``widths``) beyond the cores held there."""
        return [width - held for width, held in zip(widths, self.held, strict=True)]

    def add(self, until: float, cores: int) -> None:
        """A unit of ``cores`` kept until ``until``: at the points before it, and now."""
        for i in range(self.reach(until)):
            self.held[i] += cores


@dataclass(frozen=True, slots=True)
class Fit:
    """What the stages still open ask of a unit of one size: why it can hold none of their
    tasks, if it cannot, else when the first task it could start now would end."""

    why: str | None = None
    deadline: float = -math.inf

    def unfit(self, ends: float | None) -> str | None:
        """Why a unit of this size whose time limit ``ends`` it can hold no task, if it cannot."""
        if self.why is None and ends is not None and ends < self.deadline:
            return "its time limit ends before another task could finish"
        return self.why


@dataclass(frozen=True, slots=True)
class Fate:
    """Until when a unit is kept, and why it goes then (or why it is held though idle)."""

    until: float
    why: str = ""
    held: str | None = None


@dataclass
class Elastic:
    """Units planned from the run's width over time, by ``cost`` = lambda (s per core-hour)."""

    predict: WaitPredictor
    law: WaitLaw
    node: Resources
    cost: float = DEFAULT_COST
    name: str = "elastic"
    unit: Unit = "task"
    """The most cores a unit holds: one task's, a node's, or a number (whole tasks, at most a
    node)."""
    nodes: int | None = None
    """The partition's nodes, where the backend tells (an automatic stage's widest)."""
    _said: PlannedMoments = field(default_factory=PlannedMoments)
    _default_per_core: float | None = None
    """The memory per core the scheduler gives a unit that leaves memory to its default, as
    the units' workers showed (None: none seen yet, a node's share assumed). A cluster's
    default may be less than its nodes' share (Slurm's DefMemPerCPU): a unit then asks for
    the memory of tasks that outgrow it."""
    fit = None
    """Automatic allocations keep their fallback: units are planned from the run's width."""
    sized_to_tasks = True
    """A unit holds the memory of the tasks it serves: one grown larger than the units there
    are waits for a unit sized to it."""

    def allocations(self, stages: Sequence[StageView]) -> list[Submit]:
        """Each stage's unit, with its memory and the time limit of the longest chain: what
        may be submitted (a refusal names the stage); and first the stage's allocation as
        written, though it is never submitted whole: a file whose allocation the cluster could
        never give is refused as under every strategy, not run with its numbers ignored."""
        limit = longest_path(stages)
        checked = []
        for v in stages:
            cores = min(v.allocation.cores, self._size([v], v.allocation.cores)[0])
            unit = self._unit(cores, [v], limit)
            checked += [Submit((v.name,), v.allocation), Submit((v.name,), unit)]
        return checked

    def decide(
        self, now: float, stages: Mapping[str, StageView], pilots: Sequence[PilotView]
    ) -> Plan:
        """The plan of every place (partition, account and QOS) the stages ask for: each
        place's units serve its stages, planned from their width alone."""
        if not any(v.phase.open for v in stages.values()):
            return Plan()
        self._learn_default(pilots)
        places = {_place(v.allocation) for v in stages.values() if v.phase.open}
        places |= {_place(p.allocation) for p in pilots if p.allocation is not None}
        plans = [
            self._decide(now, stages, place, [p for p in pilots if _place(p.allocation) == place])
            for place in sorted(places, key=str)
        ]
        wake = [p.wake_at for p in plans if p.wake_at is not None]
        return Plan(
            tuple(a for p in plans for a in p.actions),
            min(wake, default=None),
            tuple(n for p in plans for n in p.notes),
        )

    def _decide(
        self,
        now: float,
        stages: Mapping[str, StageView],
        place: Place,
        pilots: Sequence[PilotView],
    ) -> Plan:
        open_ = [v for v in stages.values() if v.phase.open and _place(v.allocation) == place]
        spans = self._spans(now, stages, place)
        # A unit's time limit is planned for within the stages' forecasts: past them (a
        # stage whose end is not known yet) nothing says the width is still needed then.
        horizon = max((s.end for s in spans if s.end < math.inf), default=now)
        ends = {p.pilot_id: p.ends for p in pilots if p.ends is not None and p.ends < horizon}
        profile = Profile.of(now, spans, ends.values())
        actions: list[Submit | Cancel | Release] = []
        notes: list[str] = []
        # The units kept, each until a unit is let go where its width is next not needed and
        # holding it through that gap costs more than acquiring it again. Alike units, one
        # after another in this order, are weighed together: as many of them as the width
        # above them leaves their fate unchanged share the first one's.
        kept = Kept(now, profile.points)
        held: dict[str, list[str]] = {}
        fit = functools.cache(functools.partial(self._fit, stages=open_, now=now))

        def alike(unit: PilotView) -> tuple[object, ...]:
            """What a unit's fate reads of it, its unfitness last: units alike in this are
            weighed together (a time limit past the forecasts changes no fate)."""
            limit = unit.ends if unit.pilot_id in ends else None
            unfit = fit(unit.allocation, unit.memory, unit.busy).unfit(unit.ends)
            return (unit.started, unit.busy, unit.allocation, unit.memory, limit, unfit)

        for key, group in itertools.groupby(sorted(pilots, key=_coverage_order), key=alike):
            units = list(group)
            first, unfit = units[0], key[-1]
            while units:
                if unfit is not None:
                    fate = Fate(
                        -math.inf, f"{unfit}: {'released' if first.started else 'cancelled'}"
                    )
                else:
                    fate = self._fate(first, kept, profile, now)
                gone = fate.until <= now + DUE and not first.busy
                # Its time limit ends it: the width it holds is acquired again ahead of that.
                until = min(fate.until, ends.get(first.pilot_id, math.inf))
                sharing = len(units)  # what does not read the units kept before: all of them
                if not gone and unfit is None:
                    sharing = _sharing(first, until, kept, profile, sharing)
                these, units = units[:sharing], units[sharing:]
                if gone:
                    action = Release if first.started else Cancel
                    actions += [action(unit.pilot_id, fate.why) for unit in these]
                    continue
                if fate.held is not None:
                    held.setdefault(fate.held, []).extend(unit.pilot_id for unit in these)
                kept.add(until, first.cores * len(these))
        notes += per_pilot(held)
        wake: list[float] = []
        limit = longest_path(open_) if open_ else 0.0
        peak = max(profile.widths)
        planned = 0
        for t, width, kept_cores in zip(profile.points, profile.widths, kept.held, strict=True):
            have = planned + kept_cores
            if width <= have:
                continue
            serves = [stages[s] for s in profile.stages_from(t)]
            size, task = self._size(serves, peak)
            units = Counter(split(have, width, profile.levels(t), size, task))
            # The widest first: in a FIFO queue a narrow unit must not take a core of the hole
            # the wide one waits for.
            for cores, n in sorted(units.items(), reverse=True):
                allocation = self._unit(cores, serves, limit)
                ahead = lead(self.law(allocation), self._k(width))
                due = t - ahead
                needed = f"{count(n * cores, 'core')} needed at {offset(t)}"
                if n > 1:
                    needed += f" ({n} pilots of {count(cores, 'core')})"
                if due > now + DUE:
                    wake.append(due)
                    # What is needed, not what is had: the units held and planned move
                    # between passes (a pilot submitted now is planned, then held).
                    names = ",".join(v.name for v in serves)
                    subject = f"{place}: {n} units of {cores} cores to {width} for {names}"
                    if self._said.worth_saying(subject, due, now):
                        notes.append(
                            f"{needed}: submitting at {offset(due)} ({duration(ahead)} ahead)"
                        )
                    continue
                for _ in range(n):
                    _, prediction = self.predict(allocation)
                    actions.append(
                        Submit(
                            tuple(v.name for v in serves),
                            allocation,
                            predicted_wait=ahead,
                            prediction=prediction,
                        )
                    )
                timing = f"{duration(ahead)} ahead"
                if due < now - DUE:  # needed sooner than its lead: it may well start late
                    timing = f"late for its lead of {duration(ahead)}"
                notes.append(f"{needed}: submitting now ({timing}, no dependency)")
            planned += sum(units.elements())
        return Plan(tuple(actions), min(wake, default=None), tuple(notes))

    def _width(self, view: StageView) -> int:
        """A stage's width: what its tasks left use at once, at most its allocation; an
        automatic one's allocation is its bounds (``max_cores``, ``max_nodes`` nodes, the
        partition's nodes), not the one pilot another strategy would choose: here the units
        are the pilots."""
        a = view.allocation
        if not a.auto:
            return view.width
        nodes = a.max_nodes if a.max_nodes is not None else self.nodes
        bounds = [b for b in (a.max_cores, nodes and nodes * int(self.node.cores)) if b]
        return min([view.wanted, *bounds])

    def _size(self, serves: Sequence[StageView], peak: int) -> tuple[int, int]:
        """The cores of a unit that serves ``serves``, and of the widest task of theirs: one
        task's by default, the smallest pilot the scheduler can start in a gap (backfill
        starts a narrow job sooner: docs/elastic.md); with :attr:`unit`, as many whole tasks as
        fit in it; a node at most. A place whose width reaches ``peak`` cores holds at most
        :data:`MAX_UNITS` units: wider, each unit holds more tasks."""
        node = int(self.node.cores)
        task = min(node, max(_cores(v.task) for v in serves))
        most = {"task": task, "node": node}.get(self.unit, self.unit)
        assert isinstance(most, int)
        most = max(most, -(-peak // MAX_UNITS))
        return max(task, min(most, node) // task * task), task

    def _fit(
        self,
        allocation: Allocation | None,
        memory: float | None,
        busy: bool,
        *,
        stages: Sequence[StageView],
        now: float,
    ) -> Fit:
        """What the stages still open ask of a unit of ``allocation`` whose workers hold
        ``memory`` (None: none joined yet): whether it can hold none of their tasks (its
        cores or memory too small for tasks that have since grown, their memory after a
        kill; idle while a task it cannot hold waits for a larger unit, which counted as
        width for a later stage it would keep from being acquired), and when a task that
        starts on it now ends: a unit whose time limit comes first is given none (placement
        gives it none). Such a unit would otherwise count as width held while nothing runs."""
        assert allocation is not None  # every unit has one
        if not stages:
            return Fit()  # its fate lets it go: no stage needs it again
        memory = self._memory(allocation) if memory is None else memory
        cores = allocation.cores
        fits = [v for v in stages if _cores(v.task) <= cores and v.task.memory <= memory + 1e-9]
        if not fits:
            return Fit("too small for the tasks left")
        held = {v.name for v in fits}
        if not busy and any(v.outgrown and v.name not in held for v in stages):
            return Fit("too small for the tasks waiting")  # kept for a later stage, it would block
        # Tasks it could start now: a later stage's are left to the units acquired for it.
        startable = [now + v.duration for v in fits if v.phase != Phase.WAITING]
        return Fit(deadline=min(startable, default=-math.inf))

    def _memory(self, allocation: Allocation) -> float:
        """An allocation's memory in MB: as written, or what the default gives its cores."""
        if allocation.memory_mb is not None:
            return allocation.memory_mb
        return self._default(allocation.cores)

    def _default(self, cores: int) -> float:
        """The memory the scheduler's default gives ``cores`` (MB): as units showed, or the
        cores' share of a node's."""
        per_core = self._default_per_core or self.node.memory / self.node.cores
        return per_core * cores

    def _learn_default(self, pilots: Sequence[PilotView]) -> None:
        """What the scheduler's default memory gave the units that left memory to it."""
        for p in pilots:
            if p.memory and p.cores and p.allocation and p.allocation.memory_mb is None:
                per_core = p.memory / p.cores
                known = self._default_per_core
                self._default_per_core = per_core if known is None else min(known, per_core)

    def _k(self, cores: int) -> float:
        """The cost of a second of ``cores`` idle, in seconds of makespan."""
        return self.cost * cores / 3600.0

    def _again(
        self, law: Sequence[tuple[float, float]], cores: int, above: int, need: int, within: float
    ) -> float:
        """The expected cost, in seconds of makespan, of a unit of ``cores`` acquired again
        ``within`` seconds from now, for a moment the run needs ``need`` cores, ``above`` of
        them above the units kept below it. The unit's share of that width is the share of its
        delay the run feels (the other units work meanwhile), so it is submitted at the lead
        of the whole width: every unit of one width at the same lead, whatever its cores."""
        return min(cores, above) / need * again_cost(law, self._k(need), within)

    def _fate(self, unit: PilotView, below: Kept, profile: Profile, now: float) -> Fate:
        """Until when ``unit`` is kept, covering the width above the units kept ``below``
        it (at each moment, those still kept then): through every gap in which that width is
        not needed that is cheaper to hold than to acquire again; a pending unit, while any
        width it covers is needed."""
        points = profile.points
        above = below.above(profile.widths)
        needed = [width > 0 for width in above]
        if not unit.started:
            if any(needed):
                return Fate(math.inf)
            return Fate(now, "pending, and no stage needs it: cancelled")
        assert unit.allocation is not None  # every unit has one
        law = self.law(unit.allocation)
        if not unit.busy and needed[0]:
            narrower = self._narrower(unit, above, profile, now, law)
            if narrower is not None:
                return narrower
        i = 0
        held = None
        while True:
            gap = next((j for j in range(i, len(points)) if not needed[j]), None)
            if gap is None:
                return Fate(math.inf, held=held)
            again = next((j for j in range(gap + 1, len(points)) if needed[j]), None)
            if again is None:
                return Fate(points[gap], "no stage needs it again: released")
            a, b = points[gap], points[again]
            hold = self._k(unit.cores) * (b - a)
            anew = self._again(law, unit.cores, above[again], profile.need(b), b - now)
            if anew < hold and b - a > CHURN_S:
                return Fate(
                    a,
                    f"idle until {offset(b)}: released (holding it costs {duration(hold)} "
                    f"of makespan, acquiring it again {duration(anew)})",
                )
            if gap == 0:
                held = (
                    f"idle until {offset(b)}, held (holding it costs {duration(hold)} of "
                    f"makespan, acquiring it again {duration(anew)})"
                )
            i = again

    def _narrower(
        self,
        unit: PilotView,
        above: Sequence[int],
        profile: Profile,
        now: float,
        law: Sequence[tuple[float, float]],
    ) -> Fate | None:
        """Whether an idle ``unit`` of which the width needs only part from now on (a narrow
        stage after a wide one, when the narrow unit cut for it is gone: it ended at its time
        limit, say) is better given back now, a unit as wide as that part acquired in its
        place, and the whole width again when it is needed: by its idle cores' cost against
        the narrow unit's expected wait and the wide one's acquisition. ``above``: the width
        needed above the units kept before it, at each of the profile's points; ``law``: the
        wait of a unit like it."""
        assert unit.allocation is not None
        points = profile.points
        cores = unit.cores
        used = [min(max(width, 0), cores) for width in above]
        if not 0 < used[0] < cores:
            return None
        last = next((j for j in range(1, len(points)) if not 0 < used[j] < cores), len(points))
        end = points[last] if last < len(points) else math.inf
        if end - now <= CHURN_S:
            return None
        edges = [*points[1:last], end]
        idle = sum((cores - used[j]) * (edges[j] - points[j]) for j in range(last))
        hold = idle * self.cost / 3600.0
        width = max(used[:last])
        anew = sum(p * wait for wait, p in self.law(replace(unit.allocation, cores=width)))
        back = next((j for j in range(last, len(points)) if used[j]), None)
        again = back is not None
        if back is not None:
            b = points[back]
            anew += self._again(law, cores, above[back], profile.need(b), b - now)
        if not anew < hold:  # nan-safe: lambda 0 holds idle cores for ever
            return None
        until = "for the rest of the run" if end == math.inf else f"until {offset(end)}"
        holding = "for ever" if hold == math.inf else f"at a cost of {duration(hold)} of makespan"
        instead = "a narrower unit and the whole width again" if again else "a narrower unit"
        return Fate(
            now,
            f"{cores - used[0]} of its {cores} cores idle {until}: released for a {width}-core "
            f"unit (holding them {holding}; {instead}: {duration(anew)})",
        )

    def _spans(self, now: float, stages: Mapping[str, StageView], place: Place) -> list[Span]:
        """Each open stage's width at ``place``, from its (forecast) start to its forecast end;
        a stage whose start is not known yet is left out."""
        spans = []
        for view in stages.values():
            if not view.phase.open or _place(view.allocation) != place:
                continue
            begin = now
            if view.phase == Phase.WAITING:
                ends = [stages[a].forecast_end for a in view.after if stages[a].phase.open]
                if None in ends:
                    continue
                begin = max([now, *ends])  # type: ignore[list-item]
            end = view.forecast_end if view.forecast_end is not None else math.inf
            spans.append(Span(view.name, begin, max(end, begin), self._width(view)))
        return spans

    def _unit(self, cores: int, serves: Sequence[StageView], limit: float) -> Allocation:
        """A unit of ``cores`` for the stages it serves, with the time limit of the longest
        chain left. Its memory is the most any of them gives that many cores (a stage that
        leaves memory to the default counts what the default gives, :meth:`_default`); it
        leaves memory to the default where they all do. A stage whose allocation fits a
        node's memory gives a unit no more. Either way, it holds the memory of as many of
        their tasks as its cores hold."""
        widest = max(serves, key=lambda v: v.allocation.cores).allocation
        node = self.node
        memory: float | None = None
        if any(v.allocation.memory_mb is not None for v in serves):
            memory = max(
                self._memory(a) * min(cores, a.cores) / a.cores
                for a in (v.allocation for v in serves)
            )
            memory = math.floor(memory)
        tasks = max(v.task.memory * (cores // _cores(v.task)) for v in serves)
        if tasks > (self._default(cores) if memory is None else memory):
            memory = min(math.ceil(tasks), math.floor(node.memory))
        return replace(widest, cores=cores, nodes=None, memory_mb=memory, time_limit_s=limit)


Place = tuple[str | None, str | None, str | None]
"""Where a pilot goes: its partition, account and QOS. A unit serves the stages of its place."""


def _place(allocation: Allocation | None) -> Place:
    assert allocation is not None  # every stage and unit has one
    return (allocation.partition, allocation.account, allocation.qos)


def _cores(task: Resources) -> int:
    """The whole cores one task takes: a unit holds whole tasks."""
    return max(1, math.ceil(task.cores - 1e-9))


def _sharing(unit: PilotView, until: float, kept: Kept, profile: Profile, alike: int) -> int:
    """How many of ``alike`` units like ``unit`` (itself first), each kept on top of the one
    before until ``until``, have its fate. A kept unit adds its cores to the points before
    ``until``: the next is weighed on the width above less them, and has the same fate while
    that width stays at least its cores wherever it was needed (it is needed for the same,
    covers as much, is not narrower) and becomes needed nowhere else; a pending one, while
    any width above is needed."""
    cores = unit.cores
    to = kept.reach(until)
    above = kept.above(profile.widths)
    if not unit.started:
        if any(a > 0 for a in above[to:]):
            return alike
        return max(1, min(alike, max(-(-a // cores) for a in above[:to])))
    needed = [a for a in above[:to] if a > 0]
    return max(1, min([alike, *(a // cores for a in needed)]))


def _coverage_order(unit: PilotView) -> tuple[bool, int, bool]:
    """Which units cover the width first: running ones before pending ones, the smaller first
    (a narrow width keeps a narrow unit, and a wide one goes once its tasks end), busy before
    idle."""
    return (not unit.started, unit.cores, not unit.busy)
