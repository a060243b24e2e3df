"""Numbers as people read them: durations in days, hours, minutes and seconds, allocations.

Tables and messages show ``2 h 21 min`` where a person reads them; ``--json`` keeps seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from itertools import pairwise
from typing import Any

from learners.sizing.base import Bound, Unfittable
from workflows.spec import Allocation

_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def duration(seconds: float | None) -> str:
    """``seconds`` in its two largest units, the smaller one rounded: ``98 d 5 h``, ``2 h 21 min``,
    ``3 min 20 s``, ``45 s`` (a tenth of a second below ten seconds); ``-`` for None."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 0:
        return "-" + duration(-seconds)
    if math.isinf(seconds):
        return "forever"
    if 0.05 <= round(seconds, 1) < 10 and seconds != int(seconds):
        return f"{seconds:.1f} s"
    for (big, big_name), (small, small_name) in pairwise(_UNITS):
        whole, rest = divmod(round(seconds / small), big // small)
        if whole:
            return f"{whole:,} {big_name}" + (f" {rest} {small_name}" if rest else "")
    return f"{round(seconds)} s"


def offset(seconds: float | None) -> str:
    """A moment of a run, from its start: ``t+2 h 21 min``; empty for None."""
    return "" if seconds is None else f"t+{duration(seconds)}"


def relative(ratio: float) -> str:
    """A figure over the best one's: ``best`` (within half a percent), else ``+24%``."""
    extra = ratio - 1.0
    return "best" if abs(extra) < 0.005 else f"+{extra:.0%}"


def plural(amount: float, noun: str) -> str:
    """``noun`` as that many of it read: ``core``, ``cores``."""
    return noun if amount == 1 else f"{noun}s"


def count(n: int, noun: str) -> str:
    """``1 core``, ``28 cores``, ``2 nodes``."""
    return f"{n} {plural(n, noun)}"


def listing(names: Sequence[str], shown: int = 5) -> str:
    """Names as a sentence lists them, the first ``shown`` of many and how many more:
    ``a, b and c``, ``a, b, c, d, e and 3 more``."""
    if len(names) > shown:
        return f"{', '.join(names[:shown])} and {len(names) - shown:,} more"
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def per_pilot(pilots_by_what: Mapping[str, Sequence[str]]) -> list[str]:
    """One line for the pilots one thing is said of: ``pilot a-3: ...``, ``28 pilots (a-0,
    a-1, ... and 23 more), each: ...`` (a stage's units of one task each go together)."""
    return [
        f"pilot {pilots[0]}: {what}"
        if len(pilots) == 1
        else f"{len(pilots)} pilots ({listing(pilots)}), each: {what}"
        for what, pilots in pilots_by_what.items()
    ]


def allocation(a: Allocation) -> str:
    """A stage's pilot as a person reads it: ``28 cores on 2 nodes, 57,344 MB, 20 min``."""
    parts = [count(a.cores, "core")]
    if a.nodes:
        parts[0] += f" on {count(a.nodes, 'node')}"
    if a.memory_mb is not None:
        parts.append(f"{a.memory_mb:,} MB")
    parts.append(duration(a.time_limit_s))
    if a.partition:
        parts.append(f"partition {a.partition}")
    return ", ".join(parts)


def request(pilot: Mapping[str, Any]) -> str:
    """A pilot's request as the store keeps it, as :func:`allocation` says it; ``-`` for none."""
    if not pilot.get("cores"):
        return "-"
    return allocation(
        Allocation(
            cores=pilot["cores"],
            nodes=pilot.get("nodes"),
            memory_mb=pilot.get("memory_mb"),
            time_limit_s=pilot.get("time_limit_s") or 0.0,
            partition=pilot.get("partition"),
        )
    )


def number(value: float) -> str:
    """An amount: whole above ten (``1,507``), to two decimals below (``0.5``, ``2.25``)."""
    return f"{value:,.2f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:,.0f}"


def megabytes(mb: float) -> str:
    """A size given in MB, in the unit that keeps it short (1 GB = 1000 MB, as the sizes of
    a workflow file): ``812 MB``, ``2.6 GB``, ``1.2 TB``."""
    for unit, scale in (("TB", 1e6), ("GB", 1e3)):
        if abs(mb) >= scale:
            return f"{number(mb / scale)} {unit}"
    return f"{number(mb)} MB"


def amount(resource: str, value: float) -> str:
    """An amount of a task's resource: ``2 cores``, ``1.5 GB``, ``120 MB``, ``10 min``."""
    if resource == "cores":
        return f"{number(value)} {plural(value, 'core')}"
    return duration(value) if resource == "wall" else megabytes(value)


def amounts(values: Mapping[str, float | None]) -> str:
    """A task's allocation or peak: ``2 cores, 1.5 GB, 120 MB disk, 10 min``; the resources
    it has, in that order (wall time only when bounded)."""
    parts = []
    for r in ("cores", "memory", "disk", "wall"):
        value = values.get(r)
        if value is not None and math.isfinite(value):
            parts.append(amount(r, value) + (" disk" if r == "disk" else ""))
    return ", ".join(parts) or "-"


_NAMES = {"wall": "wall time"}
"""A resource as a message names it, where its key is not the word."""

_COUNTED = {
    "disk": "its scratch directory, where its stdout and stderr go, and its declared outputs",
}
"""What counts against a resource, where a user may not guess it."""

_MORE = {
    "memory": "give its stage's allocation more memory",
    "disk": "run its stage on nodes with more scratch disk",
}
"""How a stage's workers get more of a resource."""


def unfittable(e: Unfittable) -> str:
    """Why a task can never run (its stage fails), in a user's terms: what it needed, what
    bounds it, and what to change."""
    r = e.resource
    name = _NAMES.get(r, r)
    if e.declares:
        assert e.needed is not None
        of = "" if r == "cores" else f" of {name}"
        return (
            f"declares {amount(r, e.needed)}{of}, more than a whole worker has "
            f"({amount(r, e.limit)}): lower it, or give its stage larger nodes"
        )
    reached = ""
    if e.needed is not None:
        counted = f"; {_COUNTED[r]} count" if r in _COUNTED else ""
        reached = f" (it reached {amount(r, e.needed)}{counted})"
    if e.bound is Bound.DECLARED:
        return (
            f"needs more {name} than the {amount(r, e.limit)} its workflow declares{reached}: "
            "a declared size is fixed; raise it, or leave it out to have leadtime size it"
        )
    more = f": {_MORE[r]}" if r in _MORE else ""
    return f"needs more {name} than a whole worker has, {amount(r, e.limit)}{reached}{more}"


def wall(epoch: float | None) -> str:
    """A Unix time as local date and time: ``2025-11-03 14:02:11 CET``; ``-`` for None."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
