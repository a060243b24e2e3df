"""One run of a workflow at a time in a working directory.

Two runs of one workflow in the same working directory write the same files, and each
removes a task's declared outputs before each of its attempts: one would remove what the other
just wrote or is about to read. So a run's manager holds ``WORKDIR/.leadtime/NAME.lock``, an
advisory ``flock``, from before its first pilot is submitted until it ends, and a second run
of the same workflow there (a new one, or the resume of an older one) is refused, naming the
first. The kernel drops the lock when its process ends, however it ends, so a manager that
crashed leaves nothing to clear by hand (Snakemake's ``--unlock``). Runs of other workflows in
the same directory are not refused. On a file system without ``flock`` (Lustre mounted
without it), nothing is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

LOCKED = (errno.EAGAIN, errno.EACCES)
"""What ``flock`` says when another holds the lock; any other error means it cannot lock."""


class Busy(Exception):
    """Another run of the workflow holds its working directory (a user's mistake: exit 2)."""


def lock_path(workdir: Path, workflow: str) -> Path:
    return workdir / ".leadtime" / f"{workflow}.lock"


@contextlib.contextmanager
def holding(workdir: Path, workflow: str, run_id: str) -> Iterator[bool]:
    """Hold the lock of ``workflow`` in ``workdir`` for run ``run_id``; yields whether the
    file system could lock at all. Raises :class:`Busy` when another run holds it."""
    path = lock_path(workdir, workflow)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in LOCKED:
                yield False
                return
            raise Busy(_busy_message(workdir, workflow, _holder(fd))) from None
        os.ftruncate(fd, 0)
        holder = {"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname()}
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield True
    finally:
        os.close(fd)


def _holder(fd: int) -> dict[str, object]:
    """Who holds the lock, as it wrote (nothing yet, if it is writing now)."""
    try:
        told = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return told if isinstance(told, dict) else {}


def _busy_message(workdir: Path, workflow: str, holder: dict[str, object]) -> str:
    run_id = holder.get("run_id")
    which = f"run {run_id}" if run_id else "another run"
    where = f" (its manager is pid {holder['pid']} on {holder['host']})" if "pid" in holder else ""
    cancel = f"`leadtime cancel {run_id}`" if run_id else "cancel it"
    return (
        f"workflow {workflow} is already running in {workdir}: {which}{where}; two runs "
        "there would write, and remove, the same files. Wait for it to end, "
        f"{cancel}, or give this run another --workdir"
    )
