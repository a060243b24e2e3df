"""Pilots as processes on this machine (``--backend local``): no queue, immediate start,
workers that connect to the run's manager as a cluster's do (:mod:`backends.local.backend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from backends.local.backend import LocalBackend
from backends.options import RemoteOptions, RunSite, Workers, option

__all__ = ["LocalBackend", "LocalOptions", "open"]


@dataclass(frozen=True, kw_only=True)
class LocalOptions(RemoteOptions):
    """Pilots as processes on this machine, workers connecting to this process."""

    name: ClassVar[str] = "local"
    workers: ClassVar[Workers] = Workers.THIS_HOST

    oversubscribe: bool = option(
        False,
        "Local: let a pilot ask for more cores than this machine has (each of its workers, "
        "`nodes`, still runs tasks on at most the machine's cores).",
    )


def open(options: LocalOptions, run: RunSite) -> LocalBackend:
    """Local pilots for ``run``, whose workers its launch starts."""
    if run.launch is None:
        raise ValueError("local pilots need a worker launch")
    return LocalBackend(run.launch, run.run_dir, oversubscribe=options.oversubscribe)
