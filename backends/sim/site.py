"""The site policies a queue log was scheduled under, read from the log alone.

A log's recorded waits came from its site's scheduler, not from its jobs'
shapes alone. Four policies are read from the SWF file (header and the recorded
schedule: start = submit + wait, end = start + run), with no per-log constant:

- **node granularity**: where the machine gave jobs whole nodes, a job holds
  ``ceil(procs / node_procs)`` nodes. The header gives the node size
  (``MaxProcs / MaxNodes``); the recorded schedule says whether allocation was
  node-exclusive: counted in whole nodes, its jobs must never have needed more
  nodes at once than the machine had (beyond what the processor count itself
  overshoots, where the log's times overlap);
- **per-user limits**: the most jobs and processors any user ever had running
  at once, applied as Slurm's ``MaxJobsPerUser`` and ``MaxTRESPerUser=cpu``;
- **fair share**: Slurm's multifactor priority (age, fair share with a
  half-life decay, job size) with the weights of the configuration example of
  Slurm's documentation, every user an equal share (Fair Tree ranking);
- **withdrawn jobs**: jobs the log records as cancelled (status 5) that never
  ran still queued until their recorded cancellation (submit + wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from backends.sim.swf import RecordedSchedule, SwfTrace

DAY = 86400.0
CANCELLED = 5  # SWF status of a cancelled job


class QueueModel(StrEnum):
    """How the simulated queue treats a replayed log."""

    EASY = "easy"
    """FIFO priority and EASY backfill over the log's jobs as recorded; nothing else."""
    SITE = "site"
    """FIFO priority and EASY backfill under the log's node granularity, per-user limits and
    withdrawn jobs."""
    FAIR_SHARE = "fair-share"
    """``site`` with Slurm's multifactor fair-share priority instead of FIFO."""


@dataclass(frozen=True)
class UserLimits:
    """Running jobs and cores one user may hold at once (Slurm's MaxJobsPerUser, MaxTRESPerUser)."""

    jobs: int
    cores: int


@dataclass(frozen=True)
class FairShare:
    """Slurm's multifactor priority: weights and periods from its documented example.

    priority = age_weight * min(age / max_age, 1) + fairshare_weight * F + size_weight
    * cores / total cores, F from Fair Tree's ranking of users by usage decayed with
    ``half_life``; priorities are recomputed every ``calc_period`` seconds.
    """

    age_weight: float = 1000.0
    fairshare_weight: float = 10000.0
    size_weight: float = 1000.0
    max_age: float = 14 * DAY
    half_life: float = 14 * DAY
    calc_period: float = 300.0


@dataclass(frozen=True)
class SitePolicy:
    """The policies a replay applies; the default applies none (the EASY model)."""

    node_procs: int = 1
    """Processors of a node where the machine allocated whole nodes; 1 where it did not."""
    limits: UserLimits | None = None
    fair_share: FairShare | None = None
    withdraw_cancelled: bool = False

    @classmethod
    def of(cls, model: QueueModel | str, trace: SwfTrace) -> SitePolicy:
        """The policy of ``model`` for ``trace``."""
        model = QueueModel(model)
        if model is QueueModel.EASY:
            return NO_POLICY
        return cls.read(trace, fair_share=model is QueueModel.FAIR_SHARE)

    @classmethod
    def read(
        cls,
        trace: SwfTrace,
        *,
        granularity: bool = True,
        limits: bool = True,
        fair_share: bool = True,
        cancelled: bool = True,
    ) -> SitePolicy:
        """Every policy the log shows (or those asked for): see the module's docstring."""
        node_procs = node_exclusive_procs(trace) if granularity else 1
        known_users = np.unique(trace.jobs["user"][trace.jobs["user"] >= 0]).size
        return cls(
            node_procs=node_procs,
            limits=user_limits(trace, node_procs) if limits else None,
            fair_share=FairShare() if fair_share and known_users > 1 else None,
            withdraw_cancelled=cancelled and bool(cancelled_before_start(trace).any()),
        )

    def footprint(self, procs: np.ndarray) -> np.ndarray:
        """Processors a job of ``procs`` held: whole nodes where allocation was exclusive."""
        g = self.node_procs
        return procs if g == 1 else -(-procs // g) * g

    def withdraws(self, trace: SwfTrace) -> np.ndarray:
        """The jobs of ``trace`` this policy withdraws at their recorded cancellation."""
        if not self.withdraw_cancelled:
            return np.zeros(len(trace), bool)
        return cancelled_before_start(trace)


NO_POLICY = SitePolicy()
"""The EASY model's: jobs as recorded, no limits, FIFO priority."""


def node_exclusive_procs(trace: SwfTrace) -> int:
    """Processors per node if the machine allocated whole nodes, else 1."""
    nodes, procs = trace.header.max_nodes, trace.header.max_procs
    if not nodes or not procs or procs // nodes <= 1:
        return 1
    per_node = procs // nodes
    schedule = RecordedSchedule.of(trace)
    if not len(schedule):
        return 1  # no recorded schedule to tell: jobs keep their processor counts
    busy_procs = schedule.peak(schedule.procs)
    busy_nodes = schedule.peak(-(-schedule.procs // per_node))
    return per_node if busy_nodes <= max(nodes, -(-busy_procs // per_node)) else 1


def user_limits(trace: SwfTrace, node_procs: int = 1) -> UserLimits | None:
    """The most jobs and processors (footprints) one user ever had running at once."""
    schedule = RecordedSchedule.of(trace)
    if not (schedule.user >= 0).any():
        return None
    footprint = SitePolicy(node_procs=node_procs).footprint(schedule.procs)
    jobs = schedule.peak(np.ones(len(schedule), np.int64), by_user=True)
    return UserLimits(jobs=max(jobs, 1), cores=max(schedule.peak(footprint, by_user=True), 1))


def cancelled_before_start(trace: SwfTrace) -> np.ndarray:
    """Jobs cancelled before they ran whose cancellation time is known (submit + wait)."""
    jobs = trace.jobs
    return (jobs["status"] == CANCELLED) & (jobs["run"] <= 0) & (jobs["wait"] >= 0)
