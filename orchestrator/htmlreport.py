"""The HTML report of a run or of a comparison: one self-contained file.

Plots are inline SVG and styles inline; the page runs no script and loads
nothing, so it opens from a file with no server and no network. The figures it
shows are also embedded as JSON (``<script type="application/json"
id="figures">``): for a run, what ``leadtime run --json`` printed; for a
comparison, what ``leadtime compare --json`` prints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from html import escape
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from backends.registry import simulated
from learners.resources import PACKED
from orchestrator import plots
from orchestrator.compare import Row, normalised
from orchestrator.human import duration, offset, relative, request, wall
from orchestrator.report import causes_text
from orchestrator.runrecord import CategoryUse, CoreUsage, RunRecord, category_use, failure_kind
from orchestrator.summary import PilotFigures, StageFigures

FAILED_ROWS = 25
"""Attempts that did not succeed listed one by one; more are counted (``status`` lists all)."""

DEFINITIONS = {
    "makespan": "from the run's start to the end of its last stage",
    "TWT": "total waiting time: the pilots' queue waits (start minus eligible time), summed",
    "PWT": "perceived waiting time: from each stage being ready to its first task starting, summed",
    "core-hours": "cores every pilot held, from its start to its end",
    "OH": "overhead: core-hours pilots held before any stage they serve was ready",
    "hit ratio": "predictions of a pilot's wait that did not over-predict it",
    "idle": "core-hours held by pilots and allocated to no task",
}

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d232b;
       margin: 0; background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 6px; padding-top: 10px; border-top: 1px solid #e3e6ea; }
p.lead, p.note { color: #4b5563; margin: 4px 0 12px; }
.state-done { color: #2e7d32; } .state-failed { color: #c0392b; } .state-running { color: #b26a00; }
.error { background: #fdecea; border-left: 4px solid #c0392b; padding: 8px 12px; margin: 12px 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr)); gap: 10px;
         margin: 16px 0 8px; }
.card { border: 1px solid #e3e6ea; border-radius: 6px; padding: 10px 12px; }
.card .value { font-size: 20px; font-weight: 600; white-space: nowrap; }
.card .value small { display: block; font-size: 12px; font-weight: 400; color: #4b5563; }
.card .name { font-weight: 600; color: #374151; }
.card .what { font-size: 12px; color: #6b7280; }
div.wide { overflow-x: auto; }
figure { margin: 10px 0; } figure svg { width: 100%; height: auto; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 13.5px; }
th, td { padding: 4px 8px; border-bottom: 1px solid #e9ecef; text-align: left;
         vertical-align: top; white-space: nowrap; }
th { background: #f1f3f5; font-weight: 600; }
td.w { white-space: normal; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 10px 0; }
dt { color: #6b7280; } dd { margin: 0; }
footer { margin-top: 40px; color: #6b7280; font-size: 12.5px; }
"""


def run_page(record: RunRecord) -> str:
    """The report of one run."""
    run = record.run
    figures = record.figures
    stages = record.stage_figures()
    pilots = record.pilot_figures()
    usage = CoreUsage.of(record)
    title = f"{run['workflow']} · {run['strategy']} · run {run['run_id']}"
    body = [
        f"<h1>{escape(title)}</h1>",
        _lead(record),
        *([f'<div class="error">error: {escape(run["error"])}</div>'] if run.get("error") else []),
        _cards(figures, usage),
        "<h2>Timeline</h2>",
        '<p class="note">Each stage from the moment it was ready; each pilot from its '
        "submission: held back by its dependency, queued, then holding its cores.</p>",
        _figure(plots.timeline(stages, pilots, record.job_ids(), record.end_t)),
        _stage_table(record, stages),
        "<h2>Queue waits: predicted and real</h2>",
        _waits(record, pilots),
        "<h2>Cores held and cores busy</h2>",
        _cores(usage),
        "<h2>Task resource efficiency</h2>",
        _efficiency(category_use(record)),
        "<h2>Attempts that did not succeed</h2>",
        _failures(record),
    ]
    return _page(title, body, figures)


def _lead(record: RunRecord) -> str:
    run = record.run
    status = str(run["status"])
    parts = [
        f'<span class="state-{escape(status)}"><b>{escape(status)}</b></span>',
        f"backend {escape(str(run['backend']))}",
        f"sizer {escape(str(run['sizer']))}",
        f"random seed: {run['seed']}",
    ]
    if run.get("scale") is not None:
        parts.append(f"scale {run['scale']}")
    if run.get("created"):
        parts.append(f"started {wall(run['created'])}")
    if run.get("ended"):
        parts.append(f"ended {wall(run['ended'])}")
    text = " · ".join(parts)
    if simulated(str(run["backend"])):
        text += (
            "<br>On the simulated cluster: the run's durations are the cluster's virtual "
            "time, not the wall clock's."
        )
    if not record.recorded:
        text += (
            "<br>The run recorded no figures of its own (it is still going, or its manager "
            "stopped): these are computed from what the store holds up to its last record."
        )
    if run.get("source"):
        text += f"<br>Workflow file {escape(str(run['source']))}"
    return f'<p class="lead">{text}</p>'


def _cards(figures: Mapping[str, Any], usage: CoreUsage) -> str:
    hit = figures.get("hit_ratio")
    judged = [p["hit"] for p in figures.get("pilots", ()) if p.get("hit") is not None]
    idle, held = usage.idle_core_hours, usage.held_core_hours
    cards = [
        ("makespan", duration(figures["makespan_s"]), ""),
        ("TWT", duration(figures["twt_s"]), ""),
        ("PWT", duration(figures["pwt_s"]), ""),
        ("core-hours", f"{figures['core_hours']:,.2f}", ""),
        ("OH", f"{figures['oh_core_hours']:,.2f}", "core-hours"),
        (
            "hit ratio",
            "-" if hit is None else f"{hit:.0%}",
            f"{sum(judged)} of {len(judged)}" * bool(judged),
        ),
        ("idle", f"{idle:,.2f}", "core-hours" + (f", {idle / held:.0%}" if held > 0 else "")),
    ]
    items = "".join(
        f'<div class="card"><div class="name">{escape(name)}</div>'
        f'<div class="value">{escape(value)} <small>{escape(unit)}</small></div>'
        f'<div class="what">{escape(DEFINITIONS[name])}</div></div>'
        for name, value, unit in cards
    )
    return f'<div class="cards">{items}</div>'


def _stage_table(record: RunRecord, stages: Sequence[StageFigures]) -> str:
    rows = {s["stage"]: s for s in record.stages}
    failed = record.failures_by_stage()
    return _table(
        (
            "stage",
            "state",
            "tasks",
            "done",
            "attempts",
            "did not succeed",
            "ready",
            "submitted",
            "started",
            "ended",
            "waited",
        ),
        (
            (
                s.name,
                str(rows[s.name]["state"]),
                s.tasks,
                rows[s.name]["tasks_done"],
                s.attempts,
                causes_text(failed.get(s.name, {})) or "-",
                offset(s.ready_t),
                offset(s.submit_t),
                offset(s.start_t),
                offset(s.end_t),
                duration(s.wait),
            )
            for s in stages
        ),
        numeric={2, 3, 4, 6, 7, 8, 9, 10},
        note="Moments from the run's start; waited: from ready to its first task starting.",
    )


def _pilot_table(record: RunRecord, pilots: Sequence[PilotFigures]) -> str:
    requests = {p["pilot_id"]: p["request"] or {} for p in record.pilots}
    jobs = record.job_ids()
    return _table(
        (
            "pilot",
            "job",
            "stages",
            "request",
            "state",
            "submitted",
            "eligible",
            "started",
            "ended",
            "predicted wait",
            "real wait",
            "prediction",
        ),
        (
            (
                p.pilot_id,
                jobs.get(p.pilot_id) or "-",
                ", ".join(p.stages),
                _whole_amounts(request(requests.get(p.pilot_id, {}))),
                p.state.lower(),
                offset(p.submit_t),
                offset(p.eligible_t),
                offset(p.start_t),
                offset(p.end_t),
                duration(p.predicted_wait),
                duration(p.wait),
                {True: "hit", False: "over-predicted", None: "-"}[p.hit],
            )
            for p in pilots
        ),
        numeric={5, 6, 7, 8, 9, 10},
        wrap={2, 3},
        note="A prediction hits unless it over-predicted the wait (Table 2 of the ASA paper).",
    )


def _whole_amounts(text: str) -> str:
    """``text`` that wraps only after its commas: ``28 cores,`` / ``112,000 MB``, never
    ``28`` / ``cores``."""
    return ", ".join(part.replace(" ", "\u00a0") for part in text.split(", "))


def _waits(record: RunRecord, pilots: Sequence[PilotFigures]) -> str:
    if not pilots:
        return "<p>No pilot was submitted.</p>"
    return _figure(plots.waits(pilots)) + _pilot_table(record, pilots)


def _cores(usage: CoreUsage) -> str:
    if not usage.held.any():
        return "<p>No pilot started: the run held no core.</p>"
    return (
        '<p class="note">Cores of the running pilots, and those allocated to running task '
        "attempts; the area between them is the core-hours the run held and did not use.</p>"
        + _figure(plots.cores(usage))
    )


def _efficiency(categories: Sequence[CategoryUse]) -> str:
    if not categories:
        return "<p>No attempt ended.</p>"
    note = (
        '<p class="note">Per task category, what its attempts were allocated and the peaks '
        "they reached; below, where each resource's allocation went over the attempts' "
        "durations. The used share is the Absolute Workflow Efficiency (AWE) of Phung and "
        "Thain (IEEE IPDPS 2024): used × time / allocated × time, where an attempt that did "
        "not succeed used nothing of what it held.</p>"
    )
    rows = []
    for c in categories:
        for i, r in enumerate(PACKED):
            used, unused, failed = c.shares(r)
            rows.append(
                (
                    *((c.category, c.attempts, c.succeeded) if i == 0 else ("", "", "")),
                    plots.RESOURCE_NAMES[r],
                    _amount(c.mean_allocated(r)),
                    _amount(c.mean_peak(r)),
                    _amount(c.largest_peak(r)),
                    *(_share(x) for x in (used, unused, failed)),
                )
            )
    table = _table(
        (
            "category",
            "attempts",
            "succeeded",
            "resource",
            "allocated",
            "peak",
            "largest peak",
            "AWE",
            "unused",
            "held by failed",
        ),
        rows,
        numeric={1, 2, 4, 5, 6, 7, 8, 9},
        note="Allocated: the mean over every attempt; peak: the mean over the successful ones. "
        "AWE, unused and held by failed: shares of the allocation × time, as in the plot.",
    )
    return note + _figure(plots.efficiency(categories)) + table


def _amount(value: float) -> str:
    if value != value:  # NaN: no attempt to average
        return "-"
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.0f}"


def _share(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def _failures(record: RunRecord) -> str:
    failed = record.failures()
    if not failed:
        return "<p>Every attempt that ended succeeded.</p>"
    rows = [
        (
            a["task_id"],
            a["attempt"],
            failure_kind(a),
            a.get("cause") or a["outcome"],
            a.get("worker") or "",
            a.get("pilot_id") or "",
            offset(a["start_t"]),
            offset(a["end_t"]),
        )
        for a in failed[:FAILED_ROWS]
    ]
    more = len(failed) - FAILED_ROWS
    note = (
        f"The first {FAILED_ROWS} of {len(failed)}; `leadtime status {record.run['run_id']}` "
        "lists them all."
        if more > 0
        else "Killed for a resource: the attempt went past its allocation and was retried "
        "larger; lost: its worker went away; stopped: the run ended (failed or interrupted) "
        "before the attempt did; failed: the command did not succeed."
    )
    table = _table(
        ("task", "attempt", "why", "cause", "worker", "pilot", "started", "ended"),
        rows,
        numeric={1, 6, 7},
        wrap={3},
        note=note,
    )
    return _figure(plots.failures(record.failures_by_stage())) + table


def compare_page(rows: Sequence[Row], settings: Mapping[str, str]) -> str:
    """The report of a comparison: strategies side by side, as Table 1 of the ASA paper."""
    title = "Strategies side by side"
    norm = normalised(rows)
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    averages = _table(
        ("workflow", "strategy", "makespan", "core-hours", "TWT", "PWT"),
        (
            (
                workflow,
                strategy,
                *(relative(m[k]) for k in ("makespan_s", "core_hours", "twt_s", "pwt_s")),
            )
            for (workflow, strategy), m in sorted(
                norm.items(), key=lambda kv: (kv[0][0], strategies.index(kv[0][1]))
            )
        ),
        numeric={2, 3, 4, 5},
        note="Each figure over the best strategy's at the same scale, averaged over the scales.",
    )
    figures = _table(
        (
            "workflow",
            "cores",
            "strategy",
            "runs",
            "makespan",
            "core-hours",
            "TWT",
            "PWT",
            "OH core-hours",
            "hit ratio",
        ),
        (
            (
                r.workflow,
                r.scale,
                r.strategy + (f" ({r.failed} failed)" if r.failed else ""),
                r.runs,
                duration(r.makespan_s),
                f"{r.core_hours:,.2f}",
                duration(r.twt_s),
                duration(r.pwt_s),
                f"{r.oh_core_hours:,.2f}",
                "-" if r.hit_ratio is None else f"{r.hit_ratio:.0%}",
            )
            for r in sorted(rows, key=lambda r: (r.workflow, r.scale, strategies.index(r.strategy)))
        ),
        numeric={1, 3, 4, 5, 6, 7, 8, 9},
        note="Means over the runs of each workflow, scale and strategy.",
    )
    settings_list = "".join(
        f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in settings.items()
    )
    body = [
        f"<h1>{title}</h1>",
        '<p class="lead">Every strategy met the same cluster: the same queue, from the same '
        "moments, with the same task durations.</p>",
        f"<dl>{settings_list}</dl>",
        "<h2>Relative to the best strategy</h2>",
        '<p class="note">Makespan, core-hours and TWT of each strategy over the best '
        "strategy's at the same scale, averaged over the scales, as Table 1 of the ASA paper "
        "(Souza et al.): 1 is the best.</p>",
        _figure(plots.comparison(rows)),
        averages,
        "<h2>Per workflow and scale</h2>",
        figures,
        "<h2>What the figures mean</h2>",
        "<dl>"
        + "".join(
            f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>"
            for k, v in DEFINITIONS.items()
            if k != "idle"
        )
        + "</dl>",
    ]
    return _page(title, body, [r.as_json() for r in rows])


def _figure(svg: str) -> str:
    return f"<figure>{svg}</figure>"


def _table(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric: Collection[int],
    wrap: Collection[int] = (),
    note: str = "",
) -> str:
    """A table; ``numeric`` columns align right, text in ``wrap`` columns may wrap."""

    def cell(tag: str, i: int, value: Any) -> str:
        css = ' class="n"' if i in numeric else ' class="w"' if i in wrap and tag == "td" else ""
        return f"<{tag}{css}>{escape(str(value))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    note = re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(note))  # a command to type
    caption = f'<p class="note">{note}</p>' if note else ""
    return (
        f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        f"</div>{caption}"
    )


def _page(title: str, body: Sequence[str], data: Any) -> str:
    # "</" cannot close the script element from inside the JSON.
    embedded = json.dumps(data, indent=1).replace("</", "<\\/")
    try:
        who = f"leadtime {version('leadtime')}"
    except PackageNotFoundError:
        who = "leadtime"
    written = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>",
            *body,
            f"<footer>Written by {escape(who)} on {written}. The figures above are in this "
            "file as JSON too (<code>script#figures</code>).</footer>",
            f'<script type="application/json" id="figures">{embedded}</script>',
            "</main></body></html>",
        ]
    )
