"""Every sizer by name: ``make_sizer("exhaust", worker=...)``.

Each name picks an algorithm family and its variant; the family builds one
category learner per category behind a :class:`Composite`. Sizers that only
learn memory (Ponder, k-Segments, Witt) size the other resources with a
companion, a sizer of every resource: ``ksegments+greedy`` names it, and
``ksegments`` alone takes :data:`COMPANION`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from learners.resources import PACKED, Resource, Resources
from learners.sizing.base import Running
from learners.sizing.baselines import UserRequest, WholeWorker
from learners.sizing.bucketing import DEFAULTS, Bucketing
from learners.sizing.budget import BudgetCategory
from learners.sizing.composite import (
    CategoryLearner,
    Composite,
    PerResource,
    ResourceLearner,
    Together,
)
from learners.sizing.ksegments import KSegments
from learners.sizing.ponder import Ponder
from learners.sizing.quantized import Quantized
from learners.sizing.selector import Selector
from learners.sizing.tovar import TovarCategory
from learners.sizing.witt import Witt

SIZERS: dict[str, str] = {
    "whole": "a whole worker for every attempt (the bucketing paper's baseline)",
    "user": "the task's request, doubled on failure (k-Segments' and Ponder's user default)",
    "max-seen": "cctools max mode: largest peak + 1/3 bucket; a whole worker first and on retry",
    "min-waste": "Tovar et al. minimum waste; retry at the largest value seen",
    "max-xput": "Tovar et al. maximum throughput; retry at the largest value seen",
    "min-waste-doubling": "Tovar et al. minimum waste; retry doubles",
    "max-xput-doubling": "Tovar et al. maximum throughput; retry doubles",
    "quantized": "quantized bucketing (3 quantile buckets, Phung et al. 2021)",
    "greedy": "Greedy Bucketing (Phung & Thain 2024)",
    "exhaust": "Exhaustive Bucketing (Phung & Thain 2024)",
    "greedy-det": "Greedy Bucketing, deterministic: the smallest bucket above",
    "exhaust-det": "Exhaustive Bucketing, deterministic: the smallest bucket above",
    "ponder": "Ponder: memory by unequal-loss regression on input size",
    "ksegments": "k-Segments (k = 4) as a peak sizer; selective retry with time series",
    "ksegments-partial": "k-Segments (k = 4) as a peak sizer; partial retry with time series",
    "witt-mean": "Witt LR, intercept + standard error",
    "witt-under": "Witt LR, intercept + standard error of under-predictions",
    "witt-max": "Witt LR, intercept + largest under-prediction",
    "budget": "the quantile of peaks that keeps first-attempt kills within a 5% retry budget",
    "select": "per category, the best in the shadow of budget, the regressions and bucketing",
}

MEMORY_ONLY = ("ponder", "ksegments", "ksegments-partial", "witt-mean", "witt-under", "witt-max")
"""The sizers that learn memory only; ``<one of these>+<companion>`` names the pair."""
SELECTED = ("budget", "ksegments+budget", "ponder+budget", "greedy-det", "exhaust-det")
"""The candidates of ``select``, the first allocating while a category warms up; the bucketing
ones only where the workflow has room for their retries."""
COMPANIONS = tuple(name for name in SIZERS if name not in (*MEMORY_ONLY, "select"))
"""The sizers of every resource, each of which can size cores and disk beside a memory-only one."""
PRIORS = ("budget", "select")
"""Sizers whose categories start from the prior (Composite ``prior``); the published ones keep
their authors' start."""
COMPANION = "max-seen"
"""The companion of a memory-only sizer named alone (docs/sizing.md: chosen by measurement)."""
DEFAULT_SIZER = "select"
"""The best mean AWE over every shared trace with at most 10% of tasks retried (docs/sizing.md)."""

Factory = Callable[[str], CategoryLearner]

_OPTIONS: dict[str, set[str]] = {
    "bucketing": {"defaults", "sampling", "rate", "max_buckets"},
    "quantized": {"k", "sampling"},
    "tovar": {"maximum", "bucket_sizes", "every"},
    "ponder": {"min_memory", "max_memory", "first_tasks"},
    "ksegments": {"k"},
    "witt": set(),
    "baseline": set(),
    "budget": {"budget"},
    "select": set(),
}


def split_sizer(name: str) -> tuple[str, str | None]:
    """``name`` as (sizer, companion): the companion of a memory-only sizer (named after a
    ``+``, else :data:`COMPANION`), None for a sizer of every resource.

    Raises ValueError naming what is unknown.
    """
    base, plus, companion = name.partition("+")
    if base not in SIZERS:
        raise ValueError(f"unknown sizer {base!r}; choose from {', '.join(SIZERS)}")
    if base not in MEMORY_ONLY:
        if plus:
            raise ValueError(f"sizer {base!r} sizes every resource: it takes no companion")
        return base, None
    if not plus:
        return base, COMPANION
    if companion not in COMPANIONS:
        raise ValueError(
            f"unknown companion {companion!r} of {base!r}; choose from {', '.join(COMPANIONS)}"
        )
    return base, companion


def _family(name: str) -> str:
    if name in ("greedy", "exhaust", "greedy-det", "exhaust-det"):
        return "bucketing"
    if name in ("max-seen", "min-waste", "max-xput", "min-waste-doubling", "max-xput-doubling"):
        return "tovar"
    if name.startswith("witt"):
        return "witt"
    if name.startswith("ksegments"):
        return "ksegments"
    if name in ("ponder", "quantized", "budget", "select"):
        return name
    return "baseline"


def make_sizer(
    name: str,
    *,
    worker: Resources,
    seed: int = 0,
    resources: tuple[Resource, ...] = PACKED,
    minimum: Resources | None = None,
    running: Running | None = None,
    **options: Any,
) -> Composite | Selector:
    """The sizer called ``name`` for workers of capacity ``worker``: one of :data:`SIZERS`,
    or ``memory+companion`` (a memory-only sizer and the sizer of the other resources).

    ``resources`` are the ones it sizes (add ``"wall"`` to size wall time too);
    ``minimum`` is a floor no allocation goes below; ``seed`` seeds the sizer's
    own random generator. Family options: bucketing ``defaults`` (per
    resource), ``sampling``, ``rate``, ``max_buckets``; quantized ``k``,
    ``sampling``; Tovar ``maximum`` (per resource), ``bucket_sizes``, ``every``;
    Ponder ``min_memory``, ``max_memory``, ``first_tasks``; k-Segments ``k``
    (a companion takes its defaults). ``running`` is where the executor reports the
    attempts it runs (a new one by default), shared by a selector's candidates.
    """
    base, companion = split_sizer(name)
    unknown = set(options) - _OPTIONS[_family(base)]
    if unknown:
        raise ValueError(f"sizer {base!r} takes no option {', '.join(sorted(unknown))}")
    bad = [r for r in resources if r not in ("cores", "memory", "disk", "wall")]
    if bad or not resources:
        raise ValueError(f"cannot size {bad or 'nothing'}: resources are cores, memory, disk, wall")
    running = running or Running()
    if base == "select":
        candidates = [
            make_sizer(
                c, worker=worker, seed=seed, resources=resources, minimum=minimum, running=running
            )
            for c in SELECTED
        ]
        by_input = [split_sizer(c)[1] is not None for c in SELECTED]
        retrying = [_family(c) == "bucketing" for c in SELECTED]
        return Selector(name, candidates, by_input=by_input, retrying=retrying)
    rng = np.random.default_rng(seed)
    if companion is None:
        factory = _factory(base, resources, worker, rng, options, running)
    else:
        factory = _memory_only(base, companion, resources, worker, rng, options, running)
    prior = base in PRIORS or companion in PRIORS
    return Composite(
        name,
        factory,
        resources=resources,
        worker=worker,
        minimum=minimum,
        prior=prior,
        running=running,
    )


def _factory(
    name: str,
    resources: tuple[Resource, ...],
    worker: Resources,
    rng: np.random.Generator,
    options: Mapping[str, Any],
    running: Running,
) -> Factory:
    if name == "budget":
        return lambda category: BudgetCategory(
            resources,
            worker=worker,
            outlasting=partial(running.outlasting, category),
            concurrent=partial(running.count, category),
            queued=lambda: running.queued,
            busy=running.busy,
            **options,
        )
    if _family(name) == "tovar":
        base = name.removesuffix("-doubling")
        mode = "max-throughput" if base == "max-xput" else base
        retry = "double" if name.endswith("-doubling") else "max"
        return lambda _: TovarCategory(
            mode,
            resources,
            worker,
            retry=retry,
            **options,  # type: ignore[arg-type]
        )
    return lambda _: PerResource(
        {r: _resource_learner(name, r, worker, rng, options) for r in resources}
    )


def _resource_learner(
    name: str, r: Resource, worker: Resources, rng: np.random.Generator, options: Mapping[str, Any]
) -> ResourceLearner:
    capacity = worker[r]
    if name == "whole":
        return WholeWorker(capacity)
    if name == "user":
        return UserRequest(r, capacity)
    if name == "quantized":
        return Quantized(capacity, rng, **options)
    mode = "greedy" if name.startswith("greedy") else "exhaustive"
    extra = dict(options)
    defaults = {**DEFAULTS, **extra.pop("defaults", {})}
    return Bucketing(mode, defaults[r], rng, deterministic=name.endswith("-det"), **extra)


def _memory_only(
    name: str,
    companion: str,
    resources: tuple[Resource, ...],
    worker: Resources,
    rng: np.random.Generator,
    options: Mapping[str, Any],
    running: Running,
) -> Factory:
    others = tuple(r for r in resources if r != "memory")
    rest = _factory(companion, others, worker, rng, {}, running) if others else None

    def memory() -> ResourceLearner:
        capacity = worker.memory
        if name == "ponder":
            return Ponder(capacity, **options)
        if name.startswith("ksegments"):
            retry = "partial" if name.endswith("partial") else "selective"
            return KSegments(capacity, retry=retry, **options)
        return Witt(capacity, offset=name.removeprefix("witt-"))  # type: ignore[arg-type]

    def new(category: str) -> CategoryLearner:
        parts: list[CategoryLearner] = []
        if "memory" in resources:
            parts.append(PerResource({"memory": memory()}))
        if rest is not None:
            parts.append(rest(category))
        return parts[0] if len(parts) == 1 else Together(parts)

    return new
