"""Checks of workflow values, shared by the TOML loader and :func:`workflows.spec.validate`.

A rule looks at one model value and returns ``None`` or a :data:`Problem`:
a message, and where below the checked key it applies (an element of a
list, say). The graph checks look at all stages' names and ``after`` lists.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from workflows import bounds, template
from workflows.quantity import shown
from workflows.synthetic import Distribution
from workflows.toml_lines import KeyPath
from workflows.traces import load_trace

Problem = tuple[KeyPath, str]
"""What is wrong, and where below the key being checked (``()``: the key itself)."""

Rule = Callable[[Any], "Problem | None"]
"""A check of one value: None when fine."""

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
"""Workflow and stage names: they name Slurm jobs and task ids (``stage.index``)."""

MANAGED_SBATCH = {
    "-N": "nodes", "--nodes": "nodes", "-n": "cores", "--ntasks": "cores",
    "--ntasks-per-node": "cores and nodes", "-c": "cores", "--cpus-per-task": "cores",
    "--mem": "memory", "--mem-per-cpu": "memory", "-t": "time", "--time": "time",
    "-p": "partition", "--partition": "partition", "-A": "account", "--account": "account",
    "-q": "qos", "--qos": "qos", "-d": "stage order (after)", "--dependency": "stage order (after)",
}  # fmt: skip


def fail(message: str, *at: str | int) -> Problem:
    return at, message


def _show(value: Any) -> str:
    """A value for a message: numbers as written in a file (``0``, not ``0.0``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}"
    return shown(value)


def positive_int(value: Any) -> Problem | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return fail(f"must be a positive integer, got {_show(value)}")
    if value > bounds.INT64:
        return fail(f"must fit in 64 bits (at most {bounds.INT64:,}), got {_show(value)}")
    return None


def task_count(value: Any) -> Problem | None:
    if problem := positive_int(value):
        return problem
    if value > bounds.TASKS_PER_STAGE:
        return fail(f"{value:,} tasks: a stage has at most {bounds.TASKS_PER_STAGE:,}")
    return None


def positive_number(value: Any) -> Problem | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        return fail(f"must be a positive number, got {_show(value)}")
    return None


def duration(value: Any) -> Problem | None:
    if problem := positive_number(value):
        return problem
    if value > bounds.DURATION_S:
        days = bounds.DURATION_S / 86400
        return fail(f"must be at most {days:g} days, got {value / 86400:,.6g} days")
    return None


def _too_long(value: str, limit: int) -> Problem | None:
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        return fail(f"{shown(value)} is {size:,} bytes long: at most {limit:,}")
    return None


def word(value: Any) -> Problem | None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        return fail(f"must be a non-empty string without spaces, got {shown(value)}")
    return _too_long(value, bounds.WORD)


def nonempty_text(value: Any) -> Problem | None:
    if not isinstance(value, str) or not value.strip():
        return fail(f"must be a non-empty string, got {shown(value)}")
    return None


def category(value: Any) -> Problem | None:
    return nonempty_text(value) or _too_long(value, bounds.WORD)


def valid_name(value: Any) -> Problem | None:
    if isinstance(value, str) and len(value) > bounds.NAME:
        return fail(
            f"{shown(value)} is {len(value):,} characters long: a name has at most "
            f"{bounds.NAME} (it names Slurm jobs and their log files)"
        )
    if not isinstance(value, str) or not NAME.match(value):
        return fail(
            f"must be letters, digits, '_' or '-' (not starting with '-'), got {shown(value)}: "
            "it names Slurm jobs and task ids"
        )
    return None


def valid_command(value: Any) -> Problem | None:
    """A template that reads, and is not longer than a command may be before it is filled."""
    if problem := nonempty_text(value):
        return problem
    if problem := _too_long(value, bounds.COMMAND_BYTES):
        return fail(f"{problem[1]}: the shell gets a command as one argument, at most 128 KiB")
    try:
        template.placeholders(value)
    except ValueError as e:
        return fail(str(e))
    return None


def output_patterns(value: Any) -> Problem | None:
    """Paths or glob patterns inside the working directory: never absolute, never ``..``."""
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        return fail(f"must be a tuple of strings, got {value!r}")
    for i, pattern in enumerate(value):
        if not pattern.strip():
            return fail("is empty: give a path relative to the working directory", i)
        try:
            used = template.placeholders(pattern)
        except ValueError as e:
            return fail(str(e), i)
        if used & {"workdir", "rundir"} or pattern.startswith(("/", "~")):
            return fail(f"{pattern!r}: outputs are relative to the working directory", i)
        if ".." in Path(pattern).parts:
            return fail(f"{pattern!r}: an output may not leave the working directory (..)", i)
        if not any(c not in "*?/." for c in pattern):
            return fail(
                f"{pattern!r} would match the working directory or anything in it (a task's "
                "outputs are removed before each of its attempts): name the files it writes",
                i,
            )
    return None


def sbatch_options(value: Any) -> Problem | None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        return fail(f"must be a tuple of strings, got {shown(value)}")
    if len(value) > bounds.SBATCH_OPTIONS:
        return fail(f"{len(value):,} options: at most {bounds.SBATCH_OPTIONS}")
    for i, option in enumerate(value):
        if problem := _too_long(option, bounds.SBATCH_OPTION_BYTES):
            return fail(problem[1], i)
        if not option.startswith("-"):
            return fail(f"{shown(option)} is not an sbatch option (options start with '-')", i)
        key = option.split("=", 1)[0].split()[0]
        key = key if key.startswith("--") else key[:2]
        if key in MANAGED_SBATCH:
            return fail(f"{key} is set by leadtime: use the allocation's {MANAGED_SBATCH[key]}", i)
    return None


def item_list(value: Any) -> Problem | None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        return fail(f"must be a tuple of strings, got {shown(value)}")
    if not value:
        return fail("is empty: a stage needs at least one task")
    if len(value) > bounds.TASKS_PER_STAGE:
        return fail(f"{len(value):,} items: a stage has at most {bounds.TASKS_PER_STAGE:,} tasks")
    return None


def is_distribution(value: Any) -> Problem | None:
    if not isinstance(value, Distribution):
        return fail(f"must be a Distribution, got {shown(value)}")
    return None


def existing_file(value: Any) -> Problem | None:
    if not isinstance(value, Path):
        return fail(f"must be a Path, got {shown(value)}")
    if not value.is_file():
        return fail(f"no such file: {shown(str(value))}")
    return None


def task_trace(value: Path) -> Problem | None:
    """An existing file a simulated run can replay: read now, so that no run fails on it."""
    try:
        tasks = load_trace(value).tasks
    except (ValueError, OSError, EOFError, csv.Error) as e:
        return fail(f"cannot read it as a task trace: {e}")
    if not tasks:
        return fail(f"{shown(str(value))} has no tasks")
    for i, task in enumerate(tasks):
        peak = task.peak.as_dict()
        if not all(math.isfinite(v) and v >= 0 for k, v in peak.items() if k != "wall"):
            return fail(f"task {i + 1} of the trace has a negative or infinite peak: {peak}")
    return None


def optional(rule: Rule) -> Rule:
    return lambda value: None if value is None else rule(value)


def graph_problems(
    names: list[str | None], afters: list[tuple[str, ...] | None]
) -> Iterator[tuple[int, KeyPath, str]]:
    """Names and the ``after`` graph: ``(stage index, key path in the stage, message)``."""
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name is None:
            continue
        if problem := valid_name(name):
            yield i, ("name", *problem[0]), problem[1]
        elif name in index:
            yield (
                i,
                ("name",),
                f"duplicate stage name {name!r} (already the name of stage {index[name] + 1})",
            )
        else:
            index[name] = i
    edges: dict[int, list[int]] = {}
    for i, after in enumerate(afters):
        if after is None or names[i] is None or index.get(names[i]) != i:
            continue  # checked once the stage has a name of its own
        seen: set[str] = set()
        for j, other in enumerate(after):
            if not isinstance(other, str):
                yield i, ("after", j), f"must be a stage name, got {shown(other)}"
            elif other == names[i]:
                yield i, ("after", j), "a stage cannot run after itself"
            elif other in seen:
                yield i, ("after", j), f"{shown(other)} is listed twice"
            elif other not in index:
                close = difflib.get_close_matches(other, list(index), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                yield i, ("after", j), f"unknown stage {shown(other)}{hint}"
            else:
                edges.setdefault(i, []).append(index[other])
            if isinstance(other, str):
                seen.add(other)
    if cycle := _find_cycle(edges, len(names)):
        start = cycle.index(min(cycle[:-1]))
        cycle = cycle[start:-1] + cycle[: start + 1]
        first, *rest = (repr(names[i]) for i in cycle)
        chain = ", which runs after ".join(rest)
        yield cycle[0], ("after",), f"cycle: {first} runs after {chain}"


def _find_cycle(edges: dict[int, list[int]], n: int) -> list[int] | None:
    """A cycle of ``edges`` as a closed walk ``[a, b, ..., a]``, looking in index order."""
    state = [0] * n  # 0 unseen, 1 on the path, 2 done
    for root in range(n):
        if state[root]:
            continue
        path, iterators = [root], [iter(edges.get(root, ()))]
        state[root] = 1
        while path:
            nxt = next(iterators[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iterators.pop()
            elif state[nxt] == 1:
                return [*path[path.index(nxt) :], nxt]
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append(nxt)
                iterators.append(iter(edges.get(nxt, ())))
    return None
