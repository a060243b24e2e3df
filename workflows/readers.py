"""How TOML values become model values: numbers with units and ``scale``, items, paths.

Each reader takes the raw value of one key and a :class:`Context`, and returns
the model value or raises ValueError; :class:`Invalid` also says where below
the key the problem is (``items[3]``, ``items.range``).
"""

from __future__ import annotations

import difflib
import glob
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflows import quantity
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
    if isinstance(raw, int):
        return raw
    return quantity.whole(quantity.evaluate(raw, scale=ctx.scale), repr(raw))


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
    """A list of strings (or integers), ``{ range = [a, b, step] }`` or ``{ glob = ... }``."""
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
    check_keys(raw, ("range", "glob"))
    if len(raw) != 1:
        raise Invalid("give exactly one of range or glob")
    if "range" in raw:
        return read_range(raw["range"], ctx)
    return read_glob(raw["glob"], ctx)


def read_range(raw: Any, ctx: Context) -> tuple[str, ...]:
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise Invalid(f"must be [start, stop] or [start, stop, step], got {raw!r}", at=("range",))
    bounds = []
    for i, bound in enumerate(raw):
        try:
            bounds.append(read_int(bound, ctx))
        except ValueError as e:
            raise Invalid(str(e), at=("range", i)) from None
    if len(bounds) == 3 and bounds[2] == 0:
        raise Invalid("step must not be 0", at=("range", 2))
    numbers = range(*bounds)
    if not numbers:
        raise Invalid(f"range{tuple(bounds)} is empty (stop is exclusive)", at=("range",))
    return tuple(str(n) for n in numbers)


def read_glob(raw: Any, ctx: Context) -> tuple[str, ...]:
    if not isinstance(raw, str) or not raw:
        raise Invalid(f"must be a non-empty string, got {quantity.describe(raw)}", at=("glob",))
    pattern = os.path.join(glob.escape(str(ctx.base_dir)), os.path.expanduser(raw))
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
        raise Invalid(f"{raw!r} matches nothing in {ctx.base_dir}", at=("glob",))
    return tuple(matches)


def read_distribution(raw: Any, ctx: Context) -> Distribution:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Distribution.constant(raw)
    if not isinstance(raw, str):
        raise Invalid(
            f'must be a distribution such as "normal(300, 30)", got {quantity.describe(raw)}'
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
            raise Invalid(f"unknown key {key!r}{hint}", at=(key,))
