"""Every write of a run to the store, named by what happened.

The run's state queues its changes here as they happen (:meth:`Recorder.stage`,
:meth:`Recorder.attempt_started` ...); the engine writes the queue in one
transaction before it acts on what the changes decided (:meth:`Recorder.write_ahead`),
so a manager that dies leaves a record of every pilot submitted and attempt placed.
Times are the run's (seconds since it started).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from backends import clock
from backends.base import Dependency, JobInfo, JobState, PilotRequest
from orchestrator.agent.attempt import AttemptResult, AttemptSpec
from orchestrator.runs import STOPPED, OnWorker
from orchestrator.store import Store
from orchestrator.workerqueue import Key

if TYPE_CHECKING:
    from orchestrator.runstate import PilotRun, StageRun, TaskRun

GROUP_COMMIT_S = 0.05
"""At most this much of a simulated run's bookkeeping waits to be written."""


class Recorder:
    """The store's side of one run, ``run_id``."""

    def __init__(self, store: Store, run_id: str, *, simulated: bool) -> None:
        self.store = store
        self.run_id = run_id
        self.simulated = simulated
        """A simulated world dies with its manager (its runs are not resumed), so its
        bookkeeping is written at most every ``GROUP_COMMIT_S`` of wall time."""
        self._commit_due = -math.inf
        self._stages: dict[str, StageRun] = {}
        """Stages changed since the last write, written as they are then: a stage's row
        changes with every task done, and is written once a write."""
        self._started: dict[Key, float] = {}
        """Attempts started since the last write, and when: written with it, unless they ended
        first (their end's row says when they started: most short attempts)."""

    # ---- writing --------------------------------------------------------------

    async def flush(self) -> None:
        """Write everything queued, now."""
        self.stage_rows()
        await self.store.flush()

    async def write_ahead(self) -> None:
        """Write what the engine is about to act on; a simulated run's writes are grouped."""
        if self.simulated:
            now = clock.monotonic()
            if now < self._commit_due:
                return
            self._commit_due = now + GROUP_COMMIT_S
        await self.flush()

    # ---- the run --------------------------------------------------------------

    def run(self, **fields: Any) -> None:
        """The run's own row: how it was started, its status, its end."""
        self.store.stage("runs", {"run_id": self.run_id}, **fields)

    async def heartbeat(self) -> None:
        """The run's manager is alive (read by ``status`` and ``resume``)."""
        await self.store.put("runs", {"run_id": self.run_id}, heartbeat=clock.wall())

    def stage(self, stage: StageRun) -> None:
        """The stage's phase, times or count of tasks done changed: its row is written with
        the next write."""
        self._stages[stage.spec.name] = stage

    def stage_rows(self) -> None:
        """Queue what waits for the write (each write does this): the rows of the stages
        changed since, and the starts of the attempts that have not ended since."""
        started, self._started = self._started, {}
        for key, t in started.items():
            self.store.stage(
                "attempts", self._attempt_key(*key), outcome=str(OnWorker.RUNNING), start_t=t
            )
        changed, self._stages = self._stages, {}
        for name, stage in changed.items():
            self.store.stage(
                "stages",
                {"run_id": self.run_id, "stage": name},
                state=str(stage.phase),
                tasks_total=len(stage.tasks),
                tasks_done=stage.done,
                ready_t=stage.ready_t,
                start_t=stage.start_t,
                end_t=stage.end_t,
            )

    # ---- pilots ---------------------------------------------------------------

    async def pilot_submitting(self, pilot: PilotRun, fit: str | None) -> None:
        """Written before the submission: a manager that dies during it leaves the pilot's
        request, by which a resume finds the job again."""
        await self.store.put(
            "pilots",
            self._pilot_key(pilot),
            stage=",".join(pilot.stages),
            state="SUBMITTING",
            request=request_json(pilot.request),
            predicted_wait=pilot.predicted_wait,
            submit_t=pilot.submit_t,
            fit=fit,
        )

    async def pilot_submitted(self, pilot: PilotRun) -> None:
        await self.store.put("pilots", self._pilot_key(pilot), job_id=pilot.job_id)

    def pilot_taken_over(self, pilot: PilotRun) -> None:
        self.store.stage("pilots", self._pilot_key(pilot), job_id=pilot.job_id)

    def pilot_gone(self, pilot: PilotRun) -> None:
        self.store.stage(
            "pilots",
            self._pilot_key(pilot),
            state=str(JobState.FAILED),
            reason="gone while the run had no manager",
        )

    def pilot_changed(self, pilot: PilotRun, info: JobInfo, t0: float) -> None:
        """``info``'s times are on the loop's clock, which read ``t0`` when the run started."""

        def rel(t: float | None) -> float | None:
            return None if t is None else t - t0

        self.store.stage(
            "pilots",
            self._pilot_key(pilot),
            state=str(info.state),
            reason=info.reason,
            eligible_t=rel(info.eligible_time),
            start_t=rel(info.start_time),
            end_t=rel(info.end_time),
        )

    def wait(self, pilot: PilotRun, wait: float, t: float) -> None:
        """A pilot's queue wait, against the wait it was planned for."""
        self.store.stage(
            "waits",
            self._pilot_key(pilot),
            geometry=f"{pilot.request.cores}c/{pilot.request.partition or '-'}",
            predicted=pilot.predicted_wait,
            observed=wait,
            hit=pilot.hit,
            t=t,
        )

    def _pilot_key(self, pilot: PilotRun) -> dict[str, str]:
        return {"run_id": self.run_id, "pilot_id": pilot.pilot_id}

    # ---- tasks ----------------------------------------------------------------

    def attempt_sent(
        self, spec: AttemptSpec, worker: str, pilot_id: str, started: float | None = None
    ) -> None:
        """Sent to ``worker``: running there since ``started`` if it starts at once, else
        waiting there until :meth:`attempt_started`."""
        on_worker: dict[str, Any] = (
            {"outcome": str(OnWorker.WAITING)}
            if started is None
            else {"outcome": str(OnWorker.RUNNING), "start_t": started}
        )
        self.store.stage(
            "attempts",
            self._attempt_key(spec.task_id, spec.attempt),
            worker=worker,
            pilot_id=pilot_id,
            allocation=spec.allocation,
            **on_worker,
        )

    def attempt_started(self, key: Key, t: float) -> None:
        """Started on its worker at ``t``, once the worker had room (written with the next
        write)."""
        self._started[key] = t

    def attempt_ended(
        self,
        spec: AttemptSpec,
        result: AttemptResult,
        why: str | None,
        heard: float,
        ran: tuple[float, float | None],
        stopped: bool = False,
    ) -> None:
        """Its result came at ``heard``; ``ran``: when it ended and started (None: when
        :meth:`attempt_started` said); ``stopped``: by the run's end (:data:`STOPPED`)."""
        key = self._attempt_key(spec.task_id, spec.attempt)
        end, start = ran
        if (started := self._started.pop(spec.key, None)) is not None and start is None:
            start = started  # as recorded, had it been written
        moments = {"end_t": end} if start is None else {"start_t": start, "end_t": end}
        self.store.stage(
            "attempts",
            key,
            **moments,
            result_t=heard,
            outcome=STOPPED if stopped else str(result.outcome),
            peak=result.peak.as_dict(),
            exit_code=result.exit_code,
            exhausted=result.exhaustion.resource if result.exhaustion else None,
            measured=result.exhaustion.measured if result.exhaustion else None,
            output_tail=result.output_tail or None,
            cause=why,
            starved=result.starved or None,
            node=result.node or None,
        )
        if (output := result.output()) is not None:
            self.store.stage("outputs", key, **output)

    def attempt_late(self, spec: AttemptSpec, result: AttemptResult) -> None:
        """The result of an attempt given up on: recorded, never counted."""
        key = self._attempt_key(spec.task_id, spec.attempt)
        self._started.pop(spec.key, None)  # its end, as the run took it, stays
        self.store.stage("attempts", key, outcome=f"late {result.outcome}")

    def task(self, task: TaskRun) -> None:
        self.store.stage(
            "tasks",
            {"run_id": self.run_id, "task_id": task.task.id},
            stage=task.task.stage,
            category=task.task.category,
            state=str(task.state),
            attempts=task.attempts,
            crashes=task.crashes,
            beside=None if task.beside is None else sorted(task.beside),
        )

    def _attempt_key(self, task_id: str, attempt: int) -> dict[str, Any]:
        return {"run_id": self.run_id, "task_id": task_id, "attempt": attempt}


def request_json(request: PilotRequest) -> dict[str, Any]:
    """A pilot's request as the store keeps it."""
    return {
        "name": request.name,
        "cores": request.cores,
        "nodes": request.nodes,
        "memory_mb": request.memory_mb,
        "time_limit_s": request.time_limit_s,
        "partition": request.partition,
        "account": request.account,
        "qos": request.qos,
        "dependency": request.dependency.to_slurm() if request.dependency else None,
        "comment": request.comment,
        "extra": list(request.extra),
    }


def request_of(saved: dict[str, Any]) -> PilotRequest:
    """A pilot's request as :func:`request_json` stored it."""
    dependency = saved["dependency"]
    return PilotRequest(
        name=saved["name"],
        cores=saved["cores"],
        nodes=saved["nodes"],
        memory_mb=saved["memory_mb"],
        time_limit_s=saved["time_limit_s"],
        partition=saved["partition"],
        account=saved["account"],
        qos=saved["qos"],
        dependency=Dependency.parse(dependency) if dependency else None,
        comment=saved["comment"],
        extra=tuple(saved["extra"]),
    )
