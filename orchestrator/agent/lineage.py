"""Which attempt a process belongs to, and making sure none outlives it.

A task may leave its process group and session (``setsid``, a daemon's double fork) and be
re-parented to init: its parentage no longer leads back to the worker. What it keeps is its
environment, inherited by every process it starts: each attempt runs with
``LEADTIME_ATTEMPT_TOKEN`` and ``LEADTIME_WORKER_TOKEN`` set, and a process carrying a token
is that attempt's, or that worker's, wherever it went (the way TaskVine's resource monitor
follows a task's processes, without its library preloading). A process that empties its
environment escapes this; under Slurm the job's end still kills it.

:class:`Lineage` remembers the tokens of the processes the monitor looks at (an environment
is read once per process, known by its pid and start time). A sweep reads every process's
afresh: a pid read before may be another process's by now (pids wrap at 32,768 by default),
and a process missed is one left running. A worker also adopts its tasks' orphans
(:func:`adopt_orphans`, Linux's child subreaper): whatever an attempt leaves behind, however it
detached itself, then stays below the worker, and a sweep that finds no child of the worker
carrying the attempt's token knows that nothing of it is left without listing ``/proc`` (a
few reads instead of hundreds on a busy node). :class:`Sentinel` covers the
worker's own death: a small process forked before the worker runs anything, in a session of
its own, which learns of the worker's end from a pipe the kernel closes however the worker
died (SIGKILL included), then stops every process carrying the worker's token (SIGTERM, a
second's grace, SIGKILL, as the worker stops what an attempt leaves) and removes the
sandboxes the worker could not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import select
import signal
import time
from collections.abc import Callable, Iterable

ATTEMPT_TOKEN = "LEADTIME_ATTEMPT_TOKEN"
WORKER_TOKEN = "LEADTIME_WORKER_TOKEN"
_SWEEPS = 10
"""Rounds of a sweep: a process may fork while its siblings are killed."""
_sentinels: set[int] = set()
"""The pids of this process's sentinels (:class:`Sentinel`): children that run no attempt."""
SENTINEL_GRACE_MS = 1000
"""Between the SIGTERM a dead worker's sentinel sends what its tasks left and the SIGKILL, as
a worker gives an attempt's leftovers (an ``srun`` ends its step on SIGTERM)."""
EXEC_SETTLE_S = 1.0
"""How long a read of a process's tokens waits for it to get through an ``execve``: the
window is microseconds on an idle node; a process still inside after that is hung (a binary
on a stalled file system) and read as carrying no token."""
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def new_token() -> str:
    return secrets.token_hex(8)


def _environ_tokens(pid: int) -> tuple[str | None, str | None]:
    """The (attempt, worker) tokens in ``pid``'s environment; None where it has none or we
    may not read it. A process caught inside an ``execve`` is read again once it is through."""
    waited, pause = 0.0, 0.001
    while (data := _read(f"/proc/{pid}/environ")) == b"" and waited < EXEC_SETTLE_S:
        if not _inside_exec(pid):
            break
        time.sleep(pause)
        waited, pause = waited + pause, min(2 * pause, 0.05)
    if not data:
        return None, None
    found: dict[bytes, str] = {}
    for name in (ATTEMPT_TOKEN.encode(), WORKER_TOKEN.encode()):
        at = data.find(name + b"=")
        if at == 0 or (at > 0 and data[at - 1] == 0):
            start = at + len(name) + 1
            end = data.find(b"\0", start)
            found[name] = data[start : end if end >= 0 else len(data)].decode(errors="replace")
    return found.get(ATTEMPT_TOKEN.encode()), found.get(WORKER_TOKEN.encode())


def _inside_exec(pid: int) -> bool:
    """Whether ``pid`` is between an ``execve``'s point of no return and the setting up of
    its new stack. The kernel closes the close-on-exec descriptors first (a ``Popen`` returns
    then, and a loaded node may not run the child again for milliseconds); until the stack
    is set up, the new address space shows neither arguments nor environment. A kernel
    thread or a zombie has no address space; a process run with an empty environment still
    shows its arguments."""
    statm = _read(f"/proc/{pid}/statm")
    return bool(statm) and not statm.startswith(b"0 ") and _read(f"/proc/{pid}/cmdline") == b""


def _read(path: str) -> bytes | None:
    """What a /proc file holds, read with plain system calls (no buffered file object); None
    where it is gone or we may not read it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_all(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _prctl(option: int, arg: int | ctypes.c_int) -> bool:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return False
    return prctl(option, arg, 0, 0, 0) == 0


def _lists_children() -> bool:
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans; whether it now is.

    Only a worker process should: it reaps the zombies it adopts (:meth:`Lineage.sweep`),
    and a process that waits for children of its own elsewhere would have them reaped.
    """
    return _lists_children() and _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def adopting() -> bool:
    """Whether this process adopts its descendants' orphans, and the kernel lists its
    children."""
    flag = ctypes.c_int(0)
    return (
        _lists_children()
        and _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag))
        and bool(flag.value)
    )


def _children() -> set[int]:
    """This process's children, whichever of its threads they hang from, but its sentinels
    (no attempt's: a sweep need not read them)."""
    found: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        listed = _read(f"/proc/self/task/{tid}/children") or b""  # or the thread ended
        found.update(int(pid) for pid in listed.split())  # ours never fork
    return found - _sentinels


def _read_all(fd: int) -> bytes:
    """What a /proc file holds, read with plain system calls (no buffered file object)."""
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _reap(pid: int) -> bool:
    """Reap our child ``pid`` if it has ended; whether it had (one still running is left be)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


class Lineage:
    """The attempt and worker tokens of the processes on this node, read once per process.

    Remembered by pid; a pid seen again with another start time (the monitor's table knows
    it) is read again, and a process is read again just before it is killed, so a reused pid
    is never killed for the process it once was.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int | None, str | None, str | None]] = {}
        self.adopting = adopting()
        """This process adopts its tasks' orphans: a sweep looks at its children first."""

    def look(self, started: dict[int, int]) -> None:
        """Learn the tokens of the processes ``{pid: start time}`` (every process on the node)
        not seen before, and forget those gone."""
        for pid in self._seen.keys() - started.keys():
            del self._seen[pid]
        for pid, start in started.items():
            known = self._seen.get(pid)
            if known is None or known[0] not in (None, start):
                self._seen[pid] = (start, *_environ_tokens(pid))
            elif known[0] is None:
                self._seen[pid] = (start, *known[1:])

    def scan(self) -> None:
        """Read every process on the node now, those seen before too (their pids may have
        been reused meanwhile)."""
        pids = (int(name) for name in os.listdir("/proc") if name.isdigit())
        self._seen = {pid: (None, *_environ_tokens(pid)) for pid in pids}

    def of_attempt(self, token: str) -> list[int]:
        return [pid for pid, (_, attempt, _) in self._seen.items() if attempt == token]

    def of_worker(self, token: str) -> list[int]:
        return [pid for pid, (_, _, worker) in self._seen.items() if worker == token]

    def terminate(
        self, token: str, *, worker: bool = False, leaders: set[int] | None = None
    ) -> list[int]:
        """SIGTERM every process carrying the attempt (or worker) ``token``, a warning before
        the :meth:`sweep`: the pids signalled. ``leaders`` as for :meth:`sweep`: where we adopt
        orphans, ``/proc`` is listed only if a child of ours carries the attempt's token."""
        if self.adopting and leaders is not None and not self._left_below(token, leaders):
            return []
        self.scan()
        signalled = []
        for pid in self.of_worker(token) if worker else self.of_attempt(token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
        return signalled

    def sweep(self, token: str, *, worker: bool = False, leaders: set[int] | None = None) -> int:
        """Kill every process carrying the attempt (or worker) ``token``; how many were killed.

        ``leaders``: the leaders of the attempts still running (our children, never
        leftovers), once the attempt's own leader is reaped: then, where we adopt orphans,
        a look at our children can tell that nothing is left. None: list ``/proc``.
        """
        which = 1 if worker else 0
        if self.adopting and leaders is not None and not self._left_below(token, leaders):
            return 0
        killed: set[int] = set()
        for _ in range(_SWEEPS):
            self.scan()
            found = self.of_worker(token) if worker else self.of_attempt(token)
            fresh = [pid for pid in found if pid not in killed]
            if not found:
                break
            for pid in fresh:
                if _environ_tokens(pid)[which] != token:  # its pid was reused meanwhile
                    self._seen.pop(pid, None)
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            for pid in found:  # read again next round: dead by then, or a fork not yet seen
                self._seen.pop(pid, None)
            _until_dead(found)
        if self.adopting:
            for pid in killed:  # those we adopted are our zombies now
                _reap(pid)
        return len(killed)

    def _left_below(self, token: str, leaders: set[int]) -> bool:
        """Whether a child of ours, other than ``leaders``, carries the attempt ``token``: each
        process an attempt left is one, or below one, as we adopt orphans. Reaps the zombies
        it finds (adopted orphans that ended by themselves)."""
        for pid in _children() - leaders:
            if not _reap(pid) and _environ_tokens(pid)[0] == token:
                return True
        return False


def _until_dead(pids: Iterable[int], within_ms: int = 500) -> None:
    """Wait (briefly) until ``pids`` have exited: a SIGKILL takes effect when the process next
    runs, and a sweep must not take a dying process for one still to kill."""
    poller = select.poll()
    fds = []
    for pid in pids:
        with contextlib.suppress(OSError):  # gone already, or a kernel without pidfds
            fds.append(os.pidfd_open(pid))
            poller.register(fds[-1], select.POLLIN)
    try:
        waiting = len(fds)
        while waiting and (ready := poller.poll(within_ms)):
            for fd, _ in ready:
                poller.unregister(fd)
            waiting -= len(ready)
    finally:
        for fd in fds:
            os.close(fd)


class Sentinel:
    """Kills the worker's processes once the worker is gone, however it went, then calls
    ``leftovers`` (if given: it removes what the worker left on the node's scratch).

    Start it before the worker runs anything (it forks: no threads may run yet). It holds
    the read end of a pipe whose write end only the worker has; when the worker ends the
    kernel closes that end and the sentinel wakes, sweeps, and exits.
    """

    def __init__(self, worker_token: str, leftovers: Callable[[], object] | None = None) -> None:
        self.worker_token = worker_token
        read, self._write = os.pipe()  # neither end is inherited by the worker's tasks
        pid = os.fork()
        if pid == 0:  # the sentinel
            os.close(self._write)
            _watch(read, worker_token, leftovers)
        os.close(read)
        self.pid = pid
        _sentinels.add(pid)

    def close(self) -> None:
        """The worker ends normally: the sentinel sweeps (finding nothing, if all is well)."""
        with contextlib.suppress(OSError):
            os.close(self._write)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        _sentinels.discard(self.pid)


def _watch(pipe: int, worker_token: str, leftovers: Callable[[], object] | None) -> None:
    """The sentinel's life: wait for the worker's end; SIGTERM what its tasks left, wait the
    grace, sweep; remove what a worker killed outright left on the node's scratch (its
    attempts' sandboxes: ``leftovers``); exit without cleanup."""
    try:
        os.setsid()  # not in the worker's group: a kill of that group must not stop the sweep
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while os.read(pipe, 1):
            pass
        lineage = Lineage()
        _until_dead(lineage.terminate(worker_token, worker=True), within_ms=SENTINEL_GRACE_MS)
        lineage.sweep(worker_token, worker=True)
        if leftovers is not None:
            leftovers()
    finally:
        os._exit(0)
