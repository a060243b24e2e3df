"""The typer app every ``leadtime`` command is built on.

Conventions over typer's defaults, in one place: ``-h`` works as well as ``--help``; help
shows what a value is as a word (``NUMBER``, ``PATH``, an argument's name), never a Python
type such as ``<bool>``, and a flag shows none; a command's help is its docstring as prose,
lines joined within paragraphs.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, get_args, get_origin

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

HELP = {"help_option_names": ["-h", "--help"]}

_WORDS: dict[Any, str] = {int: "INTEGER", float: "NUMBER", str: "TEXT", Path: "PATH"}


def _word(annotation: Any) -> str:
    if get_origin(annotation) is list:
        return _word(get_args(annotation)[0])
    return _WORDS.get(annotation, "VALUE")


class _Words:
    """Fills in a word for every parameter that has no metavar of its own."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if param.metavar is not None:
                continue
            if isinstance(param, TyperArgument):
                word = _word(param.type_descriptor.annotation)
                param.metavar = param.name.upper()
                param.display_type_rich = lambda ctx, word=word: word  # its column: the word
            elif param.is_flag:
                param.metavar = ""
            else:
                param.metavar = _word(param.type_descriptor.annotation)
        return params


class Command(_Words, TyperCommand):
    pass


class Group(_Words, TyperGroup):
    pass


class App(typer.Typer):
    """A typer app whose commands follow the conventions above."""

    def __init__(self, **options: Any) -> None:
        super().__init__(cls=Group, context_settings=HELP, **options)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **options: Any) -> Any:
        register = super().command

        def decorator(f: Any) -> Any:
            text = options.get("help")
            if text is None and f.__doc__:
                text = _prose(inspect.getdoc(f) or "")
            return register(*args, cls=cls or Command, **{**options, "help": text})(f)

        return decorator


def _prose(doc: str) -> str:
    """A docstring as help: each paragraph's lines joined, as rich help would otherwise break
    the text where the source's lines end (mid-sentence in the list of commands)."""
    return "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))
