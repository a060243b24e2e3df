"""A sizer's state across runs: the latest successful records of every category, as plain data.

Records are facts about the workflow's tasks, not about one algorithm, so any sizer
learns from those an earlier run of the same workflow kept, whichever sizer that run
used: replayed in order, they rebuild its state exactly as the records first did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

from learners.resources import Resources
from learners.sizing.base import Record, TaskFeatures

KEPT = 50
"""Records kept per category: enough for every sizer's first allocations, and a small state."""
VERSION = 1


class History:
    """The latest :data:`KEPT` records of every category, in arrival order."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._by: dict[str, deque[Record]] = {}

    def add(self, record: Record) -> None:
        category = record.task.category
        if category not in self._by:
            self._by[category] = deque(maxlen=self.kept)
        self._by[category].append(record)

    def state(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "categories": {c: [_plain(r) for r in records] for c, records in self._by.items()},
        }

    @staticmethod
    def records(state: Mapping[str, Any]) -> Iterator[Record]:
        """The records of a :meth:`state`; nothing from a state of another version."""
        if state.get("version") != VERSION:
            return
        for category, records in state.get("categories", {}).items():
            for r in records:
                task = TaskFeatures(category, r.get("input_size"))
                series = r.get("series")
                yield Record(
                    task,
                    Resources(**r["peak"]),
                    None if series is None else tuple(series),
                    r.get("interval"),
                )


def _plain(record: Record) -> dict[str, Any]:
    peak = {k: v for k, v in record.peak.as_dict().items() if k != "wall" or v != float("inf")}
    out: dict[str, Any] = {"peak": peak, "input_size": record.task.input_size}
    if record.memory_series is not None:
        out["series"] = list(record.memory_series)
        out["interval"] = record.sample_interval_s
    return out
