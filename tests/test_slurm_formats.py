"""What the Slurm backend writes for and reads from Slurm, checked without a cluster.

The samples are Slurm 22.05.8's own output (``squeue --json``, ``scontrol show job -o``,
sbatch's messages), captured on the local cluster and trimmed to the fields read.
"""

import json
import os
import subprocess
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from backends import clock
from backends.base import Dependency, JobState, NodeShare, PilotRequest, SubmitError
from backends.slurm.jobs import (
    JobRecord,
    NodeSize,
    Seen,
    SlurmOutputError,
    SlurmReportedError,
    parse_scontrol,
    parse_sinfo_nodes,
    parse_squeue_json,
)
from backends.slurm.script import batch_script, rejection, sbatch_arguments
from orchestrator.agent.worker import node_share_from_env

RUN_DIR = Path("/runs/r1")

CORES = {str(i): "allocated" for i in range(16)}
SQUEUE = {
    "meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}},
    "errors": [],
    "jobs": [
        {"job_id": 82, "name": "cap-run", "comment": "run-1", "user_id": 0,
         "job_state": "RUNNING", "state_reason": "None", "submit_time": 1795316123,
         "eligible_time": 1795316123, "start_time": 1795316124, "end_time": 1826852124,
         "batch_host": "vm", "cpus": 16,
         "job_resources": {"nodes": "vm", "allocated_cores": 16, "allocated_hosts": 1,
                           "allocated_nodes": [{"sockets": {"0": {"cores": CORES}},
                                                "nodename": "vm", "cpus_used": 0,
                                                "memory_used": 0, "memory_allocated": 16000}]}},
        {"job_id": 83, "name": "cap-dep", "comment": "", "user_id": 0, "job_state": "PENDING",
         "state_reason": "Dependency", "submit_time": 1795316124, "eligible_time": 0,
         "start_time": 0, "end_time": 0, "batch_host": "", "cpus": 2},
        {"job_id": 84, "name": "cap-res", "comment": "", "user_id": 0, "job_state": "PENDING",
         "state_reason": "Resources", "submit_time": 1795316124, "eligible_time": 1795316124,
         "start_time": 1826852124, "end_time": 6121819360, "batch_host": "", "cpus": 2},
        {"job_id": 85, "name": "cap-cancel", "comment": "", "user_id": 0,
         "job_state": "CANCELLED", "state_reason": "Priority", "submit_time": 1795316124,
         "eligible_time": 1795316124, "start_time": 1795316125, "end_time": 1795316125,
         "batch_host": "", "cpus": 2},
    ],
}  # fmt: skip

SCONTROL_RUNNING = (
    "JobId=82 JobName=cap-run UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901678 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:02 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-11-22T02:55:23 EligibleTime=2026-11-22T02:55:23 "
    "AccrueTime=2026-11-22T02:55:23 StartTime=2026-11-22T02:55:24 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-22T02:55:24 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:4878 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=16 NumTasks=16 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=16,mem=16000M,node=1,billing=16 Comment=run-1  StdErr=/dev/null"
)
SCONTROL_DEPENDENT = (
    "JobId=83 JobName=cap-dep UserId=root(0) GroupId=root(0) JobState=PENDING Reason=Dependency "
    "Dependency=afterok:82(unfulfilled) SubmitTime=2026-11-22T02:55:24 EligibleTime=Unknown "
    "AccrueTime=Unknown StartTime=Unknown EndTime=Unknown Partition=debug NodeList= NumNodes=1-1"
)
SCONTROL_CANCELLED_PENDING = (
    "JobId=85 JobName=cap-cancel UserId=root(0) GroupId=root(0) JobState=CANCELLED "
    "Reason=Priority SubmitTime=2026-11-22T02:55:24 EligibleTime=2026-11-22T02:55:24 "
    "StartTime=2026-11-22T02:55:25 EndTime=2026-11-22T02:55:25 Partition=debug NodeList= "
)


def local(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# -- sbatch's command line -------------------------------------------------------------


def test_pinned_nodes_split_cores_and_memory_per_node():
    request = PilotRequest(
        name="wf-stage1",
        cores=8,
        nodes=2,
        memory_mb=3001,
        time_limit_s=3601,
        partition="debug",
        account="proj",
        qos="high",
        dependency=Dependency("afterok", ("11", "12")),
        comment="run 7",
        extra=("--exclusive",),
    )
    assert sbatch_arguments(request, RUN_DIR, ["--reservation=r"]) == [
        "--parsable",
        "--job-name=wf-stage1",
        "--output=/runs/r1/wf-stage1-%j.out",
        "--no-requeue",
        "--time=61",
        "--comment=run 7",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=4",
        "--mem=1501",
        "--partition=debug",
        "--account=proj",
        "--qos=high",
        "--dependency=afterok:11:12",
        "--kill-on-invalid-dep=yes",
        "--reservation=r",
        "--exclusive",
    ]


def test_unpinned_cores_are_tasks_with_memory_per_cpu():
    request = PilotRequest(name="p", cores=6, memory_mb=1000, time_limit_s=30)
    args = sbatch_arguments(request, RUN_DIR)
    assert args[4] == "--time=1"
    assert args[5:] == ["--ntasks=6", "--cpus-per-task=1", "--mem-per-cpu=167"]


@pytest.mark.parametrize(
    ("fields", "option"),
    [
        ({"name": "a b"}, "--job-name"),
        ({"name": "../x"}, "--job-name"),
        ({"cores": 0}, "--ntasks"),
        ({"time_limit_s": 0}, "--time"),
        ({"nodes": 0}, "--nodes"),
        ({"cores": 5, "nodes": 2}, "--cpus-per-task"),
    ],
)
def test_requests_sbatch_would_misread_are_refused(fields, option):
    request = PilotRequest(**{"name": "p", "cores": 4, "time_limit_s": 60, **fields})
    with pytest.raises(SubmitError) as refused:
        sbatch_arguments(request, RUN_DIR)
    assert refused.value.option == option


# -- the batch script ---------------------------------------------------------------


def run_script(
    tmp_path: Path,
    srun_status: int,
    end_time: str | None = None,
    *,
    steps: str = "run",
    pings: str = "0",
) -> tuple[int, list[str]]:
    """Run the batch script of job 7 with stand-ins for srun (which records its arguments and
    environment, then runs its step's mark: ``steps``, one word a try, says whether it did,
    ``run`` or ``none``) and squeue, for scontrol (``pings``: its ``ping``'s exit codes in
    turn) and for sleep (both write to ``pings`` what they were asked, and return at once);
    ``end_time`` is the job's ``SLURM_JOB_END_TIME``, if Slurm set it."""
    record = tmp_path / "srun-args"
    tries, pinged = tmp_path / "srun-tries", tmp_path / "pings"
    (tmp_path / "srun").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$@" > {record}\n'
        f'echo "W=$W" >> {record}\necho "END=$SLURM_JOB_END_TIME" >> {record}\n'
        f"echo try >> {tries}\nsteps=({steps})\n"
        f"if [[ ${{steps[$(( $(wc -l < {tries}) - 1 ))]}} == run ]]; then\n"
        "    while [[ $1 == --* ]]; do shift; done\n"
        '    "$1" "$2" "$3" "$4"  # the step\'s mark, not its worker\n'
        f"fi\nexit {srun_status}\n"
    )
    (tmp_path / "squeue").write_text(
        '#!/bin/bash\n[[ "$*" == "--noheader --jobs=7 --format=%e" ]] && echo 2026-11-22T06:14:10\n'
    )
    (tmp_path / "scontrol").write_text(
        f'#!/bin/bash\necho "$*" >> {pinged}\ncodes=({pings})\n'
        f"exit ${{codes[$(grep -c ^ping {pinged}) - 1]:-0}}\n"
    )
    (tmp_path / "sleep").write_text(f'#!/bin/bash\necho "sleep $*" >> {pinged}\n')
    for stand_in in ("srun", "squeue", "scontrol", "sleep"):
        (tmp_path / stand_in).chmod(0o755)
    script = batch_script(
        "p", ["worker", "--manager", "h:1", "it's two words"], {"W": "a b'c"}, tmp_path
    )
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "3"}
    env |= {"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": end_time or ""}
    done = subprocess.run(["bash", "-c", script], env=env, check=False, timeout=60)
    assert not (tmp_path / "p-7.started").exists()  # the script's mark goes with it
    return done.returncode, record.read_text().splitlines()


def test_script_starts_one_whole_node_worker_per_node(tmp_path):
    status, args = run_script(tmp_path, 0)
    assert status == 0
    assert args == [
        "--immediate=60",
        "--nodes=3",
        "--ntasks=3",
        "--ntasks-per-node=1",
        "--whole",
        "--overlap",
        "/bin/sh",
        "-c",
        'true 2>/dev/null >"$0"; exec "$@"',
        f"{tmp_path}/p-7.started",
        "worker",
        "--manager",
        "h:1",
        "it's two words",
        "W=a b'c",
        f"END={local('2026-11-22T06:14:10'):.0f}",  # read from squeue: Slurm 22.05 sets none
    ]
    assert (tmp_path / "srun-tries").read_text() == "try\n"


def test_script_keeps_the_end_time_slurm_gives(tmp_path):
    assert run_script(tmp_path, 0, end_time="1795000000")[1][-1] == "END=1795000000"


@pytest.mark.parametrize(("srun_status", "exit_status"), [(0, 0), (143, 0), (1, 1), (137, 137)])
def test_script_counts_a_worker_killed_by_sigterm_as_released(tmp_path, srun_status, exit_status):
    assert run_script(tmp_path, srun_status)[0] == exit_status
    assert (tmp_path / "srun-tries").read_text() == "try\n"  # its step ran: its status stands


def test_a_step_that_never_started_is_tried_again_once_the_controller_answers(tmp_path):
    """srun gave up on a slurmctld that was down (no step, no mark): the script waits while
    scontrol ping says the controller is down, lets it settle, then tries again; that step's
    status stands."""
    status, _ = run_script(tmp_path, 0, steps="none run", pings="1 1 0")
    assert status == 0
    assert (tmp_path / "srun-tries").read_text() == "try\n" * 2
    asked = ["ping", "sleep 2", "ping", "sleep 2", "ping", "sleep 10"]
    assert (tmp_path / "pings").read_text().splitlines() == asked


def test_a_step_that_never_starts_fails_the_pilot_after_five_tries(tmp_path):
    """With the controller up (or no scontrol to ask: 127), srun's refusal is not an outage's:
    five tries, then its status, so that a pilot that cannot start fails and is counted."""
    status, _ = run_script(tmp_path, 1, steps="none " * 5, pings="0 127 0 0")
    assert status == 1
    assert (tmp_path / "srun-tries").read_text() == "try\n" * 5
    assert (tmp_path / "pings").read_text().splitlines() == ["ping", "sleep 10"] * 4


# -- sbatch's rejections -------------------------------------------------------------


@pytest.mark.parametrize(
    ("stderr", "args", "option"),
    [
        (
            "sbatch: error: invalid partition specified: nosuch\n"
            "sbatch: error: Batch job submission failed: Invalid partition name specified",
            [],
            "--partition",
        ),
        ("sbatch: unrecognized option '--foo=bar'\nTry \"sbatch --help\"", [], "--foo"),
        ("sbatch: invalid option -- 'Z'", [], "-Z"),
        ("sbatch: error: Batch job submission failed: Job dependency problem", [], "--dependency"),
        ("sbatch: error: Invalid --time specification", [], "--time"),
        (
            "sbatch: error: Batch job submission failed: Requested time limit is invalid "
            "(missing or exceeds some limit)",
            [],
            "--time",
        ),
        (
            "sbatch: error: Memory specification can not be satisfied",
            ["--ntasks=4", "--mem-per-cpu=99999"],
            "--mem-per-cpu",
        ),
        (
            "sbatch: error: Batch job submission failed: More processors requested than permitted",
            ["--ntasks=100", "--cpus-per-task=1"],
            "--cpus-per-task",
        ),
        (
            "sbatch: error: Batch job submission failed: Node count specification invalid",
            [],
            "--nodes",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid account or "
            "account/partition combination specified",
            [],
            "--account",
        ),
        ("sbatch: error: Batch job submission failed: Invalid qos specification", [], "--qos"),
        ("sbatch: error: something new", [], None),
    ],
)
def test_rejections_name_the_option(stderr, args, option):
    error = rejection(stderr, args)
    assert error.option == option
    assert str(error) == "; ".join(stderr.splitlines())  # one line, as a message is


# -- squeue --json --------------------------------------------------------------------


def test_squeue_json_states_times_and_nodes():
    records = parse_squeue_json(json.dumps(SQUEUE))
    running, dependent, queued, cancelled = (records[i] for i in ("82", "83", "84", "85"))

    assert running.state is JobState.RUNNING and running.reason == ""
    assert (running.name, running.comment, running.user_id) == ("cap-run", "run-1", 0)
    assert (running.submit_time, running.eligible_time) == (1795316123, 1795316123)
    assert running.start_time == 1795316124 and running.end_time is None
    assert running.nodes == (NodeShare("vm", cores=16, memory_mb=16000),)

    assert dependent.reason == "Dependency"
    assert dependent.eligible_time is None and dependent.start_time is None

    # A pending job's StartTime is the scheduler's estimate, not a start.
    assert queued.reason == "Resources" and queued.start_time is None
    assert queued.end_time is None and queued.nodes == ()

    # Cancelled while pending: Slurm sets StartTime to the cancel time.
    assert cancelled.state is JobState.CANCELLED and cancelled.start_time is None
    assert cancelled.end_time == 1795316125


def test_squeue_json_counts_threads_of_allocated_cores():
    job = {**SQUEUE["jobs"][0], "cpus": 2 * 17}  # two threads per core
    job["job_resources"] = {
        **job["job_resources"],
        "allocated_nodes": [
            {"sockets": {"0": {"cores": {"0": "allocated_and_in_use", "1": "allocated"}},
                         "1": {"cores": {str(i): "allocated" for i in range(2, 16)}}},
             "nodename": "n1", "memory_allocated": 100},
            {"sockets": {"0": {"cores": {"3": "allocated"}}}, "nodename": "n2",
             "memory_allocated": 50},
        ],
        "allocated_cores": 16 + 1,
    }  # fmt: skip
    records = parse_squeue_json(json.dumps({"errors": [], "jobs": [job]}))
    assert records["82"].nodes == (
        NodeShare("n1", cores=32, memory_mb=100),
        NodeShare("n2", cores=2, memory_mb=50),
    )


def test_squeue_json_of_later_releases_numbers_and_state_lists():
    job = {
        "job_id": 9,
        "job_state": ["COMPLETED"],
        "state_reason": "None",
        "submit_time": {"set": True, "infinite": False, "number": 100},
        "eligible_time": {"set": True, "infinite": False, "number": 101},
        "start_time": {"set": True, "infinite": False, "number": 103},
        "end_time": {"set": True, "infinite": False, "number": 110},
        "user_id": 5,
        "batch_host": "n1",
    }
    record = parse_squeue_json(json.dumps({"jobs": [job]}))["9"]
    assert record.state is JobState.COMPLETED and not record.completing
    assert (record.eligible_time, record.start_time, record.end_time) == (101, 103, 110)
    # Completing is a flag beside the base state, which tells how the job ended: nothing hidden.
    job["job_state"] = ["FAILED", "COMPLETING"]
    record = parse_squeue_json(json.dumps({"jobs": [job]}))["9"]
    assert record.state is JobState.FAILED and not record.completing
    assert record.end_time == 110


def test_a_completing_job_is_running_until_we_cancelled_it():
    """COMPLETING hides how a job ended: it counts as running, its end time kept, unless we
    cancelled it (a node of it that no longer answers keeps it COMPLETING for minutes)."""
    job = {**SQUEUE["jobs"][0], "job_state": "COMPLETING"}
    job["end_time"] = {"set": True, "infinite": False, "number": 1795316200}
    record = parse_squeue_json(json.dumps({"errors": [], "jobs": [job]}))["82"]
    assert record.state is JobState.RUNNING and record.completing
    assert record.end_time == 1795316200
    cancelled = record.cancelled()
    assert cancelled.state is JobState.CANCELLED and cancelled.end_time == 1795316200
    assert cancelled.nodes == () and not cancelled.completing
    assert not parse_squeue_json(json.dumps(SQUEUE))["82"].completing
    line = SCONTROL_RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING")
    line = line.replace("EndTime=Unknown", "EndTime=2026-11-22T02:56:40")
    assert parse_scontrol(line).completing
    assert parse_scontrol(line).end_time == local("2026-11-22T02:56:40")


def test_squeue_json_error_inside_output_is_reported():
    # What 22.05 prints, with exit status 0, when slurmctld is down.
    down = {
        "errors": [
            {
                "description": "Failed while looking for jobs",
                "error_number": -1,
                "error": "Unspecified error",
                "source": "slurm_load_jobs",
            }
        ],
        "jobs": [],
    }
    with pytest.raises(SlurmReportedError, match="Failed while looking for jobs"):
        parse_squeue_json(json.dumps(down))
    with pytest.raises(SlurmOutputError):
        parse_squeue_json("slurm_load_jobs error: Unable to contact slurm controller")
    with pytest.raises(SlurmOutputError, match="unknown Slurm job state"):
        parse_squeue_json(json.dumps({"jobs": [{"job_id": 1, "job_state": "DREAMING"}]}))


async def test_record_times_move_to_the_loop_clock_together():
    record = parse_squeue_json(json.dumps(SQUEUE))["82"]
    info = record.info()
    assert info.wait == 1.0  # exactly: one clock reading converts all the times
    assert info.eligible_time == info.submit_time
    assert abs(info.start_time - clock.from_epoch(1795316124)) < 0.01


# -- scontrol show job -o -------------------------------------------------------------


def test_scontrol_line_running_job():
    record = parse_scontrol(SCONTROL_RUNNING)
    assert (record.job_id, record.name, record.user_id) == ("82", "cap-run", 0)
    assert record.state is JobState.RUNNING and record.reason == ""
    assert record.submit_time == local("2026-11-22T02:55:23")
    assert record.start_time == local("2026-11-22T02:55:24")
    assert record.end_time is None


def test_scontrol_line_pending_and_cancelled_pending_jobs():
    dependent = parse_scontrol(SCONTROL_DEPENDENT)
    assert dependent.reason == "Dependency"
    assert dependent.eligible_time is None and dependent.start_time is None
    cancelled = parse_scontrol(SCONTROL_CANCELLED_PENDING)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.start_time is None
    assert cancelled.end_time == local("2026-11-22T02:55:25")


def test_scontrol_without_a_job_is_an_error():
    with pytest.raises(SlurmOutputError):
        parse_scontrol("slurm_load_jobs error: Invalid job id specified")


# -- what a worker learns from srun ---------------------------------------------------


def test_node_share_from_srun_environment():
    step = {"SLURMD_NODENAME": "n3", "SLURM_CPUS_ON_NODE": "4"}
    assert node_share_from_env({**step, "SLURM_MEM_PER_NODE": "3000"}) == NodeShare("n3", 4, 3000)
    assert node_share_from_env({**step, "SLURM_MEM_PER_CPU": "500"}) == NodeShare("n3", 4, 2000)
    assert node_share_from_env(step) == NodeShare("n3", 4, 0)
    with pytest.raises(ValueError, match="SLURM_CPUS_ON_NODE"):
        node_share_from_env({"SLURMD_NODENAME": "n3"})


SINFO = "debug* 16 32000 0\nshort 32+ 64000 100000\nbig 64 256000+ 0\n"


def test_sinfo_gives_the_largest_node_of_the_partitions_asked():
    assert parse_sinfo_nodes(SINFO, {None}) == NodeSize(16, 32000, 0)
    assert parse_sinfo_nodes(SINFO, {None, "short"}) == NodeSize(32, 64000, 100000)
    assert parse_sinfo_nodes(SINFO, {"big", "short"}) == NodeSize(64, 256000, 100000)
    assert parse_sinfo_nodes(SINFO, {"gpu"}) is None


def test_sinfo_output_of_another_shape_is_an_error():
    with pytest.raises(SlurmOutputError, match="expected CPUs, memory and disk"):
        parse_sinfo_nodes("debug* 16 lots 0\n", {None})


def test_a_jobs_whole_second_times_are_not_before_what_we_saw_of_it():
    """Slurm cuts times down to whole seconds: a job submitted at x.7 s reports x, and one
    released at y.4 s may report ending at y; the backend knows better, having asked at x.7 s
    and seen it running at y.4 s."""
    record = JobRecord(
        "7", JobState.RUNNING, submit_time=100.0, eligible_time=100.0, start_time=101.0
    )
    seen = Seen(submitted=100.7)
    later = record.bounded(seen)
    assert (later.submit_time, later.eligible_time, later.start_time) == (100.7, 100.7, 101.0)
    assert later.end_time is None and record.bounded(None) is record

    seen.saw(JobState.PENDING, 101.3)  # a query begun at 101.3 s found it pending
    seen.saw(JobState.RUNNING, 104.4)
    seen.saw(JobState.COMPLETED, 105.2)  # says nothing of when it ended
    assert (seen.pending, seen.alive) == (101.3, 104.4)
    ended = replace(record, state=JobState.COMPLETED, end_time=104.0).bounded(seen)
    assert (ended.start_time, ended.end_time) == (101.3, 104.4)
    gone = JobRecord("8", JobState.CANCELLED, submit_time=100.0, end_time=100.0)
    assert gone.bounded(Seen(submitted=100.7)).end_time == 100.7
