"""Distributions of task durations and resource use, for simulated runs.

A :class:`Distribution` is written as a short string in workflow files::

    300                         constant 300
    constant(300)               the same
    normal(2000, 200)           mean, sd
    lognormal(300, 0.2)         median, sigma of the log
    uniform(10, 20)             low, high
    exponential(100)            mean
    bimodal(4000, 1000, 12000, 2000, 0.5)
                                two normal modes: mean1, sd1, mean2, sd2, p1 (p1 optional, 0.5)
    trimodal(4000, 1000, 12000, 2000, 8000, 1000)
                                the *phasing* trimodal of Phung & Thain (IPDPS 2024): the first
                                third of a stage's tasks come from mode 1, the second third
                                from mode 2, the last from mode 3

The synthetic workflows of Phung & Thain (IPDPS 2024) (memory in MB, as its traces in ``ipdps2024/``
show) are ``normal(8000, 1000)``, ``uniform(6000, 10000)``, ``exponential(6000)``,
``bimodal(4000, 1000, 12000, 2000)`` and ``trimodal(4000, 1000, 12000, 2000, 8000, 1000)``.

Samples are durations and sizes, so they are never negative. Only the normal
modes can produce negative values; those draws are redrawn, so a normal mode is
the normal distribution conditioned on being >= 0 (truncated at zero, not
clipped: no probability mass piles up at 0). :attr:`Distribution.mean` and
:attr:`Distribution.std` are the moments of that truncated distribution.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Component = tuple[str, tuple[float, ...]]
"""One simple law: ``("normal", (mean, sd))``, ``("lognormal", (median, sigma))`` ..."""


@dataclass(frozen=True, slots=True)
class _Shape:
    params: tuple[str, ...]
    rules: tuple[str, ...]
    """Per parameter: ``">= 0"``, ``"> 0"`` or ``"probability"``."""
    components: Callable[[tuple[float, ...]], tuple[tuple[Component, float], ...]]
    """The weighted simple laws the shape mixes."""
    defaults: tuple[float, ...] = ()
    """Values of the last parameters when omitted."""
    phased: bool = False
    """Mode ``k`` of ``n`` serves positions ``[k/n, (k+1)/n)`` instead of being drawn at random."""


_SHAPES: dict[str, _Shape] = {
    "constant": _Shape(("value",), (">= 0",), lambda p: ((("constant", p), 1.0),)),
    "normal": _Shape(("mean", "sd"), (">= 0", ">= 0"), lambda p: ((("normal", p), 1.0),)),
    "lognormal": _Shape(("median", "sigma"), ("> 0", ">= 0"), lambda p: ((("lognormal", p), 1.0),)),
    "uniform": _Shape(("low", "high"), (">= 0", ">= 0"), lambda p: ((("uniform", p), 1.0),)),
    "exponential": _Shape(("mean",), ("> 0",), lambda p: ((("exponential", p), 1.0),)),
    "bimodal": _Shape(
        ("mean1", "sd1", "mean2", "sd2", "p1"),
        (">= 0", ">= 0", ">= 0", ">= 0", "probability"),
        lambda p: ((("normal", p[0:2]), p[4]), (("normal", p[2:4]), 1.0 - p[4])),
        defaults=(0.5,),
    ),
    "trimodal": _Shape(
        ("mean1", "sd1", "mean2", "sd2", "mean3", "sd3"),
        (">= 0",) * 6,
        lambda p: tuple((("normal", p[i : i + 2]), 1 / 3) for i in (0, 2, 4)),
        phased=True,
    ),
}

_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Distribution:
    """A named shape and its parameters (all of them, defaults filled in)."""

    name: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        _check(self.name, tuple(self.params))
        object.__setattr__(self, "params", tuple(float(p) for p in self.params))

    @classmethod
    def constant(cls, value: float) -> Distribution:
        return cls("constant", (float(value),))

    @classmethod
    def parse(cls, text: str) -> Distribution:
        """Read ``"300"``, ``"normal(2000, 200)"`` ...; raise ValueError saying what is wrong."""
        if not isinstance(text, str):
            raise ValueError(
                f"a distribution is a string such as 'normal(2000, 200)', got {text!r}"
            )
        if not text.strip():
            raise ValueError("empty distribution")
        call = _CALL.match(text)
        if call is None:
            try:
                value = _number(text.strip())
            except ValueError:
                raise ValueError(
                    f"cannot read {text.strip()!r}: expected a number or NAME(ARGS), "
                    "e.g. 'normal(2000, 200)'"
                ) from None
            return cls.constant(value)
        name, body = call.group(1).lower(), call.group(2)
        shape = _SHAPES.get(name)
        if shape is None:
            close = difflib.get_close_matches(name, _SHAPES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown distribution {name!r}{hint}; known: {', '.join(_SHAPES)}")
        args = [a.strip() for a in body.split(",")] if body.strip() else []
        low, high = len(shape.params) - len(shape.defaults), len(shape.params)
        if not low <= len(args) <= high:
            wanted = f"{low}" if low == high else f"{low} or {high}"
            raise ValueError(
                f"{name} takes {wanted} arguments ({', '.join(shape.params)}), got {len(args)}"
            )
        values = []
        for param, arg in zip(shape.params, args, strict=False):
            try:
                values.append(_number(arg))
            except ValueError:
                raise ValueError(f"{name}: {param} is not a number: {arg!r}") from None
        return cls(name, (*values, *shape.defaults[len(values) - low :]))

    def __str__(self) -> str:
        if self.name == "constant":
            return _format(self.params[0])
        return f"{self.name}({', '.join(_format(p) for p in self.params)})"

    @property
    def _shape(self) -> _Shape:
        return _SHAPES[self.name]

    def sample(self, rng: np.random.Generator, position: float | None = None) -> float:
        """One draw. ``position`` in [0, 1) is the task's place in its stage (index / count);
        it selects the phase of a phased shape, and without it a phase is drawn at random
        (the distribution over the whole stage)."""
        parts = self._shape.components(self.params)
        if len(parts) == 1:  # the same draw as through _draw, without its arrays
            return float(_draw_component(rng, parts[0][0], 1)[0])
        positions = None if position is None else np.array([position], dtype=float)
        return float(self._draw(rng, 1, positions)[0])

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws for a stage's tasks in order: draw ``i`` is at position ``i / n``."""
        return self._draw(rng, n, np.arange(n, dtype=float) / max(n, 1))

    def _draw(self, rng: np.random.Generator, n: int, positions: np.ndarray | None) -> np.ndarray:
        parts = self._shape.components(self.params)
        if len(parts) == 1:
            which = np.zeros(n, dtype=int)
        elif self._shape.phased and positions is not None:
            which = np.clip((positions * len(parts)).astype(int), 0, len(parts) - 1)
        else:
            weights = np.array([w for _, w in parts])
            which = rng.choice(len(parts), size=n, p=weights / weights.sum())
        out = np.empty(n, dtype=float)
        for k, (component, _) in enumerate(parts):
            mask = which == k
            out[mask] = _draw_component(rng, component, int(mask.sum()))
        return out

    @property
    def mean(self) -> float:
        """Mean of the whole distribution (over all phases of a phased shape)."""
        return sum(w * _moments(c)[0] for c, w in self._weighted())

    @property
    def std(self) -> float:
        """Standard deviation of the whole distribution (over all phases of a phased shape)."""
        second = sum(w * (_moments(c)[1] + _moments(c)[0] ** 2) for c, w in self._weighted())
        return math.sqrt(max(second - self.mean**2, 0.0))

    def _weighted(self) -> tuple[tuple[Component, float], ...]:
        parts = self._shape.components(self.params)
        total = sum(w for _, w in parts)
        return tuple((c, w / total) for c, w in parts)


def _check(name: str, params: tuple[float, ...]) -> None:
    shape = _SHAPES.get(name)
    if shape is None:
        raise ValueError(f"unknown distribution {name!r}; known: {', '.join(_SHAPES)}")
    if len(params) != len(shape.params):
        raise ValueError(f"{name} has {len(shape.params)} parameters, got {len(params)}")
    for param, rule, value in zip(shape.params, shape.rules, params, strict=True):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"{name}: {param} must be a finite number, got {value!r}")
        broken = {
            ">= 0": value < 0,
            "> 0": value <= 0,
            "probability": not 0 <= value <= 1,
        }[rule]
        if broken:
            wanted = "between 0 and 1" if rule == "probability" else rule.replace(">=", "≥")
            raise ValueError(f"{name}: {param} must be {wanted}, got {_format(value)}")
    if name == "uniform" and params[0] > params[1]:
        raise ValueError(
            f"uniform: low must be ≤ high, got {_format(params[0])} > {_format(params[1])}"
        )


def _draw_component(rng: np.random.Generator, component: Component, n: int) -> np.ndarray:
    kind, p = component
    if kind == "constant":
        return np.full(n, p[0])
    if kind == "lognormal":
        return np.exp(rng.normal(math.log(p[0]), p[1], n))
    if kind == "uniform":
        return rng.uniform(p[0], p[1], n)
    if kind == "exponential":
        return rng.exponential(p[0], n)
    # normal, truncated at zero by redrawing the negatives (mean >= 0: at most half redrawn)
    out = rng.normal(p[0], p[1], n)
    negative = out < 0
    while negative.any():
        out[negative] = rng.normal(p[0], p[1], int(negative.sum()))
        negative = out < 0
    return out


def _moments(component: Component) -> tuple[float, float]:
    """Mean and variance of one simple law (a normal one truncated at zero)."""
    kind, p = component
    if kind == "constant":
        return p[0], 0.0
    if kind == "lognormal":
        median, sigma = p
        spread = math.exp(sigma**2)
        return median * math.sqrt(spread), (spread - 1) * spread * median**2
    if kind == "uniform":
        return (p[0] + p[1]) / 2, (p[1] - p[0]) ** 2 / 12
    if kind == "exponential":
        return p[0], p[0] ** 2
    mean, sd = p
    if sd == 0:
        return mean, 0.0
    alpha = -mean / sd
    density = math.exp(-(alpha**2) / 2) / math.sqrt(2 * math.pi)
    kept = 1 - 0.5 * (1 + math.erf(alpha / math.sqrt(2)))
    ratio = density / kept
    return mean + sd * ratio, sd**2 * (1 + alpha * ratio - ratio**2)


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _format(value: float) -> str:
    """Shortest text that reads back to the same float."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))
