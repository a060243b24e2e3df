"""Workflows, stages and tasks: the objects every run starts from.

The model below is what a TOML workflow file loads into (:func:`load`,
:func:`loads`) and what the Python API builds directly; :func:`validate` makes
the same semantic checks on both. The file format is described in
``docs/workflows.md``. Every problem is a :class:`SpecError` naming the file,
line and field, e.g. ``montage.toml:14: stage.diff.after: unknown stage 'projct'
(did you mean 'project'?)``.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workflows import bounds, checks, quantity, readers, template
from workflows.synthetic import Distribution
from workflows.toml_lines import KeyPath, deep_line, key_lines, line_of, long_key_line

DEFAULT_TIME_S = 3600.0
"""A pilot's time limit when the file gives none."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """A stage's pilot: ``cores`` cores and ``memory_mb`` MB in total.

    ``nodes`` pins the node count (cores split evenly); ``None`` lets the
    scheduler spread the cores over nodes with room. An ``auto`` allocation is
    chosen by the planner when its pilot is submitted (``orchestrator.autoalloc``),
    within ``max_nodes``, ``max_cores`` and ``max_time_s``; until then its
    cores and time limit are placeholders that a run replaces by the fallback.
    """

    cores: int
    nodes: int | None = None
    memory_mb: int | None = None
    time_limit_s: float = DEFAULT_TIME_S
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch: tuple[str, ...] = ()
    auto: bool = False
    max_nodes: int | None = None
    max_cores: int | None = None
    max_time_s: float | None = None


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
    """A command expanded over ``items``, or run ``count`` times (once when neither is given).

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
    outputs: tuple[str, ...] = ()
    """Paths or glob patterns, relative to the working directory, each task creates: an
    attempt succeeds only if they exist, and they are removed when one does not."""

    @property
    def declared(self) -> dict[str, float]:
        """The fixed resources, by name."""
        values = {"cores": self.cores, "memory": self.memory, "disk": self.disk, "wall": self.wall}
        return {k: v for k, v in values.items() if v is not None}

    @property
    def size(self) -> int:
        """How many tasks the template makes, counted without making them."""
        if self.items is not None:
            return len(self.items)
        return 1 if self.count is None else self.count


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
    outputs: tuple[str, ...] = ()

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

    def expand(
        self, workdir: str = ".", rundir: str = ".leadtime", first: int | None = None
    ) -> tuple[Task, ...]:
        """The stage's concrete tasks, in order: one per item, or ``count`` of them, for a run
        in ``workdir`` whose own directory is ``rundir`` (only the ``first`` ones, if given)."""
        t = self.tasks
        size = t.size if first is None else min(first, t.size)
        items: Iterable[str | None] = t.items[:size] if t.items is not None else [None] * size
        places = {"workdir": workdir, "rundir": rundir}
        category, declared = t.category or self.name, t.declared  # the same for every task
        return tuple(
            Task(
                stage=self.name,
                index=index,
                command=template.render(
                    t.command, stage=self.name, index=index, item=item, **places
                ),
                category=category,
                declared=declared,
                max_attempts=t.max_attempts,
                item=item,
                outputs=tuple(
                    template.render(o, stage=self.name, index=index, item=item, quote=False)
                    for o in t.outputs
                ),
            )
            for index, item in enumerate(items)
        )


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str
    stages: tuple[Stage, ...]
    scale: int | None = None
    source: Path | None = None
    workdir: Path | None = None
    """Where tasks run and their relative paths lead: by default the workflow file's
    directory (the current directory for a workflow built in Python)."""
    lines: Mapping[KeyPath, int] = field(default_factory=dict, compare=False, repr=False)
    """The line of each stage's keys in ``source`` (empty for a workflow built in Python)."""

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def where(self, stage: str, *keys: str) -> str:
        """Where a message about a stage's field points: ``montage.toml:14: stage.diff.tasks.cores``
        (the line of the key, or of its table when the file leaves the key out)."""
        index = next(i for i, s in enumerate(self.stages) if s.name == stage)
        field = ".".join(("stage", stage, *keys))
        if self.source is None:
            return field
        line = f":{line_of(self.lines, ('stage', index, *keys))}" if self.lines else ""
        return f"{self.source}{line}: {field}"

    def dirs_in_quotes(self, workdir: Path, rundir: Path) -> str | None:
        """Where a command writes ``{workdir}`` or ``{rundir}`` inside shell quotes while the
        directory's path needs leadtime's quoting (a space, say), and why that fails."""
        paths = {"workdir": str(workdir), "rundir": str(rundir)}
        for stage in self.stages:
            for name, spec in template.in_quotes(stage.tasks.command):
                if name in paths and template.needs_quotes(format(paths[name], spec)):
                    problem = _in_quotes_message(name, spec, repr(paths[name]))
                    return f"{self.where(stage.name, 'tasks', 'command')}: {problem}"
        return None

    def refused(self, stages: Sequence[str], option: str | None, pilot: Allocation) -> str:
        """:meth:`where` for a batch system's refusal of ``option`` in a pilot for ``stages``:
        the field of the stage whose allocation gave the pilot that value."""
        keys = _refused_keys(option)
        attr = _ALLOCATION[keys[1]].attr if keys[1:] else None
        chosen = next(
            (
                name
                for name in stages
                if attr and getattr(self.stage(name).allocation, attr) == getattr(pilot, attr)
            ),
            stages[0],
        )
        return self.where(chosen, *keys)


class SpecError(ValueError):
    """A workflow that cannot run, and where: ``str(e)`` is ``"<file>:<line>: <field>: <message>"``.

    ``field`` is dotted: ``stage.diff.after`` names a stage by its name,
    ``stage[2].allocation.cores`` by its place (1-based) when it has no usable name.
    ``path`` and ``line`` are None for workflows built in Python; ``field`` is
    empty for TOML syntax errors.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        path: str | Path | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.path = path
        self.line = line

    def __str__(self) -> str:
        where = "" if self.path is None else str(self.path)
        if self.line is not None:
            where = f"{where}:{self.line}"
        return ": ".join(part for part in (where, self.field, self.message) if part)


# --- the keys of a workflow file ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    """One key of a TOML table: the model attribute it fills, how to read it, its rule."""

    attr: str
    read: readers.Read
    rule: checks.Rule


_ALLOCATION: Mapping[str, _Field] = {
    "cores": _Field("cores", readers.read_int, checks.positive_int),
    "nodes": _Field("nodes", readers.read_int, checks.optional(checks.positive_int)),
    "memory": _Field("memory_mb", readers.read_whole_mb, checks.optional(checks.positive_int)),
    "time": _Field("time_limit_s", readers.read_seconds, checks.duration),
    "partition": _Field("partition", readers.read_str, checks.optional(checks.word)),
    "account": _Field("account", readers.read_str, checks.optional(checks.word)),
    "qos": _Field("qos", readers.read_str, checks.optional(checks.word)),
    "sbatch": _Field("sbatch", readers.read_options, checks.sbatch_options),
    "max_nodes": _Field("max_nodes", readers.read_int, checks.optional(checks.positive_int)),
    "max_cores": _Field("max_cores", readers.read_int, checks.optional(checks.positive_int)),
    "max_time": _Field("max_time_s", readers.read_seconds, checks.optional(checks.duration)),
}
AUTO = "auto"
"""``allocation = "auto"``: an automatic allocation without bounds."""
_CHOSEN = ("nodes", "memory", "time")
"""Keys an automatic allocation chooses itself."""
_BOUNDS = ("max_nodes", "max_cores", "max_time")
"""Keys that bound an automatic allocation."""
_TASKS: Mapping[str, _Field] = {
    "command": _Field("command", readers.read_str, checks.valid_command),
    "items": _Field("items", readers.read_items, checks.optional(checks.item_list)),
    "count": _Field("count", readers.read_int, checks.optional(checks.task_count)),
    "cores": _Field("cores", readers.read_number, checks.optional(checks.positive_number)),
    "memory": _Field("memory", readers.read_size, checks.optional(checks.positive_number)),
    "disk": _Field("disk", readers.read_size, checks.optional(checks.positive_number)),
    "wall": _Field("wall", readers.read_seconds, checks.optional(checks.duration)),
    "category": _Field("category", readers.read_str, checks.optional(checks.category)),
    "max_attempts": _Field("max_attempts", readers.read_int, checks.positive_int),
    "outputs": _Field("outputs", readers.read_options, checks.output_patterns),
}
_SIMULATE: Mapping[str, _Field] = {
    **{
        key: _Field(key, readers.read_distribution, checks.optional(checks.is_distribution))
        for key in ("duration", "cores", "memory", "disk", "input_size")
    },
    "trace": _Field("trace", readers.read_path, checks.optional(checks.existing_file)),
}
_COMPONENTS: Mapping[str, tuple[type, Mapping[str, _Field], tuple[str, ...]]] = {
    "allocation": (Allocation, _ALLOCATION, ()),
    "tasks": (TaskTemplate, _TASKS, ("command",)),
    "simulate": (Simulation, _SIMULATE, ()),
}
"""Stage key -> model class, its fields, and the keys a file must give."""

_STAGE_KEYS = ("name", "after", "allocation", "tasks", "simulate")
_TOP_KEYS = ("name", "scale", "workdir", "stage")


def _refused_keys(option: str | None) -> tuple[str, ...]:
    """The stage keys behind an option a batch system refused (``--mem``, ``mem``: memory).

    Pilots are named after their stage (``--job-name``); anything else is the allocation's.
    """
    if option == "--job-name":
        return ("name",)
    key = checks.MANAGED_SBATCH.get(option or "", (option or "").lstrip("-"))
    key = {"mem": "memory", "ntasks": "cores"}.get(key, key)
    return ("allocation", key) if key in _ALLOCATION else ("allocation",)


# --- checks across fields, shared by the loader and validate() -------------------------------


def _allocation_problems(a: Allocation) -> Iterator[checks.Problem]:
    bounds_given = [k for k in _BOUNDS if getattr(a, _ALLOCATION[k].attr) is not None]
    if a.auto:
        for key in _CHOSEN:
            if key != "time" and getattr(a, _ALLOCATION[key].attr) is not None:
                yield (key,), _chosen_message(key)
    elif bounds_given:
        yield (
            (bounds_given[0],),
            "bounds an automatic allocation, but this one gives cores: leave out cores, nodes, "
            "memory and time to let leadtime choose them",
        )
    elif a.nodes is not None and a.nodes > a.cores:
        yield ("nodes",), f"{a.nodes} nodes cannot share {a.cores} cores"
    elif a.nodes is not None and a.cores % a.nodes:
        yield ("nodes",), f"{a.cores} cores do not split evenly over {a.nodes} nodes"


def _tasks_problems(t: TaskTemplate) -> Iterator[checks.Problem]:
    if t.items is not None and t.count is not None:
        yield ("count",), "give either items or count, not both"
    elif t.items is None and (used := template.placeholders(t.command) & template.ITEM):
        yield ("command",), f"{{{min(used)}}} needs items, but this stage has none"
    elif t.items is None and (used := _item_outputs(t.outputs)):
        yield ("outputs",), f"{{{min(used)}}} needs items, but this stage has none"
    elif t.items and (found := _not_whole(t)):
        yield found
    elif t.items and (found := _item_in_quotes(t.command, t.items)):
        yield ("command",), found
    elif t.size > 1 and (shared := _shared_outputs(t.outputs)):
        i, pattern = shared
        yield (
            ("outputs", i),
            f"{pattern!r} is the same for each of the stage's {t.size:,} tasks: a task's outputs "
            "are removed before each of its attempts, which would remove the other tasks' "
            "files; name each task's own with {index} or {item}, e.g. 'out/{index}.txt'",
        )
    else:
        for i, pattern in enumerate(t.outputs):
            if found := template.clash(pattern, t.size, t.items):
                yield ("outputs", i), _clash_message(pattern, *found)
                return
            if t.items and (item := _absolute(t.items)) and template.item_within(pattern):
                yield ("outputs", i), _item_within_message(pattern, item)
                return


def _not_whole(t: TaskTemplate) -> checks.Problem | None:
    """A placeholder with a number's format spec (``{item:03d}``) over an item that is no whole
    number, where the command or an output has one."""
    assert t.items is not None
    for at, pattern in (
        (("command",), t.command),
        *((("outputs", i), o) for i, o in enumerate(t.outputs)),
    ):
        if found := template.not_whole((pattern,), t.items):
            placeholder, item = found
            return at, (
                f"{placeholder} formats a whole number, but item {item!r} is not one "
                "(a range's items are; write the placeholder without a number's spec for text)"
            )
    return None


def _item_in_quotes(command: str, items: Sequence[str]) -> str | None:
    """An item placeholder ``command`` writes inside shell quotes, over an item whose value
    leadtime must quote (a space, a quote, ``$``): the quotes it adds would be read literally,
    and the task would read or write other paths than its own."""
    for name, spec in template.in_quotes(command):
        if name not in template.ITEM:
            continue
        for item in items:
            value = template.format_item(template.item_values(item)[name], spec)
            if template.needs_quotes(value):
                of = "" if value == item else f" (of item {item!r})"
                return _in_quotes_message(name, spec, f"{value!r}{of}")
    return None


def _in_quotes_message(name: str, spec: str, value: str) -> str:
    shown = f"{{{name}:{spec}}}" if spec else f"{{{name}}}"
    return (
        f"{shown} is inside shell quotes, where the quotes leadtime puts around {value} would "
        "be read as part of it: write the placeholder outside the quotes (leadtime quotes "
        "each value it fills in)"
    )


def _item_outputs(outputs: tuple[str, ...]) -> set[str]:
    """The placeholders of :data:`template.ITEM` that ``outputs`` use."""
    return {name for o in outputs for name in template.placeholders(o) & template.ITEM}


def _absolute(items: tuple[str, ...]) -> str | None:
    """An item that is an absolute path (a glob gives only such items), if any."""
    return next((item for item in items if item.startswith("/")), None)


def _item_within_message(pattern: str, item: str) -> str:
    named = pattern.replace("{item}", "{item.name}").replace("{item:", "{item.name:")
    return (
        f"{pattern!r} puts {{item}} after other text, but items here are absolute paths "
        f"(such as {item!r}), so it would name a path that ends in the item's whole path; "
        f"for the item's file name write {{item.name}} ({named!r}), or {{item.stem}} for "
        "that name without its suffix"
    )


def _clash_message(pattern: str, name: str, a: str, b: str) -> str:
    why = "(a task's outputs are removed before each of its attempts)"
    if a != b:
        fixed = ", or give it a fixed width ({index:03d})" if name == "index" else ""
        return (
            f"{pattern!r} with {{{name}}} {a!r} also matches the files of the task with "
            f"{{{name}}} {b!r} {why}: put a separator between {{{name}}} and the wildcard{fixed}"
        )
    if name == "index":
        fix = "write {index} whole ({index:03d})"
    else:
        fix = "make the items different, or add {index} to the pattern"
    return f"{pattern!r} names the same files for two tasks whose {{{name}}} is {a!r} {why}: {fix}"


def _shared_outputs(outputs: tuple[str, ...]) -> tuple[int, str] | None:
    """The first output pattern every task of a stage shares (no {index} or {item})."""
    for i, pattern in enumerate(outputs):
        if not template.placeholders(pattern) & template.VARYING:
            return i, pattern
    return None


def _simulate_problems(s: Simulation) -> Iterator[checks.Problem]:
    if s.trace is not None and any(getattr(s, k) is not None for k in _SIMULATE if k != "trace"):
        yield ("trace",), "give a trace or distributions, not both"
    elif s.trace is not None and (problem := checks.task_trace(s.trace)):
        yield ("trace", *problem[0]), problem[1]


def _chosen_message(key: str) -> str:
    bound = {"nodes": "max_nodes", "time": "max_time"}.get(key)
    how = f"bound it with {bound}" if bound else "give the tasks' memory instead"
    return f"an automatic allocation (no cores given) chooses its {key} itself: {how}"


def _fit_problems(t: TaskTemplate, a: Allocation) -> Iterator[checks.Problem]:
    """A task declaring more than its stage's pilot has could never start."""
    if a.auto:
        yield from _auto_fit_problems(t, a)
        return
    nodes = a.nodes or 1
    where = " per node" if a.nodes else ""
    if t.cores is not None and t.cores > a.cores / nodes:
        yield (
            ("tasks", "cores"),
            f"a task declares {t.cores:g} cores but the allocation has {a.cores / nodes:g}{where}",
        )
    if t.memory is not None and a.memory_mb is not None and t.memory > a.memory_mb / nodes:
        yield (
            ("tasks", "memory"),
            f"a task declares {t.memory:g} MB but the allocation has "
            f"{a.memory_mb / nodes:g} MB{where}",
        )
    if t.wall is not None and t.wall > a.time_limit_s:
        yield (
            ("tasks", "wall"),
            f"a task declares {t.wall:g} s of wall time but the allocation's time limit "
            f"is {a.time_limit_s:g} s",
        )


def _auto_fit_problems(t: TaskTemplate, a: Allocation) -> Iterator[checks.Problem]:
    """A task declaring more than an automatic allocation's bounds allow could never start."""
    if t.cores is not None and a.max_cores is not None and t.cores > a.max_cores:
        yield (
            ("tasks", "cores"),
            f"a task declares {t.cores:g} cores but the allocation's max_cores is {a.max_cores}",
        )
    if t.wall is not None and a.max_time_s is not None and t.wall > a.max_time_s:
        yield (
            ("tasks", "wall"),
            f"a task declares {t.wall:g} s of wall time but the allocation's max_time "
            f"is {a.max_time_s:g} s",
        )


def _command_problems(stage: str, t: TaskTemplate) -> Iterator[checks.Problem]:
    """A command too long for the shell once its placeholders are filled, for any task."""
    if t.items and _not_whole(t):
        return  # the tasks' own problem: no command can be filled in
    size = template.longest(t.command, stage=stage, count=t.size, items=t.items)
    if size > bounds.COMMAND_BYTES:
        yield (
            ("tasks", "command"),
            f"a task's command may take {size:,} bytes once filled in: the shell gets it as one "
            f"argument, at most {bounds.COMMAND_BYTES:,} bytes",
        )


def _stage_fit_problems(stage: str, t: TaskTemplate, a: Allocation) -> Iterator[checks.Problem]:
    """The checks of a stage's tasks against its allocation and name, once both are whole."""
    yield from _fit_problems(t, a)
    yield from _command_problems(stage, t)


_CROSS: Mapping[str, Callable[[Any], Iterator[checks.Problem]]] = {
    "allocation": _allocation_problems,
    "tasks": _tasks_problems,
    "simulate": _simulate_problems,
}


def _stage_problems(stage: Stage) -> Iterator[checks.Problem]:
    """Every problem of one stage's allocation, tasks and simulation (names and order aside)."""
    whole = True
    for key, (cls, table, _) in _COMPONENTS.items():
        value = getattr(stage, key)
        if value is None and key == "simulate":
            continue
        if not isinstance(value, cls):
            whole = False
            yield (key,), f"must be a {cls.__name__}, got {quantity.shown(value)}"
            continue
        broken = [(k, p) for k, f in table.items() if (p := f.rule(getattr(value, f.attr)))]
        yield from (((key, k, *at), message) for k, (at, message) in broken)
        if broken:
            whole = False
        else:
            yield from (((key, *at), p) for at, p in _CROSS[key](value))
    if whole:
        yield from _stage_fit_problems(stage.name, stage.tasks, stage.allocation)


def _labels(names: list[Any]) -> list[str]:
    """How fields name each stage: ``stage.<name>``, or ``stage[<n>]`` without a usable name."""
    labels, seen = [], set()
    for i, name in enumerate(names):
        usable = checks.valid_name(name) is None and name not in seen
        labels.append(f"stage.{name}" if usable else f"stage[{i + 1}]")
        if isinstance(name, str):
            seen.add(name)
    return labels


def _field(path: KeyPath, labels: list[str]) -> str:
    out, rest = "", path
    if len(path) >= 2 and path[0] == "stage" and isinstance(path[1], int):
        i = path[1]
        out, rest = labels[i] if i < len(labels) else f"stage[{i + 1}]", path[2:]
    for part in rest:
        if isinstance(part, str) and len(part) > bounds.NAME:  # a key the file made up
            part = f"{part[:40]}…({len(part):,} characters)"
        out += f"[{part + 1}]" if isinstance(part, int) else f".{part}" if out else part
    return out


def _workflow_problems(workflow: Workflow) -> list[checks.Problem]:
    """All problems of a workflow built in Python, roughly in the order a file would list them."""
    problems: list[checks.Problem] = []
    if problem := checks.valid_name(workflow.name):
        problems.append((("name",), problem[1]))
    if problem := checks.optional(checks.positive_int)(workflow.scale):
        problems.append((("scale",), problem[1]))
    if not isinstance(workflow.stages, tuple):
        got = quantity.shown(workflow.stages)
        problems.append((("stage",), f"must be a tuple of Stage, got {got}"))
        return problems
    if not workflow.stages:
        problems.append((("stage",), "a workflow needs at least one stage"))
        return problems
    if len(workflow.stages) > bounds.STAGES:
        problems.append((("stage", bounds.STAGES), _TOO_MANY_STAGES))
        return problems
    stages = [s for s in workflow.stages if isinstance(s, Stage)]
    if len(stages) != len(workflow.stages):
        bad = next(i for i, s in enumerate(workflow.stages) if not isinstance(s, Stage))
        problems.append((("stage", bad), "must be a Stage"))
        return problems
    per_stage: list[list[checks.Problem]] = [[] for _ in stages]
    names = [s.name if isinstance(s.name, str) else None for s in stages]
    afters = [tuple(s.after) if isinstance(s.after, tuple) else None for s in stages]
    for i, s in enumerate(stages):
        if names[i] is None:
            per_stage[i].append((("name",), f"must be a string, got {quantity.shown(s.name)}"))
        if afters[i] is None:
            got = quantity.shown(s.after)
            per_stage[i].append((("after",), f"must be a tuple of stage names, got {got}"))
    for i, at, message in checks.graph_problems(names, afters):
        per_stage[i].append((at, message))
    order = {key: n for n, key in enumerate(_STAGE_KEYS)}
    for i, s in enumerate(stages):
        per_stage[i].extend(_stage_problems(s))
        per_stage[i].sort(key=lambda p: order.get(str(p[0][0]) if p[0] else "", 0))
        problems.extend((("stage", i, *at), message) for at, message in per_stage[i])
    if not problems:
        problems.extend(_total_problems([s.tasks.size for s in stages]))
    return problems


_TOO_MANY_STAGES = f"more than {bounds.STAGES} stages: each is a pilot job"


def _total_problems(sizes: list[int]) -> Iterator[checks.Problem]:
    """The stage at which the workflow's tasks pass the bound, if they do."""
    total = 0
    for i, size in enumerate(sizes):
        total += size
        if total > bounds.TASKS:
            yield (
                ("stage", i, "tasks"),
                f"brings the workflow to {total:,} tasks: a workflow has at most {bounds.TASKS:,}",
            )
            return


def validate(workflow: Workflow) -> None:
    """Raise :class:`SpecError` for the first problem of ``workflow``, built in Python or loaded."""
    problems = _workflow_problems(workflow)
    if problems:
        path, message = problems[0]
        names = [getattr(s, "name", None) for s in workflow.stages or ()]
        raise SpecError(message, field=_field(path, _labels(names)), path=workflow.source)


# --- the TOML loader -------------------------------------------------------------------------

_NAME_KEY = _Field("name", readers.read_str, checks.valid_name)
_SCALE_KEY = _Field("scale", readers.read_int, checks.positive_int)
_WORKDIR_KEY = _Field("workdir", readers.read_path, lambda _: None)  # may not exist yet
_AFTER_KEY = _Field("after", readers.read_names, lambda _: None)  # names are checked with the graph


EXAMPLES = Path(__file__).parent / "examples"


def example(name: str) -> Path:
    """The path of a shipped example workflow: ``montage``, ``blast``, ``statistics``, ``demo``."""
    path = EXAMPLES / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in EXAMPLES.glob("*.toml")))
        raise SpecError(f"no example named {quantity.shown(name)} (known: {known})")
    return path


def load(path: str | Path, *, scale: int | None = None) -> Workflow:
    """Read and validate a workflow file; ``scale`` overrides the file's ``scale``."""
    return loads(_read(Path(path)), source=path, scale=scale)


def _read(path: Path) -> str:
    """The text of a workflow file: a regular file of UTF-8 (a leading BOM is dropped),
    checked for size before it is read, so that a FIFO or ``/dev/zero`` cannot hang us."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise SpecError(f"cannot read the file: {e.strerror or e}", path=path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise SpecError(f"cannot read the file: it is {kind}", path=path)
        data = b""
        if info.st_size <= bounds.FILE_BYTES:
            with open(fd, "rb", closefd=False) as f:
                data = f.read(bounds.FILE_BYTES + 1)  # it may have grown since
        if max(info.st_size, len(data)) > bounds.FILE_BYTES:
            raise SpecError(
                f"the file is {max(info.st_size, len(data)):,} bytes: a workflow file has at "
                f"most {bounds.FILE_BYTES:,} (write large item sets as a glob or a range)",
                path=path,
            )
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise SpecError(
            f"the file is not UTF-8 text (byte {data[e.start]:#04x} at column "
            f"{e.start - line_start + 1})",
            path=path,
            line=data.count(b"\n", 0, e.start) + 1,
        ) from None


def loads(text: str, *, source: str | Path = "<string>", scale: int | None = None) -> Workflow:
    """Parse and validate a workflow given as TOML text.

    ``source`` names the text in errors; unless it is ``"<string>"`` it is the
    file's path, whose directory relative globs and trace paths start from
    (otherwise they start from the current directory).
    """
    doc = _parse(text, source)
    from_file = str(source) != "<string>"
    base_dir = Path(source).parent.absolute() if from_file else Path.cwd()
    loader = _Loader(base_dir, _stage_names(doc))
    loader.problems.extend(_value_problems(doc))
    source_path = Path(source) if from_file else None
    workflow = None if loader.problems else loader.workflow(doc, scale, source_path)
    if workflow is None:
        lines = key_lines(text)
        first = min(
            range(len(loader.problems)),
            key=lambda i: (line_of(lines, loader.problems[i][0]), i),
        )
        path, message = loader.problems[first]
        field = _field(path, _labels(loader.names))
        raise SpecError(message, field=field, path=source, line=line_of(lines, path))
    if not from_file:
        return workflow
    return replace(workflow, lines=key_lines(text, depth=4))  # to ("stage", i, "tasks", "cores")


def _parse(text: str, source: str | Path) -> dict[str, Any]:
    """The TOML document, or SpecError; keys so long, or arrays so deep, that the parser
    itself would crawl or overflow are refused before or while parsing."""
    if (line := long_key_line(text)) is not None:
        raise SpecError(
            f"a dotted key or table header of more than {bounds.DEPTH} parts",
            path=source,
            line=line,
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message, line = _syntax_error(str(e), text)
        raise SpecError(message, path=source, line=line) from None
    except RecursionError:
        raise SpecError(
            f"arrays or inline tables nested more than {bounds.DEPTH} deep",
            path=source,
            line=deep_line(text, bounds.DEPTH) or 1,
        ) from None


def _stage_names(doc: dict[str, Any]) -> list[Any]:
    """The ``name`` of each ``[[stage]]`` (None where a stage has none or is no table)."""
    stages = doc.get("stage")
    if not isinstance(stages, list):
        return []
    return [s.get("name") if isinstance(s, dict) else None for s in stages]


def _value_problems(doc: dict[str, Any]) -> list[checks.Problem]:
    """Values no workflow key can take, wherever they are: too deep, integers beyond 64 bits,
    NaN and infinities, NUL characters (no command or file name can hold one)."""
    problems: list[checks.Problem] = []
    stack: list[tuple[KeyPath, Any]] = [((), doc)]
    while stack:
        path, value = stack.pop()
        if len(path) > bounds.DEPTH:
            problems.append((path[:4], f"nests more than {bounds.DEPTH} levels deep"))
        elif isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not -bounds.INT64 - 1 <= value <= bounds.INT64:
            problems.append(
                (path, f"{quantity.shown(value)} does not fit in 64 bits, as TOML requires")
            )
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append((path, f"must be a finite number, got {value}"))
        elif isinstance(value, str) and "\0" in value:
            problems.append((path, "contains a NUL character, which no command can hold"))
    return problems


def _syntax_error(message: str, text: str) -> tuple[str, int]:
    """tomllib's ``"Invalid value (at line 3, column 7)"`` as a message and a line."""
    where = re.search(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$", message)
    base = message[: where.start()] if where else message
    base = f"invalid TOML: {base[:1].lower()}{base[1:]}"
    if where and where.group(1):
        return f"{base} (column {where.group(2)})", int(where.group(1))
    return f"{base} at the end of the file", max(1, len(text.splitlines()))


class _Loader:
    """Turns a parsed document into a :class:`Workflow`, collecting every problem with its path.

    Keys are read one by one; a part (allocation, tasks, simulate) whose keys
    all read well gets its cross-key checks, and names and ``after`` are
    checked over all stages, so the first problem in the file is among those
    found, whichever kind it is.
    """

    def __init__(self, base_dir: Path, names: list[Any]) -> None:
        self.base_dir = base_dir
        self.problems: list[checks.Problem] = []
        self.names = names
        """Each stage's ``name`` as the file gives it (whatever its type)."""

    def problem(self, path: KeyPath, message: str) -> None:
        self.problems.append((path, message))

    def table(self, path: KeyPath, raw: Any, known: Iterable[str], required: Iterable[str]) -> bool:
        """Whether ``raw`` is a table with only ``known`` keys and all ``required`` ones."""
        if not isinstance(raw, dict):
            self.problem(path, f"must be a table, got {quantity.describe(raw)}")
            return False
        clean = True
        for key in raw:
            try:
                readers.check_keys({key: None}, known)
            except readers.Invalid as e:
                self.problem((*path, *e.at), str(e))
                clean = False
        if clean:  # a misspelt key is most likely the missing one: report only that
            for key in required:
                if key not in raw:
                    self.problem((*path, key), "is missing (required)")
                    clean = False
        return clean

    def read(self, path: KeyPath, raw: Any, key: _Field, ctx: readers.Context) -> tuple[bool, Any]:
        """One key read and checked: ``(ok, value)``."""
        try:
            value = key.read(raw, ctx)
        except readers.Invalid as e:
            self.problem((*path, *e.at), str(e))
            return False, None
        except ValueError as e:
            self.problem(path, str(e))
            return False, None
        if problem := key.rule(value):
            at, message = problem
            self.problem((*path, *at), message)
            return False, None
        return True, value

    def workflow(
        self, doc: dict[str, Any], scale: int | None, source: Path | None
    ) -> Workflow | None:
        ok = self.table((), doc, _TOP_KEYS, ("name",))
        ctx = readers.Context(None, self.base_dir)
        name_ok, name = (
            self.read(("name",), doc["name"], _NAME_KEY, ctx) if "name" in doc else (False, None)
        )
        ok &= name_ok
        if "scale" in doc:
            scale_ok, file_scale = self.read(("scale",), doc["scale"], _SCALE_KEY, ctx)
            ok &= scale_ok
            scale = file_scale if scale is None else scale
        if problem := checks.optional(checks.positive_int)(scale):
            self.problem(("scale",), f"the scale asked for {problem[1]}")
        workdir = None if source is None else self.base_dir  # None: where the run starts
        if "workdir" in doc:
            workdir_ok, workdir = self.read(("workdir",), doc["workdir"], _WORKDIR_KEY, ctx)
            ok &= workdir_ok
        raw_stages = doc.get("stage")
        if raw_stages is None or raw_stages == []:
            self.problem(("stage",), "a workflow needs at least one [[stage]]")
            return None
        if not isinstance(raw_stages, list) or not all(isinstance(s, dict) for s in raw_stages):
            self.problem(("stage",), "must be an array of tables: write each stage as [[stage]]")
            return None
        if len(raw_stages) > bounds.STAGES:
            self.problem(("stage", bounds.STAGES), _TOO_MANY_STAGES)
            return None
        ctx = readers.Context(scale, self.base_dir)
        stages, afters = [], []
        for i, raw in enumerate(raw_stages):
            stage, after = self.stage(("stage", i), raw, self.names[i - 1] if i else None, ctx)
            stages.append(stage)
            afters.append(after)
        names = [n if isinstance(n, str) else None for n in self.names]
        for i, at, message in checks.graph_problems(names, afters):
            self.problem(("stage", i, *at), message)
        if not ok or self.problems or not all(stages):
            return None
        for at, message in _total_problems([s.tasks.size for s in stages if s is not None]):
            self.problem(at, message)
            return None
        return Workflow(name, tuple(stages), scale=scale, source=source, workdir=workdir)  # type: ignore[arg-type]

    def stage(
        self, path: KeyPath, raw: dict[str, Any], previous: Any, ctx: readers.Context
    ) -> tuple[Stage | None, tuple[str, ...] | None]:
        """The stage at ``path`` (None if broken) and its ``after`` (None if unreadable)."""
        ok = self.table(path, raw, _STAGE_KEYS, ("name", "allocation", "tasks"))
        if "name" in raw and not isinstance(raw["name"], str):
            self.problem((*path, "name"), f"must be a string, got {quantity.describe(raw['name'])}")
            ok = False
        after: tuple[str, ...] | None = (previous,) if isinstance(previous, str) else ()
        if "after" in raw:
            after_ok, after = self.read((*path, "after"), raw["after"], _AFTER_KEY, ctx)
            ok &= after_ok
        parts: dict[str, Any] = {}
        for key, (cls, keys, required) in _COMPONENTS.items():
            if key in raw:
                parts[key] = self.part((*path, key), raw[key], cls, keys, required, ctx)
                ok &= parts[key] is not None
        if parts.get("tasks") and parts.get("allocation"):
            name = raw["name"] if isinstance(raw.get("name"), str) else ""
            for at, message in _stage_fit_problems(name, parts["tasks"], parts["allocation"]):
                self.problem((*path, *at), message)
        if not ok:
            return None, after
        return Stage(raw["name"], after=after, **parts), after

    def part(
        self,
        path: KeyPath,
        raw: Any,
        cls: type,
        keys: Mapping[str, _Field],
        required: tuple[str, ...],
        ctx: readers.Context,
    ) -> Any:
        """An Allocation, TaskTemplate or Simulation, or None when any key of it is wrong."""
        if cls is Allocation and raw == AUTO:
            return Allocation(1, auto=True)
        if cls is Allocation and isinstance(raw, str):
            self.problem(path, f'must be a table or "auto", got {quantity.describe(raw)}')
            return None
        ok = self.table(path, raw, keys, required)
        if not isinstance(raw, dict):
            return None
        values = {}
        for key, spec in keys.items():
            if key in raw:
                key_ok, values[spec.attr] = self.read((*path, key), raw[key], spec, ctx)
                ok &= key_ok
        if ok and cls is Allocation and "cores" not in raw:
            given = [k for k in _CHOSEN if k in raw]
            if given:
                self.problem(
                    (*path, "cores"),
                    f"is missing (required): an allocation that gives {given[0]} needs cores; "
                    "leave out nodes, memory and time too for an automatic one",
                )
                return None
            values.update(cores=1, auto=True)
            values["time_limit_s"] = values.get("max_time_s") or DEFAULT_TIME_S
        if not ok:
            return None
        value = cls(**values)
        cross = list(_CROSS[str(path[-1])](value))
        for at, message in cross:
            self.problem((*path, *at), message)
        return None if cross else value
