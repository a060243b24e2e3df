"""How TOML values become model values: numbers with units and ``scale``, items, paths.

Each reader takes the raw value of one key and a :class:`Context`, and returns
the model value or raises ValueError; :class:`Invalid` also says where below
the key the problem is (``items[3]``, ``items.range``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflows import bounds, globs, quantity
from workflows.synthetic import Distribution
from workflows.toml_lines import KeyPath


class Invalid(ValueError):
    """A conversion error at ``at`` below the field being converted (e.g. an array element)."""

    def __init__(self, message: str, at: KeyPath = ()) -> None:
        super().__init__(message)
        self.at = at


@dataclass(frozen=True, slots=True)
class Context:
    """What readers need besides the value: ``scale`` for expressions, and the directory
    relative globs and paths start from."""

    scale: int | None
    base_dir: Path


Read = Callable[[Any, Context], Any]


def read_str(raw: Any, ctx: Context) -> str:
    if not isinstance(raw, str):
        raise Invalid(f"must be a string, got {quantity.describe(raw)}")
    return raw


def read_int(raw: Any, ctx: Context) -> int:
    """An integer, or an expression in ``scale`` whose value is whole."""
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise Invalid(
            f'must be an integer or an expression such as "scale / 4", got {quantity.describe(raw)}'
        )
    if isinstance(raw, str):
        raw = quantity.whole(quantity.evaluate(raw, scale=ctx.scale), repr(raw))
    if not -bounds.INT64 - 1 <= raw <= bounds.INT64:
        raise Invalid(f"must fit in 64 bits (at most {bounds.INT64:,}), got {raw:.6g}")
    return raw


def read_number(raw: Any, ctx: Context) -> float:
    return quantity.evaluate(raw, scale=ctx.scale)


def read_size(raw: Any, ctx: Context) -> float:
    return quantity.size_mb(raw, scale=ctx.scale)


def read_whole_mb(raw: Any, ctx: Context) -> int:
    return math.ceil(quantity.size_mb(raw, scale=ctx.scale))


def read_seconds(raw: Any, ctx: Context) -> float:
    return quantity.seconds(raw, scale=ctx.scale)


def read_options(raw: Any, ctx: Context) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise Invalid(f"must be an array of strings, got {quantity.describe(raw)}")
    for i, option in enumerate(raw):
        if not isinstance(option, str):
            raise Invalid(f"must be a string, got {quantity.describe(option)}", at=(i,))
    return tuple(raw)


def read_names(raw: Any, ctx: Context) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise Invalid(
            f'must be an array of stage names, e.g. ["split"], got {quantity.describe(raw)}'
        )
    for i, name in enumerate(raw):
        if not isinstance(name, str):
            raise Invalid(f"must be a stage name, got {quantity.describe(name)}", at=(i,))
    return tuple(raw)


def read_items(raw: Any, ctx: Context) -> tuple[str, ...]:
    """A list of strings (or integers), ``{ range = [a, b, step] }`` or
    ``{ glob = ..., root = ... }``; a range is counted before it is expanded."""
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise Invalid(
                    f"must be a string or an integer, got {quantity.describe(item)}", at=(i,)
                )
        return tuple(str(item) for item in raw)
    if not isinstance(raw, dict):
        raise Invalid(
            'must be an array, { range = [start, stop] } or { glob = "pattern" }, '
            f"got {quantity.describe(raw)}"
        )
    check_keys(raw, ("range", "glob", "root"))
    if ("range" in raw) == ("glob" in raw):
        raise Invalid("give exactly one of range or glob")
    if "range" in raw:
        if "root" in raw:
            raise Invalid("root is the directory a glob searches: a range has none", at=("root",))
        return read_range(raw["range"], ctx)
    root = read_root(raw["root"], ctx) if "root" in raw else None
    return read_glob(raw["glob"], ctx, root)


def read_range(raw: Any, ctx: Context) -> tuple[str, ...]:
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise Invalid(
            f"must be [start, stop] or [start, stop, step], got {quantity.shown(raw)}",
            at=("range",),
        )
    ends = []
    for i, bound in enumerate(raw):
        try:
            ends.append(read_int(bound, ctx))
        except ValueError as e:
            raise Invalid(str(e), at=("range", i)) from None
    if len(ends) == 3 and ends[2] == 0:
        raise Invalid("step must not be 0", at=("range", 2))
    start, stop, step = (*ends, 1)[:3]
    count = max(0, (stop - start + step - (1 if step > 0 else -1)) // step)
    if count == 0:
        raise Invalid(f"range{tuple(ends)} is empty (stop is exclusive)", at=("range",))
    if count > bounds.TASKS_PER_STAGE:
        raise Invalid(
            f"range{tuple(ends)} has {count:,} numbers: a stage has at most "
            f"{bounds.TASKS_PER_STAGE:,} tasks",
            at=("range",),
        )
    return tuple(map(str, range(start, stop, step)))


def read_root(raw: Any, ctx: Context) -> Path:
    """The directory a glob searches instead of the workflow's: naming it allows leaving."""
    if not isinstance(raw, str) or not raw:
        raise Invalid(f"must be a directory, got {quantity.describe(raw)}", at=("root",))
    root = ctx.base_dir / Path(raw).expanduser()
    if not root.is_dir():
        raise Invalid(f"no such directory: {quantity.shown(str(root))}", at=("root",))
    return root


def read_glob(raw: Any, ctx: Context, root: Path | None = None) -> tuple[str, ...]:
    if not isinstance(raw, str) or not raw:
        raise Invalid(f"must be a non-empty string, got {quantity.describe(raw)}", at=("glob",))
    where = root or ctx.base_dir
    if globs.escapes(raw):
        raise Invalid(
            f"{quantity.shown(raw)} leaves the directory it searches ({where}): give the "
            'directory as root = "..." and the pattern below it',
            at=("glob",),
        )
    try:
        matches = globs.bounded_glob(where, raw)
    except globs.GlobError as e:
        raise Invalid(str(e), at=("glob",)) from None
    if not matches:
        raise Invalid(
            f"{quantity.shown(raw)} matches nothing in {where} (a glob is expanded when the "
            "file is read, before any stage runs: for files an earlier stage writes, give "
            "count or range and write their names in the command)",
            at=("glob",),
        )
    return tuple(matches)


def read_distribution(raw: Any, ctx: Context) -> Distribution:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Distribution.constant(raw)
    if not isinstance(raw, str) or len(raw) > bounds.EXPRESSION_CHARS:
        raise Invalid(
            'must be a distribution such as "normal(300, 30)" (at most '
            f"{bounds.EXPRESSION_CHARS} characters), got {quantity.describe(raw)}"
        )
    return Distribution.parse(raw)


def read_path(raw: Any, ctx: Context) -> Path:
    return ctx.base_dir / Path(read_str(raw, ctx)).expanduser()


def check_keys(table: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise :class:`Invalid` at the first key of ``table`` not in ``known``."""
    known = tuple(known)
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(known)}"
            raise Invalid(f"unknown key {quantity.shown(key)}{hint}", at=(key,))
