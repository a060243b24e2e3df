"""Pilots on a real Slurm, through sbatch, squeue, scontrol and scancel.

Every command runs as an asyncio subprocess with a time limit. A controller that is busy or
down ("Socket timed out", "Unable to contact slurm controller", a command that does not
answer in time) is waited out with exponential backoff for a bounded time. A submission
whose answer was lost is looked for by its job name and comment before sbatch runs again,
so a pilot is never submitted twice.

States come from one ``squeue --json`` per poll for all tracked jobs, falling back to
``scontrol show job -o`` for a job squeue does not list; every change is pushed to
:meth:`SlurmBackend.updates`.

pyslurm is not used: PyPI's builds need the newest Slurm's headers while clusters (and
Debian 12, with 22.05) run older ones, and the commands' output is what stays stable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from backends import clock
from backends.base import (
    BackendError,
    JobInfo,
    JobState,
    PilotRequest,
    SubmitError,
    WorkerLaunch,
)
from backends.slurm.jobs import (
    JobRecord,
    Seen,
    SlurmOutputError,
    SlurmReportedError,
    parse_scontrol,
    parse_sinfo_nodes,
    parse_squeue_json,
    parse_test_only,
)
from backends.slurm.script import batch_script, rejection, sbatch_arguments
from learners.resources import Resources

T = TypeVar("T")
log = logging.getLogger(__name__)

# Messages of a controller that is down, restarting or overloaded, or of munge trouble.
_TRANSIENT = re.compile(
    r"socket timed out|unable to contact slurm controller|controller not responding"
    r"|connection refused|connection timed out|communication connection failure"
    r"|zero bytes were transmitted|resource temporarily unavailable|munge"
    r"|protocol authentication error|slurmctld.*busy|try again later",
    re.IGNORECASE,
)
# How far a lost submission's SubmitTime may precede our first sbatch (clock skew between
# this host and the controller's).
_CLOCK_SLACK_S = 120.0


class SlurmError(BackendError):
    """A Slurm command failed; the message is Slurm's own."""

    system = "Slurm"


class SlurmUnavailable(SlurmError):
    """The controller did not answer within the retry budget (or the commands are missing)."""


class _Transient(SlurmError):
    """A failure worth retrying: the controller may answer later."""


class _CommandFailed(SlurmError):
    """A command refused what it was asked (a rejection, an unknown job id, ...)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The command's exit status."""


ALREADY_DONE_STATUS = 2021 % 256
"""scancel's exit status for Slurm's ESLURM_ALREADY_DONE (2021, "Job/step already completing
or completed"), which it may give without a word, as to a signal for a job that has just
ended (seen on Slurm 22.05: ``scancel --signal=TERM`` exited 229, stderr empty)."""


@dataclass(frozen=True, slots=True)
class SlurmCommands:
    """The Slurm commands, and how long one may take before its answer counts as lost."""

    sbatch: str = "sbatch"
    squeue: str = "squeue"
    scontrol: str = "scontrol"
    scancel: str = "scancel"
    sinfo: str = "sinfo"
    timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retries of transient failures: delays double from ``first_s`` up to ``max_s``; no
    new attempt starts more than ``give_up_s`` after the first."""

    first_s: float = 1.0
    max_s: float = 15.0
    give_up_s: float = 300.0


@dataclass(slots=True)
class _Release:
    first: float
    last: float


class SlurmBackend:
    """Pilots as Slurm batch jobs, each starting ``launch`` once per allocated node.

    ``run_dir`` receives the jobs' output files (``<name>-<jobid>.out``); ``sbatch_options``
    are added to every submission. A running
    pilot that is released gets SIGTERM again every ``release_resend_s`` (a signal sent
    before its job step exists is lost) and is cancelled after ``release_timeout_s``. The
    signals go in the background: one for a job with a node that no longer answers kept
    scancel a minute and more (Slurm 22.05), which held up polling and the run.
    """

    name = "slurm"
    simulated = False
    queued = True
    true_wait = None
    node_count = None

    def __init__(
        self,
        launch: WorkerLaunch,
        run_dir: str | Path,
        *,
        sbatch_options: Sequence[str] = (),
        poll_interval_s: float = 2.0,
        release_resend_s: float = 10.0,
        release_timeout_s: float = 300.0,
        backoff: Backoff | None = None,
        commands: SlurmCommands | None = None,
    ) -> None:
        if not launch.argv:
            raise ValueError("the worker's command is empty: a pilot must start some worker")
        self.launch = launch
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.sbatch_options = tuple(sbatch_options)
        self.poll_interval_s = poll_interval_s
        self.release_resend_s = release_resend_s
        self.release_timeout_s = release_timeout_s
        self.backoff = backoff or Backoff()
        self.commands = commands or SlurmCommands()
        self._uid = os.getuid()
        self._known: set[str] = set()
        self._active: dict[str, None] = {}  # an ordered set: updates come in submission order
        self._records: dict[str, JobRecord] = {}
        self._seen: dict[str, Seen] = {}
        """What we saw of each job ourselves, which bounds Slurm's whole-second times."""
        self._releases: dict[str, _Release] = {}
        self._signals: dict[str, asyncio.Task[None]] = {}
        """The release signal under way, by job: one at a time a job."""
        self._cancelled: set[str] = set()
        """Jobs we cancelled (once running): COMPLETING, they have ended cancelled."""
        self._submitting: set[tuple[str, str]] = set()
        self._cut_short: list[tuple[str, str]] = []
        """Submissions interrupted (the run stopped): their job may be queued, its id unknown."""
        self._updates: asyncio.Queue[JobInfo | None] = asyncio.Queue()
        self._poller: asyncio.Task[None] | None = None

    # -- the protocol ------------------------------------------------------------------

    async def submit(self, request: PilotRequest) -> str:
        args, script = self._job(request)
        key = (request.name, request.comment)
        if key in self._submitting:
            raise SubmitError(f"pilot {request.name!r} is being submitted already", "--job-name")
        self._submitting.add(key)
        asked = clock.epoch_now()
        try:
            job_id = await self._submit(request, args, script)
        except asyncio.CancelledError:
            self._cut_short.append(key)
            raise
        finally:
            self._submitting.discard(key)
        self._seen[job_id] = Seen(submitted=asked)
        self._track(job_id)
        return job_id

    async def check(self, request: PilotRequest) -> None:
        """Slurm's own verdict on ``request`` (``sbatch --test-only``): nothing is queued."""
        args, script = self._job(request)
        await self._retrying(
            f"check {request.name}", lambda: self._sbatch(args, script, "--test-only")
        )

    async def expected_wait(
        self, request: PilotRequest, instead_of: str | None = None
    ) -> float | None:
        """The start Slurm foresees (``sbatch --test-only``), as a wait from now: one try, and
        None if Slurm refuses, fails or tells no start.

        Slurm's foresight places a new job after every pending job of higher priority, as if
        each started now, even one that cannot start and that backfill would let it pass; so
        the job ``instead_of`` is held (``scontrol hold``) while Slurm is asked, and released
        at once after (retried until Slurm takes it)."""
        args, script = self._job(replace(request, dependency=None))
        held = instead_of if instead_of is not None and await self._hold(instead_of) else None
        try:
            told = await self._run(
                self.commands.sbatch, "--test-only", *args, stdin=script, stderr=True
            )
        except SlurmError as e:
            log.info("no expected start of %s: %s", request.name, e)
            return None
        finally:
            if held is not None:
                await self._unhold(held)
        start = parse_test_only(told)
        return None if start is None else max(0.0, start - clock.wall())

    async def _hold(self, job_id: str) -> bool:
        """Hold pending job ``job_id``; whether it is held (not if it started or ended)."""
        try:
            await self._run(self.commands.scontrol, "hold", job_id)
        except SlurmError as e:
            log.info("job %s not held: %s", job_id, e)
            return False
        return True

    async def _unhold(self, job_id: str) -> None:
        try:
            await self._retrying(
                f"release the hold on job {job_id}",
                lambda: self._run(self.commands.scontrol, "release", job_id),
            )
        except _CommandFailed as e:  # it ended meanwhile (cancelled): nothing is held
            log.warning("job %s: its hold not released: %s", job_id, e)

    async def cancel(self, job_id: str) -> None:
        await self._retrying(f"cancel job {job_id}", lambda: self._scancel(job_id))

    async def release(self, job_id: str) -> None:
        record = await self._current(job_id)
        if record.state is JobState.PENDING:
            await self._retrying(
                f"cancel pending job {job_id}", lambda: self._scancel(job_id, "--state=PENDING")
            )
            record = await self._current(job_id)  # it may have started meanwhile
        if record.state.finished:
            return
        now = clock.now()
        self._releases[job_id] = _Release(first=now, last=now)
        self._track(job_id)
        self._send_signal(job_id)

    async def info(self, job_id: str) -> JobInfo:
        return (await self._current(job_id)).info()

    async def updates(self) -> AsyncIterator[JobInfo]:
        while (info := await self._updates.get()) is not None:
            yield info

    async def close(self) -> None:
        """Stop following jobs; cancel the job an interrupted submission may have queued
        (sbatch killed before it told the id), which would otherwise start with no manager."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        sending = list(self._signals.values())
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)
        for name, comment in self._cut_short:
            try:
                for job_id in await self.find(name, comment):
                    if job_id not in self._known:
                        log.warning("cancelling job %s: its submission was interrupted", job_id)
                        await self._scancel(job_id)
            except SlurmError as e:
                log.warning("job %s may be left queued: %s", name, e)
        self._updates.put_nowait(None)

    async def cluster_name(self) -> str:
        """``slurm:<ClusterName>`` from ``scontrol show config``."""

        async def ask() -> str:
            out = await self._run(self.commands.scontrol, "show", "config")
            found = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
            return f"slurm:{found.group(1) if found else 'unnamed'}"

        return await self._retrying("read the cluster's name", ask)

    async def reattach(
        self, request: PilotRequest, job_id: str | None, submitted: float
    ) -> str | None:
        """Follow a pilot an earlier manager submitted: by its id, or, if the manager died
        before storing it, by the pilot's job name and comment, waiting until an sbatch it
        left running would have answered. None: Slurm does not have it."""
        while job_id is None:
            found = await self.find(request.name, request.comment)
            if found:
                job_id = found[0]
            elif clock.epoch_now() - submitted > 2 * self.commands.timeout_s:
                return None
            else:
                await clock.sleep(self.poll_interval_s)
        self._seen[job_id] = Seen(submitted=submitted)
        with contextlib.suppress(LookupError):
            record = await self._current(job_id)
            if record.state is JobState.PENDING and "Held" in record.reason:
                # Held while a manager asked Slurm about its replacement (expected_wait) and
                # died before releasing it: nothing else holds a pilot.
                log.warning("pilot job %s was held (%s): released", job_id, record.reason)
                await self._unhold(job_id)
        self._track(job_id)
        return job_id

    # -- beyond the protocol: re-attaching after a restart -------------------------------

    def _track(self, job_id: str) -> None:
        """Report this job's changes in :meth:`updates` (a pilot submitted, or a live one
        taken over by a resumed run)."""
        self._known.add(job_id)
        if job_id in self._records and self._records[job_id].state.finished:
            return
        self._active[job_id] = None
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def find(self, name: str, comment: str = "") -> list[str]:
        """Ids of this user's jobs named ``name`` with ``comment`` that slurmctld still knows,
        oldest first: finds a pilot submitted by a manager that died before storing its id."""
        records = await self._retrying("list jobs", self._squeue)
        return [r.job_id for r in self._matching(records, name, comment)]

    async def largest_node(self, partitions: set[str | None]) -> Resources | None:
        """The largest node of ``partitions`` (None: the default partition), by sinfo; its
        disk 0 where sinfo does not know it (no ``TmpDisk`` configured, as at many sites)."""

        async def ask() -> Resources | None:
            out = await self._run(self.commands.sinfo, "-h", "-o", "%P %c %m %d")
            size = parse_sinfo_nodes(out, partitions)
            if size is None:
                return None
            return Resources(size.cpus, float(size.memory_mb), float(size.tmp_disk_mb))

        return await self._retrying("list partitions", ask)

    # -- submission ----------------------------------------------------------------------

    async def _submit(self, request: PilotRequest, args: list[str], script: str) -> str:
        since = clock.epoch_now() - _CLOCK_SLACK_S
        answer_lost = False

        async def attempt() -> str:
            nonlocal answer_lost
            if answer_lost:
                found = await self._find_lost(request, since)
                if found is not None:
                    return found
            answer_lost = True
            return _parsable_job_id(await self._sbatch(args, script))

        return await self._retrying(f"submit {request.name}", attempt)

    async def _find_lost(self, request: PilotRequest, since: float) -> str | None:
        """The job a lost sbatch answer submitted, if it did; duplicates are cancelled."""
        matches = [
            r
            for r in self._matching(await self._squeue(), request.name, request.comment)
            if r.job_id not in self._known and (r.submit_time or 0) >= since
        ]
        if not matches:
            return None
        kept, *extra = matches
        log.warning("sbatch's answer for %s was lost; found job %s", request.name, kept.job_id)
        for duplicate in extra:
            log.warning("cancelling duplicate job %s of %s", duplicate.job_id, request.name)
            await self._scancel(duplicate.job_id)
        return kept.job_id

    def _matching(
        self, records: Mapping[str, JobRecord], name: str, comment: str
    ) -> list[JobRecord]:
        found = [
            r
            for r in records.values()
            if r.name == name and r.comment == comment and r.user_id == self._uid
        ]
        return sorted(found, key=lambda r: int(r.job_id))

    # -- tracking ------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        failing = False
        while self._active:
            try:
                await self._poll()
            except (SlurmError, SlurmOutputError) as e:
                if not failing:
                    interval = self.poll_interval_s
                    log.warning("polling Slurm failed (retrying every %g s): %s", interval, e)
                failing = True
            except Exception:
                log.exception("polling Slurm failed unexpectedly; polling goes on")
            else:
                if failing:
                    log.info("polling Slurm works again")
                failing = False
            await clock.sleep(self.poll_interval_s)
        self._poller = None

    async def _poll(self) -> None:
        at = clock.epoch_now()
        records = await self._squeue()
        for job_id in list(self._active):
            record = records.get(job_id) or await self._scontrol(job_id)
            if record is None:
                last = self._records.get(job_id, JobRecord(job_id, JobState.PENDING))
                record = last.vanished()
            self._observe(record, at)
        await self._follow_releases()

    def _observe(self, record: JobRecord, at: float) -> JobRecord:
        """Take in ``record``, from a query begun at Unix time ``at``: bounded by what we saw."""
        if record.completing and record.job_id in self._cancelled:
            record = record.cancelled()
        if (seen := self._seen.get(record.job_id)) is not None:
            seen.saw(record.state, at)
        record = record.bounded(seen)
        if record.job_id not in self._active or self._records.get(record.job_id) == record:
            return record
        self._records[record.job_id] = record
        self._updates.put_nowait(record.info())
        if record.state.finished:
            self._active.pop(record.job_id, None)
            self._releases.pop(record.job_id, None)
        return record

    async def _follow_releases(self) -> None:
        now = clock.now()
        for job_id, release in list(self._releases.items()):
            record = self._records.get(job_id)
            if record is None or record.state is not JobState.RUNNING:
                continue
            if now - release.first >= self.release_timeout_s:
                log.warning(
                    "job %s ignored its release for %.0f s: cancelling it",
                    job_id,
                    now - release.first,
                )
                await self._scancel(job_id)
                del self._releases[job_id]
            elif now - release.last >= self.release_resend_s:
                self._send_signal(job_id)
                release.last = now

    def _send_signal(self, job_id: str) -> None:
        """SIGTERM to a released job's workers, in the background, unless one is under way."""
        if job_id in self._signals:
            return
        sending = asyncio.create_task(self._release_signal(job_id))
        self._signals[job_id] = sending
        sending.add_done_callback(lambda _: self._signals.pop(job_id, None))

    async def _release_signal(self, job_id: str) -> None:
        try:
            await self._retrying(f"release job {job_id}", lambda: self._signal(job_id))
        except SlurmError as e:
            log.warning("release of job %s: %s (sent again in %g s)", job_id, e,
                        self.release_resend_s)  # fmt: skip

    async def _current(self, job_id: str) -> JobRecord:
        async def lookup() -> JobRecord | None:
            return (await self._squeue()).get(job_id) or await self._scontrol(job_id)

        at = clock.epoch_now()
        record = await self._retrying(f"state of job {job_id}", lookup)
        if record is None:
            raise LookupError(f"Slurm knows no job {job_id}")
        return self._observe(record, at)

    # -- the commands ----------------------------------------------------------------------

    def _job(self, request: PilotRequest) -> tuple[list[str], str]:
        """sbatch's arguments and the batch script of ``request``'s pilot."""
        args = sbatch_arguments(request, self.run_dir, self.sbatch_options)
        return args, batch_script(request.name, self.launch.argv, self.launch.env, self.run_dir)

    async def _sbatch(self, args: list[str], script: str, *flags: str) -> str:
        """Run sbatch; a refusal becomes a :class:`SubmitError` naming the option."""
        try:
            return await self._run(self.commands.sbatch, *flags, *args, stdin=script)
        except _CommandFailed as e:
            raise rejection(str(e), args) from None

    async def _squeue(self) -> dict[str, JobRecord]:
        out = await self._run(self.commands.squeue, "--json")
        try:
            return parse_squeue_json(out)
        except SlurmReportedError as e:
            raise _Transient(str(e)) from None

    async def _scontrol(self, job_id: str) -> JobRecord | None:
        try:
            out = await self._run(self.commands.scontrol, "show", "job", "-o", job_id)
        except _CommandFailed as e:
            if "invalid job id" in str(e).lower():
                return None
            raise
        return parse_scontrol(out.strip().splitlines()[0])

    async def _scancel(self, job_id: str, *options: str) -> None:
        """scancel ``options`` ``job_id``; with no options (a kill), the job counts as
        cancelled from then on (see :meth:`_observe`)."""
        try:
            await self._run(self.commands.scancel, *options, job_id)
        except _CommandFailed as e:
            message = str(e).lower()
            if "invalid job id" in message:
                raise LookupError(f"Slurm knows no job {job_id}") from None
            done = "already completing or completed" in message
            if not done and e.status != ALREADY_DONE_STATUS:
                raise
            return
        if not options:
            self._cancelled.add(job_id)

    async def _signal(self, job_id: str) -> None:
        """SIGTERM to a running job's workers. Slurm answers "Invalid job id" to a signal for
        a job that is completing or has ended (a plain scancel it accepts): there is nothing
        left to signal, and the poller reports how the job ended."""
        # Without --full/--batch the signal reaches the job's steps (the workers), not the
        # batch shell; and srun would turn a SIGTERM of its own into a SIGKILL of its tasks.
        with contextlib.suppress(LookupError):
            await self._scancel(job_id, "--signal=TERM")

    async def _run(
        self, program: str, *args: str, stdin: str | None = None, stderr: bool = False
    ) -> str:
        """Run one command: its stdout (and then its stderr, with ``stderr``), or
        :class:`_Transient` or :class:`_CommandFailed`."""
        what = shlex.join([program, *args[:3]])
        try:
            proc = await asyncio.create_subprocess_exec(
                program,
                *args,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise SlurmUnavailable(f"cannot run {program}: {e}") from None
        try:
            async with asyncio.timeout(self.commands.timeout_s):  # wait_for can swallow Ctrl-C
                out, err = await proc.communicate(None if stdin is None else stdin.encode())
        except TimeoutError:
            limit = self.commands.timeout_s
            raise _Transient(f"{what} did not answer within {limit:g} s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        message = err.decode(errors="replace").strip()
        if proc.returncode == 0:
            return out.decode() + (message if stderr else "")
        if proc.returncode < 0 or _TRANSIENT.search(message):
            raise _Transient(message or f"{what} was killed by signal {-proc.returncode}")
        raise _CommandFailed(
            message or f"{what} exited with status {proc.returncode}", proc.returncode
        )

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = self.backoff.first_s
        give_up = clock.now() + self.backoff.give_up_s
        while True:
            try:
                return await attempt()
            except _Transient as e:
                if clock.now() + delay > give_up:
                    raise SlurmUnavailable(
                        f"{what}: Slurm did not answer for {self.backoff.give_up_s:g} s: {e}"
                    ) from None
                log.warning("%s: %s (retrying in %g s)", what, e, delay)
                await clock.sleep(delay)
                delay = min(2 * delay, self.backoff.max_s)


def _parsable_job_id(out: str) -> str:
    """The id in ``sbatch --parsable`` output (``<id>`` or ``<id>;<cluster>``)."""
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmOutputError(f"sbatch --parsable printed {out.strip()!r}, not a job id")
    return job_id
