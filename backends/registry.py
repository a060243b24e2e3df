"""Backends by name: adding one is one options class and one :func:`register`.

Nothing else in leadtime names a backend: the CLI's ``--backend`` choices, a run's record
of its options and how its workers arrive all come from the options class
(:class:`~backends.base.BackendOptions`).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

from backends.base import BackendOptions
from backends.local import LocalOptions
from backends.mock import MockOptions
from backends.slurm import SlurmOptions

Options = TypeVar("Options", bound=type[BackendOptions])

BACKENDS: dict[str, type[BackendOptions]] = {}
"""Every backend's options class, by the backend's name."""


def register(options: Options) -> Options:
    """Make ``options`` a backend (usable as a class decorator)."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"{options.__name__}: a backend's options are a dataclass")
    BACKENDS[options.name] = options
    return options


for _options in (MockOptions, LocalOptions, SlurmOptions):
    register(_options)


def backend_options(name: str) -> type[BackendOptions]:
    """The options class of backend ``name``; ValueError naming the choices."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None


def options_json(options: BackendOptions) -> dict[str, Any]:
    """``options`` as plain data, named (:func:`options_of` reads it back)."""
    fields = dataclasses.asdict(options)  # type: ignore[call-overload]
    return {"name": options.name, **json.loads(json.dumps(fields, default=str))}


def options_of(data: dict[str, Any]) -> BackendOptions:
    """The options :func:`options_json` wrote: lists become tuples, nested dataclasses are
    built again from their fields' types."""
    cls = backend_options(data["name"])
    hints = typing.get_type_hints(cls)
    values = {
        f.name: _value(hints[f.name], data[f.name])
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name in data
    }
    return cls(**values)


def _value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for kind in kinds:
        if isinstance(value, list) and typing.get_origin(kind) is tuple:
            return tuple(value)
        if isinstance(value, dict) and dataclasses.is_dataclass(kind):
            return kind(**value)
    return value
