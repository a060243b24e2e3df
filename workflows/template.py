"""Command templates: ``"mProjectPP {item} proj/{index:04d}.fits region.hdr"``.

Placeholders are ``{item}`` (the task's item), ``{index}`` (its 0-based place in
the stage), ``{stage}`` (the stage's name), ``{workdir}`` (the workflow's working
directory) and ``{rundir}`` (the run's own directory, ``WORKDIR/.leadtime/RUN``),
with an optional Python format spec (``{index:03d}``). In a command every
substituted value is shell-quoted, so an item such as ``my file; rm -rf ~`` stays
one harmless word; in an output pattern it is written as it is. ``{{`` and ``}}``
are literal braces. Placeholders belong outside shell quotes: the quoting is
leadtime's job.
"""

from __future__ import annotations

import difflib
import shlex
from string import Formatter

PLACEHOLDERS: tuple[str, ...] = ("item", "index", "stage", "workdir", "rundir")
_EXAMPLE = {"item": "x", "index": 0, "stage": "s", "workdir": "/w", "rundir": "/w/.leadtime/r"}


def placeholders(template: str) -> frozenset[str]:
    """The placeholders ``template`` uses; ValueError if it is malformed or names unknown ones."""
    used = set()
    for _, name, spec, conversion in _pieces(template):
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            close = difflib.get_close_matches(name, PLACEHOLDERS, n=1)
            hint = f" (did you mean {{{close[0]}}}?)" if close else ""
            known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
            shown = "{}" if name == "" else f"{{{name}}}"
            raise ValueError(
                f"unknown placeholder {shown}{hint}; known: {known} "
                "(write {{ for a literal brace)"
            )
        if conversion is not None:
            raise ValueError(f"{{{name}!{conversion}}}: conversions are not supported")
        if "{" in (spec or ""):
            raise ValueError(f"{{{name}:{spec}}}: nested placeholders are not supported")
        try:
            format(_EXAMPLE[name], spec or "")
        except ValueError:
            raise ValueError(f"{{{name}:{spec}}}: bad format spec {spec!r}") from None
        used.add(name)
    return frozenset(used)


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
    values = {"item": item, "index": index, "stage": stage, "workdir": workdir, "rundir": rundir}
    out = []
    for literal, name, spec, _ in _pieces(template):
        out.append(literal)
        if name is not None:
            value = values[name]
            if value is None:
                raise ValueError(f"{{{name}}} has no value for task {stage}.{index}")
            text = format(value, spec or "")
            out.append(shlex.quote(text) if quote else text)
    return "".join(out)


def _pieces(template: str) -> list[tuple[str, str | None, str | None, str | None]]:
    try:
        return list(Formatter().parse(template))
    except ValueError as e:
        reason = str(e).lower().replace("single", "unmatched")
        raise ValueError(f"{reason} (write {{{{ or }}}} for a literal brace)") from None
