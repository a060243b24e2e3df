"""The report's figures, drawn with matplotlib as inline SVG (text kept as text).

Each function takes what :mod:`orchestrator.runrecord` or the comparison
computed and returns one ``<svg>`` element. Figures are built on
:class:`matplotlib.figure.Figure` directly: no pyplot, no global state, no
display. Colours keep one meaning across figures: grey a pilot held back by its
dependency, amber waiting in the queue, blue cores held, green work done, red
what was waited for or wasted.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Mapping, Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from learners.resources import PACKED
from orchestrator.compare import Row, normalised
from orchestrator.human import count, duration, relative
from orchestrator.runrecord import CategoryUse, CoreUsage
from orchestrator.summary import PilotFigures, StageFigures

HELD = "#c9ced6"
QUEUED = "#f0a534"
RUNNING = "#3a78c2"
WAITING = "#e07a70"
WORKING = "#4e9a5b"
WASTED = "#c0392b"
ALLOCATED = "#a9c6e8"
KINDS = {
    "memory": "#c0392b",
    "disk": "#8e5a2b",
    "wall": "#8e44ad",
    "cores": "#d35400",
    "failed": "#2c3e50",
    "lost": "#95a5a6",
    "stopped": "#bdc3c7",
}
"""Why an attempt did not succeed; any other kind (a late result) is drawn in :data:`OTHER`."""
OTHER = "#d5d8dc"
STRATEGIES = {
    "bigjob": "#7f8c8d",
    "per-stage": "#f0a534",
    "asa": "#3a78c2",
    "asa-naive": "#8e44ad",
    "oracle": "#4e9a5b",
}
RESOURCE_NAMES = {"cores": "cores", "memory": "memory (MB)", "disk": "disk (MB)"}

STYLE = {
    "svg.fonttype": "none",
    "svg.hashsalt": "leadtime",
    "font.family": "sans-serif",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#e3e6ea",
    "grid.linewidth": 0.8,
    "legend.frameon": False,
}
WIDTH = 11.0
"""Inches; every figure is as wide as the page's column."""


def svg(fig: Figure) -> str:
    """``fig`` as one ``<svg>`` element (no XML prologue), reproducible byte for byte."""
    buffer = io.StringIO()
    with matplotlib.rc_context(STYLE):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(height: float) -> Figure:
    with matplotlib.rc_context(STYLE):
        return Figure(figsize=(WIDTH, height), layout="constrained")


def time_unit(span: float) -> tuple[float, str]:
    """The unit a time axis of ``span`` seconds reads best in: its seconds and its name."""
    for seconds, name in ((86400.0, "d"), (3600.0, "h"), (60.0, "min")):
        if span >= 2 * seconds:
            return seconds, name
    return 1.0, "s"


def timeline(
    stages: Sequence[StageFigures],
    pilots: Sequence[PilotFigures],
    job_ids: Mapping[str, str | None],
    end_t: float,
) -> str:
    """Stages (ready, then running tasks) above pilots (held by a dependency, queued,
    running), on one time axis, each pilot with the start its prediction planned for."""
    unit, name = time_unit(end_t)
    right = end_t * 1.03 / unit if end_t > 0 else 1.0
    with matplotlib.rc_context(STYLE):
        fig = _figure(1.6 + 0.34 * (len(stages) + len(pilots)))
        top, bottom = fig.subplots(
            2,
            1,
            sharex=True,
            height_ratios=[max(len(stages), 1), max(len(pilots), 1)],
        )
        for ax, title in ((top, "stages"), (bottom, "pilots")):
            ax.set_ylabel(title, fontweight="bold")
            ax.grid(axis="y", visible=False)
            ax.axvline(end_t / unit, color="#555", linestyle="--", linewidth=1)
        for row, s in enumerate(stages):
            if s.ready_t is None:
                continue
            began = s.start_t if s.start_t is not None else end_t
            _span(top, row, s.ready_t, began, WAITING, unit)
            if s.start_t is not None:
                _span(top, row, s.start_t, end_t if s.end_t is None else s.end_t, WORKING, unit)
        _labels(top, [f"{s.name} ({count(s.tasks, 'task')})" for s in stages])
        for row, p in enumerate(pilots):
            ended = end_t if p.end_t is None else p.end_t
            eligible = p.eligible_t if p.eligible_t is not None else ended
            started = p.start_t if p.start_t is not None else ended
            _span(bottom, row, p.submit_t, eligible, HELD, unit)
            _span(bottom, row, eligible, started, QUEUED, unit)
            if p.start_t is not None:
                _span(bottom, row, p.start_t, ended, RUNNING, unit)
            if p.predicted_wait is not None and p.eligible_t is not None:
                planned = (p.eligible_t + p.predicted_wait) / unit
                if planned <= right:
                    bottom.plot(planned, row, marker="|", markersize=14, mew=2.5, color="black")
                else:
                    bottom.plot(right, row, marker=">", markersize=7, color="black", clip_on=False)
        _labels(bottom, [_pilot_label(p, job_ids.get(p.pilot_id)) for p in pilots])
        bottom.set_xlim(0, right)
        bottom.set_xlabel(f"time since the run started ({name}); dashed: the run's end")
        handles = [
            Patch(color=WAITING, label="stage ready, its tasks waiting for cores"),
            Patch(color=WORKING, label="stage running tasks"),
            Patch(color=HELD, label="pilot held until the stages it follows end"),
            Patch(color=QUEUED, label="pilot queued (eligible, waiting for nodes)"),
            Patch(color=RUNNING, label="pilot running (cores held)"),
            Line2D(
                [],
                [],
                color="black",
                marker="|",
                markersize=12,
                mew=2.5,
                linestyle="None",
                label="predicted start: eligible + predicted wait (▸ after the run's end)",
            ),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=3)
        return svg(fig)


def _span(ax, row: int, start: float, end: float, color: str, unit: float) -> None:
    """A bar from ``start`` to ``end``; its outline keeps a span of a few seconds in a
    run of hours visible."""
    if end > start:
        ax.barh(
            row,
            (end - start) / unit,
            left=start / unit,
            height=0.6,
            color=color,
            edgecolor=color,
            linewidth=1.2,
        )


def _labels(ax, labels: Sequence[str]) -> None:
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(max(len(labels), 1) - 0.5, -0.5)


def _pilot_label(p: PilotFigures, job_id: str | None) -> str:
    label = f"{p.pilot_id} · {count(p.cores, 'core')}"
    if job_id:
        label += f" · job {job_id}"
    if p.state and p.state != "COMPLETED":
        label += f" · {p.state.lower()}"
    return label


def waits(pilots: Sequence[PilotFigures]) -> str:
    """Per pilot, the queue wait it was predicted (outline) and the one it had (filled)."""
    longest = max(
        [w for p in pilots for w in (p.predicted_wait, p.wait) if w is not None], default=0.0
    )
    unit, name = time_unit(longest)
    with matplotlib.rc_context(STYLE):
        fig = _figure(1.3 + 0.42 * len(pilots))
        ax = fig.subplots()
        ax.grid(axis="y", visible=False)
        for row, p in enumerate(pilots):
            if p.predicted_wait is not None:
                ax.barh(
                    row - 0.17,
                    p.predicted_wait / unit,
                    height=0.34,
                    color="white",
                    edgecolor="black",
                    hatch="//",
                    linewidth=0.8,
                )
            if p.wait is not None:
                ax.barh(row + 0.17, p.wait / unit, height=0.34, color=QUEUED)
            ax.text(
                max(p.predicted_wait or 0.0, p.wait or 0.0) / unit,
                row,
                "  " + _wait_note(p),
                va="center",
                fontsize=9,
            )
        _labels(ax, [p.pilot_id for p in pilots])
        ax.set_xlim(0, max(longest / unit, 1e-9) * 1.45)
        ax.set_xlabel(f"queue wait ({name}): from eligible to start")
        handles = [Patch(color=QUEUED, label="real wait")]
        if any(p.predicted_wait is not None for p in pilots):
            handles.insert(
                0, Patch(facecolor="white", edgecolor="black", hatch="//", label="predicted wait")
            )
        fig.legend(handles=handles, loc="outside upper left", ncols=2)
        return svg(fig)


def _wait_note(p: PilotFigures) -> str:
    predicted = (
        "no prediction" if p.predicted_wait is None else f"predicted {duration(p.predicted_wait)}"
    )
    if p.wait is None:
        real = "never started"
    elif p.start_t is None:
        real = f"cancelled after {duration(p.wait)} in the queue"
    else:
        real = f"real {duration(p.wait)}"
    verdict = {True: "hit", False: "over-predicted", None: ""}[p.hit]
    return f"{predicted}, {real}" + (f": {verdict}" if verdict else "")


def cores(usage: CoreUsage) -> str:
    """Cores held by running pilots over time, the part allocated to tasks, and the idle
    rest between them: the core-hours wasted."""
    unit, name = time_unit(float(usage.times[-1]) if len(usage.times) else 0.0)
    t = usage.times / unit
    busy = [min(b, h) for b, h in zip(usage.busy, usage.held, strict=True)]
    held_ch, idle_ch = usage.held_core_hours, usage.idle_core_hours
    share = f" ({idle_ch / held_ch:.0%} of those held)" if held_ch > 0 else ""
    with matplotlib.rc_context(STYLE):
        fig = _figure(3.6)
        ax = fig.subplots()
        ax.fill_between(
            t,
            0,
            busy,
            step="post",
            color=WORKING,
            linewidth=0,
            label=f"allocated to tasks: {usage.busy_core_hours:,.2f} core-hours",
        )
        ax.fill_between(
            t,
            busy,
            usage.held,
            step="post",
            color=WAITING,
            alpha=0.45,
            linewidth=0,
            label=f"idle: {idle_ch:,.2f} core-hours wasted{share}",
        )
        ax.step(
            t,
            usage.held,
            where="post",
            color=RUNNING,
            linewidth=1.6,
            label=f"held by running pilots: {held_ch:,.2f} core-hours",
        )
        ax.set_xlim(0, max(t[-1], 1e-9))
        ax.set_ylim(0, max(max(usage.held, default=0.0), 1.0) * 1.15)
        ax.set_xlabel(f"time since the run started ({name})")
        ax.set_ylabel("cores")
        ax.legend(loc="upper left", ncols=3)
        return svg(fig)


def efficiency(categories: Sequence[CategoryUse]) -> str:
    """Per resource, each category's mean allocation beside its tasks' mean and largest
    peak (top), and where its allocation went (bottom): used, unused by the attempts that
    succeeded, held by those that did not; the used share is the AWE."""
    names = [c.category for c in categories]
    x = range(len(categories))
    with matplotlib.rc_context(STYLE):
        fig = _figure(6.2)
        axes = fig.subplots(2, len(PACKED), height_ratios=[1.2, 1])
        for col, r in enumerate(PACKED):
            top, bottom = axes[0][col], axes[1][col]
            top.set_title(RESOURCE_NAMES[r])
            for shift, amounts, color, label in (
                (-0.2, [c.mean_allocated(r) for c in categories], ALLOCATED,
                 "allocated (mean per attempt)"),
                (0.2, [c.mean_peak(r) for c in categories], WORKING,
                 "peak (mean of successful attempts)"),
            ):  # fmt: skip
                top.bar([i + shift for i in x], amounts, width=0.4, color=color, label=label)
            top.scatter(
                [i + 0.2 for i in x],
                [c.largest_peak(r) for c in categories],
                marker="_",
                s=200,
                linewidths=2,
                color="black",
                zorder=3,
                label="largest peak",
            )
            top.set_xticks(list(x), names)
            top.grid(axis="x", visible=False)
            _amount_axis(top, [c.mean_allocated(r) for c in categories])
            split = [c.shares(r) for c in categories]
            left = [0.0] * len(categories)
            for k, (label, color) in enumerate(
                (
                    ("used (AWE)", WORKING),
                    ("unused by successful attempts", ALLOCATED),
                    ("held by attempts that did not succeed", WASTED),
                )
            ):
                part = [s[k] for s in split]
                bottom.barh(list(x), part, left=left, color=color, height=0.6, label=label)
                left = [a + b for a, b in zip(left, part, strict=True)]
            for i, s in enumerate(split):
                if not math.isnan(s[0]):
                    bottom.text(
                        min(s[0], 0.97),
                        i,
                        f" {s[0]:.2f}",
                        va="center",
                        fontsize=9,
                        color="white" if s[0] > 0.12 else "black",
                        ha="right" if s[0] > 0.12 else "left",
                    )
            bottom.set_yticks(list(x), names)
            bottom.tick_params(axis="y", length=0)  # a tick beside "0.00" read as "-0.00"
            bottom.set_ylim(len(categories) - 0.5, -0.5)
            bottom.set_xlim(0, 1)
            bottom.set_xlabel(f"share of allocated {r} × time")
            bottom.grid(axis="y", visible=False)
        handles, labels = axes[0][0].get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: labels[i] == "largest peak")
        fig.legend(
            [handles[i] for i in order],
            [labels[i] for i in order],
            loc="outside upper left",
            ncols=3,
        )
        fig.legend(*axes[1][0].get_legend_handles_labels(), loc="outside lower left", ncols=3)
        return svg(fig)


def _amount_axis(ax, amounts: Sequence[float]) -> None:
    """Plain numbers on the y axis, logarithmic where amounts span more than 50-fold (a
    whole worker's disk beside a task's)."""
    found = [a for a in amounts if a > 0 and not math.isnan(a)]
    if found and max(found) > 50 * min(found):
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}"))


def failures(by_stage: Mapping[str, Counter[str]]) -> str:
    """Per stage, the attempts that did not succeed, stacked by why."""
    stages = list(by_stage)
    kinds = sorted({k for c in by_stage.values() for k in c}, key=_kind_rank)
    with matplotlib.rc_context(STYLE):
        fig = _figure(1.4 + 0.42 * len(stages))
        ax = fig.subplots()
        ax.grid(axis="y", visible=False)
        left = [0] * len(stages)
        for kind in kinds:
            counts = [by_stage[s][kind] for s in stages]
            label = f"killed for {kind}" if kind in PACKED or kind == "wall" else kind
            ax.barh(
                range(len(stages)),
                counts,
                left=left,
                height=0.6,
                color=KINDS.get(kind, OTHER),
                label=label,
            )
            left = [a + b for a, b in zip(left, counts, strict=True)]
        for row, total in enumerate(left):
            if total:
                ax.text(total, row, f"  {total}", va="center", fontsize=9)
        _labels(ax, stages)
        ax.set_xlim(0, max(max(left, default=0), 1) * 1.12)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("attempts that did not succeed")
        fig.legend(loc="outside upper left", ncols=len(kinds))
        return svg(fig)


def _kind_rank(kind: str) -> tuple[int, str]:
    order = list(KINDS)
    return (order.index(kind) if kind in order else len(order), kind)


COMPARED = (("makespan_s", "makespan"), ("core_hours", "core-hours"), ("twt_s", "TWT"))


def comparison(rows: Sequence[Row]) -> str:
    """Per workflow, each strategy's makespan, core-hours and TWT over the best strategy's
    at the same scale, averaged over the scales (Table 1 of the ASA paper): 1 is the best."""
    norm = normalised(rows)
    workflows = sorted({r.workflow for r in rows})
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    width = 0.8 / max(len(strategies), 1)
    with matplotlib.rc_context(STYLE):
        fig = _figure(3.8)
        axes = fig.subplots(1, len(COMPARED), sharey=True)
        for ax, (metric, title) in zip(axes, COMPARED, strict=True):
            ax.set_title(title)
            ax.axhline(1.0, color="#555", linewidth=1)
            ax.grid(axis="x", visible=False)
            for k, strategy in enumerate(strategies):
                xs, ys = [], []
                for i, workflow in enumerate(workflows):
                    value = norm.get((workflow, strategy), {}).get(metric)
                    if value is not None and not math.isnan(value):
                        xs.append(i - 0.4 + width * (k + 0.5))
                        ys.append(value)
                bars = ax.bar(
                    xs,
                    ys,
                    width=width * 0.92,
                    label=strategy,
                    color=STRATEGIES.get(strategy, OTHER),
                )
                ax.bar_label(
                    bars,
                    labels=[relative(y) for y in ys],
                    fontsize=8,
                    padding=2,
                    rotation=90 if len(strategies) > 3 else 0,
                )
            ax.set_xticks(range(len(workflows)), workflows)
        axes[0].set_ylabel("relative to the best strategy (1 = best)")
        top = max((v for m in norm.values() for v in m.values() if not math.isnan(v)), default=1)
        axes[0].set_ylim(0, top * 1.25)
        fig.legend(
            *axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(strategies)
        )
        return svg(fig)
