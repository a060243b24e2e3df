"""The import contracts between leadtime's rooms, each checked in a fresh interpreter."""

import json
import subprocess
import sys

import pytest

OURS = ("orchestrator", "backends", "learners", "workflows")


def imported(*modules: str) -> set[str]:
    """Every module a fresh interpreter holds after importing ``modules``."""
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in OURS}


def test_the_agent_imports_no_learner_no_numpy_nothing_of_the_manager():
    modules = imported("orchestrator.agent.worker")
    assert "numpy" not in modules
    allowed = {
        "orchestrator",
        "orchestrator.command",  # the typer app's conventions, shared with the CLI
        "backends",
        "backends.base",
        "backends.clock",
        "backends.cores",
        "learners",
        "learners.resources",
    }
    assert {m for m in ours(modules) if not m.startswith("orchestrator.agent")} <= allowed


def test_backends_import_nothing_of_the_orchestrator():
    modules = imported("backends.registry", "backends.sim", "backends.local", "backends.slurm")
    assert {m for m in modules if m.split(".")[0] == "orchestrator"} == set()


def test_learners_import_no_other_room():
    modules = imported("learners.sizing", "learners.queue_wait", "learners.replay")
    assert {m.split(".")[0] for m in ours(modules)} == {"learners"}


@pytest.mark.parametrize("package", OURS)
def test_no_package_of_ours_is_a_standard_module(package):
    assert package not in sys.stdlib_module_names


def test_a_package_of_another_distribution_that_shadows_one_of_ours_is_named(tmp_path):
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "__init__.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-c", "import orchestrator"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "leadtime's package 'workflows' is not the one Python finds" in done.stderr
    assert str(tmp_path / "workflows") in done.stderr
