"""One run of a workflow at a time in a working directory: the lock a run's manager holds."""

import errno
import os
import signal
import socket
import subprocess
import sys

import pytest

from orchestrator import workdirlock
from orchestrator.workdirlock import Busy, holding, lock_path


def test_a_second_run_of_the_workflow_is_refused_naming_the_first_and_may_run_once_it_ends(
    tmp_path,
):
    with holding(tmp_path, "wf", "r1") as locked:
        assert locked
        with pytest.raises(Busy) as e, holding(tmp_path, "wf", "r2"):
            pass
        assert str(e.value) == (
            f"workflow wf is already running in {tmp_path}: run r1 (its manager is pid "
            f"{os.getpid()} on {socket.gethostname()}); two runs there would write, and remove, "
            "the same files. Wait for it to end, `leadtime cancel r1`, or give this run another "
            "--workdir"
        )
        with holding(tmp_path, "other", "r3") as other:  # another workflow: its own lock
            assert other
    with holding(tmp_path, "wf", "r2") as locked:
        assert locked and b'"run_id": "r2"' in lock_path(tmp_path, "wf").read_bytes()


def test_a_killed_manager_leaves_no_lock_to_clear(tmp_path):
    code = (
        "import sys, time; from pathlib import Path; from orchestrator.workdirlock import holding\n"
        "with holding(Path(sys.argv[1]), 'wf', 'dead'):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(Busy, match="run dead"), holding(tmp_path, "wf", "r"):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    with holding(tmp_path, "wf", "r") as locked:
        assert locked


def test_a_file_system_without_flock_refuses_nothing(tmp_path, monkeypatch):
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(workdirlock.fcntl, "flock", no_flock)
    with holding(tmp_path, "wf", "r1") as first, holding(tmp_path, "wf", "r2") as second:
        assert (first, second) == (False, False)
