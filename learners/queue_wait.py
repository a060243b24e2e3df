"""ASA: learn the queue wait of a job geometry by exponential weights (Souza et al., Algorithm 1).

Per job geometry the learner keeps a probability vector p over m fixed waiting-time
alternatives θ_1 < … < θ_m (by default the paper's 53, from 10 s to 100 000 s) and learns
from observed queue waits which alternative to predict.

**Algorithm 1 as an online service.** The paper's double loop runs over *cases*: each case
applies one action a ~ p_t and scores its loss ℓ(a); a round collects cases until
max_a ℓ_{t,a} > 1, then p_{t+1,a} ∝ p_{t,a}·exp(−γ_t·ℓ_{t,a}) and the round's losses reset.
Here a case is one use of a predicted wait:

- :meth:`QueueWaitLearner.predict` is line 4, "sample action a according to p_t": the sampled
  alternative is the wait the planner uses for one allocation.
- :meth:`QueueWaitLearner.observe` scores cases against the wait the allocation really had
  (line 5): the prediction's own action first, then ``repetition − 1`` more actions drawn from
  the current p (none for ``default``, 49 for ``tuned``). A wait observed without a prediction
  (a job the learner did not plan, e.g. a per-stage pilot) is scored on ``repetition`` drawn
  actions. After every case, if max_a ℓ_{t,a} > 1 the round ends at once (lines 3, 7): p is
  updated, t advances, ℓ_t resets, and later cases belong to the new round.
- A prediction still outstanding when a round ends is scored in the round in which its wait
  is observed: the loss vector belongs to the round, the action to the p it was drawn from.

**Loss** (eq. 3): 0 for the alternative closest to the observed wait, 1 for any other.
"Closest" is in seconds, |θ_a − w|, ties going to the smaller alternative: the paper says
closest "to the true queue waiting time", and what a wrong prediction costs (the perceived
wait of an under-prediction, the idle allocation of an over-prediction) grows linearly in
seconds. Only the scored action's loss is added (bandit feedback: line 5, and the indicator
I(θ_i = θ^{s−1}) of Appendix A). With 0/1 losses a round ends when one alternative has been
scored wrong twice.

**γ_t.** Appendix A proves its regret bound for the potential Z_t = Σ_i exp(−Σ_s losses), i.e.
γ_t = 1 in every round, using that a round adds at most 2 to any alternative. The default is
that constant. A constant rate also keeps p able to move when the queue changes, which a
decreasing γ_t slows down round after round (γ_t → 0 freezes p); :class:`GammaSchedule` offers
γ_t = γ_1·t^(−decay), e.g. decay 0.5 for a 1/√t sequence.

**Policies** (section 4.4): ``default`` is Algorithm 1; ``tuned`` scores each observed wait on
50 cases (the repetition of section 4.5), which converges fast but follows the latest waits;
``greedy`` always predicts the alternative with the lowest mean loss so far (0 before it was
ever tried; ties to the smaller wait), the textbook greedy action-value rule. It climbs the
grid from the smallest wait to the true one, and on when the wait rises; but after a drop it
climbs through the untried larger waits, and then every alternative has mean loss 1 except
those that were once right, whose means stay below 1 for ever: it predicts the one of them
with the best record, whatever the queue does from then on. This is Figure 5's failure, where
greedy "reaches a local minimum, and does not behave correctly afterwards". (The largest p,
the least *summed* loss, would not get stuck: untried alternatives keep their weight, so it
rescans the grid after every change.)

**Outcome** of a prediction: ``hit`` (the closest alternative), ``over`` (a miss: above the
closest alternative, so the allocation would start before it is needed: Table 2's misses,
"over-predictions"; the grid's resolution is the tolerance), or ``under``.

**Randomness.** Each geometry has its own numpy Generator seeded from (seed, geometry key), so
one geometry's predictions do not depend on how other geometries were used. The whole state,
generators included, is plain data: :meth:`QueueWaitLearner.to_dict` and
:meth:`QueueWaitLearner.from_dict` round-trip through JSON, and a restored learner continues
identically.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Literal

import numpy as np

Outcome = Literal["hit", "over", "under"]
GEOMETRY_FIELDS: tuple[str, ...] = ("cores", "nodes", "partition")
FORMAT = "leadtime.queue_wait/1"


def stepped_grid(steps: Sequence[tuple[float, float]]) -> tuple[float, ...]:
    """Multiples of each ``step`` above the previous ``last`` and up to its own ``last``.

    ``((10, 180), (100, 1800))`` gives 10, 20, …, 180, 200, 300, …, 1800.
    """
    values: list[float] = []
    floor = 0.0
    for step, last in steps:
        if not (step > 0 and last > floor):
            raise ValueError(f"grid step ({step}, {last}): need step > 0 and last > {floor}")
        k = math.floor(floor / step) + 1
        while k * step <= last:
            values.append(float(k * step))
            k += 1
        floor = last
    return tuple(values)


DEFAULT_GRID = stepped_grid(((10, 180), (100, 1800), (1000, 9000), (10_000, 100_000)))
"""The paper's m = 53 alternatives (ASA paper, section 4.3): 18 multiples of 10 s up to 3 min,
17 of 100 s up to 30 min, 8 of 1000 s up to 2.5 h and 10 of 10 000 s up to 100 000 s (27.8 h,
the longest wait the paper saw): dense in the 10s and 100s, where small jobs' waits vary most."""


@dataclass(frozen=True, slots=True)
class Geometry:
    """The shape of a job request; queue waits are learned per geometry."""

    cores: int | None = None
    nodes: int | None = None
    partition: str | None = None

    def __post_init__(self) -> None:
        for name in ("cores", "nodes"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"geometry {name} must be a positive integer, got {value!r}")
        part = self.partition
        if part is not None and (
            not isinstance(part, str) or not part or any(c in part for c in ",= \t\n")
        ):
            raise ValueError(f"geometry partition must be a Slurm partition name, got {part!r}")

    def only(self, names: Iterable[str]) -> Geometry:
        """This geometry with every field not in ``names`` cleared."""
        keep = set(names)
        return Geometry(**{f: getattr(self, f) if f in keep else None for f in GEOMETRY_FIELDS})

    def __str__(self) -> str:
        """Stable key for storage, e.g. ``cores=28,partition=batch`` (``any`` if empty)."""
        parts = [f"{f}={getattr(self, f)}" for f in GEOMETRY_FIELDS if getattr(self, f) is not None]
        return ",".join(parts) or "any"

    @classmethod
    def parse(cls, text: str) -> Geometry:
        """The inverse of ``str()``."""
        if text == "any":
            return cls()
        values: dict[str, Any] = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            if not sep or name not in GEOMETRY_FIELDS or name in values:
                raise ValueError(f"bad geometry {text!r}: expected e.g. 'cores=28,partition=batch'")
            if name == "partition":
                values[name] = value
            elif value.isdigit():
                values[name] = int(value)
            else:
                raise ValueError(f"bad geometry {text!r}: {name} must be a positive integer")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Policy:
    """How a prediction is chosen and on how many cases an observed wait is scored."""

    name: str
    repetition: int = 1
    greedy: bool = False

    def __post_init__(self) -> None:
        if type(self.repetition) is not int or self.repetition < 1:
            raise ValueError(f"policy repetition must be an integer >= 1, got {self.repetition!r}")


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (Policy("default"), Policy("tuned", repetition=50), Policy("greedy", greedy=True))
}


@dataclass(frozen=True, slots=True)
class GammaSchedule:
    """γ_t = ``initial``·t^(−``decay``) for rounds t = 1, 2, …: non-increasing."""

    initial: float = 1.0
    decay: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial > 0):
            raise ValueError(f"gamma must be a finite number > 0, got {self.initial!r}")
        if not (math.isfinite(self.decay) and self.decay >= 0):
            raise ValueError(f"gamma decay must be a finite number >= 0, got {self.decay!r}")

    def __call__(self, t: int) -> float:
        return self.initial * t ** (-self.decay)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted queue wait: the alternative ``index`` of the grid, ``value`` seconds.

    ``probability`` is p_t of that alternative (for ``greedy``, not the chance it was chosen).
    """

    value: float
    index: int
    probability: float
    observations: int = 0
    """Waits of the geometry learned before this prediction: 0, and it is the prior's."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What one observed wait did: its closest alternative and the prediction's outcome."""

    wait: float
    closest: int
    loss: float | None
    """Loss of the prediction's alternative; ``None`` when observed without a prediction."""
    outcome: Outcome | None
    rounds_ended: int


@dataclass(frozen=True, slots=True)
class Alternative:
    """One waiting-time alternative of a geometry, for display."""

    index: int
    value: float
    probability: float
    tried: int
    """Cases this alternative was scored on."""
    mean_loss: float | None


@dataclass(frozen=True, slots=True)
class Stats:
    """A geometry's learning so far; rates over the last ``recent`` scored predictions."""

    observations: int
    rounds: int
    recent: int
    hit_rate: float | None
    miss_rate: float | None
    last_wait: float | None


@dataclass(slots=True, eq=False)
class GeometryState:
    """Algorithm 1's variables for one geometry, plus what ``greedy`` and ``stats`` need."""

    p: np.ndarray
    round_loss: np.ndarray
    tried: np.ndarray
    lost: np.ndarray
    rng: np.random.Generator
    round: int = 1
    observations: int = 0
    last_wait: float | None = None
    recent: list[Outcome] = field(default_factory=list)

    @classmethod
    def fresh(cls, m: int, rng: np.random.Generator) -> GeometryState:
        """p_0 uniform, an empty first round."""
        return cls(np.full(m, 1.0 / m), np.zeros(m), np.zeros(m, dtype=np.int64), np.zeros(m), rng)

    def sample(self) -> int:
        """Draw a ~ p_t (inverse CDF of one uniform draw)."""
        cdf = np.cumsum(self.p)
        index = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return min(index, len(cdf) - 1)

    def least_mean_loss(self) -> int:
        """The alternative with the lowest mean loss so far (0 if untried; ties to the smaller)."""
        mean = np.divide(self.lost, self.tried, out=np.zeros_like(self.lost), where=self.tried > 0)
        return int(np.argmin(mean))

    def score(self, action: int, loss: float, gamma: GammaSchedule) -> bool:
        """Add one case's loss to the round; end the round if max loss exceeds 1."""
        self.round_loss[action] += loss
        self.tried[action] += 1
        self.lost[action] += loss
        if self.round_loss.max() <= 1.0:
            return False
        with np.errstate(divide="ignore"):
            log_p = np.log(self.p) - gamma(self.round) * self.round_loss
        weights = np.exp(log_p - log_p.max())
        self.p = weights / weights.sum()
        self.round += 1
        self.round_loss[:] = 0.0
        return True

    def to_dict(self) -> dict[str, Any]:
        state = self.rng.bit_generator.state
        return {
            "p": self.p.tolist(),
            "round_loss": self.round_loss.tolist(),
            "tried": self.tried.tolist(),
            "lost": self.lost.tolist(),
            "round": self.round,
            "observations": self.observations,
            "last_wait": self.last_wait,
            "recent": list(self.recent),
            "rng": {
                "state": str(state["state"]["state"]),
                "inc": str(state["state"]["inc"]),
                "has_uint32": state["has_uint32"],
                "uinteger": state["uinteger"],
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], m: int) -> GeometryState:
        bits = np.random.PCG64()
        rng = data["rng"]
        bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": int(rng["state"]), "inc": int(rng["inc"])},
            "has_uint32": int(rng["has_uint32"]),
            "uinteger": int(rng["uinteger"]),
        }
        state = cls(
            p=np.array(data["p"], dtype=float),
            round_loss=np.array(data["round_loss"], dtype=float),
            tried=np.array(data["tried"], dtype=np.int64),
            lost=np.array(data["lost"], dtype=float),
            rng=np.random.Generator(bits),
            round=int(data["round"]),
            observations=int(data["observations"]),
            last_wait=None if data["last_wait"] is None else float(data["last_wait"]),
            recent=list(data["recent"]),
        )
        vectors = (state.p, state.round_loss, state.tried, state.lost)
        if any(v.shape != (m,) for v in vectors):
            raise ValueError(f"vectors must have the grid's {m} entries")
        if not (np.all(state.p >= 0) and abs(state.p.sum() - 1.0) < 1e-9):
            raise ValueError("p is not a probability vector")
        if any(o not in ("hit", "over", "under") for o in state.recent):
            raise ValueError(f"unknown outcome in {state.recent}")
        return state


class QueueWaitLearner:
    """ASA's queue-wait learner: one :class:`GeometryState` per job geometry.

    ``key`` names the geometry fields that tell states apart (others are ignored);
    ``window`` is the number of recent predictions that :meth:`stats` rates.
    """

    def __init__(
        self,
        grid: Sequence[float] = DEFAULT_GRID,
        policy: str | Policy = "default",
        gamma: float | GammaSchedule = 1.0,
        *,
        key: Sequence[str] = GEOMETRY_FIELDS,
        window: int = 20,
        seed: int = 0,
    ) -> None:
        self.grid = _checked_grid(grid)
        self.policy = _policy(policy)
        self.gamma = gamma if isinstance(gamma, GammaSchedule) else GammaSchedule(float(gamma))
        self.key = tuple(key)
        if not self.key or any(k not in GEOMETRY_FIELDS for k in self.key):
            raise ValueError(f"geometry key must be fields among {GEOMETRY_FIELDS}, got {key!r}")
        if type(window) is not int or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        self.window = window
        if type(seed) is not int or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.seed = seed
        self._states: dict[str, GeometryState] = {}

    def closest(self, wait: float) -> int:
        """Index of the alternative closest to ``wait`` seconds (ties to the smaller)."""
        return int(np.argmin(np.abs(self.grid - wait)))

    def predict(self, geometry: Geometry) -> Prediction:
        """The wait to plan ``geometry``'s next allocation with."""
        state = self._state(geometry)
        index = self._choose(state)
        return Prediction(float(self.grid[index]), index, float(state.p[index]), state.observations)

    def observe(
        self, geometry: Geometry, wait: float, prediction: Prediction | None = None
    ) -> Observation:
        """Learn from an allocation of ``geometry`` that waited ``wait`` seconds in the queue.

        ``prediction`` is what :meth:`predict` gave for that allocation, or ``None`` if the
        learner did not plan it.
        """
        if isinstance(wait, bool) or not isinstance(wait, Real) or not 0 <= wait < math.inf:
            raise ValueError(f"observed wait must be a finite number of seconds >= 0, got {wait!r}")
        if prediction is not None:
            self._check(prediction)
        state = self._state(geometry)
        best = self.closest(wait)
        rounds = 0
        for case in range(self.policy.repetition):
            action = (
                prediction.index if prediction is not None and case == 0 else self._choose(state)
            )
            rounds += state.score(action, float(action != best), self.gamma)
        state.observations += 1
        state.last_wait = float(wait)
        if prediction is None:
            return Observation(float(wait), best, None, None, rounds)
        outcome: Outcome = (
            "hit" if prediction.index == best else "over" if prediction.index > best else "under"
        )
        state.recent = [*state.recent, outcome][-self.window :]
        return Observation(float(wait), best, float(outcome != "hit"), outcome, rounds)

    def distribution(self, geometry: Geometry, top: int = 5) -> list[Alternative]:
        """The ``top`` most probable alternatives of ``geometry``, most probable first."""
        state = self._state(geometry, create=False)
        order = sorted(range(len(self.grid)), key=lambda i: (-state.p[i], i))[:top]
        return [
            Alternative(
                i,
                float(self.grid[i]),
                float(state.p[i]),
                int(state.tried[i]),
                float(state.lost[i] / state.tried[i]) if state.tried[i] else None,
            )
            for i in order
        ]

    def stats(self, geometry: Geometry) -> Stats:
        state = self._state(geometry, create=False)
        recent = state.recent
        return Stats(
            observations=state.observations,
            rounds=state.round - 1,
            recent=len(recent),
            hit_rate=recent.count("hit") / len(recent) if recent else None,
            miss_rate=recent.count("over") / len(recent) if recent else None,
            last_wait=state.last_wait,
        )

    def geometries(self) -> list[Geometry]:
        """Geometries with learned state, in key order."""
        return [Geometry.parse(k) for k in sorted(self._states)]

    def to_dict(self) -> dict[str, Any]:
        """Configuration and state as JSON-serialisable plain data."""
        return {
            "format": FORMAT,
            "grid": self.grid.tolist(),
            "policy": {
                "name": self.policy.name,
                "repetition": self.policy.repetition,
                "greedy": self.policy.greedy,
            },
            "gamma": {"initial": self.gamma.initial, "decay": self.gamma.decay},
            "key": list(self.key),
            "window": self.window,
            "seed": self.seed,
            "geometries": {k: s.to_dict() for k, s in sorted(self._states.items())},
        }

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        policy: str | Policy | None = None,
        gamma: float | GammaSchedule | None = None,
    ) -> QueueWaitLearner:
        """A learner restored from :meth:`to_dict`, optionally with another policy or γ_t.

        The state does not depend on the policy, so a learned state can change policy.
        """
        try:
            if data.get("format") != FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
            learner = cls(
                grid=data["grid"],
                policy=policy if policy is not None else Policy(**data["policy"]),
                gamma=gamma if gamma is not None else GammaSchedule(**data["gamma"]),
                key=data["key"],
                window=data["window"],
                seed=data["seed"],
            )
            m = len(learner.grid)
            for text, state in data["geometries"].items():
                key = str(Geometry.parse(text).only(learner.key))
                if key != text:
                    raise ValueError(f"geometry {text!r} is not a key of fields {learner.key}")
                learner._states[key] = GeometryState.from_dict(state, m)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"invalid queue-wait learner state: {e}") from e
        return learner

    def _choose(self, state: GeometryState) -> int:
        return state.least_mean_loss() if self.policy.greedy else state.sample()

    def _state(self, geometry: Geometry, create: bool = True) -> GeometryState:
        if not isinstance(geometry, Geometry):
            raise TypeError(f"expected a Geometry, got {geometry!r}")
        key = str(geometry.only(self.key))
        state = self._states.get(key)
        if state is None:
            seeds = np.random.SeedSequence(self.seed, spawn_key=tuple(key.encode()))
            state = GeometryState.fresh(len(self.grid), np.random.default_rng(seeds))
            if create:
                self._states[key] = state
        return state

    def _check(self, prediction: Prediction) -> None:
        i = prediction.index
        if not (0 <= i < len(self.grid) and self.grid[i] == prediction.value):
            raise ValueError(
                f"prediction {prediction.value} s (alternative {i}) is not on this learner's grid"
            )


def _checked_grid(grid: Sequence[float]) -> np.ndarray:
    values = np.asarray(grid, dtype=float)
    if values.ndim != 1 or len(values) < 2:
        raise ValueError(f"grid must be a sequence of at least 2 waits, got {grid!r}")
    if not (np.all(np.isfinite(values)) and values[0] >= 0 and np.all(np.diff(values) > 0)):
        raise ValueError("grid must be finite waits >= 0 in strictly increasing order")
    return values


def _policy(policy: str | Policy) -> Policy:
    if isinstance(policy, Policy):
        return policy
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[policy]
