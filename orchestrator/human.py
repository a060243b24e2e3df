"""Numbers as people read them: durations in days, hours, minutes and seconds, allocations.

Tables and messages show ``2 h 21 min`` where a person reads them; ``--json`` keeps seconds.
"""

from __future__ import annotations

import math
from itertools import pairwise

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


def allocation(a: Allocation) -> str:
    """A stage's pilot as a person reads it: ``28 cores on 2 nodes, 57,344 MB, 20 min``."""
    parts = [f"{a.cores} core{'s' if a.cores != 1 else ''}"]
    if a.nodes:
        parts[0] += f" on {a.nodes} node{'s' if a.nodes != 1 else ''}"
    if a.memory_mb is not None:
        parts.append(f"{a.memory_mb:,} MB")
    parts.append(duration(a.time_limit_s))
    if a.partition:
        parts.append(f"partition {a.partition}")
    return ", ".join(parts)
