"""The flags that set a backend's options, made from the options classes registered.

A field of a backend's options made with :func:`backends.options.option` is a flag of the
commands that take backend options (``leadtime run``, and ``compare`` for the simulated
cluster's): its name, type, default and help come from the field, so a backend registered
anywhere, any time before the command runs or shows its help, brings its flags with it.
A flag given for a field the chosen backend lacks is refused, naming the backends it is for.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from backends.options import BackendOptions, Flag, Seconds, duration, flag_of
from orchestrator import human

Options = TypeVar("Options", bound=BackendOptions)

CONTEXT = "_context"
"""The parameter that brings a command its typer context (which tells the flags given)."""
BACKENDS = "{backends}"
"""In a flag's help, the backends that have its field."""
PLAIN = (str, int, float, bool, Path)
"""Types a flag takes as they are; a field of another type takes text, which its parse reads."""


@dataclass(frozen=True, slots=True)
class BackendFlag:
    """One flag: the field it fills (its parameter's name too), how the user spells it, and
    what the command line shows of it."""

    field: str
    flag: str
    spec: Flag
    kind: Any
    """What typer reads: the field's type, or text, or a repeatable flag's item type."""
    repeated: bool
    optional: bool
    default: Any
    help: str
    panel: str | None = None
    """The help panel it is listed in: the backends that have its field."""
    seconds: bool = False
    """A duration (:data:`~backends.options.Seconds`): typed as text, shown as people read it."""

    def parameter(self) -> inspect.Parameter:
        kind = list[self.kind] if self.repeated else self.kind
        hint = kind | None if self.optional or self.repeated else kind
        decls = () if self.spec.flag is None else (self.spec.flag,)
        metavar = self.spec.metavar or ("DURATION" if self.seconds else None)
        info = typer.Option(*decls, help=self.help, metavar=metavar, rich_help_panel=self.panel)
        default = None if self.repeated else self.default
        if self.seconds and default is not None:  # shown; a flag left out keeps the field's
            default = human.duration(default)
        return inspect.Parameter(
            self.field, inspect.Parameter.KEYWORD_ONLY, default=default,
            annotation=Annotated[hint, info],
        )  # fmt: skip

    def value(self, given: Any) -> Any:
        """The field's value from what the user gave; ValueError naming the flag."""
        if self.repeated:
            return tuple(given)
        try:
            value = duration(given) if self.seconds else given
            return value if self.spec.parse is None else self.spec.parse(value)
        except ValueError as e:
            raise ValueError(f"{self.flag}: {e}") from None


def backend_flags(
    classes: Iterable[type[BackendOptions]],
    defaults: Mapping[str, Any] | None = None,
    without: Collection[str] = (),
) -> dict[str, BackendFlag]:
    """The flags of ``classes``' fields, by field, in order (a field they share, once), but
    those of the fields ``without``; ``defaults`` replaces the fields' own defaults. In a
    flag's help, ``{backends}`` becomes the backends that have its field (``Local, slurm``)."""
    classes = tuple(classes)
    found: dict[str, BackendFlag] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec = flag_of(field)
            if spec is None or field.name in without:
                continue
            default = (defaults or {}).get(field.name, field.default)
            made = _flag(field.name, spec, hints[field.name], default)
            if found.setdefault(field.name, made) != made:
                raise TypeError(f"{cls.__name__}.{field.name}: another backend's option of "
                                "that name is given otherwise on the command line")  # fmt: skip
    for name, flag in found.items():
        names = [c.name for c in classes if name in _fields(c)]
        help = flag.spec.help.replace(BACKENDS, ", ".join(names).capitalize())
        panel = f"Options of --backend {' and '.join(names)}"
        found[name] = dataclasses.replace(flag, help=help, panel=panel)
    return found


def _flag(name: str, spec: Flag, hint: Any, default: Any) -> BackendFlag:
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    kinds = typing.get_args(hint) if union else (hint,)
    optional = type(None) in kinds
    (kind,) = (k for k in kinds if k is not type(None))
    repeated = typing.get_origin(kind) is tuple
    if repeated:
        kind = typing.get_args(kind)[0]
    seconds = kind is Seconds
    if kind not in PLAIN:
        kind = str
    flag = spec.flag or f"--{name.replace('_', '-')}"
    return BackendFlag(
        name, flag, spec, kind, repeated, optional, default, spec.help, seconds=seconds
    )


def options(
    cls: type[Options],
    given: Mapping[str, Any],
    flags: Mapping[str, BackendFlag],
    owners: Mapping[str, type[BackendOptions]],
    **values: Any,
) -> Options:
    """Backend ``cls``'s options from the flags ``given`` (by field; the others keep their
    flag's default), over ``values`` (the command's own, such as the run's seed, for the
    fields ``cls`` has of those names); ValueError, naming the flag, for a bad value or a
    flag of other backends (``owners``: every backend's options class, by name)."""
    own = _fields(cls)
    for field in given:
        if field not in own:
            names = [n for n, c in owners.items() if field in _fields(c)]
            raise ValueError(f"{flags[field].flag} is for --backend {' or '.join(names)}")
    chosen = {k: v for k, v in values.items() if k in own}
    chosen.update({f: flag.default for f, flag in flags.items() if f in own})
    chosen.update({f: flags[f].value(v) for f, v in given.items()})
    return cls(**chosen)


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


class WithBackendFlags:
    """``command`` with the flags of ``classes()`` after its parameter ``after``, made anew
    each time the command is built (so a backend registered late still has its flags).
    The flags given on the command line reach the command's ``**given``, by field; those
    left out do not."""

    def __init__(
        self,
        command: Callable[..., Any],
        classes: Callable[[], Iterable[type[BackendOptions]]],
        *,
        after: str,
        defaults: Mapping[str, Any] | None = None,
        without: Collection[str] = (),
    ) -> None:
        functools.update_wrapper(self, command)
        self._command = command
        self._classes = classes
        self._after = after
        self._defaults = defaults
        self._without = without

    def flags(self) -> dict[str, BackendFlag]:
        return backend_flags(self._classes(), self._defaults, self._without)

    @property
    def __signature__(self) -> inspect.Signature:
        own = inspect.signature(self._command, eval_str=True)
        params = [  # typer calls a command by keywords
            p.replace(kind=p.KEYWORD_ONLY)
            for p in own.parameters.values()
            if p.kind is not p.VAR_KEYWORD
        ]
        clash = {p.name for p in params} & set(self.flags())
        if clash:
            raise TypeError(f"backend options named as the command's own: {', '.join(clash)}")
        at = [p.name for p in params].index(self._after) + 1
        params[at:at] = [f.parameter() for f in self.flags().values()]
        context = inspect.Parameter(
            CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context
        )
        return own.replace(parameters=[*params, context])

    def __call__(self, **values: Any) -> Any:
        context: typer.Context = values.pop(CONTEXT)
        given = {}
        for field in self.flags():
            value = values.pop(field)
            if getattr(context.get_parameter_source(field), "name", None) == "COMMANDLINE":
                given[field] = value
        return self._command(**values, **given)


def with_backend_flags(
    classes: Callable[[], Iterable[type[BackendOptions]]],
    *,
    after: str,
    defaults: Mapping[str, Any] | None = None,
    without: Collection[str] = (),
) -> Callable[[Callable[..., Any]], WithBackendFlags]:
    """Decorate a command with the flags of ``classes()`` (see :class:`WithBackendFlags`)."""
    return lambda command: WithBackendFlags(
        command, classes, after=after, defaults=defaults, without=without
    )
