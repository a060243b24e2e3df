"""Command templates: ``"mProjectPP {item} proj/{index:04d}.fits region.hdr"``.

Placeholders are ``{item}`` (the task's item), ``{item.name}`` and ``{item.stem}``
(the item read as a path: its last component, and that without its last suffix, as
:mod:`pathlib` has them: a glob's items are absolute paths, and an output named after
one needs its name), ``{index}`` (its 0-based place in
the stage), ``{stage}`` (the stage's name), ``{workdir}`` (the workflow's working
directory) and ``{rundir}`` (the run's own directory, ``WORKDIR/.leadtime/RUN``),
with an optional Python format spec (``{index:03d}``; an item that is a whole number, as a
range's are, takes a number's spec too: ``{item:03d}``). In a command every
substituted value is shell-quoted, so an item such as ``my file; rm -rf ~`` stays
one harmless word; in an output pattern it is written as it is. ``{{`` and ``}}``
are literal braces. Placeholders belong outside shell quotes: the quoting is
leadtime's job.

A format spec's width and precision are at most :data:`~workflows.bounds.FORMAT_WIDTH`;
:func:`longest` measures the longest command a stage renders, without rendering them all.
"""

from __future__ import annotations

import difflib
import itertools
import re
import shlex
from collections.abc import Sequence
from functools import lru_cache
from pathlib import PurePosixPath
from string import Formatter

from workflows import bounds

PLACEHOLDERS: tuple[str, ...] = (
    "item",
    "item.name",
    "item.stem",
    "index",
    "stage",
    "workdir",
    "rundir",
)
ITEM: frozenset[str] = frozenset({"item", "item.name", "item.stem"})
"""The placeholders a task's item gives: a stage of ``count`` tasks has none."""
VARYING: frozenset[str] = ITEM | {"index"}
"""The placeholders whose value differs from task to task."""
_EXAMPLE = {"index": 0, "stage": "s", "workdir": "/w", "rundir": "/w/.leadtime/r"}
_EXAMPLE |= dict.fromkeys(ITEM, "x")
_PATH_MAX = 4096
"""The longest a directory placeholder may be, as the command's length is bounded."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*|[0-9]*")
"""What a placeholder's name looks like (``{}`` and ``{0}`` included), unlike code in braces."""
_WHOLE = re.compile(r"[-+]?[0-9]{1,4000}")
"""A whole number as an item writes it (Python reads at most 4,300 digits as one)."""
_SPEC = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?(?P<zero>0?)(?P<width>\d*)[,_]?"
    r"(?:\.(?P<precision>\d*))?(?P<type>[a-zA-Z%]?)",
    re.DOTALL,
)


def placeholders(template: str) -> frozenset[str]:
    """The placeholders ``template`` uses; ValueError if it is malformed or names unknown ones."""
    used = set()
    for text, name, spec, conversion in _pieces(template):
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            close = difflib.get_close_matches(name, PLACEHOLDERS, n=1)
            code = not close and (not _NAME.fullmatch(name) or text.endswith("$"))
            if close:
                hint = f" (did you mean {{{close[0]}}}?)"
            elif code:  # awk's '{print $1}', the shell's ${HOME}
                hint = " (braces of awk or the shell are written twice: {{ and }})"
            else:
                hint = ""
            shown = "{}" if name == "" else f"{{{_brief(name)}}}"
            known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
            literal = "" if code else " (write {{ for a literal brace)"
            raise ValueError(f"unknown placeholder {shown}{hint}; known: {known}{literal}")
        if conversion is not None:
            raise ValueError(f"{{{name}!{_brief(conversion)}}}: conversions are not supported")
        if "{" in (spec or ""):
            raise ValueError(f"{{{name}:{_brief(spec)}}}: nested placeholders are not supported")
        _check_spec(name, spec or "")
        used.add(name)
    return frozenset(used)


def _brief(text: str) -> str:
    """User text cut to fit a message."""
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text):,} characters)"


def _check_spec(name: str, spec: str) -> None:
    """ValueError unless ``spec`` formats ``name``'s values, within the width bound."""
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"{{{name}:{_brief(spec)}}}: bad format spec {_brief(spec)!r}")
    for part in ("width", "precision"):
        digits = match.group(part) or ""
        if len(digits) > 4 or (digits and int(digits) > bounds.FORMAT_WIDTH):
            raise ValueError(
                f"{{{name}:{spec}}}: a {part} of {digits} is more than {bounds.FORMAT_WIDTH}"
            )
    if name == "index" and match.group("type") == "c":
        raise ValueError(f"{{{name}:{spec}}}: an index is a number, not a character")
    if name in ITEM and match.group("type") == "c":
        raise ValueError(f"{{{name}:{spec}}}: an item is text or a whole number, not a character")
    try:
        format(0 if name in ITEM and _numeric(spec) else _EXAMPLE[name], spec)
    except ValueError:
        raise ValueError(f"{{{name}:{spec}}}: bad format spec {spec!r}") from None


def render(
    template: str,
    *,
    stage: str,
    index: int,
    item: str | None = None,
    workdir: str = ".",
    rundir: str = ".leadtime",
    quote: bool = True,
) -> str:
    """``template`` with its placeholders replaced by their values, shell-quoted unless
    ``quote`` is false (an output pattern is a path, not a shell word)."""
    if (fixed := _fixed(template)) is not None:
        return fixed
    pieces = _pieces(template)
    values = {"index": index, "stage": stage, "workdir": workdir, "rundir": rundir}
    values |= item_values(item) if item is not None else dict.fromkeys(ITEM)
    out = []
    for literal, name, spec, _ in pieces:
        out.append(literal)
        if name is not None:
            value = values[name]
            if value is None:
                raise ValueError(f"{{{name}}} has no value for task {stage}.{index}")
            text = format_item(value, spec) if name in ITEM else format(value, spec or "")
            out.append(shlex.quote(text) if quote else text)
    return "".join(out)


def item_values(item: str) -> dict[str, str]:
    """What each of :data:`ITEM` stands for, for ``item``."""
    path = PurePosixPath(item)
    return {"item": item, "item.name": path.name, "item.stem": path.stem}


@lru_cache(maxsize=256)
def _numeric(spec: str | None) -> bool:
    """Whether ``spec`` is a number's: text cannot take it (``d``, ``.2f``, ``+``, ``,``) or
    it pads with zeros (``03``, which pads text on the right: ``700``)."""
    match = _SPEC.fullmatch(spec or "")
    if match is not None and match.group("zero"):
        return True
    try:
        format("", spec or "")
    except ValueError:
        return True
    return False


def format_item(value: str, spec: str | None) -> str:
    """An item's value (text) formatted by ``spec``: read as the whole number it is where the
    spec is a number's, so ``{item:03d}`` over ``{ range = [1, 13] }`` gives ``001``."""
    return format(int(value) if _numeric(spec) else value, spec or "")


def not_whole(templates: Sequence[str], items: Sequence[str]) -> tuple[str, str] | None:
    """A placeholder of :data:`ITEM` with a number's spec in ``templates`` and the first item
    whose value is not a whole number it could format; None if there is none."""
    numeric = [
        (name, spec)
        for t in templates
        for _, name, spec, _ in _pieces(t)
        if name in ITEM and _numeric(spec)
    ]
    for name, spec in numeric:
        for item in items:
            if not _WHOLE.fullmatch(item_values(item)[name]):
                return f"{{{name}:{spec}}}", item
    return None


def in_quotes(command: str) -> list[tuple[str, str]]:
    """The placeholders (name, format spec) that ``command`` writes inside shell quotes
    (``'...'`` or ``"..."``), where the quotes leadtime puts around a value that needs them
    are read literally: ``'out/{item}'`` with an item ``a b`` gives ``'out/'a b''``."""
    found, quote, escaped = [], "", False
    for literal, name, spec, _ in _pieces(command):
        for char in literal:
            if escaped:
                escaped = False
            elif char == "\\" and quote != "'":
                escaped = True
            elif char in "'\"" and quote in ("", char):
                quote = "" if quote else char
        escaped = False  # a backslash before a placeholder escapes only its first character
        if name is not None and quote:
            found.append((name, spec or ""))
    return found


def needs_quotes(value: str) -> bool:
    """Whether the shell reads ``value`` as it is only once quoted."""
    return not value or _UNSAFE.search(value) is not None


def item_within(pattern: str) -> bool:
    """Whether ``{item}`` itself appears in ``pattern`` after anything else: where items are
    absolute paths, such a pattern names a path within the working directory that ends in
    the item's whole path (``out/sq_/data/in1.txt``)."""
    pieces = _pieces(pattern)
    return any(name == "item" and (k or literal) for k, (literal, name, _, _) in enumerate(pieces))


def longest(template: str, *, stage: str, count: int, items: Sequence[str] | None) -> int:
    """At least the bytes (UTF-8) of the longest command ``template`` renders to in a stage of
    ``count`` tasks, one per item of ``items`` when given.

    Each placeholder's widest value is found on its own, so nothing is rendered per task;
    the figure is exact unless the template has both ``{item}`` and ``{index}``, whose
    widest values may belong to different tasks (it is then over by a few digits at most).
    """
    fixed = 0
    item_uses: list[tuple[str, str]] = []
    for literal, name, spec, _ in _pieces(template):
        fixed += len(literal.encode())
        if name == "stage":
            fixed += _quoted_bytes(format(stage, spec or ""))
        elif name == "index":
            fixed += max(_quoted_bytes(format(i, spec or "")) for i in _widest_indices(count))
        elif name in ITEM:
            item_uses.append((name, spec or ""))
        elif name in ("workdir", "rundir"):  # known only when the run starts: at most a path
            fixed += _PATH_MAX
    if item_uses and items:
        fixed += _widest_item(items, item_uses)
    return fixed


def clash(pattern: str, count: int, items: Sequence[str] | None) -> tuple[str, str, str] | None:
    """Where output ``pattern`` of one task also names another task's files: its placeholder
    and the values it has in the two tasks; None if no two tasks clash.

    Only a pattern in which one placeholder varies from task to task (``{index}`` or one of
    :data:`ITEM`) is looked at. Two of its tasks clash where their values are equal, or, where
    the placeholder runs into a ``*``, where one value begins the other (``*`` after:
    ``tile1*`` matches ``tile10.fits``) or ends it (``*`` before), or, with a ``*`` on both
    sides, lies within it. Sorted, a value and one it begins lie side by side. (``?`` and
    ``[...]`` stand for one character: beside them, only equal values clash.)
    """
    pieces = _pieces(pattern)
    varying = [k for k, piece in enumerate(pieces) if piece[1] in VARYING]
    if len(varying) != 1:
        return None
    k = varying[0]
    literal, name, spec, _ = pieces[k]
    after = pieces[k + 1][0] if k + 1 < len(pieces) else ""
    ends = [end for end, star in ((1, after[:1] == "*"), (-1, literal[-1:] == "*")) if star]
    if name == "index" and not ends and not (spec and spec[-1] in "eEfFgG%"):
        return None  # whole numbers, written exactly: all different
    indices = range(count if items is None else len(items))
    if name == "index":
        values = [format(i, spec or "") for i in indices]
    else:
        values = [format_item(item_values(item)[name], spec) for item in items or ()]
    if len(ends) == 2 and (a_b := _within(values)):  # *{item}*: one value within another
        return name, *a_b
    end = ends[0] if ends else 1  # read from the end where the * is before it
    for a, b in itertools.pairwise(sorted(values, key=lambda v: v[::end])):
        if a == b or (ends and b[::end].startswith(a[::end])):
            return name, a, b
    return None


def _within(values: list[str]) -> tuple[str, str] | None:
    """A value that lies within a longer one, and that one: each value's pieces are looked up
    only at the lengths values have (a few, where names are alike), not at every length."""
    known = set(values)
    sizes = sorted({len(v) for v in known})
    for b in values:
        for size in itertools.takewhile(lambda n, b=b: n < len(b), sizes):
            pieces = (b[i : i + size] for i in range(len(b) - size + 1))
            if (a := next((p for p in pieces if p in known), None)) is not None:
                return a, b
    return None


_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII)
"""What :func:`shlex.quote` quotes: anything else stays as it is."""


def _widest_item(items: Sequence[str], uses: list[tuple[str, str]]) -> int:
    """Bytes the widest item takes in a command where it appears once per use of ``uses``
    (a placeholder of :data:`ITEM` and its format spec)."""
    if all(use == ("item", "") for use in uses) and all(items):
        joined = "/".join(items)
        if joined.isascii() and not _UNSAFE.search(joined):  # nothing quoted: the longest
            return len(uses) * max(map(len, items))
    return max(
        sum(_quoted_bytes(format_item(item_values(item)[name], spec)) for name, spec in uses)
        for item in items
    )


def _widest_indices(count: int) -> list[int]:
    """The indices among which the widest is, whatever the number format: the first, the
    last, and the largest of each number of digits."""
    last = max(count - 1, 0)
    return [0, last, *(10**k - 1 for k in range(1, len(str(last))))]


def _quoted_bytes(value: str) -> int:
    return len(shlex.quote(value).encode())


@lru_cache(maxsize=256)
def _fixed(template: str) -> str | None:
    """``template``'s text if it has no placeholder (the same for every task), else None."""
    pieces = _pieces(template)
    if any(name is not None for _, name, _, _ in pieces):
        return None
    return "".join(literal for literal, _, _, _ in pieces)


@lru_cache(maxsize=256)
def _pieces(template: str) -> tuple[tuple[str, str | None, str | None, str | None], ...]:
    """The literal text and placeholders of ``template``, parsed once per template (a stage
    renders the same command for each of its tasks)."""
    try:
        return tuple(Formatter().parse(template))
    except ValueError as e:
        reason = str(e).lower().replace("single", "unmatched")
        raise ValueError(f"{reason} (write {{{{ or }}}} for a literal brace)") from None
