"""Background load: clusters from headers, replay windows, rotated copies, synthetic load."""

import numpy as np
import pytest

from backends.sim.simulator import Simulator
from backends.sim.swf import SwfHeader, SwfTrace, load_trace, read_swf
from backends.sim.workload import ClusterSpec, JobStream, SyntheticLoad, TraceReplay


def trace(tmp_path, header, rows):
    path = tmp_path / "t.swf"
    lines = [f"; {k}: {v}" for k, v in header.items()]
    lines += [" ".join(str(x) for x in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return read_swf(path)


def job(i, submit, run, procs, req_time, req_procs=None):
    req = procs if req_procs is None else req_procs
    return [i, submit, 0, run, procs, -1, -1, req, req_time, -1, 1, 1, 1, -1, 1, -1, -1, -1]


def test_cluster_from_trace_header(tmp_path):
    assert ClusterSpec.for_trace(load_trace("HPC2N")) == ClusterSpec(240, 1)
    assert ClusterSpec.for_trace(load_trace("CTC")).total_cores == 338
    t = trace(tmp_path, {"MaxProcs": 64, "MaxNodes": 16}, [job(1, 0, 10, 4, 60)])
    assert ClusterSpec.for_trace(t) == ClusterSpec(16, 4)
    t = trace(tmp_path, {"MaxProcs": 64}, [job(1, 0, 10, 4, 60)])
    assert ClusterSpec.for_trace(t) == ClusterSpec(64, 1)  # no MaxNodes: one-core nodes


def test_a_replay_runs_on_nodes_of_28_cores_holding_the_logs_processors(tmp_path):
    assert TraceReplay.of("HPC2N").default_cluster() == ClusterSpec(9, 28, 128 * 1024)  # 240
    assert TraceReplay.of("KTH").default_cluster().nodes == 4  # 100 processors
    assert TraceReplay.of("CTC").default_cluster().nodes == 13  # 338 processors
    t = trace(tmp_path, {"MaxProcs": 28}, [job(1, 0, 10, 4, 60)])
    assert TraceReplay.of(t).default_cluster() == ClusterSpec(1, 28, 128 * 1024)


def test_stream_from_trace_cleans_unknowns_and_impossible_jobs(tmp_path):
    rows = [
        job(1, 0, 100, 4, 60),  # ran past its limit: cut to 60
        job(2, 5, -1, 4, 60),  # never ran: left out
        job(3, 9, 10, 8, 60, req_procs=-1),  # unknown request: allocated 8
        job(4, 12, 10, 99, 60),  # larger than the machine: rejected
    ]
    stream = JobStream.from_trace(trace(tmp_path, {"MaxProcs": 16}, rows), max_cores=16)
    assert stream.submit.tolist() == [0, 9]
    assert stream.cores.tolist() == [4, 8]
    assert stream.run.tolist() == [60, 10]
    assert stream.limit.tolist() == [60, 60]


def test_trace_replay_maps_the_origin_to_the_start_after_a_warmup():
    kth = load_trace("KTH")
    replay = TraceReplay(kth, start_job=5000, warmup=86400)
    stream = replay.stream(start=1000.0, cluster=replay.default_cluster())
    origin = kth.jobs["submit"][5000]
    assert replay.origin() == origin
    assert stream.submit[0] >= 1000.0 - 86400
    assert 1000.0 in stream.submit  # job 5000 arrives at the start
    n_warm = np.count_nonzero(stream.submit < 1000.0)
    expected = np.count_nonzero(
        (kth.jobs["submit"] >= origin - 86400) & (kth.jobs["submit"] < origin)
    )
    assert n_warm == expected
    by_offset = TraceReplay(kth, offset=float(origin), warmup=86400).stream(
        1000.0, replay.default_cluster()
    )
    assert np.array_equal(by_offset.submit, stream.submit)


def test_trace_replay_rejects_bad_options():
    with pytest.raises(ValueError, match="not both"):
        TraceReplay.of("KTH", offset=10, start_job=3)
    with pytest.raises(ValueError, match="not among"):
        TraceReplay.of("KTH", start_job=10**6).origin()
    with pytest.raises(ValueError, match="warmup"):
        TraceReplay.of("KTH", warmup=-1)


def test_rotated_copies_keep_every_job_and_the_span():
    stream = JobStream(
        submit=np.array([0.0, 10.0, 40.0, 99.0]),
        cores=np.array([1, 2, 3, 4]),
        run=np.array([5.0, 6.0, 7.0, 8.0]),
        limit=np.array([10.0, 10.0, 10.0, 10.0]),
    )
    copies = stream.rotated_copies(2)
    assert len(copies) == 8
    assert copies.submit.min() >= 0 and copies.submit.max() < 100
    assert sorted(copies.cores.tolist()) == [1, 1, 2, 2, 3, 3, 4, 4]
    pairs = sorted(zip(copies.cores.tolist(), copies.run.tolist(), strict=True))
    assert pairs == sorted(2 * list(zip([1, 2, 3, 4], [5.0, 6.0, 7.0, 8.0], strict=True)))
    replay = TraceReplay.of("KTH", scale=3)
    assert replay.default_cluster() == TraceReplay.of("KTH").default_cluster().scaled(3)


def test_synthetic_load_is_seeded_and_meets_its_utilisation():
    cluster = ClusterSpec(nodes=32, cores_per_node=16)
    load = SyntheticLoad(utilisation=0.6, duration=20 * 86400, warmup=86400, seed=7)
    a, b = load.stream(0.0, cluster), load.stream(0.0, cluster)
    assert np.array_equal(a.submit, b.submit) and np.array_equal(a.cores, b.cores)
    assert a.submit[0] >= -86400 and a.submit[-1] < 20 * 86400
    assert (a.limit >= a.run).all() and a.cores.max() <= 0.25 * cluster.total_cores
    offered = float((a.cores * a.run).sum()) / (cluster.total_cores * 21 * 86400)
    assert offered == pytest.approx(0.6, rel=0.15)
    sim = Simulator(cluster, stream=a)
    sim.run()
    assert not np.isnan(sim.stream_starts).any()


def test_header_integer_parsing():
    h = SwfHeader((("MaxNodes", "338 (batch partition; 512 total)"), ("Note", "x")))
    assert h.max_nodes == 338 and h.integer("Note") is None and h.max_procs is None
    assert isinstance(load_trace("KTH"), SwfTrace)
