"""``allocation = "auto"``: a stage's pilot sized from what was learned.

A hand-written allocation is a guess: too wide and cores idle (and the pilot
waits longer in the queue), too narrow and the stage runs long, too long a time
limit and EASY backfill cannot slip the pilot into a gap (backfill trusts the
requested limit), too short and the pilot is killed. An automatic allocation is
chosen when its pilot is submitted, from

- the stage's tasks still to run and the cores (and memory) each takes;
- their run times, learned in earlier runs of the workflow, in this run, or
  declared (``wall``);
- the node shape of the partition;
- the learned queue wait of each geometry (the ASA learner's).

**Width.** The candidates are the fewest slots (tasks side by side) for each
number of waves the stage's tasks can run in, and whole nodes, up to the bounds
(``max_nodes``, ``max_cores``, the partition's nodes). A candidate's cost is its
expected wait plus its expected run time (a schedule of the learned run times on
its slots) plus the core-hours it holds priced at ``cost`` seconds each (the
elastic strategy's lambda, ``--cost``: a wider pilot finishes sooner but idles
more cores in its last wave); the cheapest wins, ties (within 1% of its wait +
run time) to the narrower. The wait of a width is the one its geometry last had
(the freshest the learner has); a width never tried is read off
the line through the learned waits by cores (from no wait at no cores,
proportional beyond the widest), a prior the learner corrects once a pilot of
that width has waited, and no candidate is more than twice as wide as the
widest learned one (:data:`WIDER`). With no wait learned at all, waits count as
nothing. A width the scheduler itself expects to start now (within :data:`NOW_S`: Slurm's
``sbatch --test-only``, asked before the choice about the widths :func:`to_ask` lists)
waits nothing, whatever was learned: the queue as it is outweighs the queue as it was,
and such a pilot fills a gap the backfill scheduler has now. A later expected start is
not used: the scheduler assumes every job runs to its limit and none arrives, so it is
no better a wait than the learned one. Tasks of one core ask for cores only,
wherever the scheduler finds them, as a hand-written allocation without
``nodes`` does; tasks of several cores get whole nodes (``--nodes``), so that no
task is split.

**Time limit.** The :data:`RISK` quantile of the stage's predicted run time on
the chosen width (schedules of run times drawn from the learned ones, seeded),
plus :data:`MARGIN` of it and :data:`STARTUP_S`, rounded up to a minute; never
below the longest learned task plus that margin. A tighter limit backfills
sooner; the pool's walltime-aware placement keeps tasks off a pilot about to
end, and a stage whose pilot ends early gets another.

**Replacing a pending pilot.** A pilot chosen ahead of its stage, on a forecast and the waits
learned before, may meet another queue once the stage is ready. :class:`Instead` weighs it
against the widths that, started now, cost less than it would if it waited as long again as
it has since the stage became ready (a queue wait that has lasted a while is as likely to last
as long again as to end soon); if the scheduler starts one of them now, the cheapest replaces
it (``planner.AutoFit.replacements``).

**Fallback.** With no run time known (no earlier run, no task finished, no
``wall``), the pilot is one node, with no more cores than the stage's tasks
fill, for ``max_time`` (or 1 h).

Pure and deterministic: no I/O; the only randomness is a fixed seed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from orchestrator.human import count, duration
from workflows.bounds import DURATION_S
from workflows.spec import Allocation, Stage, Workflow

RISK = 0.99
"""The quantile of the predicted run time a time limit covers: about one pilot in a hundred
may hit its limit before its stage's tasks are done."""
MARGIN = 0.10
"""Added to that quantile (and to the longest learned task), as a share of it."""
STARTUP_S = 60.0
"""Added too: a pilot's workers start and connect before its first task runs."""
FALLBACK_TIME_S = 3600.0
"""The time limit of an automatic allocation that knows nothing, without ``max_time``."""
DRAWS = 200
"""Simulated schedules behind a predicted run time's quantile."""
DRAWN = 200_000
"""Run times drawn at most for one width; beyond, a slot's total is drawn whole."""
DRAWN_SLOTS = 2048
"""Slots whose totals are drawn, at most, when run times are not drawn one by one."""
WIDER = 2.0
"""An automatic allocation is at most this many times as wide as the widest one whose wait
was learned: a wider pilot's wait is not known, and may be much longer (widths grow run by
run as their waits are learned)."""
TIE = 0.01
"""Widths whose cost is within this share of the cheapest one's wait + run time count as
equal: the narrower wins, holding fewer cores for the same time."""
NOW_S = 60.0
"""A pilot the scheduler expects to start within this long starts now (its next backfill
pass): its wait counts as nothing."""
SEED = 0
LEARNED_KEEP = 2000
"""At most this many learned run times per stage are used (the latest)."""


@dataclass(frozen=True, slots=True)
class Node:
    """A node's cores, and how many nodes the partition has (None: not known)."""

    cores: int
    count: int | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    """What a stage still has to run."""

    tasks: int
    """Tasks still to run."""
    task_cores: float = 1.0
    task_memory_mb: float | None = None
    durations: tuple[float, ...] = ()
    """Learned (or declared) run times of its tasks, seconds."""
    source: str = ""
    """Where ``durations`` come from, in words: ``run times learned of 24 in earlier runs, the
    longest 5 min 31 s``."""


class WaitFrom(enum.Enum):
    """Where a chosen width's expected wait comes from."""

    LEARNED = "learned"
    """What a pilot of this geometry last waited."""
    OTHER_WIDTHS = "other widths"
    """Read off the waits learned of other widths: this one was never tried."""
    SCHEDULER = "scheduler"
    """The scheduler expects it to start now."""
    UNWEIGHED = "unweighed"
    """No width was weighed (no run time known yet): the fallback."""


@dataclass(frozen=True, slots=True)
class Fit:
    """The chosen pilot: ``cores`` on ``nodes`` nodes, ``time_limit_s``, and why."""

    cores: int
    nodes: int
    time_limit_s: float
    memory_mb: int | None
    run_s: float | None
    """Expected run time of the stage on it (None: nothing known)."""
    wait_s: float | None
    """Expected queue wait (None: none learned)."""
    because: str
    pinned: bool = False
    """Ask for exactly ``nodes`` nodes (tasks of several cores need them whole); otherwise
    only the cores are asked for, and the scheduler places them wherever there is room."""
    wait_from: WaitFrom = WaitFrom.LEARNED

    def words(self, stage: str) -> str:
        """``stage x fit: 3 nodes x 28 cores, 2 h 10 min, predicted wait 14 min, because ...``"""
        nodes = count(self.nodes, "node")
        shape = (
            f"{nodes} x {self.cores // self.nodes} cores"
            if self.pinned
            else count(self.cores, "core")
            + (f" ({self.nodes} nodes' worth)" if self.nodes > 1 else "")
        )
        if self.wait_from is WaitFrom.UNWEIGHED:
            wait = ""
        elif self.wait_s is None:
            wait = "no wait learned"
        elif self.wait_from is WaitFrom.SCHEDULER:
            wait = "starts now, as the scheduler foresees"
        elif self.wait_from is WaitFrom.LEARNED:
            wait = f"predicted wait {duration(self.wait_s)}"
        else:
            wait = f"wait {duration(self.wait_s)} by other widths' (never tried)"
        said = ", ".join(w for w in (shape, duration(self.time_limit_s), wait) if w)
        return f"stage {stage} fit: {said}, because {self.because}"


def demand(
    tasks: int,
    declared: dict[str, float],
    this_run: tuple[float, ...],
    earlier: list[tuple[float, float | None]],
) -> Demand:
    """A stage's demand from what is known of its tasks: run times of this run and of
    earlier runs (with the cores they were given), else their declared ``wall``; cores
    as declared, else as earlier runs gave them (the median), else one."""
    walls = tuple(w for w, _ in earlier[-LEARNED_KEEP:])
    given = [c for _, c in earlier if c is not None]
    cores = declared.get("cores", float(np.median(given)) if given else 1.0)
    durations = (*walls, *this_run)[-LEARNED_KEEP:]
    if durations:
        parts = [f"{n} in earlier runs" for n in [len(walls)] if n]
        parts += [f"{n} in this run" for n in [len(this_run)] if n]
        source = (
            f"run times learned of {' and '.join(parts)}, the longest {duration(max(durations))}"
        )
    elif "wall" in declared:
        durations, source = (declared["wall"],), f"the tasks declare {duration(declared['wall'])}"
    else:
        source = ""
    return Demand(tasks, cores, declared.get("memory"), durations, source)


WaitOf = Callable[[int | None, int], float | None]
"""The learned wait of a pilot of (nodes, cores), nodes None where not pinned; None where
never learned."""

Geometry = tuple[int | None, int, float, int | None]
"""A pilot as the scheduler is asked about it: nodes (None where not pinned), cores, time
limit (s), memory (MB; None: the scheduler's default)."""

Expected = Callable[[Geometry], float | None]
"""The wait the scheduler foresees for a pilot of a geometry submitted now; None where it
was not asked or could not tell."""


def _not_asked(geometry: Geometry) -> float | None:
    return None


@dataclass(frozen=True, slots=True)
class _Shape:
    """How a stage's tasks lie on nodes: ``per_task`` cores each, ``per_node`` to a node."""

    tasks: int
    per_task: float
    per_node: int
    node: Node

    @classmethod
    def of(cls, demand: Demand, node: Node) -> _Shape:
        per_task = max(demand.task_cores, 1e-9)
        per_node = max(1, math.floor(node.cores / per_task + 1e-9))
        return cls(max(demand.tasks, 1), per_task, per_node, node)

    @property
    def pinned(self) -> bool:
        return self.per_task > 1

    def nodes(self, slots: int) -> int:
        return math.ceil(slots / self.per_node)

    def cores(self, slots: int) -> int:
        """Cores for ``slots`` tasks side by side: whole nodes' worth of slots when pinned."""
        if self.pinned:
            nodes = self.nodes(slots)
            return nodes * math.ceil(math.ceil(slots / nodes) * self.per_task - 1e-9)
        return max(1, math.ceil(slots * self.per_task - 1e-9))

    def most_slots(self, b: Allocation) -> int:
        most = self.tasks
        for nodes in (b.max_nodes, self.node.count):
            if nodes is not None:
                most = min(most, nodes * self.per_node)
        if b.max_cores is not None:
            most = min(most, max(1, int(b.max_cores // self.per_task)))
        return max(most, 1)

    def candidates(self, b: Allocation) -> list[int]:
        """The fewest slots for each number of waves, and whole nodes, up to the bounds."""
        most = self.most_slots(b)
        root = math.isqrt(self.tasks) + 1
        waves = {math.ceil(self.tasks / k) for k in range(1, root + 1)} | set(range(1, root + 1))
        nodes = {n * self.per_node for n in range(1, self.nodes(most) + 1)}
        return sorted(s for s in waves | nodes if s <= most) or [most]

    def fit(
        self,
        slots: int,
        limit: float,
        run: float | None,
        why: str,
        demand: Demand,
        wait_s: float | None = None,
        wait_from: WaitFrom = WaitFrom.LEARNED,
    ) -> Fit:
        """The pilot of ``slots`` tasks side by side."""
        memory = None if demand.task_memory_mb is None else math.ceil(slots * demand.task_memory_mb)
        return Fit(
            self.cores(slots),
            self.nodes(slots),
            limit,
            memory,
            run,
            wait_s,
            why,
            self.pinned,
            wait_from,
        )

    def geometry(self, slots: int, limit: float, demand: Demand) -> Geometry:
        fit = self.fit(slots, limit, None, "", demand)
        return (fit.nodes if fit.pinned else None, fit.cores, limit, fit.memory_mb)


@dataclass(frozen=True, slots=True)
class _Weighing:
    """The widths an automatic allocation may take, with their learned waits and run times."""

    shape: _Shape
    cores: dict[int, int]
    learned: dict[int, float | None]
    waits: dict[int, float]
    timed: dict[int, tuple[float, float]]
    """Each width's expected run time and time limit."""
    allowed: list[int]
    """The widths whose wait is known (or all, where none is)."""
    fitting: list[int]
    """The allowed widths whose time limit is within ``max_time``."""
    demand: Demand

    @classmethod
    def of(cls, demand: Demand, node: Node, bounds: Allocation, wait_of: WaitOf) -> _Weighing:
        shape = _Shape.of(demand, node)
        runs = np.sort(np.asarray(demand.durations, dtype=float))
        slots = shape.candidates(bounds)
        cores = {s: shape.cores(s) for s in slots}
        learned = {s: wait_of(shape.nodes(s) if shape.pinned else None, cores[s]) for s in slots}
        waits = _waits(learned, cores)
        timed = {s: _run_time(runs, shape.tasks, s) for s in slots}
        allowed = [s for s in slots if s in waits] if waits else slots
        most = bounds.max_time_s
        fitting = [s for s in allowed if most is None or timed[s][1] <= most]
        return cls(shape, cores, learned, waits, timed, allowed, fitting, demand)

    def geometry(self, slots: int) -> Geometry:
        return self.shape.geometry(slots, self.timed[slots][1], self.demand)

    def starting_now(self, widths: Iterable[int], expected: Expected) -> set[int]:
        """The ``widths`` the scheduler starts within :data:`NOW_S` (``expected``)."""
        return {s for s in widths if (e := expected(self.geometry(s))) is not None and e <= NOW_S}

    def prices(self, waits: dict[int, float], cost: float) -> tuple[dict[int, float], int]:
        """Each fitting width's wait + run time + priced core-hours, and the cheapest width."""
        price = {
            s: waits.get(s, 0.0) + self.timed[s][0] * (1 + cost * self.cores[s] / 3600.0)
            for s in self.fitting
        }
        return price, min(self.fitting, key=price.__getitem__)


def to_ask(
    demand: Demand, node: Node, bounds: Allocation, wait_of: WaitOf, cost: float = 0.0
) -> list[Geometry]:
    """The pilots to ask the scheduler about before :func:`choose`: the widths that would be
    chosen instead of the cheapest if they started now (none where no run time is known: the
    fallback weighs nothing)."""
    if not demand.durations:
        return []
    w = _Weighing.of(demand, node, bounds, wait_of)
    if not w.fitting:
        return []
    price, cheapest = w.prices(w.waits, cost)
    now, _ = w.prices({}, cost)
    return [w.geometry(s) for s in w.fitting if s != cheapest and now[s] < price[cheapest]]


@dataclass(frozen=True, slots=True)
class Instead:
    """The widths that would replace a stage's pending pilot of ``held`` cores, which has
    waited ``waited`` s since the stage became ready: those that, started now, would cost less
    than it would if it waited as long again, with their prices.

    As long again: a queue wait is heavy-tailed, and one that has lasted a while is as likely
    to last about as long again as to end soon. The pending pilot's place in the queue is
    given up, so a width that starts now must beat it by that much, not merely by its run."""

    weighing: _Weighing
    price: dict[int, float]
    held: int
    waited: float

    @classmethod
    def of(
        cls,
        demand: Demand,
        node: Node,
        bounds: Allocation,
        wait_of: WaitOf,
        cost: float,
        held: int,
        waited: float,
    ) -> Instead | None:
        """None where no run time is known (nothing to weigh)."""
        if not demand.durations:
            return None
        w = _Weighing.of(demand, node, bounds, wait_of)
        slots = max(1, math.floor(held / w.shape.per_task + 1e-9))
        runs = np.sort(np.asarray(demand.durations, dtype=float))
        run = w.timed[slots][0] if slots in w.timed else _run_time(runs, w.shape.tasks, slots)[0]
        keep = waited + run * (1 + cost * held / 3600.0)
        now, _ = w.prices({}, cost)
        price = {s: p for s, p in now.items() if w.cores[s] != held and p < keep}
        return cls(w, price, held, waited)

    def to_ask(self) -> list[Geometry]:
        """The pilots to ask the scheduler about: every width that would replace it."""
        return [self.weighing.geometry(s) for s in self.price]

    def choose(self, expected: Expected) -> Fit | None:
        """The cheapest width the scheduler starts now (``expected``, asked about the widths
        :meth:`to_ask` listed); None to keep the pending pilot."""
        w = self.weighing
        now = w.starting_now(self.price, expected)
        if not now:
            return None
        best = min(sorted(now), key=self.price.__getitem__)  # ties: the narrower
        mean, limit = w.timed[best]
        why = (
            f"{w.demand.source}; its pilot of {count(self.held, 'core')} still waited "
            f"{duration(self.waited)} after the stage became ready, and this width starts now"
        )
        return w.shape.fit(
            best, limit, mean, why, w.demand, wait_s=0.0, wait_from=WaitFrom.SCHEDULER
        )


def choose(
    demand: Demand,
    node: Node,
    bounds: Allocation,
    wait_of: WaitOf,
    cost: float = 0.0,
    expected: Expected = _not_asked,
) -> Fit:
    """The pilot for ``demand`` on nodes like ``node`` within the automatic allocation
    ``bounds`` (its ``max_nodes``, ``max_cores``, ``max_time_s``); ``cost`` is the seconds
    of makespan a core-hour is worth (the elastic strategy's lambda); ``expected`` the
    scheduler's own foresight of the waits :func:`to_ask` listed."""
    if not demand.durations:
        return fallback(demand, node, bounds)
    w = _Weighing.of(demand, node, bounds, wait_of)
    waits, timed, cores, fitting = dict(w.waits), w.timed, w.cores, w.fitting
    now = w.starting_now(fitting, expected)
    waits.update(dict.fromkeys(now, 0.0))
    if fitting:
        took = {s: waits.get(s, 0.0) + timed[s][0] for s in fitting}
        price, cheapest = w.prices(waits, cost)
        best = min(s for s in fitting if price[s] <= price[cheapest] + TIE * took[cheapest])
        mean, limit = timed[best]
        why = f"{demand.source}; {_weighed(waits, len(w.allowed), cost)}"
    else:
        assert bounds.max_time_s is not None
        best = w.allowed[-1]
        mean, limit = timed[best][0], bounds.max_time_s
        why = f"{demand.source}; even {cores[best]} cores need longer than max_time allows"
    if best in now:
        source = WaitFrom.SCHEDULER
    else:
        source = WaitFrom.LEARNED if w.learned[best] is not None else WaitFrom.OTHER_WIDTHS
    return w.shape.fit(best, limit, mean, why, demand, wait_s=waits.get(best), wait_from=source)


def fallback(demand: Demand, node: Node, bounds: Allocation) -> Fit:
    """The pilot where no run time is known: one node, no more cores than the tasks fill."""
    shape = _Shape.of(demand, node)
    slots = min(shape.per_node, shape.most_slots(bounds))
    limit = bounds.max_time_s if bounds.max_time_s is not None else FALLBACK_TIME_S
    why = f"no run time known yet (first run, no wall declared): one node, {duration(limit)}"
    return shape.fit(slots, limit, None, why, demand, wait_from=WaitFrom.UNWEIGHED)


def fitted(allocation: Allocation, fit: Fit) -> Allocation:
    """``allocation`` (automatic) as the pilot ``fit`` chose."""
    return replace(
        allocation,
        cores=fit.cores,
        nodes=fit.nodes if fit.pinned else None,
        memory_mb=fit.memory_mb,
        time_limit_s=fit.time_limit_s,
    )


def with_fallbacks(workflow: Workflow, node: Node) -> Workflow:
    """``workflow`` with each automatic allocation at its fallback until a pilot is chosen:
    what a run checks before it starts, sizes its first tasks by, and what planners that do
    not choose (``bigjob``) submit."""
    stages = tuple(
        replace(s, allocation=fitted(s.allocation, fallback(_declared(s), node, s.allocation)))
        if s.allocation.auto
        else s
        for s in workflow.stages
    )
    return replace(workflow, stages=stages)


def _declared(stage: Stage) -> Demand:
    declared = stage.tasks.declared
    return Demand(stage.tasks.size, declared.get("cores", 1.0), declared.get("memory"))


def _run_time(runs: np.ndarray, tasks: int, slots: int) -> tuple[float, float]:
    """Expected run time of ``tasks`` on ``slots`` and the time limit that covers it.

    Run times are drawn from the learned ones (:data:`DRAWS` schedules, seeded); slot ``i``
    runs tasks ``i``, ``i + slots``, ... one after the other (a round-robin schedule,
    a little longer than one that gives each task the first free slot: on the safe side).
    Past :data:`DRAWN` draws a slot's total is drawn from its normal approximation
    (the sum of many run times), for at most :data:`DRAWN_SLOTS` slots. The limit is the
    :data:`RISK` quantile with its margin, never below the longest learned task with its
    margin.
    """
    slots = min(slots, tasks)
    full, extra = divmod(tasks, slots)
    rng = np.random.default_rng(SEED)
    if DRAWS * tasks <= DRAWN:
        draws = np.zeros((DRAWS, (full + (extra > 0)) * slots))
        draws[:, :tasks] = runs[rng.integers(0, len(runs), size=(DRAWS, tasks))]
        ends = draws.reshape(DRAWS, -1, slots).sum(axis=1).max(axis=1)
    else:
        shown = min(slots, DRAWN_SLOTS)
        longer = math.ceil(extra * shown / slots)
        counts = np.full(shown, float(full))
        counts[:longer] += 1
        mean, sd = float(runs.mean()), float(runs.std())
        totals = rng.normal(counts * mean, np.sqrt(counts) * sd, size=(DRAWS, shown))
        ends = totals.max(axis=1)
    predicted = max(float(np.quantile(ends, RISK)), float(runs[-1]))
    limit = min(predicted * (1 + MARGIN) + STARTUP_S, DURATION_S)
    return float(ends.mean()), 60.0 * math.ceil(limit / 60.0)


def _waits(learned: dict[int, float | None], cores: dict[int, int]) -> dict[int, float]:
    """The wait of every candidate that may be chosen: learned, else read off the line
    through the learned waits by cores, from no wait at no cores, and proportional beyond
    the widest learned one, for candidates at most :data:`WIDER` times as wide as it;
    empty when none was learned."""
    points = sorted((cores[s], float(v)) for s, v in learned.items() if v is not None)
    if not points:
        return {}
    widest, last = points[-1]
    xs, ys = [0.0, *(c for c, _ in points)], [0.0, *(w for _, w in points)]
    out: dict[int, float] = {}
    for s, value in learned.items():
        if value is not None:
            out[s] = value
        elif cores[s] <= widest:
            out[s] = float(np.interp(cores[s], xs, ys))
        elif cores[s] <= WIDER * widest:
            out[s] = last * cores[s] / widest
    return out


def _weighed(waits: dict[int, float], candidates: int, cost: float) -> str:
    priced = f" + {duration(cost)} per core-hour" if cost > 0 else ""
    if not waits:
        return f"no queue wait learned yet, so the least run time{priced}"
    if candidates == 1:
        return "one width holds every task"
    return f"the least wait + run time{priced} of {candidates} widths"
