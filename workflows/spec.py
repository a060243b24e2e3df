"""Workflows, stages and tasks: the objects every run starts from.

The model below is what a TOML workflow file loads into and what the Python
API builds directly. Loading and validation live beside it (``load``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from learners.resources import Resources
from workflows import template
from workflows.synthetic import Distribution


@dataclass(frozen=True, slots=True)
class Allocation:
    """A stage's pilot: ``cores`` cores and ``memory_mb`` MB in total.

    ``nodes`` pins the node count (cores split evenly); ``None`` lets the
    scheduler spread the cores over nodes with room.
    """

    cores: int
    nodes: int | None = None
    memory_mb: int | None = None
    time_limit_s: float = 3600.0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Simulation:
    """How a stage's tasks behave in simulated runs: distributions or a trace of records.

    Units: duration in seconds, cores in cores, memory and disk in MB, input_size in bytes.
    """

    duration: Distribution | None = None
    cores: Distribution | None = None
    memory: Distribution | None = None
    disk: Distribution | None = None
    input_size: Distribution | None = None
    trace: Path | None = None


@dataclass(frozen=True, slots=True)
class TaskTemplate:
    """A command expanded over ``items`` (or run ``count`` times).

    Resources left at ``None`` are sized by the sizer; declared ones are fixed.
    """

    command: str
    items: tuple[str, ...] | None = None
    count: int | None = None
    cores: float | None = None
    memory: float | None = None
    disk: float | None = None
    wall: float | None = None
    category: str | None = None
    max_attempts: int = 3

    @property
    def declared(self) -> dict[str, float]:
        """The fixed resources, by name."""
        values = {"cores": self.cores, "memory": self.memory, "disk": self.disk, "wall": self.wall}
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Task:
    """One concrete task of a stage."""

    stage: str
    index: int
    command: str
    category: str
    declared: dict[str, float] = field(default_factory=dict)
    max_attempts: int = 3
    item: str | None = None

    @property
    def id(self) -> str:
        return f"{self.stage}.{self.index}"


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    tasks: TaskTemplate
    allocation: Allocation
    after: tuple[str, ...] = ()
    simulate: Simulation | None = None

    def expand(self) -> tuple[Task, ...]:
        """The stage's concrete tasks, in order: one per item, or ``count`` of them."""
        t = self.tasks
        items: Iterable[str | None] = t.items if t.items is not None else [None] * (t.count or 0)
        return tuple(
            Task(
                stage=self.name,
                index=index,
                command=template.render(t.command, stage=self.name, index=index, item=item),
                category=t.category or self.name,
                declared=t.declared,
                max_attempts=t.max_attempts,
                item=item,
            )
            for index, item in enumerate(items)
        )


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str
    stages: tuple[Stage, ...]
    scale: int | None = None
    source: Path | None = None

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


def declared_resources(task: Task, base: Resources) -> Resources:
    """``base`` with the task's declared resources put in: a declared size always wins."""
    out = base
    for name, value in task.declared.items():
        out = out.with_(name, value)  # type: ignore[arg-type]
    return out
