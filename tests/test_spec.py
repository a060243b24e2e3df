"""Workflow files: every feature, every way to get one wrong, and the Python API."""

import dataclasses
import re
import shlex
import textwrap
from pathlib import Path

import pytest

from workflows.spec import (
    Allocation,
    Simulation,
    SpecError,
    Stage,
    TaskTemplate,
    Workflow,
    load,
    loads,
    validate,
)
from workflows.synthetic import Distribution

# --- malformed files: each names the field, and the line marked "# <-" ------------------------


def case(name: str, field: str, message: str, text: str, eof_newline: bool = True):
    """A corpus entry: ``text`` is indented in the source and its first line is blank."""
    text = textwrap.dedent(text).lstrip("\n")
    return name, field, message, text if eof_newline else text.rstrip("\n")


OK_STAGE = """
[[stage]]
name = "a"
allocation = { cores = 4 }
tasks = { command = "run {index}", count = 2 }
"""

# fmt: off
CORPUS = [
    case("toml syntax", "", "invalid TOML: invalid value", """
        name = "wf"
        scale =   # <-
        """),
    case("unclosed array", "", "invalid TOML", """
        name = "wf"
        x = [1,
          2  # <-
        """, eof_newline=False),
    case("duplicate toml key", "", "invalid TOML", """
        name = "wf"
        name = "again"  # <-
        """),
    case("unknown top key", "stages", "unknown key 'stages' (did you mean 'stage'?)", """
        name = "wf"
        stages = 3  # <-

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        """),
    case("missing workflow name", "name", "is missing", """
        # <-
        scale = 2

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        """),
    case("bad workflow name", "name", "must be letters, digits", """
        name = "my wf"  # <-

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        """),
    case("workflow name type", "name", "must be a string, got an integer", """
        name = 5  # <-
        """),
    case("scale zero", "scale", "must be a positive integer, got 0", """
        name = "wf"
        scale = 0  # <-

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        """),
    case("scale bool", "scale", "got a boolean", """
        name = "wf"
        scale = true  # <-

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        """),
    case("no stages", "stage", "a workflow needs at least one [[stage]]", """
        # <-
        name = "wf"
        """),
    case("empty stage array", "stage", "a workflow needs at least one [[stage]]", """
        name = "wf"
        stage = []  # <-
        """),
    case("stage as table", "stage", "write each stage as [[stage]]", """
        name = "wf"
        [stage]  # <-
        name = "a"
        """),
    case("stage without name", "stage[1].name", "is missing", """
        name = "wf"
        [[stage]]  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("stage name type", "stage[1].name", "must be a string, got an integer", """
        name = "wf"
        [[stage]]
        name = 7  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("stage name with a dot", "stage[2].name", "must be letters, digits", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "b.c"  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("duplicate stage name", "stage[2].name",
         "duplicate stage name 'a' (already the name of stage 1)", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "a"  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("unknown stage key", "stage.a.alocation", "did you mean 'allocation'?", """
        name = "wf"
        [[stage]]
        name = "a"
        alocation = { cores = 1 }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("missing allocation", "stage.a.allocation", "is missing", """
        name = "wf"
        [[stage]]  # <-
        name = "a"
        tasks = { command = "x", count = 1 }
        """),
    case("allocation not a table", "stage.a.allocation", "must be a table, got an integer", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = 4  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("missing cores", "stage.a.allocation.cores", "is missing", """
        name = "wf"
        [[stage]]
        name = "a"
        [stage.allocation]  # <-
        time = "1h"
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("unknown allocation key", "stage.a.allocation.coers", "did you mean 'cores'?", """
        name = "wf"
        [[stage]]
        name = "a"
        [stage.allocation]
        coers = 4  # <-
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("cores zero", "stage.a.allocation.cores", "must be a positive integer, got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation.cores = 0  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("cores float", "stage.a.allocation.cores", "must be an integer or an expression", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 2.5 }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("cores not whole", "stage.a.allocation.cores",
         "'scale / 3' must be a whole number, got 9.33", """
        name = "wf"
        scale = 28
        [[stage]]
        name = "a"
        [stage.allocation]
        cores = "scale / 3"  # <-
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("negative cores expression", "stage.a.allocation.cores",
         "must be a positive integer, got -20", """
        name = "wf"
        scale = 8
        [[stage]]
        name = "a"
        [stage.allocation]
        cores = "scale - 28"  # <-
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("scale missing", "stage.a.allocation.cores", "uses scale, but no scale is set", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = "scale" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("power operator", "stage.a.allocation.cores", "only numbers, scale, + - * / //", """
        name = "wf"
        scale = 2
        [[stage]]
        name = "a"
        allocation = { cores = "scale ** 2" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("code in an expression", "stage.a.allocation.cores", "only numbers, scale", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = "__import__('os').getpid()" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("unknown name in expression", "stage.a.allocation.cores", "unknown name 'nodes'", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = "2 * nodes" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("nodes do not divide cores", "stage.a.allocation.nodes",
         "30 cores do not split evenly over 4 nodes", """
        name = "wf"
        [[stage]]
        name = "a"
        [stage.allocation]
        cores = 30
        nodes = 4  # <-
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("more nodes than cores", "stage.a.allocation.nodes", "4 nodes cannot share 2 cores", """
        name = "wf"
        [[stage]]
        name = "a"
        [stage.allocation]
        cores = 2
        nodes = 4  # <-
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("memory unit", "stage.a.allocation.memory", "unknown unit 'X' in '4X'", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, memory = "4X" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("memory zero", "stage.a.allocation.memory", "must be a positive integer, got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, memory = "0G" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("memory bool", "stage.a.allocation.memory", "got a boolean", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, memory = false }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("time unreadable", "stage.a.allocation.time", "cannot read '1:xx'", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = "1:xx" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("time negative", "stage.a.allocation.time", "must be a positive number, got -5", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = -5 }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("time unit", "stage.a.allocation.time", "unknown unit 'hours'", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = "2 hours" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("empty partition", "stage.a.allocation.partition", "non-empty string without spaces", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, partition = "" }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("account type", "stage.a.allocation.account", "must be a string, got an integer", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, account = 42 }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("sbatch not a list", "stage.a.allocation.sbatch", "must be an array of strings", """
        name = "wf"
        [[stage]]
        name = "a"
        [stage.allocation]
        cores = 1
        sbatch = "--exclusive"  # <-
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("sbatch managed option", "stage.a.allocation.sbatch[2]",
         "--time is set by leadtime: use the allocation's time", """
        name = "wf"
        [[stage]]
        name = "a"
        [stage.allocation]
        cores = 1
        sbatch = [
          "--exclusive",
          "--time=10",  # <-
        ]
        [stage.tasks]
        command = "x"
        count = 1
        """),
    case("sbatch short managed option", "stage.a.allocation.sbatch[1]",
         "-N is set by leadtime", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, sbatch = ["-N2"] }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("sbatch not an option", "stage.a.allocation.sbatch[1]",
         "'exclusive' is not an sbatch option", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, sbatch = ["exclusive"] }  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("missing tasks", "stage.a.tasks", "is missing", """
        name = "wf"
        [[stage]]  # <-
        name = "a"
        allocation = { cores = 1 }
        """),
    case("missing command", "stage.a.tasks.command", "is missing", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]  # <-
        count = 1
        """),
    case("unknown task key", "stage.a.tasks.comand", "did you mean 'command'?", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { comand = "x", count = 1 }  # <-
        """),
    case("empty command", "stage.a.tasks.command", "must be a non-empty string", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "  ", count = 1 }  # <-
        """),
    case("items and count", "stage.a.tasks.count", "give either items or count, not both", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        items = ["p", "q"]
        count = 2  # <-
        """),
    case("empty items", "stage.a.tasks.items", "is empty", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", items = [] }  # <-
        """),
    case("item of a wrong type", "stage.a.tasks.items[3]",
         "must be a string or an integer, got a number", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {item}"
        items = [
          "p",
          7,
          2.5,  # <-
        ]
        """),
    case("range arity", "stage.a.tasks.items.range",
         "must be [start, stop] or [start, stop, step]", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", items = { range = [5] } }  # <-
        """),
    case("empty range", "stage.a.tasks.items.range", "range(3, 3) is empty", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        items = { range = [3, 3] }  # <-
        """),
    case("range step zero", "stage.a.tasks.items.range[3]", "step must not be 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        items = { range = [0, 10, 0] }  # <-
        """),
    case("range bound expression", "stage.a.tasks.items.range[2]", "uses scale, but no scale", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        items = { range = [0, "4 * scale"] }  # <-
        """),
    case("unknown items key", "stage.a.tasks.items.rnage", "did you mean 'range'?", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        items = { rnage = [0, 3] }  # <-
        """),
    case("range and glob", "stage.a.tasks.items", "give exactly one of range or glob", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        items = { range = [0, 3], glob = "*" }  # <-
        """),
    case("glob matching nothing", "stage.a.tasks.items.glob",
         "'data/*.fits' matches nothing in", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {item}"
        items = { glob = "data/*.fits" }  # <-
        """),
    case("count zero", "stage.a.tasks.count", "must be a positive integer, got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 0 }  # <-
        """),
    case("count expression without scale", "stage.a.tasks.count",
         "uses scale, but no scale is set", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        count = "2 * scale"  # <-
        """),
    case("unknown placeholder", "stage.a.tasks.command",
         "unknown placeholder {itme} (did you mean {item}?)", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {itme}"  # <-
        items = ["p"]
        """),
    case("braces of awk", "stage.a.tasks.command",
         "unknown placeholder {print $1} (braces of awk or the shell are written twice: {{ and }})",
         """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "awk '{print $1}' {item}"  # <-
        items = ["p"]
        """),
    case("unmatched brace", "stage.a.tasks.command", "unmatched '}'", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {item} }"  # <-
        items = ["p"]
        """),
    case("unclosed brace", "stage.a.tasks.command", "expected '}' before end of string", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {item"  # <-
        items = ["p"]
        """),
    case("item placeholder with count", "stage.a.tasks.command", "{item} needs items", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {item}"  # <-
        count = 3
        """),
    case("item's stem in outputs with count", "stage.a.tasks.outputs", "{item.stem} needs", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x"
        count = 3
        outputs = ["out/{item.stem}.txt"]  # <-
        """),
    case("bad format spec", "stage.a.tasks.command", "bad format spec 'q'", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {index:q}"  # <-
        count = 3
        """),
    case("a number's spec over an item that is text", "stage.a.tasks.outputs[2]",
         "{item:03d} formats a whole number, but item 'b7' is not one", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x {item}"
        items = ["7", "b7"]
        outputs = ["log/{item}.txt", "out/{item:03d}.txt"]  # <-
        """),
    case("an item inside shell quotes", "stage.a.tasks.command",
         "{item.stem} is inside shell quotes, where the quotes leadtime puts around 'a b' (of "
         "item 'in/a b.txt') would be read as part of it: write the placeholder outside", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "tr a-z A-Z < {item} > 'out/{item.stem}.up'"  # <-
        items = ["in/a.txt", "in/a b.txt"]
        """),
    case("task cores above allocation", "stage.a.tasks.cores",
         "a task declares 8 cores but the allocation has 4", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        [stage.tasks]
        command = "x"
        count = 1
        cores = 8  # <-
        """),
    case("task cores above a node", "stage.a.tasks.cores", "the allocation has 4 per node", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 16, nodes = 4 }
        [stage.tasks]
        command = "x"
        count = 1
        cores = 6  # <-
        """),
    case("task memory above a node", "stage.a.tasks.memory",
         "a task declares 3000 MB but the allocation has 2000 MB per node", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 2, nodes = 2, memory = "4G" }
        tasks = { command = "x", count = 1, memory = "3G" }  # <-
        """),
    case("task wall above time limit", "stage.a.tasks.wall",
         "3600 s of wall time but the allocation's", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1, time = "30m" }
        tasks = { command = "x", count = 1, wall = "1h" }  # <-
        """),
    case("task disk zero", "stage.a.tasks.disk", "must be a positive number, got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1, disk = 0 }  # <-
        """),
    case("max attempts zero", "stage.a.tasks.max_attempts",
         "must be a positive integer, got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1, max_attempts = 0 }  # <-
        """),
    case("empty category", "stage.a.tasks.category", "must be a non-empty string", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1, category = "" }  # <-
        """),
    case("after not a list", "stage.b.after", "must be an array of stage names", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "b"
        after = "a"  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("unknown after", "stage.b.after[2]", "unknown stage 'aa' (did you mean 'a'?)", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "b"
        after = [
          "a",
          "aa",  # <-
        ]
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("after listed twice", "stage.b.after[2]", "'a' is listed twice", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "b"
        after = ["a", "a"]  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("after itself", "stage.b.after[1]", "a stage cannot run after itself", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "b"
        after = ["b"]  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("cycle", "stage.a.after",
         "cycle: 'a' runs after 'c', which runs after 'b', which runs after 'a'", """
        name = "wf"
        [[stage]]
        name = "a"
        after = ["c"]  # <-
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        [[stage]]
        name = "b"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        [[stage]]
        name = "c"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("unknown simulate key", "stage.a.simulate.durration", "did you mean 'duration'?", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [stage.simulate]
        durration = "normal(10, 1)"  # <-
        """),
    case("distribution arity", "stage.a.simulate.duration",
         "normal takes 2 arguments (mean, sd), got 1", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [stage.simulate]
        memory = 300
        duration = "normal(10)"  # <-
        """),
    case("unknown distribution", "stage.a.simulate.memory", "unknown distribution 'gauss'", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        simulate = { memory = "gauss(1, 2)" }  # <-
        """),
    case("negative sd", "stage.a.simulate.disk", "normal: sd must be ≥ 0, got -1", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        simulate.disk = "normal(10, -1)"  # <-
        """),
    case("distribution type", "stage.a.simulate.cores", "must be a distribution such as", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        simulate = { cores = [1, 2] }  # <-
        """),
    case("missing trace", "stage.a.simulate.trace", "no such file", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [stage.simulate]
        trace = "traces/none.csv"  # <-
        """),
    case("trace and distributions", "stage.a.simulate.trace", "give a trace or distributions", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [stage.simulate]
        duration = 5
        trace = "wf.toml"  # <-
        """),
    case("sub-table of the second stage", "stage.b.allocation.cores",
         "must be a positive integer", """
        name = "wf"

        [[stage]]
        name = "a"
        allocation = { cores = 4 }
        tasks = { command = "run {index}", count = 2 }
        [[stage]]
        name = "b"
        [stage.tasks]
        command = "x"
        count = 1
        [stage.allocation]
        cores = -1  # <-
        """),
    case("quoted and spaced dotted keys", "stage.a.allocation.cores", "got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        "allocation" . cores = 0  # <-
        tasks = { command = "x", count = 1 }
        """),
    case("first error in file order: semantic before syntax", "stage.a.allocation.cores",
         "got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 0 }  # <-
        tasks = { command = "x", count = 1 }
        simulate = { duration = "normal(1)" }
        """),
    case("first error in file order: later stage name", "stage.a.tasks.count", "got 0", """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 0 }  # <-
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        tasks = { command = "x", count = 1 }
        """),
    case("multi-line string does not fool the locator", "stage.a.tasks.count", "got 0", r'''
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = """
        run \
          [[stage]] x = 1
        """
        count = 0  # <-
        ''', eof_newline=True),
]
# fmt: on


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert len(lines) == 1, "a corpus entry marks exactly one line"
    return lines[0]


@pytest.mark.parametrize(("case", "field", "message", "text"), CORPUS, ids=[c[0] for c in CORPUS])
def test_malformed_workflow_names_field_and_line(case, field, message, text, tmp_path):
    path = tmp_path / "wf.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load(path)
    e = caught.value
    assert (e.field, e.line) == (field, marked_line(text)), str(e)
    assert message in e.message
    assert e.path == path
    prefix = f"{path}:{e.line}: {field}: " if field else f"{path}:{e.line}: "
    assert str(e) == prefix + e.message


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 30


def test_unreadable_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read the file") as e:
        load(tmp_path / "missing.toml")
    assert e.value.line is None
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="not UTF-8"):
        load(tmp_path / "binary.toml")


def test_string_source_appears_in_errors():
    with pytest.raises(SpecError) as e:
        loads("name = 3\n")
    assert str(e.value) == "<string>:1: name: must be a string, got an integer (3)"


# --- every valid feature ---------------------------------------------------------------------

FULL = """
name = "full"
scale = 8

[[stage]]
name = "prepare"
allocation = { cores = 1 }
tasks = { command = "prepare", count = 1 }

[[stage]]
name = "work"
[stage.allocation]
cores = "scale"
nodes = "scale // 4"
memory = "scale * 1.5G"
time = "1:30:00"
partition = "batch"
account = "proj-42"
qos = "normal"
sbatch = ["--exclusive", "--constraint=skylake"]
[stage.tasks]
command = "work --in {item} --n {index:03d} --stage {stage} --awk '{{print $1}}'"
items = ["a b.txt", "x;rm -rf ~", 7]
cores = 2
memory = "1500M"
disk = "2GiB"
wall = "1h 15m"
category = "heavy"
max_attempts = 5
[stage.simulate]
duration = "lognormal(300, 0.2)"
cores = 1.5
memory = "bimodal(400, 40, 1200, 100, 0.8)"
disk = "uniform(10, 20)"
input_size = "exponential(1e6)"

[[stage]]
name = "sweep"
after = ["prepare"]
allocation = { cores = "scale / 2", time = 600 }
tasks = { command = "sweep {item}", items = { range = [0, "2 * scale", 3] } }

[[stage]]
name = "report"
after = ["work", "sweep"]
allocation.cores = 1
allocation.time = "2-00:00:00"
tasks.command = "report"
tasks.count = "scale // 8"
"""


def test_every_feature_loads_into_the_model():
    w = loads(FULL)
    assert w.name == "full" and w.scale == 8 and w.source is None
    prepare, work, sweep, report = w.stages
    assert prepare.after == () and prepare.allocation == Allocation(cores=1)
    assert work.after == ("prepare",)  # sequential by default
    assert work.allocation == Allocation(
        cores=8,
        nodes=2,
        memory_mb=12000,
        time_limit_s=5400.0,
        partition="batch",
        account="proj-42",
        qos="normal",
        sbatch=("--exclusive", "--constraint=skylake"),
    )
    assert work.tasks.items == ("a b.txt", "x;rm -rf ~", "7")
    assert work.tasks.declared == {
        "cores": 2.0,
        "memory": 1500.0,
        "disk": pytest.approx(2147.483648),
        "wall": 4500.0,
    }
    assert (work.tasks.category, work.tasks.max_attempts) == ("heavy", 5)
    assert work.simulate == Simulation(
        duration=Distribution.parse("lognormal(300, 0.2)"),
        cores=Distribution.constant(1.5),
        memory=Distribution.parse("bimodal(400, 40, 1200, 100, 0.8)"),
        disk=Distribution.parse("uniform(10, 20)"),
        input_size=Distribution.parse("exponential(1000000)"),
    )
    assert sweep.after == ("prepare",)
    assert sweep.allocation == Allocation(cores=4, time_limit_s=600.0)
    assert sweep.tasks.items == ("0", "3", "6", "9", "12", "15")
    assert report.after == ("work", "sweep")
    assert report.allocation.time_limit_s == 2 * 86400
    assert report.tasks.count == 1 and report.tasks.items is None


def test_expansion_quotes_every_substituted_value():
    tasks = loads(FULL).stage("work").expand()
    assert [t.id for t in tasks] == ["work.0", "work.1", "work.2"]
    assert tasks[0].command == ("work --in 'a b.txt' --n 000 --stage work --awk '{print $1}'")
    assert tasks[1].command.startswith("work --in 'x;rm -rf ~' --n 001")
    assert shlex.split(tasks[1].command)[2] == "x;rm -rf ~"  # one harmless word
    assert (tasks[2].item, tasks[2].category, tasks[2].max_attempts) == ("7", "heavy", 5)
    assert tasks[2].declared == {
        "cores": 2.0,
        "memory": 1500.0,
        "disk": 2147.483648,
        "wall": 4500.0,
    }


def test_a_ranges_items_take_a_numbers_format_spec():
    stage = loads(
        """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "x q{item}.txt h{item:02d}"
        items = { range = [8, 11] }
        outputs = ["h{item:02d}"]
        """
    ).stage("a")
    assert [(t.command, t.outputs) for t in stage.expand()] == [
        ("x q8.txt h08", ("h08",)),
        ("x q9.txt h09", ("h09",)),
        ("x q10.txt h10", ("h10",)),
    ]


def test_placeholders_in_quotes_are_fine_where_no_value_needs_quoting():
    stage = loads(
        """
        name = "wf"
        [[stage]]
        name = "a"
        allocation = { cores = 1 }
        [stage.tasks]
        command = "echo \\"{item} {index}\\" > 'out/{item}.txt'"
        items = ["a", "b-2"]
        """
    ).stage("a")
    assert [t.command for t in stage.expand()] == [
        "echo \"a 0\" > 'out/a.txt'",
        "echo \"b-2 1\" > 'out/b-2.txt'",
    ]


def test_count_expansion_and_default_category():
    w = loads(FULL)
    (only,) = w.stage("report").expand()
    assert (only.id, only.command, only.category, only.item, only.declared) == (
        "report.0",
        "report",
        "report",
        None,
        {},
    )
    assert len(w.stage("sweep").expand()) == 6


@pytest.mark.parametrize(("scale", "cores", "sweep"), [(8, 8, 6), (16, 16, 11), (24, 24, 16)])
def test_scale_argument_overrides_the_file(scale, cores, sweep):
    w = loads(FULL, scale=scale)
    assert w.scale == scale
    assert w.stage("work").allocation.cores == cores
    assert len(w.stage("sweep").expand()) == sweep


def test_scale_argument_is_checked():
    with pytest.raises(SpecError, match="the scale asked for must be a positive integer"):
        loads(FULL, scale=0)


def test_scale_given_only_by_the_caller():
    text = 'name = "w"\n[[stage]]\nname = "a"\nallocation = { cores = "scale" }\n'
    text += 'tasks = { command = "x", count = "scale" }\n'
    assert loads(text, scale=3).stage("a").allocation.cores == 3
    assert loads(text, scale=3).scale == 3
    with pytest.raises(SpecError, match="no scale is set"):
        loads(text)


def test_glob_items_are_sorted_paths_beside_the_file(tmp_path):
    data = tmp_path / "data"
    (data / "deep").mkdir(parents=True)
    for name in ["b.fits", "a.fits", "my image.fits", "notes.txt", "deep/c.fits"]:
        (data / name).write_text("")
    path = tmp_path / "wf.toml"
    path.write_text(
        'name = "g"\n[[stage]]\nname = "p"\nallocation = { cores = 2 }\n'
        'tasks = { command = "mProjectPP {item} out/{index}.fits region.hdr", '
        'items = { glob = "data/**/*.fits" } }\n'
    )
    w = load(path)
    assert w.source == path
    assert w.stage("p").tasks.items == tuple(
        str(data / n) for n in ["a.fits", "b.fits", "deep/c.fits", "my image.fits"]
    )
    assert w.stage("p").expand()[3].command == (
        f"mProjectPP '{data}/my image.fits' out/3.fits region.hdr"
    )


def test_an_output_named_after_a_glob_item_uses_its_name(tmp_path):
    (tmp_path / "data").mkdir()
    for name in ["in1.txt", "in2.txt"]:
        (tmp_path / "data" / name).write_text("")
    path = tmp_path / "wf.toml"
    stage = (
        'name = "g"\n[[stage]]\nname = "sq"\nallocation = { cores = 1 }\n[stage.tasks]\n'
        'command = "square {item} > out/sq_{item.name}"\nitems = { glob = "data/*.txt" }\n'
    )
    path.write_text(stage + 'outputs = ["out/sq_{item.name}", "out/{item.stem}.log"]\n')
    tasks = load(path).stage("sq").expand()
    assert tasks[1].command == f"square {tmp_path}/data/in2.txt > out/sq_in2.txt"
    assert tasks[1].outputs == ("out/sq_in2.txt", "out/in2.log")

    path.write_text(stage + 'outputs = ["out/sq_{item}"]\n')
    with pytest.raises(SpecError) as e:
        load(path)
    assert e.value.line == 8 and e.value.field == "stage.sq.tasks.outputs[1]"
    assert (
        f"'out/sq_{{item}}' puts {{item}} after other text, but items here are absolute paths "
        f"(such as '{tmp_path}/data/in1.txt'), so it would name a path that ends in the item's "
        "whole path; for the item's file name write {item.name} ('out/sq_{item.name}')"
    ) in e.value.message

    path.write_text(stage + 'outputs = ["{item}.sq"]\n')  # beside the item: allowed
    assert load(path).stage("sq").expand()[0].outputs == (f"{tmp_path}/data/in1.txt.sq",)


def test_a_glob_over_files_an_earlier_stage_writes_is_refused_with_what_to_write_instead(
    tmp_path,
):
    path = tmp_path / "wf.toml"
    path.write_text(
        'name = "g"\n[[stage]]\nname = "gen"\nallocation = { cores = 1 }\n'
        'tasks = { command = "make-part {index} > parts/{index}.txt", count = 4 }\n'
        '[[stage]]\nname = "use"\nallocation = { cores = 1 }\n'
        'tasks = { command = "use {item}", items = { glob = "parts/*.txt" } }\n'
    )
    with pytest.raises(SpecError) as e:
        load(path)
    assert f"'parts/*.txt' matches nothing in {tmp_path} (a glob is expanded when" in str(e.value)
    assert "before any stage runs: for files an earlier stage writes, give count or range" in str(
        e.value
    )


def test_trace_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text(
        "category,cores,memory,disk,cpu_time,wall_time\nblast,1,900,10,50,60\n"
    )
    path = tmp_path / "wf.toml"
    path.write_text('name = "t"\n' + OK_STAGE + 'simulate = { trace = "traces/t.csv" }\n')
    assert load(path).stage("a").simulate == Simulation(trace=tmp_path / "traces" / "t.csv")


def test_after_empty_list_makes_a_root():
    text = 'name = "w"\n' + OK_STAGE + '[[stage]]\nname = "b"\nafter = []\n'
    text += 'allocation = { cores = 1 }\ntasks = { command = "x", count = 1 }\n'
    assert loads(text).stage("b").after == ()


def test_stages_may_run_after_later_stages():
    text = 'name = "w"\n[[stage]]\nname = "b"\nafter = ["a"]\n'
    text += 'allocation = { cores = 1 }\ntasks = { command = "x", count = 1 }\n'
    text += '[[stage]]\nname = "a"\nafter = []\nallocation = { cores = 1 }\n'
    text += 'tasks = { command = "x", count = 1 }\n'
    assert [s.after for s in loads(text).stages] == [("a",), ()]


def test_the_documented_example_loads():
    doc = (Path(__file__).parent.parent / "docs" / "workflows.md").read_text()
    first = re.search(r"```toml\n(.*?)```", doc, re.DOTALL)
    assert first is not None
    w = loads(first.group(1))
    assert [(s.name, s.after) for s in w.stages] == [("search", ()), ("merge", ("search",))]


# --- the Python API --------------------------------------------------------------------------


def python_full() -> Workflow:
    """FULL, built by hand."""
    return Workflow(
        name="full",
        scale=8,
        stages=(
            Stage("prepare", TaskTemplate("prepare", count=1), Allocation(cores=1)),
            Stage(
                "work",
                TaskTemplate(
                    "work --in {item} --n {index:03d} --stage {stage} --awk '{{print $1}}'",
                    items=("a b.txt", "x;rm -rf ~", "7"),
                    cores=2,
                    memory=1500,
                    disk=2 * 1024**3 / 1e6,
                    wall=4500,
                    category="heavy",
                    max_attempts=5,
                ),
                Allocation(
                    cores=8,
                    nodes=2,
                    memory_mb=12000,
                    time_limit_s=5400,
                    partition="batch",
                    account="proj-42",
                    qos="normal",
                    sbatch=("--exclusive", "--constraint=skylake"),
                ),
                after=("prepare",),
                simulate=Simulation(
                    duration=Distribution("lognormal", (300, 0.2)),
                    cores=Distribution.constant(1.5),
                    memory=Distribution("bimodal", (400, 40, 1200, 100, 0.8)),
                    disk=Distribution("uniform", (10, 20)),
                    input_size=Distribution("exponential", (1e6,)),
                ),
            ),
            Stage(
                "sweep",
                TaskTemplate("sweep {item}", items=tuple(str(i) for i in range(0, 16, 3))),
                Allocation(cores=4, time_limit_s=600),
                after=("prepare",),
            ),
            Stage(
                "report",
                TaskTemplate("report", count=1),
                Allocation(cores=1, time_limit_s=2 * 86400),
                after=("work", "sweep"),
            ),
        ),
    )


def test_python_api_builds_the_same_objects_as_toml():
    built = python_full()
    validate(built)
    assert loads(FULL) == built
    assert [s.expand() for s in loads(FULL).stages] == [s.expand() for s in built.stages]


def test_loaded_workflows_validate():
    validate(loads(FULL))


def replace_stage(w: Workflow, stage: str, /, **changes) -> Workflow:
    stages = tuple(dataclasses.replace(s, **changes) if s.name == stage else s for s in w.stages)
    return dataclasses.replace(w, stages=stages)


def replace_part(w: Workflow, stage: str, part: str, /, **changes) -> Workflow:
    old = getattr(w.stage(stage), part)
    return replace_stage(w, stage, **{part: dataclasses.replace(old, **changes)})


# (TOML edit of FULL, the same defect made in Python): both must give the same field and message
SAME_ERRORS = [
    (("cores = \"scale\"\nnodes = \"scale // 4\"", "cores = 0\nnodes = \"scale // 4\""),
     lambda w: replace_part(w, "work", "allocation", cores=0)),
    (('nodes = "scale // 4"', "nodes = 3"),
     lambda w: replace_part(w, "work", "allocation", nodes=3)),
    (('memory = "scale * 1.5G"', "memory = -5"),
     lambda w: replace_part(w, "work", "allocation", memory_mb=-5)),
    (('time = "1:30:00"', "time = 0"),
     lambda w: replace_part(w, "work", "allocation", time_limit_s=0)),
    (('partition = "batch"', 'partition = "a b"'),
     lambda w: replace_part(w, "work", "allocation", partition="a b")),
    (('sbatch = ["--exclusive", ', 'sbatch = ["--mem=1G", '),
     lambda w: replace_part(w, "work", "allocation", sbatch=("--mem=1G", "--constraint=skylake"))),
    (('cores = 2\n', "cores = 9\n"), lambda w: replace_part(w, "work", "tasks", cores=9)),
    (('wall = "1h 15m"', 'wall = "3h"'), lambda w: replace_part(w, "work", "tasks", wall=10800)),
    (('max_attempts = 5', "max_attempts = 0"),
     lambda w: replace_part(w, "work", "tasks", max_attempts=0)),
    (('items = ["a b.txt", "x;rm -rf ~", 7]', 'items = ["a b.txt", "x;rm -rf ~", 7]\ncount = 3'),
     lambda w: replace_part(w, "work", "tasks", count=3)),
    (('tasks.count = "scale // 8"', "tasks.count = 0"),
     lambda w: replace_part(w, "report", "tasks", count=0)),
    (('command = "work --in {item}', 'command = "work --in {itme}'),
     lambda w: replace_part(w, "work", "tasks", command="work --in {itme}")),
    (('name = "sweep"', 'name = "prepare"'), lambda w: replace_stage(w, "sweep", name="prepare")),
    (('name = "sweep"', 'name = "swe ep"'), lambda w: replace_stage(w, "sweep", name="swe ep")),
    (('after = ["work", "sweep"]', 'after = ["work", "swep"]'),
     lambda w: replace_stage(w, "report", after=("work", "swep"))),
    (('after = ["prepare"]', 'after = ["report"]'),
     lambda w: replace_stage(w, "sweep", after=("report",))),
    (('input_size = "exponential(1e6)"', 'input_size = "exponential(1e6)"\ntrace = "x.csv"'),
     lambda w: replace_part(w, "work", "simulate", trace=Path("x.csv"))),
    # the bounds, the same for a file and for Python
    (('name = "sweep"', f'name = "{"s" * 65}"'),
     lambda w: replace_stage(w, "sweep", name="s" * 65)),
    (('time = "1:30:00"', 'time = "366d"'),
     lambda w: replace_part(w, "work", "allocation", time_limit_s=366 * 86400)),
    (('wall = "1h 15m"', 'wall = "400d"'),
     lambda w: replace_part(w, "work", "tasks", wall=400 * 86400)),
    (('tasks.count = "scale // 8"', "tasks.count = 1000001"),
     lambda w: replace_part(w, "report", "tasks", count=1_000_001)),
    (('partition = "batch"', f'partition = "{"p" * 256}"'),
     lambda w: replace_part(w, "work", "allocation", partition="p" * 256)),
    (('command = "work --in {item}', f'command = "{"x" * 131_100} {{item}}'),
     lambda w: replace_part(w, "work", "tasks", command="x" * 131_100 + " " + w.stage("work")
                            .tasks.command.removeprefix("work --in "))),
    (('sbatch = ["--exclusive", ', 'sbatch = [' + '"--exclusive", ' * 100),
     lambda w: replace_part(w, "work", "allocation",
                            sbatch=("--exclusive",) * 100 + ("--constraint=skylake",))),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "defect"), SAME_ERRORS)
def test_validate_catches_what_the_loader_catches(edit, defect):
    old, new = edit
    assert FULL.count(old) == 1
    with pytest.raises(SpecError) as from_toml:
        loads(FULL.replace(old, new))
    with pytest.raises(SpecError) as from_python:
        validate(defect(python_full()))
    assert from_python.value.field == from_toml.value.field
    if "trace" not in from_toml.value.field:  # the file resolves the path, Python does not
        assert from_python.value.message == from_toml.value.message
    assert from_python.value.line is None and from_python.value.path is None


@pytest.mark.parametrize(
    ("workflow", "field", "message"),
    [
        (Workflow("w", ()), "stage", "at least one stage"),
        (Workflow("w", list(python_full().stages)), "stage", "must be a tuple of Stage"),
        (Workflow("w w", python_full().stages), "name", "must be letters"),
        (Workflow("w", python_full().stages, scale=0), "scale", "positive integer"),
        (Workflow("w", ("not a stage",)), "stage[1]", "must be a Stage"),  # type: ignore[arg-type]
        (replace_stage(python_full(), "sweep", after=["prepare"]), "stage.sweep.after", "tuple"),
        (replace_stage(python_full(), "sweep", allocation=None), "stage.sweep.allocation",
         "must be a Allocation"),
        (replace_part(python_full(), "sweep", "tasks", items=("0", 1)), "stage.sweep.tasks.items",
         "tuple of strings"),
        (replace_part(python_full(), "sweep", "tasks", items=()), "stage.sweep.tasks.items",
         "is empty"),
        (replace_part(python_full(), "work", "allocation", cores=True),
         "stage.work.allocation.cores", "positive integer"),
        (replace_part(python_full(), "work", "simulate", memory="normal(1, 2)"),
         "stage.work.simulate.memory", "must be a Distribution"),
    ],
)  # fmt: skip
def test_validate_rejects_hand_built_mistakes(workflow, field, message):
    with pytest.raises(SpecError) as e:
        validate(workflow)
    assert e.value.field == field
    assert message in e.value.message
    assert str(e.value) == f"{field}: {e.value.message}"


def _stages(n: int, count: int = 1) -> tuple[Stage, ...]:
    return tuple(
        Stage(f"s{i}", TaskTemplate("x", count=count), Allocation(cores=1)) for i in range(n)
    )


@pytest.mark.parametrize(
    ("workflow", "field", "message"),
    [
        (Workflow("w", _stages(257)), "stage.s256", "more than 256 stages"),
        (Workflow("w", _stages(3, count=1_000_000)), "stage.s2.tasks",
         "brings the workflow to 3,000,000 tasks: a workflow has at most 2,000,000"),
        (Workflow("w", (Stage("a", TaskTemplate("x {item}", items=("i",) * 1_000_001),
                              Allocation(cores=1)),)),
         "stage.a.tasks.items", "1,000,001 items: a stage has at most 1,000,000 tasks"),
        (Workflow("w", (Stage("a", TaskTemplate("x {item} {item}", items=("y" * 70_000,)),
                              Allocation(cores=1)),)),
         "stage.a.tasks.command", "may take 140,003 bytes once filled in"),
        (Workflow("w", (Stage("a", TaskTemplate("x", count=1, category="c" * 256),
                              Allocation(cores=1)),)),
         "stage.a.tasks.category", "is 256 bytes long: at most 255"),
        (Workflow("w", (Stage("a", TaskTemplate("x", count=1), Allocation(cores=2**63)),)),
         "stage.a.allocation.cores", "must fit in 64 bits"),
    ],
)  # fmt: skip
def test_validate_holds_python_workflows_to_the_bounds(workflow, field, message):
    with pytest.raises(SpecError) as e:
        validate(workflow)
    assert (e.value.field, message in e.value.message) == (field, True), str(e.value)


def test_a_stage_with_neither_items_nor_count_runs_its_command_once():
    w = loads(
        'name = "w"\n[[stage]]\nname = "merge"\nallocation = { cores = 1 }\n'
        'tasks = { command = "cat parts/* > all.txt", outputs = ["all.txt"] }\n'
    )
    (only,) = w.stage("merge").expand()
    assert (w.stages[0].tasks.size, only.id, only.outputs) == (1, "merge.0", ("all.txt",))


def test_the_task_count_is_known_without_making_the_tasks():
    w = loads('name = "w"\n' + OK_STAGE.replace("count = 2", "count = 1000000"))
    assert w.stages[0].tasks.size == 1_000_000
    assert loads(FULL).stages[1].tasks.size == 3


def test_a_loaded_workflow_knows_where_each_stage_field_is(tmp_path):
    path = tmp_path / "wf.toml"
    path.write_text(
        'name = "w"\n\n[[stage]]\nname = "a"\nallocation = { cores = 4 }\n'
        'tasks = { command = "x", count = 2, cores = 1 }\n\n[[stage]]\nname = "b"\n'
        '[stage.allocation]\ncores = 8\nmemory = "16G"\n[stage.tasks]\ncommand = "y"\ncount = 1\n'
    )
    w = load(path)
    assert w.where("a", "allocation", "cores") == f"{path}:5: stage.a.allocation.cores"
    assert w.where("a", "tasks", "cores") == f"{path}:6: stage.a.tasks.cores"
    assert w.where("a", "allocation", "memory") == f"{path}:5: stage.a.allocation.memory"
    assert w.where("b", "allocation", "memory") == f"{path}:12: stage.b.allocation.memory"
    assert w.where("b", "name") == f"{path}:9: stage.b.name"
    assert loads(path.read_text()).where("b", "name") == "stage.b.name"  # no file: no line


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ("--mem", "stage.b.allocation.memory"),
        ("mem", "stage.b.allocation.memory"),
        ("memory", "stage.b.allocation.memory"),
        ("-n", "stage.b.allocation.cores"),
        ("--ntasks", "stage.b.allocation.cores"),
        ("cores", "stage.b.allocation.cores"),
        ("--nodes", "stage.b.allocation.nodes"),
        ("-t", "stage.b.allocation.time"),
        ("--partition", "stage.b.allocation.partition"),
        ("--job-name", "stage.a.name"),  # not one stage's value: the first stage's field
        ("--constraint", "stage.a.allocation"),
        (None, "stage.a.allocation"),
    ],
)
def test_a_refused_option_names_the_field_of_the_stage_that_set_it(option, field):
    w = loads(
        'name = "w"\n[[stage]]\nname = "a"\nallocation = { cores = 4, memory = "1G" }\n'
        'tasks = { command = "x", count = 1 }\n[[stage]]\nname = "b"\n'
        'allocation = { cores = 8, memory = "2G", nodes = 2, time = "2h", partition = "p" }\n'
        'tasks = { command = "x", count = 1 }\n'
    )
    big = w.stage("b").allocation  # a big job of both stages takes b's geometry
    assert w.refused(("a", "b"), option, big) == field
