"""Numbers in workflow files: sizes, durations and arithmetic on the ``scale`` factor.

A quantity is a plain number or a string holding a small expression: numbers
(optionally with a unit), the name ``scale``, ``+ - * / //`` and parentheses,
e.g. ``"scale / 4"``, ``"scale * 4G"``, ``"2h + 30m"``. Expressions are parsed
with :mod:`ast` and evaluated by walking the tree; nothing is ever ``eval``-ed.

Sizes are in MB with decimal units (1 G = 1000 M, as the rest of leadtime and
as cctools count): a request of ``128G`` then fits a node Slurm reports as
128000 MB. Binary units (``KiB``, ``MiB``, ``GiB``, ``TiB``) are there for exact
powers of two. Durations are in seconds; Slurm's clock forms ``MM:SS``,
``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` and ``D-HH:MM:SS`` are read too (a bare
number is seconds, not Slurm's minutes), each field checked: minutes and seconds
below 60, hours below 24 after days.

Expressions are at most :data:`~workflows.bounds.EXPRESSION_CHARS` characters and
:data:`~workflows.bounds.EXPRESSION_DEPTH` levels deep, and their values finite.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import reprlib
from collections.abc import Mapping

from workflows import bounds

SIZE_UNITS: Mapping[str, float] = {
    "K": 1e-3, "KB": 1e-3, "M": 1.0, "MB": 1.0, "G": 1e3, "GB": 1e3, "T": 1e6, "TB": 1e6,
    "KiB": 1024 / 1e6, "MiB": 1024**2 / 1e6, "GiB": 1024**3 / 1e6, "TiB": 1024**4 / 1e6,
}  # fmt: skip
"""Multipliers to MB. Unit names are matched case-insensitively, here as everywhere."""

TIME_UNITS: Mapping[str, float] = {
    "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
}  # fmt: skip
"""Multipliers to seconds."""

NO_UNITS: Mapping[str, float] = {}

_NUMBER_WITH_UNIT = re.compile(r"((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]+)?")
_CLOCK = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


def evaluate(
    value: object, *, units: Mapping[str, float] = NO_UNITS, scale: int | None = None
) -> float:
    """The number ``value`` denotes; ``units`` are the suffixes allowed on its numbers.

    Raises ValueError naming what is wrong (bad syntax, unknown unit or name,
    ``scale`` used while none is set, division by zero).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number or an expression, got {describe(value)}")
    if not isinstance(value, str):
        return _finite(value, shown(value))
    text = _expression(value)
    tree = _parse(_expand_units(text, units), text)
    if _depth(tree.body) > bounds.EXPRESSION_DEPTH:
        raise ValueError(f"{shown(text)} is nested more than {bounds.EXPRESSION_DEPTH} levels deep")
    return _finite(_walk(tree.body, text, scale), shown(text))


def seconds(value: object, *, scale: int | None = None) -> float:
    """A duration in seconds: a number, ``"90m"``, ``"1h30m"``, ``"1:30:00"``, ``"2-00:00:00"``."""
    if isinstance(value, str) and (clock := _clock(_expression(value))) is not None:
        return clock
    return evaluate(value, units=TIME_UNITS, scale=scale)


def size_mb(value: object, *, scale: int | None = None) -> float:
    """A size in MB: a number (MB), ``"500M"``, ``"4G"``, ``"1.5GiB"``, ``"scale * 4G"``."""
    return evaluate(value, units=SIZE_UNITS, scale=scale)


def whole(value: float, what: str) -> int:
    """``value`` as an int, or ValueError if it has a fractional part."""
    if not float(value).is_integer():
        raise ValueError(f"{what} must be a whole number, got {value:g}")
    return int(value)


def _expression(value: str) -> str:
    """``value`` stripped, or ValueError when empty or too long to be a quantity."""
    text = value.strip()
    if not text:
        raise ValueError("empty expression")
    if len(text) > bounds.EXPRESSION_CHARS:
        raise ValueError(
            f"{shown(text)} is {len(text):,} characters long: an expression has at most "
            f"{bounds.EXPRESSION_CHARS}"
        )
    return text


def _finite(value: float, what: str) -> float:
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{what} is not a finite number")
    return number


def _clock(text: str) -> float | None:
    """Slurm's ``[D-]HH:MM:SS`` family, or None when ``text`` is not in it.

    The first field may be as large as it likes (``90:00`` is 90 minutes); the ones after
    it are below 60, or below 24 for hours after days, as Slurm writes them.
    """
    match = _CLOCK.match(text)
    if match is None or (":" not in text and "-" not in text):
        return None
    days, first, second, third = match.groups()
    fields = [int(f) for f in (first, second, third) if f is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        names, limits = ("hours", "minutes", "seconds"), (24, 60, 60)
    elif len(fields) == 2:  # MM:SS
        names, limits = ("minutes", "seconds"), (0, 60)
    else:  # HH:MM:SS
        names, limits = ("hours", "minutes", "seconds"), (0, 60, 60)
    for name, limit, value in zip(names, limits, fields, strict=False):
        if limit and value >= limit:
            raise ValueError(f"{text!r}: {name} must be below {limit}, got {value}")
    scales = dict(zip(names, (3600.0, 60.0, 1.0)[-len(names) :], strict=True))
    total = sum(value * scales[name] for name, value in zip(names, fields, strict=False))
    return total + (int(days) * 86400.0 if days is not None else 0.0)


def _expand_units(text: str, units: Mapping[str, float]) -> str:
    """Replace each ``<number><unit>`` by its value in base units; ``1h30m`` becomes a sum."""
    out: list[str] = []
    last_end = 0
    previous_had_unit = False
    for match in _NUMBER_WITH_UNIT.finditer(text):
        number, unit = match.groups()
        between = text[last_end : match.start()]
        if unit is None:
            out.append(between + number)
            previous_had_unit = False
        else:
            factor = {name.lower(): f for name, f in units.items()}.get(unit.lower())
            if factor is None:
                raise ValueError(_unknown_unit(unit, text, units))
            joiner = " + " if previous_had_unit and not between.strip() else between
            value = _finite(float(number) * factor, f"{number}{unit} in {text!r}")
            out.append(f"{joiner}({value!r})")
            previous_had_unit = True
        last_end = match.end()
    out.append(text[last_end:])
    return "".join(out)


def _unknown_unit(unit: str, text: str, units: Mapping[str, float]) -> str:
    if not units:
        return f"unexpected {unit!r} after a number in {text!r} (this field takes plain numbers)"
    return f"unknown unit {unit!r} in {text!r} (known: {', '.join(units)})"


def _parse(expanded: str, original: str) -> ast.Expression:
    try:
        return ast.parse(expanded, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {original!r} as a number or an expression") from None


def _depth(node: ast.AST) -> int:
    """How many levels deep ``node``'s tree goes (counted without recursing)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(current))
    return deepest


def _walk(node: ast.AST, text: str, scale: int | None) -> float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"unexpected {shown(node.value)} in {text!r}")
        return _finite(node.value, f"{shown(node.value)} in {text!r}")
    if isinstance(node, ast.Name):
        if node.id != "scale":
            raise ValueError(f"unknown name {node.id!r} in {text!r} (only 'scale' may appear)")
        if scale is None:
            raise ValueError(
                f"{text!r} uses scale, but no scale is set "
                "(add `scale = N` at the top of the file or pass a scale)"
            )
        return float(scale)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _walk(node.operand, text, scale)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _walk(node.left, text, scale), _walk(node.right, text, scale)
        if isinstance(node.op, ast.Div | ast.FloorDiv) and right == 0:
            raise ValueError(f"division by zero in {text!r}")
        return float(_OPERATORS[type(node.op)](left, right))
    raise ValueError(f"{text!r}: only numbers, scale, + - * / // and parentheses are allowed")


def describe(value: object) -> str:
    """A TOML value for a message: its kind, then its text, e.g. ``a boolean (True)``."""
    kinds = {bool: "a boolean", list: "an array", dict: "a table", str: "a string"}
    kinds |= {int: "an integer", float: "a number"}
    kind = kinds.get(type(value))
    return f"{kind} ({shown(value)})" if kind else shown(value)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = 8
_SHORT.maxlong = 40


def shown(value: object) -> str:
    """``repr(value)`` cut to a line: a message must not repeat a megabyte of the file.

    Control characters come out escaped, as ``repr`` writes them.
    """
    text = _SHORT.repr(value)
    if isinstance(value, str) and len(value) > _SHORT.maxstring:
        text += f" ({len(value):,} characters)"
    return text
