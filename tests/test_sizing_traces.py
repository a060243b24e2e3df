"""The trace readers on the real files of the data directory, $LEADTIME_DATA (row counts from
its MANIFEST.md)."""

from __future__ import annotations

import pytest

from workflows.traces import MB, TraceError, all_traces, load_trace

COUNTS = {
    "ipdps2024/synthetic_normal_whole.tasks.csv": 1000,
    "ipdps2024/synthetic_trimodal_greedy.tasks.csv": 1000,
    "jobsizing/bioblast.csv": 7754,
    "jobsizing/lobsterCMSsimulation.csv": 30630,
    "jobsizing/coffea.tasks.csv": 1884,
    "k-segments/eager_tasks.csv": 1631 - 1,  # one task has no memory file
    "k-segments/sarek_tasks.csv": 5508,
    "nfcore/trace_chipseq.csv": 2938,
    "nfcore/trace_eager.csv": 1576,
    "nfcore/trace_iwd.csv": 1661,
    "nfcore/trace_methylseq.csv": 1083 - 72,  # FAILED rows carry no metrics
    "nfcore/trace_rnaseq.csv": 1308,
}


@pytest.mark.parametrize("relative", sorted(COUNTS))
def test_row_counts(data, relative):
    assert len(load_trace(data / relative).tasks) == COUNTS[relative]


def test_all_traces_are_the_ground_truth_files(data):
    names = [p.name for p in all_traces()]
    assert len(names) == 15
    assert "synthetic_normal_whole.tasks.csv" in names and "trace_rnaseq.csv" in names
    assert not any("greedy" in n for n in names)


def test_taskvine_rows(data):
    trace = load_trace(data / "ipdps2024/synthetic_normal_whole.tasks.csv")
    first = trace.tasks[0]
    assert trace.resources == ("cores", "memory", "disk")
    assert (first.category, first.peak.cores, first.peak.memory, first.peak.disk) == (
        "default",
        2.972,
        8139,
        6925,
    )
    assert first.peak.wall == pytest.approx(150.778393)


def test_jobsizing_categories(data):
    trace = load_trace(data / "jobsizing/bioblast.csv")
    assert {t.category for t in trace.tasks} == {"Analysis", "Split", "Join"}
    assert trace.tasks[0].peak.memory == 277 and trace.tasks[0].peak.disk == 670


def test_nextflow_units_and_order(data):
    trace = load_trace(data / "nfcore/trace_eager.csv")
    assert trace.resources == ("cores", "memory")
    first = next(t for t in trace.tasks if t.input_size == 145215827)  # fastqc (DA188_L1)
    assert first.category == "fastqc"
    assert first.peak.memory == pytest.approx(274485248 / MB)
    assert first.peak.cores == pytest.approx(1.196) and first.peak.wall == pytest.approx(12.291)
    assert first.requested == {"cores": 2.0, "memory": 4096.0}


def test_ksegments_series(data):
    trace = load_trace(data / "k-segments/sarek_tasks.csv")
    assert trace.has_series
    task = trace.tasks[0]
    assert task.series is not None and task.peak.memory == task.series.mb.max()
    assert task.peak.wall == task.series.times[-1]
    assert task.requested["memory"] >= task.peak.memory


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nothing.csv")
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(odd)
    broken = tmp_path / "broken.csv"
    broken.write_text("category,cores,memory,disk,cpu_time,wall_time\nx,1,lots,3,4,5\n")
    with pytest.raises(TraceError, match="bad memory 'lots'"):
        load_trace(broken)
