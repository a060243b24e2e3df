"""The limits a workflow must stay within, each with the reason for its value.

They are checked before anything is expanded, globbed or submitted, so a hostile or
mistyped file is refused in well under a second instead of exhausting memory, walking
the whole file system or filling the queue. ``docs/workflows.md`` lists them for users.
"""

from __future__ import annotations

FILE_BYTES = 64 * 2**20
"""A workflow file: 64 MiB holds a generated list of a million input paths of 60
characters; larger item sets are written as a glob or a range."""

DEPTH = 32
"""Tables, arrays and dotted key parts nested in one value: a workflow's deepest key has
six levels (``stage[i].tasks.items.range[j]``); the limit keeps TOML parsing linear."""

INT64 = 2**63 - 1
"""TOML integers are 64-bit signed (the specification requires larger ones be refused);
so are values computed from expressions, as Slurm and the store hold them."""

STAGES = 256
"""Stages in a workflow: each is a pilot job and a step of the planner's critical-path
walk; staged workflows have a handful to a few dozen (Montage 9, CyberShake 5)."""

TASKS_PER_STAGE = 1_000_000
"""Tasks of one stage: a million-task stage is legitimate (one task per input file)."""

TASKS = 2_000_000
"""Tasks of a workflow: the manager holds every task in memory, about 1 KB each, so
two million tasks take about 2 GB, what one process on a login node may use."""

NAME = 64
"""Workflow and stage names, in characters: a pilot is named ``lt-<run id>-<stage>-<n>``
and writes ``<pilot>-<job id>.out``; 64 keeps that far inside Slurm's 255-byte job
names (its accounting database's limit) and the file system's 255-byte file names."""

WORD = 255
"""Partition, account, QOS and category, in bytes: Slurm's accounting keeps such names
in 255 bytes."""

SBATCH_OPTIONS = 100
SBATCH_OPTION_BYTES = 4096
"""Extra sbatch options: they go on sbatch's command line, which Linux limits to
2 MB in all (ARG_MAX); 100 options of 4 KiB stay well inside it."""

COMMAND_BYTES = 128 * 2**10 - 1
"""A task's command once its placeholders are filled, in bytes: it is passed to the shell
as one argument (``sh -c COMMAND``), and Linux limits one argument to 128 KiB including
its terminating NUL (MAX_ARG_STRLEN)."""

FORMAT_WIDTH = 100
"""Width and precision of a placeholder's format spec (``{index:06d}``): padding needs a
few digits; a width of millions would build a huge command before any check."""

EXPRESSION_CHARS = 256
EXPRESSION_DEPTH = 32
"""An expression such as ``"scale * 4G + 2h"``: real ones have a few terms; the limits
keep parsing and evaluating them instant and far from Python's recursion limit."""

DURATION_S = 365 * 86400.0
"""A pilot's time limit or a task's wall time: no site runs jobs for over a year, so a
longer one is a typo (``1000000000d``)."""

GLOB_ENTRIES = 200_000
GLOB_SECONDS = 0.5
"""A glob visits at most 200,000 directory entries and stops after half a second, so
``**`` over a large tree is refused at once rather than walked for hours, on a local or
a parallel file system; larger input sets are written as a range or a list."""
