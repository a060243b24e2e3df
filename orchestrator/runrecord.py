"""One run as the store holds it, and what its report draws from it.

Everything here comes from the store's rows (read through :meth:`Store.rows`):
the run's figures are those the run recorded at its end (what ``leadtime run
--json`` printed); a run that recorded none (still going, or its manager
stopped) gets figures computed the same way from what the store holds so far.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from learners.metrics import Usage
from learners.resources import PACKED, Resource
from orchestrator.runs import ON_WORKER
from orchestrator.store import Store
from orchestrator.summary import PilotFigures, StageFigures, summarize

StoreRow = Mapping[str, Any]
"""A row of the store, as :meth:`Store.rows` gives it."""

UNFINISHED = ("success", *ON_WORKER)
"""Outcomes of attempts that did not fail: succeeded, or not over yet."""


def stage_of(task_id: str) -> str:
    """The stage of a task (task ids are ``STAGE.INDEX``)."""
    return task_id.rsplit(".", 1)[0]


def failure_kind(attempt: StoreRow) -> str | None:
    """What ended an attempt that did not succeed, for counting: the resource it exhausted
    (memory, disk, wall, cores), or its outcome (failed, lost, stopped, late ...); None
    otherwise."""
    if attempt["outcome"] in UNFINISHED:
        return None
    return attempt["exhausted"] or attempt["outcome"]


@dataclass(frozen=True)
class RunRecord:
    """A run's rows: the run, its stages, pilots, tasks, attempts and observed waits."""

    run: StoreRow
    stages: Sequence[StoreRow]
    pilots: Sequence[StoreRow]
    tasks: Sequence[StoreRow]
    attempts: Sequence[StoreRow]
    waits: Sequence[StoreRow]

    @classmethod
    async def load(cls, store: Store, run_id: str) -> RunRecord | None:
        """The run ``run_id`` of ``store``, or None when the store has no such run."""
        where = {"run_id": run_id}
        runs = await store.rows("runs", where)
        if not runs:
            return None
        run = runs[0]
        stages = await store.rows("stages", where)
        pilots = await store.rows("pilots", where)
        recorded = run.get("summary") or {}
        return cls(
            run,
            _in_order(stages, "stage", [s["name"] for s in recorded.get("stages", ())], "ready_t"),
            _in_order(pilots, "pilot_id", [p["pilot_id"] for p in recorded.get("pilots", ())]),
            await store.rows("tasks", where),
            await store.rows("attempts", where, order="start_t"),
            await store.rows("waits", where),
        )

    @property
    def recorded(self) -> bool:
        """The run recorded its figures at its end."""
        return self.run.get("summary") is not None

    @property
    def figures(self) -> dict[str, Any]:
        """The run's figures as ``leadtime run --json`` gives them (``RunSummary.as_json``)."""
        if self.recorded:
            return dict(self.run["summary"])
        return self._figures_so_far()

    @property
    def end_t(self) -> float:
        """The run's end, from its start: its makespan, or the last moment it recorded."""
        if self.recorded:
            return float(self.run["summary"]["makespan_s"])
        moments = [
            t
            for rows, names in (
                (self.stages, ("ready_t", "start_t", "end_t")),
                (self.pilots, ("submit_t", "eligible_t", "start_t", "end_t")),
                (self.attempts, ("start_t", "end_t")),
            )
            for row in rows
            for name in names
            if (t := row.get(name)) is not None
        ]
        return max(moments, default=0.0)

    def stage_figures(self) -> list[StageFigures]:
        """Each stage's moments and counts, in the workflow's order."""
        attempts = Counter(stage_of(a["task_id"]) for a in self.attempts)
        submitted: dict[str, float] = {}
        for p in self.pilot_figures():
            for stage in p.stages:
                submitted[stage] = min(submitted.get(stage, p.submit_t), p.submit_t)
        return [
            StageFigures(
                s["stage"],
                s["ready_t"],
                submitted.get(s["stage"]),
                s["start_t"],
                s["end_t"],
                s["tasks_total"] or 0,
                attempts[s["stage"]],
            )
            for s in self.stages
        ]

    def pilot_figures(self) -> list[PilotFigures]:
        """Each pilot's moments, size, predicted wait and whether the prediction hit."""
        hits = {w["pilot_id"]: w["hit"] for w in self.waits}
        return [
            PilotFigures(
                p["pilot_id"],
                tuple(p["stage"].split(",")),
                int((p["request"] or {}).get("cores") or 0),
                p["submit_t"],
                p["eligible_t"],
                p["start_t"],
                p["end_t"],
                p["predicted_wait"],
                None if hits.get(p["pilot_id"]) is None else bool(hits[p["pilot_id"]]),
                str(p["state"] or ""),
            )
            for p in self.pilots
        ]

    def job_ids(self) -> dict[str, str | None]:
        """Each pilot's batch job id."""
        return {p["pilot_id"]: p["job_id"] for p in self.pilots}

    def _figures_so_far(self) -> dict[str, Any]:
        run = self.run
        return summarize(
            run["run_id"],
            run["workflow"],
            run["strategy"],
            run["status"],
            self.end_t,
            self.stage_figures(),
            self.pilot_figures(),
            run.get("error"),
        ).as_json()

    def categories(self) -> dict[str, str]:
        """Each task's category (its stage's name until it has a row of its own)."""
        return {t["task_id"]: t["category"] for t in self.tasks if t["category"]}

    def failures(self) -> list[StoreRow]:
        """The attempts that did not succeed, in the order they ended."""
        failed = [a for a in self.attempts if failure_kind(a) is not None]
        return sorted(failed, key=lambda a: (a["end_t"] or 0.0, a["task_id"], a["attempt"]))

    def failures_by_stage(self) -> dict[str, Counter[str]]:
        """Per stage (every stage, in the workflow's order), its failed attempts by kind."""
        found: dict[str, Counter[str]] = {s["stage"]: Counter() for s in self.stages}
        for a in self.failures():
            kind = failure_kind(a)
            assert kind is not None
            found.setdefault(stage_of(a["task_id"]), Counter())[kind] += 1
        return found


def _in_order(
    rows: list[dict[str, Any]], key: str, known: Sequence[str], moment: str = "submit_t"
) -> list[dict[str, Any]]:
    """``rows`` in the order the run recorded them (the workflow's stages, the pilots as
    submitted); where it recorded none, by ``moment`` (unknown last), then by the number a
    name ends with (a pilot's is its rank of submission), then by name."""
    place = {name: i for i, name in enumerate(known)}

    def rank(row: Mapping[str, Any]) -> tuple[int, float, int, str]:
        t, name = row[moment], row[key]
        digits = re.search(r"\d+$", name)
        number = int(digits.group()) if digits else -1
        return (place.get(name, len(place)), math.inf if t is None else t, number, name)

    return sorted(rows, key=rank)


@dataclass(frozen=True)
class CoreUsage:
    """Cores held by running pilots and cores allocated to running attempts, over time.

    Both are step functions: from ``times[i]`` to ``times[i + 1]`` the run held
    ``held[i]`` cores, of which ``busy[i]`` were allocated to attempts.
    """

    times: np.ndarray
    held: np.ndarray
    busy: np.ndarray

    @classmethod
    def of(cls, record: RunRecord) -> CoreUsage:
        end = record.end_t
        changes: list[tuple[float, float, float]] = []
        for p in record.pilot_figures():
            if p.start_t is not None:
                stop = end if p.end_t is None else p.end_t
                changes += [(p.start_t, p.cores, 0.0), (stop, -p.cores, 0.0)]
        for a in record.attempts:
            cores = float((a["allocation"] or {}).get("cores") or 0.0)
            if a["start_t"] is not None and cores:
                stop = end if a["end_t"] is None else a["end_t"]
                changes += [(a["start_t"], 0.0, cores), (stop, 0.0, -cores)]
        if not changes:
            return cls(np.array([0.0, end]), np.zeros(2), np.zeros(2))
        changes.sort(key=lambda c: c[0])
        moments = np.array([c[0] for c in changes])
        times, first = np.unique(moments, return_index=True)
        held = np.add.reduceat(np.array([c[1] for c in changes]), first).cumsum()
        busy = np.add.reduceat(np.array([c[2] for c in changes]), first).cumsum()
        # Sums of floats that should cancel leave dust: a level within 1e-9 of zero is zero.
        held[np.abs(held) < 1e-9] = 0.0
        busy[np.abs(busy) < 1e-9] = 0.0
        return cls(times, held, busy)

    def _core_hours(self, level: np.ndarray) -> float:
        return float(np.sum(level[:-1] * np.diff(self.times)) / 3600)

    @property
    def held_core_hours(self) -> float:
        return self._core_hours(self.held)

    @property
    def busy_core_hours(self) -> float:
        """Core-hours allocated to attempts while pilots held them."""
        return self._core_hours(np.minimum(self.busy, self.held))

    @property
    def idle_core_hours(self) -> float:
        """Core-hours held and allocated to no attempt: what the run wasted."""
        return self.held_core_hours - self.busy_core_hours


@dataclass
class CategoryUse:
    """How the attempts of one task category used what they were allocated.

    ``usage`` accounts each resource as Phung & Thain's AWE does, with the
    allocation held for an attempt's duration: successful attempts consume
    their peak, and every attempt that ended otherwise (killed, failed or lost)
    wasted all it held.
    """

    category: str
    attempts: int = 0
    succeeded: int = 0
    allocated: dict[Resource, list[float]] = field(default_factory=dict)
    peak: dict[Resource, list[float]] = field(default_factory=dict)
    usage: dict[Resource, Usage] = field(default_factory=dict)

    def add(self, attempt: StoreRow) -> None:
        held = attempt["end_t"] - attempt["start_t"]
        allocation = attempt["allocation"] or {}
        success = attempt["outcome"] == "success"
        self.attempts += 1
        self.succeeded += success
        for r in PACKED:
            amount = float(allocation.get(r) or 0.0)
            self.allocated.setdefault(r, []).append(amount)
            usage = self.usage.setdefault(r, Usage())
            if success:
                used = float((attempt["peak"] or {}).get(r) or 0.0)
                self.peak.setdefault(r, []).append(used)
                usage.success(used * held, amount * held)
            else:
                usage.failure(amount * held)

    def mean_allocated(self, r: Resource) -> float:
        return float(np.mean(self.allocated[r])) if self.allocated.get(r) else float("nan")

    def mean_peak(self, r: Resource) -> float:
        """Mean peak of the successful attempts."""
        return float(np.mean(self.peak[r])) if self.peak.get(r) else float("nan")

    def largest_peak(self, r: Resource) -> float:
        return float(np.max(self.peak[r])) if self.peak.get(r) else float("nan")

    def shares(self, r: Resource) -> tuple[float, float, float]:
        """Used (the AWE), unused by the successful attempts, and held by the others: shares
        of all ``r`` × time the attempts held (NaN where they held none)."""
        u = self.usage[r]
        if u.allocated <= 0:
            return (math.nan, math.nan, math.nan)
        return (u.awe, u.fragmentation / u.allocated, u.failed / u.allocated)


def category_use(record: RunRecord) -> list[CategoryUse]:
    """Per task category, in the order categories first appear, the attempts that ended."""
    categories = record.categories()
    found: dict[str, CategoryUse] = {}
    for a in record.attempts:
        if a["outcome"] in ON_WORKER or a["start_t"] is None or a["end_t"] is None:
            continue
        category = categories.get(a["task_id"]) or stage_of(a["task_id"])
        found.setdefault(category, CategoryUse(category)).add(a)
    return list(found.values())
