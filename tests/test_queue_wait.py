import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from learners.queue_wait import (
    DEFAULT_GRID,
    GammaSchedule,
    Geometry,
    Policy,
    Prediction,
    QueueWaitLearner,
    stepped_grid,
)

G = Geometry(cores=28, partition="batch")
SMALL = (10.0, 100.0, 1000.0)


def planned(learner: QueueWaitLearner, index: int) -> Prediction:
    """A prediction of alternative ``index``: a fixed draw instead of a sampled one."""
    return Prediction(float(learner.grid[index]), index, 1.0 / len(learner.grid))


def probabilities(learner: QueueWaitLearner, geometry: Geometry = G) -> np.ndarray:
    p = np.zeros(len(learner.grid))
    for alt in learner.distribution(geometry, top=len(learner.grid)):
        p[alt.index] = alt.probability
    return p


def tried(learner: QueueWaitLearner, geometry: Geometry = G) -> int:
    return sum(a.tried for a in learner.distribution(geometry, top=len(learner.grid)))


# The grid


def test_default_grid_is_the_papers_53_alternatives():
    # 18 multiples of 10 s, 17 of 100 s, 8 of 1000 s, 10 of 10 000 s.
    tens = [*range(10, 181, 10), *range(200, 1801, 100)]
    thousands = [*range(2000, 9001, 1000), *range(10_000, 100_001, 10_000)]
    assert tuple(float(v) for v in tens + thousands) == DEFAULT_GRID
    assert len(DEFAULT_GRID) == 53 == len(set(DEFAULT_GRID))
    assert DEFAULT_GRID[0] == 10 and DEFAULT_GRID[-1] == 100_000
    assert list(DEFAULT_GRID) == sorted(DEFAULT_GRID)
    assert len(tens) == 35  # denser at 10s and 100s


def test_stepped_grid_rejects_steps_that_do_not_advance():
    assert stepped_grid(((5, 15), (10, 40))) == (5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
    with pytest.raises(ValueError, match="last > 15"):
        stepped_grid(((5, 15), (10, 15)))
    with pytest.raises(ValueError, match="step > 0"):
        stepped_grid(((0, 15),))


@pytest.mark.parametrize(
    "grid", [(10.0,), (10.0, 10.0), (100.0, 10.0), (-1.0, 10.0), (1.0, math.inf), [[1, 2]]]
)
def test_bad_grids_are_rejected(grid):
    with pytest.raises(ValueError, match="grid"):
        QueueWaitLearner(grid=grid)


def test_closest_is_linear_in_seconds_with_ties_to_the_smaller():
    learner = QueueWaitLearner(grid=SMALL)
    assert learner.closest(0) == 0
    assert learner.closest(40) == 0  # in log space 40 s would be closer to 100 s
    assert learner.closest(55) == 0  # a tie
    assert learner.closest(56) == 1
    assert learner.closest(10**7) == 2


# Algorithm 1: rounds and the exponential-weights update, with fixed draws


def test_a_round_ends_exactly_when_the_largest_loss_exceeds_one():
    learner = QueueWaitLearner(grid=(10.0, 100.0, 1000.0, 10_000.0))
    # The wait is 10 s: alternative 0 is right, the others each lose 1 per case.
    for index in (0, 1, 2, 3, 0, 0):
        assert learner.observe(G, 10, planned(learner, index)).rounds_ended == 0
    assert learner.stats(G).rounds == 0  # max loss is exactly 1: the round goes on
    assert np.allclose(probabilities(learner), 0.25)
    assert learner.observe(G, 10, planned(learner, 2)).rounds_ended == 1
    assert learner.stats(G).rounds == 1


def test_the_update_after_a_round_by_hand():
    learner = QueueWaitLearner(grid=SMALL, gamma=GammaSchedule(1.0, decay=1.0))
    # Round 1 (γ_1 = 1): losses (0, 2, 1).
    for index, ended in ((1, 0), (2, 0), (0, 0), (1, 1)):
        assert learner.observe(G, 10, planned(learner, index)).rounds_ended == ended
    p1 = np.array([1.0, math.exp(-2), math.exp(-1)])
    p1 /= p1.sum()
    assert probabilities(learner) == pytest.approx(p1, abs=1e-15)
    # Round 2 (γ_2 = 1/2): losses (0, 0, 2); the previous round's losses were reset.
    learner.observe(G, 10, planned(learner, 2))
    assert probabilities(learner) == pytest.approx(p1, abs=1e-15)
    learner.observe(G, 10, planned(learner, 2))
    p2 = p1 * np.array([1.0, 1.0, math.exp(-0.5 * 2)])
    p2 /= p2.sum()
    assert probabilities(learner) == pytest.approx(p2, abs=1e-15)
    assert learner.stats(G).rounds == 2


def test_outcomes_and_recent_rates():
    learner = QueueWaitLearner(grid=SMALL, window=3)
    outcomes = [learner.observe(G, 100, planned(learner, i)).outcome for i in (1, 2, 0, 1)]
    assert outcomes == ["hit", "over", "under", "hit"]
    stats = learner.stats(G)
    assert (stats.observations, stats.recent) == (4, 3)
    assert stats.hit_rate == pytest.approx(1 / 3) and stats.miss_rate == pytest.approx(1 / 3)
    assert stats.last_wait == 100
    obs = learner.observe(G, 100, planned(learner, 2))
    assert (obs.loss, obs.closest) == (1.0, 1)


# γ_t


def test_gamma_is_constant_one_by_default_as_in_appendix_a():
    gamma = QueueWaitLearner().gamma
    assert [gamma(t) for t in (1, 2, 10, 10**6)] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("initial, decay", [(1.0, 0.0), (2.0, 0.5), (0.3, 1.0), (1.0, 2.5)])
def test_gamma_schedules_are_non_increasing(initial, decay):
    values = [GammaSchedule(initial, decay)(t) for t in range(1, 2000)]
    assert values[0] == initial
    assert all(b <= a for a, b in itertools.pairwise(values))
    assert all(v > 0 for v in values)


def test_inverse_square_root_schedule():
    assert GammaSchedule(1.0, 0.5)(4) == 0.5


@pytest.mark.parametrize("initial, decay", [(0.0, 0.0), (-1.0, 0.0), (1.0, -0.5), (math.nan, 0)])
def test_bad_gamma_is_rejected(initial, decay):
    with pytest.raises(ValueError, match="gamma"):
        GammaSchedule(initial, decay)


# Sampling, determinism, independence


def test_same_seed_same_predictions_other_seed_other_predictions():
    def run(seed):
        learner = QueueWaitLearner(seed=seed)
        values = []
        for _ in range(40):
            prediction = learner.predict(G)
            learner.observe(G, 3000, prediction)
            values.append(prediction.value)
        return values

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_sampling_follows_p():
    learner = QueueWaitLearner(grid=SMALL)
    for _ in range(20):  # concentrate p on alternative 2
        for index in (0, 0, 1, 1):
            learner.observe(G, 1000, planned(learner, index))
    p = probabilities(learner)
    counts = np.bincount([learner.predict(G).index for _ in range(4000)], minlength=3)
    assert counts / 4000 == pytest.approx(p, abs=0.02)
    assert p[2] > 0.99


def test_geometries_have_independent_state_and_randomness():
    other = Geometry(cores=56, partition="batch")
    alone, shared = QueueWaitLearner(seed=3), QueueWaitLearner(seed=3)
    for step in range(60):
        a, b = alone.predict(G), shared.predict(G)
        assert a == b
        alone.observe(G, 600, a)
        shared.observe(G, 600, b)
        for _ in range(step % 3):  # another geometry used in between, irregularly
            shared.observe(other, 20_000, shared.predict(other))
    assert alone.to_dict()["geometries"][str(G)] == shared.to_dict()["geometries"][str(G)]
    assert shared.stats(other).observations == 60
    assert shared.distribution(other, 1)[0].value != shared.distribution(G, 1)[0].value


def test_key_fields_choose_which_geometries_share_state():
    learner = QueueWaitLearner(key=("cores",))
    learner.observe(Geometry(cores=28, partition="a"), 50)
    learner.observe(Geometry(cores=28, partition="b"), 50)
    assert learner.stats(Geometry(cores=28)).observations == 2
    assert learner.geometries() == [Geometry(cores=28)]
    with pytest.raises(ValueError, match="geometry key"):
        QueueWaitLearner(key=("memory",))


def test_reading_an_unknown_geometry_creates_no_state():
    learner = QueueWaitLearner()
    assert learner.stats(G).observations == 0 and learner.stats(G).hit_rate is None
    assert learner.distribution(G, 1)[0].probability == pytest.approx(1 / 53)
    assert learner.geometries() == []


# Observing without a prediction, policies


def test_a_wait_observed_without_prediction_scores_sampled_actions():
    for policy, cases in (("default", 1), ("tuned", 50), ("greedy", 1)):
        learner = QueueWaitLearner(policy=policy)
        for n in range(1, 11):
            obs = learner.observe(G, 1500, None)
            assert (obs.outcome, obs.loss) == (None, None)
            assert tried(learner) == n * cases
        stats = learner.stats(G)
        assert (stats.observations, stats.recent, stats.hit_rate) == (10, 0, None)


def test_tuned_scores_the_prediction_and_49_more_cases():
    learner = QueueWaitLearner(grid=SMALL, policy="tuned")
    learner.observe(G, 1000, planned(learner, 0))
    assert tried(learner) == 50
    assert learner.stats(G).rounds >= 1
    for seed in range(20):  # the prediction's own action is always among the scored cases
        learner = QueueWaitLearner(grid=SMALL, policy=Policy("twice", repetition=2), seed=seed)
        learner.observe(G, 10, planned(learner, 2))
        scored = {a.index: a.tried for a in learner.distribution(G, 3)}
        assert scored[2] >= 1 and sum(scored.values()) == 2


def test_greedy_climbs_to_the_wait_and_follows_rises():
    learner = QueueWaitLearner(grid=SMALL, policy="greedy")
    values = []
    for wait in [10] * 3 + [1000] * 4:
        prediction = learner.predict(G)
        learner.observe(G, wait, prediction)
        values.append(prediction.value)
    assert values == [10, 10, 10, 10, 100, 1000, 1000]


def test_greedy_stays_on_the_old_wait_after_a_drop():
    learner = QueueWaitLearner(grid=SMALL, policy="greedy")
    for _ in range(5):
        learner.observe(G, 1000, learner.predict(G))
    values = set()
    for _ in range(300):
        prediction = learner.predict(G)
        learner.observe(G, 10, prediction)
        values.add(prediction.value)
    assert values == {1000.0}
    assert learner.stats(G).miss_rate == 1.0


def test_after_a_drop_tuned_reconverges_and_greedy_does_not():
    hits = {}
    for policy in ("tuned", "greedy"):
        learner = QueueWaitLearner(policy=policy, seed=1)
        for wait in [5000] * 200 + [50] * 200:
            obs = learner.observe(G, wait, learner.predict(G))
        hits[policy] = learner.stats(G).hit_rate
        assert obs.closest == DEFAULT_GRID.index(50)
    assert hits == {"tuned": pytest.approx(1.0, abs=0.15), "greedy": 0.0}


def test_custom_policy_and_unknown_policy():
    learner = QueueWaitLearner(policy=Policy("tuned10", repetition=10))
    learner.observe(G, 100)
    assert tried(learner) == 10
    with pytest.raises(ValueError, match="unknown policy 'fast'; choose one of default"):
        QueueWaitLearner(policy="fast")
    with pytest.raises(ValueError, match="repetition"):
        Policy("none", repetition=0)


# Convergence on a stationary wait


def observations_to_converge(policy: str, seed: int, wait: float) -> int:
    """Observations until p puts more than 0.9 on the alternative closest to ``wait``."""
    learner = QueueWaitLearner(policy=policy, seed=seed)
    best = learner.closest(wait)
    for n in range(1, 5000):
        learner.observe(G, wait, learner.predict(G))
        top = learner.distribution(G, 1)[0]
        if top.index == best and top.probability > 0.9:
            return n
    raise AssertionError(f"{policy} did not converge in 5000 observations")


def test_convergence_on_a_stationary_wait():
    # Measured over 30 seeds and waits 10, 1500, 45 000, 100 000 s:
    # default median ~810, max 1001; tuned median 17, max 21.
    default = [observations_to_converge("default", s, w) for s, w in enumerate((10, 1500, 45e3))]
    tuned = [observations_to_converge("tuned", s, w) for s, w in enumerate((10, 1500, 45e3, 1e5))]
    assert max(default) <= 1300
    assert max(tuned) <= 30
    assert max(tuned) * 10 < min(default)


# Persistence


@pytest.mark.parametrize("policy", ["default", "tuned", "greedy"])
def test_state_round_trips_through_json_and_continues_identically(policy):
    other = Geometry(nodes=2)
    learner = QueueWaitLearner(policy=policy, gamma=GammaSchedule(0.8, 0.5), window=5, seed=11)
    for i in range(30):
        learner.observe(G, 700 + i, learner.predict(G))
        learner.observe(other, 40_000)
    restored = QueueWaitLearner.from_dict(
        json.loads(json.dumps(learner.to_dict(), allow_nan=False))
    )
    assert restored.to_dict() == learner.to_dict()
    for i in range(40):
        for geometry in (G, other):
            a, b = learner.predict(geometry), restored.predict(geometry)
            assert a == b
            assert learner.observe(geometry, 90 * i, a) == restored.observe(geometry, 90 * i, b)
    assert restored.to_dict() == learner.to_dict()
    assert restored.stats(G) == learner.stats(G)


def test_restoring_with_another_policy_keeps_the_learned_state():
    learner = QueueWaitLearner(policy="tuned")
    for _ in range(30):
        learner.observe(G, 2000, learner.predict(G))
    greedy = QueueWaitLearner.from_dict(learner.to_dict(), policy="greedy", gamma=0.5)
    assert greedy.policy.name == "greedy" and greedy.gamma(9) == 0.5
    assert greedy.stats(G) == learner.stats(G)
    assert greedy.predict(G).value == 2000


def test_corrupt_state_is_rejected_with_a_clear_message():
    learner = QueueWaitLearner(grid=SMALL)
    learner.observe(G, 10)
    good = learner.to_dict()

    def broken(change):
        data = json.loads(json.dumps(good))
        change(data)
        return data

    cases = [
        broken(lambda d: d.update(format="other/9")),
        broken(lambda d: d.pop("grid")),
        broken(lambda d: d["geometries"][str(G)].update(p=[0.5, 0.5])),
        broken(lambda d: d["geometries"][str(G)].update(p=[0.5, 0.5, 0.5])),
        broken(lambda d: d["geometries"][str(G)].update(recent=["maybe"])),
        broken(lambda d: d["geometries"].update({"cores=x": {}})),
        broken(lambda d: d.update(grid=[1, 2, 3, 4])),
        "not a dict",
    ]
    for data in cases:
        with pytest.raises(ValueError, match="invalid queue-wait learner state"):
            QueueWaitLearner.from_dict(data)


# Input checking


@pytest.mark.parametrize("wait", [-1, math.nan, math.inf, "5", True, None])
def test_bad_waits_are_rejected(wait):
    with pytest.raises(ValueError, match="observed wait"):
        QueueWaitLearner().observe(G, wait)


def test_predictions_from_another_grid_are_rejected():
    learner = QueueWaitLearner(grid=SMALL)
    with pytest.raises(ValueError, match="not on this learner's grid"):
        learner.observe(G, 10, Prediction(20.0, 0, 1.0))
    with pytest.raises(ValueError, match="not on this learner's grid"):
        learner.observe(G, 10, Prediction(10.0, 5, 1.0))


def test_bad_arguments_are_rejected():
    with pytest.raises(TypeError, match="expected a Geometry"):
        QueueWaitLearner().predict("cores=28")
    with pytest.raises(ValueError, match="window"):
        QueueWaitLearner(window=0)
    with pytest.raises(ValueError, match="seed"):
        QueueWaitLearner(seed=-1)


# Geometry keys


def test_geometry_string_form():
    assert str(G) == "cores=28,partition=batch"
    assert str(Geometry(nodes=4)) == "nodes=4"
    assert str(Geometry()) == "any"
    assert G.only(["partition"]) == Geometry(partition="batch")


@given(
    cores=st.none() | st.integers(1, 10**6),
    nodes=st.none() | st.integers(1, 10**4),
    partition=st.none() | st.text("abcxyz_-.0123456789", min_size=1, max_size=12),
)
def test_geometry_round_trips_through_its_string(cores, nodes, partition):
    geometry = Geometry(cores, nodes, partition)
    assert Geometry.parse(str(geometry)) == geometry


@pytest.mark.parametrize("text", ["cores", "cores=x", "cores=0", "memory=5", "cores=1,cores=2", ""])
def test_bad_geometry_strings_are_rejected(text):
    with pytest.raises(ValueError, match="geometry"):
        Geometry.parse(text)


@pytest.mark.parametrize(
    "kwargs",
    [{"cores": 0}, {"nodes": 1.5}, {"cores": True}, {"partition": "a,b"}, {"partition": ""}],
)
def test_bad_geometries_are_rejected(kwargs):
    with pytest.raises(ValueError, match="geometry"):
        Geometry(**kwargs)


# Invariants


@given(
    steps=st.lists(
        st.tuples(st.none() | st.integers(0, 3), st.floats(0, 20_000, allow_nan=False)),
        max_size=60,
    ),
    policy=st.sampled_from(["default", "tuned", "greedy"]),
)
def test_p_stays_a_probability_vector(steps, policy):
    learner = QueueWaitLearner(grid=(0.0, 10.0, 100.0, 10_000.0), policy=policy)
    rounds = 0
    for index, wait in steps:
        prediction = None if index is None else planned(learner, index)
        rounds += learner.observe(G, wait, prediction).rounds_ended
    p = probabilities(learner)
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    assert learner.stats(G).rounds == rounds
