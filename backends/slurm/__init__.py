"""Pilots as batch jobs of a real Slurm (``--backend slurm``), through its commands
(:mod:`backends.slurm.backend`: sbatch, squeue, scontrol, scancel, sinfo; their output read
by :mod:`backends.slurm.jobs`, pilots' batch scripts written by :mod:`backends.slurm.script`);
workers connect to the run's manager from the compute nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from backends.options import RemoteOptions, RunSite, Workers, option
from backends.slurm.backend import SlurmBackend, SlurmError

__all__ = ["SlurmBackend", "SlurmError", "SlurmOptions", "open"]


@dataclass(frozen=True, kw_only=True)
class SlurmOptions(RemoteOptions):
    """Pilots as Slurm batch jobs, workers connecting to this process from the compute nodes."""

    name: ClassVar[str] = "slurm"
    workers: ClassVar[Workers] = Workers.CLUSTER

    sbatch_options: tuple[str, ...] = option(
        (),
        "Slurm: an option added to every pilot's sbatch (repeatable), "
        "e.g. --sbatch-option=--account=proj.",
        flag="--sbatch-option",
    )
    """Added to every pilot's sbatch command line (``--account=proj``, ``--constraint=x``)."""
    poll_interval_s: float = 2.0
    """Seconds between two ``squeue`` readings of the run's jobs."""


def open(options: SlurmOptions, run: RunSite) -> SlurmBackend:
    """Slurm pilots for ``run``, each starting its launch once per node."""
    if run.launch is None:
        raise ValueError("Slurm pilots need a worker launch")
    return SlurmBackend(
        run.launch,
        run.run_dir,
        sbatch_options=options.sbatch_options,
        poll_interval_s=options.poll_interval_s,
    )
