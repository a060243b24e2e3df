"""The HTML report of a run and of a comparison: what it shows, that it is one file, and the
message when its plotting library is missing."""

import html
import json
import math
import re
import sys
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import orchestrator
from backends import clock
from learners.sizing.base import Bound, Unfittable
from orchestrator import human
from orchestrator.cli import DEMO_MOCK, app
from orchestrator.htmlreport import FAILED_ROWS, run_page
from orchestrator.human import duration, offset
from orchestrator.runrecord import CoreUsage, RunRecord, category_use
from orchestrator.session import RunConfig, run_simulated
from orchestrator.store import Store
from workflows.spec import example, load

BLAST = str(example("blast"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo workflow by ASA on the demo's replay of HPC2N, in a store file: the store,
    the run's summary, and what the store holds of it."""
    db = tmp_path_factory.mktemp("report") / "store.db"
    summary = run_simulated(load(example("demo")), RunConfig(strategy="asa", backend=DEMO_MOCK), db)
    return db, summary, _record(db, summary.run_id)


@pytest.fixture(scope="module")
def demo_page(demo):
    return run_page(demo[2])


def _record(db, run_id: str) -> RunRecord:
    async def main():
        async with await Store.open(db) as store:
            return await RunRecord.load(store, run_id)

    record = clock.run(main(), virtual=False)
    assert record is not None
    return record


def _embedded(page: str):
    found = re.search(r'<script type="application/json" id="figures">(.*?)</script>', page, re.S)
    assert found, "the page embeds its figures"
    return json.loads(found.group(1).replace("<\\/", "</"))


def _cells(page: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", page)]


def test_the_report_of_a_run_shows_every_stage_and_pilot_and_the_run_s_own_figures(demo, demo_page):
    _, summary, _ = demo
    page = demo_page
    as_printed = json.loads(json.dumps(summary.as_json()))  # what `run --json` prints
    assert _embedded(page) == as_printed
    cells = _cells(page)
    for stage in summary.stages:
        assert stage.name in cells
        assert re.search(rf">{stage.name} \(\d+ tasks?\)</text>", page), "in the timeline"
    for pilot in summary.pilots:
        assert pilot.pilot_id in cells
        assert re.search(rf">{pilot.pilot_id} · {pilot.cores} cores?", page), "in the timeline"
        assert duration(pilot.wait) in cells
    for shown in (
        duration(summary.makespan_s),
        duration(summary.twt_s),
        duration(summary.pwt_s),
        f"{summary.core_hours:,.2f}",
        f"{summary.oh_core_hours:,.2f}",
        f"{summary.hit_ratio:.0%}",
    ):
        assert f'<div class="value">{shown} ' in page
    assert page.count("<svg") == 5  # timeline, waits, cores, efficiency, failed attempts
    assert "28\xa0cores, 112,000\xa0MB, 30\xa0min" in cells  # wraps only after a comma
    assert "durations are the cluster's virtual time" in page
    # past FAILED_ROWS failed attempts, a note names the command that lists them, set as code
    more = [
        _row(task_id=f"simulate.{i}", attempt=9, outcome="exhausted", exhausted="memory",
             allocation={"cores": 1, "memory": 1000, "disk": 10}, peak=None,
             start_t=3200.0, end_t=3250.0)
        for i in range(FAILED_ROWS + 1)
    ]  # fmt: skip
    record = demo[2]
    many = run_page(replace(record, attempts=[*record.attempts, *more]))
    assert "`" not in many and f"<code>leadtime status {record.run['run_id']}</code>" in many


def test_the_report_shows_the_numbers_status_json_gives(demo, demo_page):
    db, summary, _ = demo
    done = CliRunner().invoke(app, ["status", summary.run_id, "--json", "--db", str(db)])
    assert done.exit_code == 0, done.output
    shown = json.loads(done.output)
    for key, value in _embedded(demo_page).items():
        if key in ("stages", "pilots"):  # each entry grown with more of what the store holds
            pairs = zip(shown[key], value, strict=True)
            assert [{k: mine[k] for k in theirs} for mine, theirs in pairs] == value
        else:
            assert shown[key] == value, key
    cells = _cells(demo_page)
    for s in shown["stages"]:
        row = cells[cells.index(s["name"]) :][:11]
        assert row[2:5] == [str(s["tasks"]), str(s["done"]), str(s["attempts"])]
        assert row[6:] == [offset(s["ready_s"]), offset(s["submit_s"]), offset(s["start_s"]),
                           offset(s["end_s"]), duration(s["wait_s"])]  # fmt: skip
    for p in shown["pilots"]:
        row = cells[cells.index(p["pilot_id"]) :][:12]
        assert row[1] == p["job_id"]
        assert row[9:11] == [duration(p["predicted_wait"]), duration(p["wait_s"])]


def test_the_report_is_one_file_that_loads_nothing(demo_page):
    page = demo_page
    assert not re.search(r"""\b(?:src|href)\s*=\s*["'](?!#)""", page), "no outside resource"
    assert "<link" not in page and "@import" not in page and "url(http" not in page
    assert "<script" in page and not re.search(r"<script(?! type=\"application/json\")", page)


def test_the_report_lists_what_did_not_succeed_with_why(demo, demo_page):
    failed = demo[2].failures()
    assert failed, "the demo's sizer learns memory by killing a few attempts"
    page = demo_page
    cells = _cells(page)
    for attempt in failed[:25]:
        assert attempt["task_id"] in cells and attempt["cause"] in cells
    assert ">killed for memory</text>" in page


def test_cores_held_add_up_to_the_run_s_core_hours_and_busy_to_its_attempts(demo):
    _, summary, record = demo
    usage = CoreUsage.of(record)
    assert usage.held_core_hours == pytest.approx(summary.core_hours)
    busy = (
        sum(a["allocation"]["cores"] * (a["end_t"] - a["start_t"]) for a in record.attempts) / 3600
    )
    assert usage.busy_core_hours == pytest.approx(busy)
    assert 0 < usage.idle_core_hours < usage.held_core_hours
    assert all(b <= h + 1e-9 for b, h in zip(usage.busy, usage.held, strict=True))


def test_a_run_that_recorded_no_figures_gets_them_from_its_rows(demo):
    _, summary, record = demo
    unrecorded = RunRecord(
        {**record.run, "summary": None, "status": "running"},
        record.stages,
        record.pilots,
        record.tasks,
        record.attempts,
        record.waits,
    )
    assert not unrecorded.recorded
    figures = unrecorded.figures
    recorded = record.figures
    for key in ("makespan_s", "twt_s", "pwt_s", "core_hours", "oh_core_hours", "hit_ratio"):
        assert figures[key] == pytest.approx(recorded[key]), key
    assert figures["stages"] == recorded["stages"]
    assert [p["pilot_id"] for p in figures["pilots"]] == [p.pilot_id for p in summary.pilots]
    assert "recorded no figures of its own" in run_page(unrecorded)


def _row(**fields):
    return {
        "worker": "w",
        "pilot_id": "p-0",
        "exit_code": 0,
        "exhausted": None,
        "measured": None,
        "output_tail": None,
        "cause": None,
        **fields,
    }


def test_awe_and_cores_by_hand():
    """Two pilots and three attempts whose figures are worked out by hand."""
    record = RunRecord(
        run={"run_id": "r", "workflow": "w", "strategy": "asa", "status": "done",
             "backend": "mock", "sizer": "select", "seed": 0, "error": None, "summary": {
                 "makespan_s": 400.0, "twt_s": 100.0, "pwt_s": 100.0, "core_hours": 1 / 3,
                 "oh_core_hours": 0.0, "hit_ratio": 0.0, "stages": [{"name": "a"}],
                 "pilots": [{"pilot_id": "a-0"}, {"pilot_id": "a-1"}]}},
        stages=[{"stage": "a", "state": "done", "tasks_total": 2, "tasks_done": 2,
                 "ready_t": 0.0, "start_t": 100.0, "end_t": 400.0}],
        pilots=[
            {"pilot_id": "a-0", "stage": "a", "job_id": "1", "state": "COMPLETED", "reason": None,
             "request": {"cores": 4}, "predicted_wait": 50.0, "submit_t": 0.0,
             "eligible_t": 0.0, "start_t": 100.0, "end_t": 400.0},
            {"pilot_id": "a-1", "stage": "a", "job_id": "2", "state": "CANCELLED",
             "reason": None, "request": {"cores": 2}, "predicted_wait": None, "submit_t": 0.0,
             "eligible_t": 0.0, "start_t": None, "end_t": 300.0},
        ],
        tasks=[{"task_id": "a.0", "stage": "a", "category": "c", "state": "done"},
               {"task_id": "a.1", "stage": "a", "category": "c", "state": "done"}],
        attempts=[
            # killed for memory after 100 s holding 2 cores and 1000 MB
            _row(task_id="a.0", attempt=1, outcome="exhausted", exhausted="memory",
                 allocation={"cores": 2, "memory": 1000, "disk": 10}, peak=None,
                 start_t=100.0, end_t=200.0, cause="memory 1,200 MB > 1,000 MB"),
            # then 200 s with 2 cores, 2000 MB, using 1 core and 1500 MB
            _row(task_id="a.0", attempt=2, outcome="success",
                 allocation={"cores": 2, "memory": 2000, "disk": 10},
                 peak={"cores": 1, "memory": 1500, "disk": 5}, start_t=200.0, end_t=400.0),
            # 100 s with 1 core, 500 MB, using all of it
            _row(task_id="a.1", attempt=1, outcome="success",
                 allocation={"cores": 1, "memory": 500, "disk": 10},
                 peak={"cores": 1, "memory": 500, "disk": 10}, start_t=100.0, end_t=200.0),
        ],
        waits=[{"pilot_id": "a-0", "hit": 0}],
    )  # fmt: skip
    usage = CoreUsage.of(record)
    # a-0 held 4 cores for 300 s (a-1 never started); 3 cores busy 100-200 s, 2 cores 200-400 s
    assert usage.held_core_hours == pytest.approx(4 * 300 / 3600)
    assert usage.busy_core_hours == pytest.approx((3 * 100 + 2 * 200) / 3600)
    assert usage.idle_core_hours == pytest.approx((1 * 100 + 2 * 200) / 3600)
    (c,) = category_use(record)
    assert (c.category, c.attempts, c.succeeded) == ("c", 3, 2)
    # memory: used 1500*200 + 500*100; held 1000*100 (killed) + 2000*200 + 500*100
    assert c.usage["memory"].awe == pytest.approx(350_000 / 550_000)
    used, unused, failed = c.shares("memory")
    assert (unused, failed) == (pytest.approx(100_000 / 550_000), pytest.approx(100_000 / 550_000))
    assert used + unused + failed == pytest.approx(1.0)
    assert c.mean_allocated("memory") == pytest.approx(3500 / 3)
    assert c.mean_peak("memory") == pytest.approx(1000) and c.largest_peak("memory") == 1500
    by_stage = record.failures_by_stage()
    assert by_stage == {"a": {"memory": 1}}
    (a0, a1) = record.pilot_figures()
    # a-1 waited from eligible until it was cancelled: its 300 s in the queue are its wait
    assert (a0.cores, a0.hit, a1.wait, a1.state) == (4, False, 300.0, "CANCELLED")
    page = run_page(record)
    assert "a-1 · 2 cores · job 2 · cancelled" in page


def test_report_writes_the_page_of_a_run(cli, tmp_path):
    done = cli("run", BLAST, "--json", "--strategy", "per-stage", "--scale", "28")
    summary = json.loads(done.stdout)
    page = tmp_path / "out.html"
    written = cli("report", summary["run_id"], "--out", str(page))
    assert written.exit_code == 0, written.output
    assert str(page) in written.output
    assert _embedded(page.read_text()) == summary
    short = cli("report", summary["run_id"], "-o", str(tmp_path / "short.html"))
    assert short.exit_code == 0 and _embedded((tmp_path / "short.html").read_text()) == summary
    newest = cli("run", BLAST, "--json", "--strategy", "asa", "--scale", "28")
    newest = json.loads(newest.stdout)
    default = cli("report", "-o", str(tmp_path / "newest.html"))  # no RUN_ID: the newest run
    assert default.exit_code == 0 and f"run {newest['run_id']} of blast" in default.output
    assert _embedded((tmp_path / "newest.html").read_text()) == newest
    unknown = cli("report", "nosuchrun", "--out", str(tmp_path / "no.html"))
    assert unknown.exit_code == 2 and "no run nosuchrun" in unknown.output
    assert not (tmp_path / "no.html").exists()
    unwritable = cli("report", summary["run_id"], "--out", str(tmp_path / "no" / "dir.html"))
    assert unwritable.exit_code == 2 and "--out" in unwritable.output
    assert "Traceback" not in unwritable.output


def test_compare_report_puts_the_strategies_side_by_side(cli, tmp_path):
    page = tmp_path / "compare.html"
    done = cli(
        "compare", BLAST, str(example("demo")), "--strategies", "per-stage,asa",
        "--scales", "28", "--runs", "1", "--load", "0.5", "--json", "--quiet",
        "--report", str(page),
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    rows = json.loads(done.stdout)
    text = page.read_text()
    assert _embedded(text) == rows
    cells = _cells(text)
    for row in rows:
        assert row["workflow"] in cells and row["strategy"] in cells
        assert duration(row["makespan_s"]) in cells and f"{row['core_hours']:,.2f}" in cells
    for panel in ("makespan", "core-hours", "TWT"):
        assert f">{panel}</text>" in text
    assert text.count("<svg") == 1
    assert all(">best<" in text for _ in rows)


@pytest.mark.parametrize(
    "args",
    [("report", "anyrun"), ("compare", BLAST, "--quiet", "--report", "out.html")],
    ids=["report", "compare --report"],
)
def test_without_matplotlib_the_report_says_how_to_get_it(cli, monkeypatch, tmp_path, args):
    for name in ("htmlreport", "plots"):  # imported afresh, as in a new process
        monkeypatch.delitem(sys.modules, f"orchestrator.{name}", raising=False)
        monkeypatch.delattr(orchestrator, name, raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    monkeypatch.chdir(tmp_path)
    done = cli(*args)
    assert done.exit_code == 2
    lines = done.output.strip().splitlines()
    assert lines == ["error: the report draws its plots with matplotlib: pip install "
                     "'leadtime[report]'"]  # fmt: skip
    assert not (tmp_path / "out.html").exists()


def test_time_axes_read_in_the_unit_of_their_span():
    from orchestrator.plots import time_unit

    assert time_unit(90) == (1.0, "s")
    assert time_unit(600) == (60.0, "min")
    assert time_unit(5958) == (60.0, "min")
    assert time_unit(3 * 3600) == (3600.0, "h")
    assert time_unit(5 * 86400) == (86400.0, "d")
    assert not math.isnan(time_unit(0)[0])


def test_a_run_that_recorded_only_its_start_still_has_a_report():
    record = RunRecord(
        run={"run_id": "r", "workflow": "w", "strategy": "asa", "status": "failed",
             "backend": "slurm", "sizer": "select", "seed": 0, "summary": None,
             "error": "the batch system refused a pilot: <bad account>"},
        stages=[{"stage": s, "state": "waiting", "tasks_total": 3, "tasks_done": 0,
                 "ready_t": None, "start_t": None, "end_t": None} for s in ("a", "b")],
        pilots=[], tasks=[], attempts=[], waits=[],
    )  # fmt: skip
    page = run_page(record)
    assert '<div class="error">error: the batch system refused a pilot: &lt;bad account&gt;' in page
    assert "No pilot was submitted." in page and "the run held no core" in page
    assert "virtual time" not in page  # a Slurm run's durations are the wall clock's
    assert "No attempt ended." in page and "Every attempt that ended succeeded." in page
    assert _embedded(page)["makespan_s"] == 0.0
    assert re.search(r">a \(3 tasks\)</text>", page) and re.search(r">b \(3 tasks\)</text>", page)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            Unfittable("c", "memory", Bound.WORKER, 64_000, 70_200.5),
            "needs more memory than a whole worker has, 64 GB (it reached 70 GB): give its "
            "stage's allocation more memory",
        ),
        (
            Unfittable("c", "memory", Bound.WORKER, 64_000),
            "needs more memory than a whole worker has, 64 GB: give its stage's allocation "
            "more memory",
        ),
        (
            Unfittable("c", "cores", Bound.WORKER, 28, 32, declares=True),
            "declares 32 cores, more than a whole worker has (28 cores): lower it, or "
            "give its stage larger nodes",
        ),
        (
            Unfittable("c", "wall", Bound.DECLARED, 3600, 3600),
            "needs more wall time than the 1 h its workflow declares (it reached 1 h): a "
            "declared size is fixed; raise it, or leave it out to have leadtime size it",
        ),
    ],
)
def test_a_task_that_can_never_fit_is_told_in_a_users_units(error, said):
    assert human.unfittable(error) == said


def test_twt_counts_a_pilot_cancelled_while_it_waited():
    """TWT is every pilot's time in the queue once eligible: to its start, or to its end for
    one cancelled while it waited (as Slurm starts a cancelled pending job at its end); a
    pilot cancelled before it was eligible (its dependency unmet, or before its begin time,
    for which Slurm still gives an eligible time) waited for nothing."""
    from orchestrator.plots import _wait_note
    from orchestrator.summary import PilotFigures, summarize

    started = PilotFigures("a-0", ("a",), 4, 0.0, 0.0, 100.0, 400.0, predicted_wait=90.0)
    replaced = PilotFigures("a-1", ("a",), 8, 0.0, 10.0, None, 70.0, state="CANCELLED")
    held = PilotFigures("b-0", ("b",), 2, 0.0, None, None, 70.0, state="CANCELLED")
    early = PilotFigures("c-0", ("c",), 2, 0.0, 120.0, None, 70.0, state="CANCELLED")
    pilots = [started, replaced, held, early]
    summary = summarize("r", "w", "per-stage", "done", 400.0, [], pilots)
    assert [p.wait for p in pilots] == [100.0, 60.0, None, None]
    assert summary.twt_s == 160.0
    assert summary.core_hours == pytest.approx(4 * 300 / 3600)  # only what started holds cores
    assert _wait_note(replaced) == "no prediction, cancelled after 1 min in the queue"
    assert _wait_note(held) == _wait_note(early) == "no prediction, never started"
    assert _wait_note(started) == "predicted 1 min 30 s, real 1 min 40 s"


def test_report_of_a_store_with_no_run_says_so(tmp_path, empty_store):
    db = empty_store
    done = CliRunner().invoke(app, ["report", "--db", str(db), "-o", str(tmp_path / "r.html")])
    assert done.exit_code == 2, done.output
    assert f"{db}: no run yet" in " ".join(done.output.split())
    assert not (tmp_path / "r.html").exists()
