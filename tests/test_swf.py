"""The SWF reader: header, fields, unknown values, malformed lines, the shared traces."""

import gzip
import json

import numpy as np
import pytest

from backends.sim.swf import TRACES_DIR, SwfError, load_trace, read_swf, trace_path
from workflows.datasets import DataNotFound
from workflows.spec import example

HEADER = """\
; Version: 2.2
; Computer: Test machine
; UnixStartTime: 1000000000
; MaxNodes: 8 (batch partition; 16 total)
; MaxProcs: 32
; Queue:  1 short
; Queue:  2 long
;
"""
JOBS = """\
    1      0   10   100   4  95.5  -1    4   3600  -1  1  1  1 -1  1 -1 -1 -1
    2     60    0    50   8    -1  -1   -1    -1  -1  0  2  1 -1  2 -1 -1 -1
; a comment between jobs
    3    120    5  7200   2    -1  -1    2   1800  -1  5  1  1 -1  1 -1 -1 -1

"""


def write(tmp_path, text, name="t.swf"):
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["t.swf", "t.swf.gz"])
def test_reads_header_and_jobs(tmp_path, name):
    trace = read_swf(write(tmp_path, HEADER + JOBS, name))
    h = trace.header
    assert (h.max_procs, h.max_nodes, h.unix_start_time) == (32, 8, 1_000_000_000)
    assert h.get("computer") == "Test machine"
    assert [v for k, v in h.entries if k == "Queue"] == ["1 short", "2 long"]
    assert len(trace) == 3 and trace.name == "t"
    jobs = trace.jobs
    assert jobs["job_id"].tolist() == [1, 2, 3]
    assert jobs["submit"].tolist() == [0, 60, 120]
    assert jobs["avg_cpu"][0] == 95.5 and jobs["status"].tolist() == [1, 0, 5]
    assert jobs["req_procs"].dtype == np.int64 and not jobs.flags.writeable


def test_unknown_fields_fall_back(tmp_path):
    trace = read_swf(write(tmp_path, HEADER + JOBS))
    assert trace.procs().tolist() == [4, 8, 2]  # job 2 requested -1: allocated 8
    assert trace.time_limits().tolist() == [3600, 3600, 1800]  # -1: the longest request
    assert trace.max_procs() == 32


def test_without_any_requested_time_the_longest_run_is_the_limit(tmp_path):
    text = "1 0 0 100 1 -1 -1 1 -1 -1 1 1 1 -1 1 -1 -1 -1\n"
    text += "2 5 0 300 1 -1 -1 1 -1 -1 1 1 1 -1 1 -1 -1 -1\n"
    trace = read_swf(write(tmp_path, text))
    assert trace.time_limits().tolist() == [300, 300]
    # no MaxProcs: the most processors busy at once in the recorded schedule (both jobs)
    assert trace.header.max_procs is None and trace.max_procs() == 2


def test_header_only_gives_no_jobs(tmp_path):
    trace = read_swf(write(tmp_path, HEADER))
    assert len(trace) == 0 and trace.jobs.dtype.names[0] == "job_id"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("4 1 2 3", r"t\.swf:14: expected 18 fields, found 4"),
        ("4 180 0 1_0 1 -1 -1 1 60 -1 1 1 1 -1 1 -1 -1 -1", r":14: field 4 \(run\) is not a"),
        (
            "4 180 0 x1 1 -1 -1 1 60 -1 1 1 1 -1 1 -1 -1 -1",
            r":14: field 4 \(run\) is not a number: 'x1'",
        ),
        (
            "4 180 0 10 1.5 -1 -1 1 60 -1 1 1 1 -1 1 -1 -1 -1",
            r":14: field 5 \(alloc_procs\) must be an integer",
        ),
        ("4 180 0 nan 1 -1 -1 1 60 -1 1 1 1 -1 1 -1 -1 -1", r":14: not a finite number"),
    ],
)
def test_malformed_lines_are_named_by_file_and_line(tmp_path, line, message):
    path = write(tmp_path, HEADER + JOBS + line + "\n")
    with pytest.raises(SwfError, match=message):
        read_swf(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(SwfError, match="cannot read"):
        read_swf(tmp_path / "missing.swf")
    bad = tmp_path / "bad.swf.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(SwfError, match=r"bad\.swf\.gz: cannot read"):
        read_swf(bad)


def test_trace_names_resolve_to_the_files_shipped_with_the_package(tmp_path):
    assert trace_path("hpc2n") == TRACES_DIR / "HPC2N-2002-2.2-cln.swf.gz"
    assert trace_path("hpc2n").is_file()
    own = tmp_path / "own.swf"
    own.write_text("1 0 0 10 1 -1 -1 1 60 -1 1 1 1 1 1 1 -1 -1\n")
    assert trace_path(own) == own
    with pytest.raises(DataNotFound, match="'NOPE' is not one of HPC2N, KTH, CTC, nor a file"):
        trace_path("NOPE")


@pytest.fixture
def tiny_data(tmp_path, monkeypatch):
    """A data directory of one tiny SWF log, as $LEADTIME_DATA."""
    (tmp_path / "swf").mkdir()
    write(tmp_path / "swf", HEADER + JOBS, "TINY-SP2-1999-1.0-cln.swf")
    write(tmp_path / "swf", "not a log", "notes.txt")
    monkeypatch.setenv("LEADTIME_DATA", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no file of the names tried here
    return tmp_path


def test_a_name_not_shipped_is_an_swf_log_of_the_data_directory(tiny_data):
    logs = tiny_data / "swf"
    tiny = logs / "TINY-SP2-1999-1.0-cln.swf"
    assert trace_path("tiny") == trace_path("TINY-SP2") == trace_path(tiny.name) == tiny
    assert len(load_trace("Tiny")) == 3
    write(logs, HEADER + JOBS, "TINY-SP2-2001-2.0-cln.swf.gz")
    with pytest.raises(DataNotFound, match=r"'tiny' names several logs in .*: TINY-SP2-1999"):
        trace_path("tiny")
    assert trace_path("tiny-sp2-2001") == logs / "TINY-SP2-2001-2.0-cln.swf.gz"
    with pytest.raises(DataNotFound) as e:
        trace_path("notes")
    assert str(e.value) == (
        "trace 'notes' is not one of HPC2N, KTH, CTC, nor a file, "
        f"nor an SWF log notes[-*].swf[.gz] in {logs}"
    )


def test_without_a_data_directory_a_name_not_shipped_says_so(monkeypatch):
    def nowhere():
        raise DataNotFound("trace data not found")

    monkeypatch.setattr("backends.sim.swf.data_dir", nowhere)
    with pytest.raises(
        DataNotFound, match=r"nor a file, and no data directory is set \(LEADTIME_DATA"
    ):
        trace_path("SDSC-BLUE")


def test_the_run_s_trace_flag_takes_a_log_of_the_data_directory(tiny_data, cli):
    done = cli("run", str(example("blast")), "--trace", "tiny", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["status"] == "done"
    refused = " ".join(cli("run", str(example("blast")), "--trace", "huge").output.split())
    assert (
        "--trace: trace 'huge' is not one of HPC2N, KTH, CTC, nor a file, nor an SWF log" in refused
    )


def test_shared_traces():
    kth, ctc, hpc2n = load_trace("KTH"), load_trace("CTC"), load_trace("HPC2N")
    assert (len(kth), kth.header.max_procs, kth.header.max_nodes) == (27_992, 100, 100)
    assert (len(ctc), ctc.header.max_nodes) == (77_222, 338)  # "338 (batch partition; 512 total)"
    assert (ctc.jobs["req_procs"] == -1).all()
    assert np.array_equal(ctc.procs(), ctc.jobs["alloc_procs"])
    assert (len(hpc2n), hpc2n.header.max_procs) == (202_871, 240)
    assert np.median(hpc2n.jobs["wait"]) == 1599  # as MANIFEST.md records
    assert load_trace("kth") is kth  # cached by file
