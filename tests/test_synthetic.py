import csv

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.synthetic import Distribution

SHAPES = [
    "300",
    "constant(5)",
    "normal(2000, 200)",
    "lognormal(300, 0.2)",
    "uniform(10, 20)",
    "exponential(100)",
    "bimodal(4000, 1000, 12000, 2000, 0.3)",
    "trimodal(4000, 1000, 12000, 2000, 8000, 1000)",
    "normal(0, 50)",
    "normal(10, 40)",
]


@pytest.mark.parametrize("text", SHAPES)
def test_str_round_trips(text):
    d = Distribution.parse(text)
    assert Distribution.parse(str(d)) == d
    assert str(Distribution.parse(str(d))) == str(d)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("300", "300"),
        ("constant(5)", "5"),
        ("  Normal( 2000 ,200 ) ", "normal(2000, 200)"),
        ("lognormal(300, 0.2)", "lognormal(300, 0.2)"),
        ("bimodal(1, 2, 3, 4)", "bimodal(1, 2, 3, 4, 0.5)"),
        ("uniform(1e3, 2.5e3)", "uniform(1000, 2500)"),
        ("0.1", "0.1"),
    ],
)
def test_parse_normalises(text, shown):
    assert str(Distribution.parse(text)) == shown


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty distribution"),
        ("   ", "empty distribution"),
        ("gauss(1, 2)", "unknown distribution 'gauss'"),
        ("normall(1, 2)", "did you mean 'normal'?"),
        ("normal(1)", "normal takes 2 arguments (mean, sd), got 1"),
        ("normal(1, 2, 3)", "normal takes 2 arguments"),
        ("bimodal(1, 2, 3)", "bimodal takes 4 or 5 arguments"),
        ("normal()", "got 0"),
        ("normal(a, 1)", "normal: mean is not a number: 'a'"),
        ("normal(1, -1)", "normal: sd must be ≥ 0, got -1"),
        ("normal(-5, 1)", "normal: mean must be ≥ 0, got -5"),
        ("lognormal(0, 1)", "lognormal: median must be > 0, got 0"),
        ("exponential(0)", "exponential: mean must be > 0"),
        ("uniform(5, 1)", "uniform: low must be ≤ high, got 5 > 1"),
        ("uniform(-1, 1)", "uniform: low must be ≥ 0"),
        ("bimodal(1, 1, 2, 1, 1.5)", "bimodal: p1 must be between 0 and 1, got 1.5"),
        ("-3", "constant: value must be ≥ 0, got -3"),
        ("nan", "cannot read 'nan'"),
        ("normal(inf, 1)", "mean is not a number"),
        ("normal(1, 2", "cannot read 'normal(1, 2'"),
        ("normal 1 2", "cannot read"),
    ],
)
def test_parse_errors_say_what_is_wrong(text, message):
    with pytest.raises(ValueError) as e:
        Distribution.parse(text)
    assert message in str(e.value)


def test_direct_construction_is_checked():
    with pytest.raises(ValueError, match="normal has 2 parameters, got 1"):
        Distribution("normal", (1.0,))
    with pytest.raises(ValueError, match="must be a finite number"):
        Distribution("normal", (True, 1.0))
    with pytest.raises(ValueError, match="unknown distribution"):
        Distribution("weird", (1.0,))
    assert Distribution("normal", (2000, 200)) == Distribution.parse("normal(2000, 200)")
    assert hash(Distribution("normal", (2000, 200))) == hash(Distribution.parse("normal(2000,200)"))


@pytest.mark.parametrize("text", SHAPES)
def test_sampling_is_deterministic_given_the_generator(text):
    d = Distribution.parse(text)
    a = d.sample_many(np.random.default_rng(7), 500)
    b = d.sample_many(np.random.default_rng(7), 500)
    assert np.array_equal(a, b)
    assert d.sample(np.random.default_rng(3)) == d.sample(np.random.default_rng(3))
    if d.std > 0:
        assert not np.array_equal(a, d.sample_many(np.random.default_rng(8), 500))


@pytest.mark.parametrize("text", SHAPES)
def test_moments_match_many_samples(text):
    d = Distribution.parse(text)
    x = d.sample_many(np.random.default_rng(11), 200_000)
    assert x.shape == (200_000,)
    # five standard errors of the mean; the sd within 2%
    assert abs(x.mean() - d.mean) <= 5 * d.std / np.sqrt(x.size) + 1e-9
    assert x.std() == pytest.approx(d.std, rel=0.02, abs=1e-9)


@pytest.mark.parametrize("text", ["normal(0, 50)", "normal(10, 40)", "bimodal(5, 20, 30, 50)"])
def test_samples_are_never_negative_and_truncation_redraws(text):
    d = Distribution.parse(text)
    x = d.sample_many(np.random.default_rng(5), 100_000)
    assert x.min() >= 0
    assert np.count_nonzero(x == 0) == 0  # redrawn, not clipped: no mass piles up at zero
    assert all(d.sample(np.random.default_rng(s)) >= 0 for s in range(200))


def test_truncated_normal_moments_are_exact():
    # half-normal: mean sd*sqrt(2/pi), variance sd^2 (1 - 2/pi)
    d = Distribution.parse("normal(0, 10)")
    assert d.mean == pytest.approx(10 * np.sqrt(2 / np.pi))
    assert d.std == pytest.approx(10 * np.sqrt(1 - 2 / np.pi))
    # far from zero the truncation is invisible
    assert Distribution.parse("normal(2000, 200)").mean == pytest.approx(2000)


def test_bimodal_weight_chooses_the_first_mode():
    d = Distribution.parse("bimodal(100, 5, 1000, 5, 0.3)")
    x = d.sample_many(np.random.default_rng(2), 50_000)
    assert np.mean(x < 500) == pytest.approx(0.3, abs=0.01)


def test_trimodal_phases_follow_the_position_in_the_stage():
    d = Distribution.parse("trimodal(1000, 10, 3000, 10, 2000, 10)")
    x = d.sample_many(np.random.default_rng(4), 900)
    assert x[:300].mean() == pytest.approx(1000, abs=5)
    assert x[300:600].mean() == pytest.approx(3000, abs=5)
    assert x[600:].mean() == pytest.approx(2000, abs=5)
    rng = np.random.default_rng(0)
    assert d.sample(rng, position=0.0) < 1100
    assert 2900 < d.sample(rng, position=0.5) < 3100
    assert 1900 < d.sample(rng, position=0.99) < 2100
    # without a position, a phase is drawn at random: the whole stage's distribution
    whole = np.array([d.sample(rng) for _ in range(3000)])
    assert {round(v, -3) for v in whole} == {1000, 2000, 3000}
    assert whole.mean() == pytest.approx(d.mean, rel=0.03)


def test_non_phased_shapes_ignore_the_position():
    d = Distribution.parse("normal(100, 10)")
    assert d.sample(np.random.default_rng(1), position=0.9) == d.sample(np.random.default_rng(1))


def test_the_bucketing_papers_synthetic_workflows_are_reproduced(data):
    """The documented parameters match the memory peaks of the synthetic tasks of Phung & Thain
    (IPDPS 2024)."""
    shapes = {
        "normal": "normal(8000, 1000)",
        "uniform": "uniform(6000, 10000)",
        "exponential": "exponential(6000)",
        "bimodal": "bimodal(4000, 1000, 12000, 2000)",
        "trimodal": "trimodal(4000, 1000, 12000, 2000, 8000, 1000)",
    }
    for name, text in shapes.items():
        with open(data / "ipdps2024" / f"synthetic_{name}_whole.tasks.csv") as f:
            rows = sorted(csv.DictReader(f), key=lambda r: int(r["task_id"]))
        peaks = np.array([float(r["peak_memory_mb"]) for r in rows])
        d = Distribution.parse(text)
        assert peaks.mean() == pytest.approx(d.mean, rel=0.06), name
        assert peaks.std() == pytest.approx(d.std, rel=0.06), name
        if name == "trimodal":  # the phases, in task order
            model = d.sample_many(np.random.default_rng(0), len(peaks))
            for part in np.array_split(np.arange(len(peaks)), 3):
                assert peaks[part].mean() == pytest.approx(model[part].mean(), rel=0.05)


@given(
    st.sampled_from(["normal", "lognormal", "uniform", "exponential", "bimodal", "trimodal"]),
    st.lists(st.floats(0.001, 1e7, allow_nan=False), min_size=6, max_size=6),
)
def test_any_valid_distribution_round_trips(name, values):
    arity = {"exponential": 1, "bimodal": 5, "trimodal": 6}.get(name, 2)
    params = sorted(values[:arity]) if name == "uniform" else values[:arity]
    if name == "bimodal":
        params[4] = min(params[4], 1.0)
    if name == "lognormal":
        params[1] = min(params[1], 3.0)  # exp() of wider spreads overflows a float
    d = Distribution(name, tuple(params))
    assert Distribution.parse(str(d)) == d
    assert d.sample(np.random.default_rng(0)) >= 0
