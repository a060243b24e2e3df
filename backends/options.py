"""A backend's side as a plugin: its options, how they appear on the command line, and what
a run hands the backend it opens.

A backend's options are a frozen dataclass of plain values (what the CLI fills and a run's
record keeps). A field made with :func:`option` is a flag of ``leadtime run``: its name,
type, default and help come from the field, so a backend's options reach the command line
with no edit of the CLI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, NewType, Protocol

from backends.base import WorkerLaunch
from workflows import quantity

Seconds = NewType("Seconds", float)
"""A duration in seconds. A field of this type is a flag that takes a duration as a workflow
file writes one (``600``, ``10m``, ``1h30m``, ``0:10:00``: :func:`duration`), its ``parse``
then checking the seconds."""


class Workers(StrEnum):
    """How a backend's workers arrive."""

    @property
    def simulated(self) -> bool:
        return self is Workers.SIMULATED

    SIMULATED = "simulated"
    """With their pilot, on virtual time: no manager, no process."""
    THIS_HOST = "this-host"
    """Processes on this machine that connect to the run's manager (by loopback by default)."""
    CLUSTER = "cluster"
    """Processes on the cluster's nodes that connect to the run's manager over the network."""


@dataclass(frozen=True, slots=True)
class RunSite:
    """Where a backend opened for a run works: the run's directory (pilot output, records)
    and how its pilots start workers (None for simulated workers)."""

    run_dir: Path
    launch: WorkerLaunch | None = None


class BackendOptions(Protocol):
    """A backend's options: its ``name`` (a ``--backend`` of the CLI), how its ``workers``
    arrive, and its fields (a dataclass's). Registered with the function that opens the
    backend (:func:`backends.registry.register`)."""

    name: ClassVar[str]
    workers: ClassVar[Workers]


@dataclass(frozen=True, slots=True)
class Flag:
    """How an option is given on the command line: ``--FIELD-NAME`` (or ``flag``) with
    ``help``; ``parse`` turns the value typed (text where the field's type is not a plain
    one) into the field's, raising ValueError that says what is wrong with it."""

    help: str
    flag: str | None = None
    parse: Callable[[Any], Any] | None = None
    metavar: str | None = None


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    parse: Callable[[Any], Any] | None = None,
    metavar: str | None = None,
) -> Any:
    """A field of a backend's options that is also a flag of the command line; in ``help``,
    ``{backends}`` stands for the backends that have the field (a field of a base class)."""
    return dataclasses.field(default=default, metadata={"flag": Flag(help, flag, parse, metavar)})


def flag_of(field: dataclasses.Field) -> Flag | None:
    """The command-line flag of ``field``, if it has one."""
    return field.metadata.get("flag")


def one_of(what: str, choices: Iterable[str]) -> Callable[[str], str]:
    """A parser that takes only ``choices``."""
    allowed = tuple(choices)

    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
        return value

    return parse


def duration(value: str) -> float:
    """Seconds from a duration as a workflow file writes one: a number of seconds, with units
    (``10m``, ``1h30m``) or in Slurm's clock forms (``0:10:00``, ``1-00:00:00``); not negative."""
    try:
        seconds = quantity.seconds(value)
    except ValueError:
        raise ValueError(
            f"expected a duration such as 600 (seconds), 10m, 1h30m or 0:10:00, got {value!r}"
        ) from None
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return seconds


def positive(value: float) -> float:
    """A parser that takes only numbers above zero."""
    if not value > 0:
        raise ValueError(f"{value:g} is not positive")
    return value


KEEP_SANDBOXES = ("never", "failure", "always")


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """The options every backend shares whose workers connect to the run's manager."""

    keep_sandboxes: str = option(
        "failure",
        "{backends}: which attempts' scratch directories ($LEADTIME_SCRATCH, with their "
        "stdout and stderr) stay after they end.",
        metavar="|".join(KEEP_SANDBOXES),
        parse=one_of("value", KEEP_SANDBOXES),
    )
    bind: str | None = option(
        None,
        "{backends}: the address the manager listens on for its workers "
        "(default: 127.0.0.1 for local, this host's address for slurm).",
    )
    """By default 127.0.0.1 for workers on this host, and this host's address as other nodes
    reach it (its name resolved) for a cluster's."""
    manager_grace_s: Seconds = option(
        Seconds(600.0),
        "{backends}: how long the run's workers wait for a manager that is gone "
        "(for `leadtime resume` to take them over) before they end, and their pilots "
        "with them.",
        flag="--manager-grace",
        parse=positive,
    )
    worker_args: tuple[str, ...] = ()
    """More ``leadtime worker`` options for every worker (``--sample-interval 0.2``, say)."""
    heartbeat_s: float = 5.0

    def worker_options(self) -> tuple[str, ...]:
        """The options every worker of the run is started with."""
        grace = ("--connect-timeout", f"{self.manager_grace_s:g}")
        return ("--keep-sandboxes", self.keep_sandboxes, *grace, *self.worker_args)
