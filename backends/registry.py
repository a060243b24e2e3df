"""Backends by name: adding one is one options class, one function that opens it, and one
:func:`register`.

Nothing else in leadtime names a backend: the CLI's ``--backend`` choices and flags, a run's
record of its options and how its workers arrive all come from the options class
(:mod:`backends.options`).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from backends import local, sim, slurm
from backends.base import BatchBackend
from backends.options import BackendOptions, RunSite, Workers

Options = TypeVar("Options", bound=BackendOptions)
Open = Callable[[Options, RunSite], BatchBackend]
"""A backend's one way in: its options and the run's site -> the backend, ready for pilots."""

BACKENDS: dict[str, type[BackendOptions]] = {}
"""Every backend's options class, by the backend's name."""
_OPEN: dict[type[BackendOptions], Open[Any]] = {}


def register(options: type[Options], open: Open[Options]) -> None:
    """Make a backend of ``options`` (a dataclass), which ``open`` opens for a run."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"{options.__name__}: a backend's options are a dataclass")
    BACKENDS[options.name] = options
    _OPEN[options] = open


def unregister(name: str) -> None:
    """Forget backend ``name``."""
    del _OPEN[BACKENDS.pop(name)]


register(sim.MockOptions, sim.open)
register(local.LocalOptions, local.open)
register(slurm.SlurmOptions, slurm.open)


def open_backend(options: BackendOptions, run: RunSite) -> BatchBackend:
    """The backend ``options`` are for, opened for ``run``."""
    return _OPEN[type(options)](options, run)


def backend_options(name: str) -> type[BackendOptions]:
    """The options class of backend ``name``; ValueError naming the choices."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None


def simulated(name: str) -> bool:
    """Backend ``name``'s workers are simulated: its runs ran no command, on virtual time
    (False for a backend not registered here)."""
    kind = BACKENDS.get(name)
    return kind is not None and kind.workers is Workers.SIMULATED


def options_json(options: BackendOptions) -> dict[str, Any]:
    """``options`` as plain data, named (:func:`options_of` reads it back)."""
    fields = dataclasses.asdict(options)  # type: ignore[call-overload]
    return {"name": options.name, **json.loads(json.dumps(fields, default=str))}


def options_of(data: dict[str, Any]) -> BackendOptions:
    """The options :func:`options_json` wrote: lists become tuples, nested dataclasses are
    built again from their fields' types; fields it lacks (recorded before they were
    options) keep their defaults."""
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
