"""The shipped examples load at every scale and keep the shapes and timings of the ASA paper
(Souza et al.)."""

from importlib import resources

import numpy as np
import pytest

from workflows.spec import EXAMPLES, SpecError, Stage, Workflow, example, load, validate

SCALES = (28, 56, 112)

# Table 1 of the ASA paper (HPC2N), makespan - TWT, averaged over Big Job and Per-Stage, in seconds;
# the examples' simulated execution times must be of that order (within 20%).
TABLE_1 = {
    "montage": {28: 1144, 56: 1062, 112: 1070},
    "blast": {28: 2670, 56: 1349, 112: 766},
    "statistics": {28: 5490, 56: 4341, 112: 3994},
}
SHAPES = {  # the ASA paper's stages, p: parallel (cores = scale), s: sequential
    "montage": "ppssp" + "ssss",
    "blast": "ps",
    "statistics": "spsp",
}


def execution(workflow: Workflow, seed: int) -> list[float]:
    """Each stage's duration with no queue wait: its tasks list-scheduled on its cores."""
    rng = np.random.default_rng(seed)
    durations = []
    for stage in workflow.stages:
        tasks = stage.expand()
        free = np.zeros(stage.allocation.cores)
        for task, duration in zip(
            tasks, stage.simulate.duration.sample_many(rng, len(tasks)), strict=True
        ):
            need = int(task.declared.get("cores", 1))
            free.sort()
            free[:need] = free[need - 1] + duration
        durations.append(float(free.max()))
    return durations


def shape(stage: Stage, scale: int) -> str:
    return "p" if stage.allocation.cores == scale and len(stage.expand()) > 1 else "s"


@pytest.mark.parametrize("name", ["montage", "blast", "statistics", "demo"])
@pytest.mark.parametrize("scale", SCALES)
def test_examples_load_and_validate(name, scale):
    w = load(example(name), scale=scale)
    validate(w)
    assert w.scale == scale
    for stage in w.stages:
        assert stage.expand()
        assert stage.simulate is not None and stage.simulate.duration is not None


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_stages_are_parallel_or_sequential_as_in_the_asa_paper(name):
    w = load(example(name))
    assert w.scale == 28  # the default
    assert "".join(shape(s, 28) for s in w.stages) == SHAPES[name]
    assert all(s.after == (w.stages[i - 1].name,) for i, s in enumerate(w.stages) if i)
    assert all(s.allocation.cores <= 2 for s in w.stages if shape(s, 28) == "s")


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_execution_times_are_of_the_order_of_table_1(name):
    for scale in SCALES:
        w = load(example(name), scale=scale)
        runs = [execution(w, seed) for seed in range(5)]
        total = float(np.mean([sum(r) for r in runs]))
        assert total == pytest.approx(TABLE_1[name][scale], rel=0.2), (scale, total)
        # the Big Job holds the largest stage's cores all along; Per-Stage each stage's own
        big_job = max(s.allocation.cores for s in w.stages) * total
        per_stage = np.mean(
            [sum(s.allocation.cores * d for s, d in zip(w.stages, r, strict=True)) for r in runs]
        )
        assert big_job > per_stage


def test_montage_does_not_scale_and_blast_does():
    def total(name, scale):
        return np.mean([sum(execution(load(example(name), scale=scale), s)) for s in range(3)])

    assert total("montage", 112) == pytest.approx(total("montage", 28), rel=0.02)
    assert total("blast", 28) / total("blast", 112) > 3


def test_demo_is_small():
    w = load(example("demo"))
    assert w.scale == 28
    assert 3 <= len(w.stages) <= 4
    assert sum(len(s.expand()) for s in w.stages) <= 4 * 28 + 6


def test_examples_are_package_data():
    shipped = resources.files("workflows") / "examples"
    assert {p.name for p in shipped.iterdir() if p.name.endswith(".toml")} >= {
        "montage.toml",
        "blast.toml",
        "statistics.toml",
        "demo.toml",
    }
    assert example("blast") == EXAMPLES / "blast.toml"


def test_unknown_example():
    with pytest.raises(SpecError, match="no example named 'montag' \\(known: blast, demo"):
        example("montag")
