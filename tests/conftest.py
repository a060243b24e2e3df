import subprocess
import time
from pathlib import Path

import pytest
from missing import missing
from typer.testing import CliRunner

from backends import clock
from orchestrator.cli import app
from orchestrator.store import Store
from workflows.datasets import DataNotFound, data_dir

SLURM_LOCAL = Path(__file__).resolve().parents[1] / "scripts" / "slurm-local"
_slurm_down: list[str] = []  # why the local Slurm is not usable, once checked
_SESSION_START = time.time()
_cleared: list[list[str]] = []  # the jobs of earlier test sessions cancelled, once looked for


@pytest.fixture(scope="session")
def data():
    """The directory of the large task traces (``$LEADTIME_DATA``, :func:`data_dir`).

    A clone with nothing beside it has none: the tests that need them are skipped, with the
    reason, except under CI, which always has them.
    """
    try:
        return data_dir()
    except DataNotFound as e:
        missing(f"the trace data: {e}")


@pytest.fixture
def cli(tmp_path):
    """``leadtime ARGS --db STORE`` in-process, on a store of the test's own."""
    runner = CliRunner()
    db = str(tmp_path / "store.db")

    def invoke(*args: str):
        return runner.invoke(app, [*args, "--db", db])

    return invoke


@pytest.fixture
def empty_store(tmp_path) -> Path:
    """A store file with no run in it."""
    db = tmp_path / "empty.db"

    async def create() -> None:
        async with await Store.open(db):
            pass

    clock.run(create(), virtual=False)
    return db


@pytest.fixture(scope="session")
def slurm_local() -> str:
    """The script that runs the local Slurm (``up``, ``stop-ctld``, ``start-ctld``, ...)."""
    return str(SLURM_LOCAL)


def _slurm_status() -> str | None:
    """None when ``scripts/slurm-local status`` says the cluster is usable, else why not."""
    try:
        done = subprocess.run(
            [SLURM_LOCAL, "status"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"scripts/slurm-local status failed: {e}"
    if done.returncode == 0:
        return None
    return (done.stdout + done.stderr).strip() or f"exit status {done.returncode}"


def pytest_runtest_setup(item):
    """Tests marked ``slurm`` need the local cluster: skipped without it, failed under CI."""
    if item.get_closest_marker("slurm") is None:
        return
    if not _slurm_down:
        _slurm_down.append(_slurm_status() or "")
    why = _slurm_down[0]
    if why:
        missing(f"the local Slurm (scripts/slurm-local up): {why}")
    if not _cleared:
        _cleared.append(_cancel_earlier_jobs())


def _earlier_jobs() -> list[str]:
    """Leadtime jobs (``lt-...``) submitted before this test session began and pending,
    running or completing (what ``squeue`` lists by default)."""
    out = subprocess.run(
        ["squeue", "--noheader", "--format=%i|%j|%V"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    began = int(_SESSION_START)
    earlier = []
    for line in out.splitlines():
        job_id, name, submitted = line.split("|")
        at = time.mktime(time.strptime(submitted, "%Y-%m-%dT%H:%M:%S"))
        if name.startswith("lt-") and at < began:
            earlier.append(job_id)
    return earlier


def _cancel_earlier_jobs() -> list[str]:
    """The Slurm tests need the local cluster's CPUs: a test session killed before its cleanup
    (or a trial run of leadtime) can leave pilots and load jobs there that would hold them.
    One test session at a time uses the local cluster; it cancels those jobs and waits for
    them to leave. Returns their ids, for the summary."""
    earlier = _earlier_jobs()
    if not earlier:
        return []
    subprocess.run(["scancel", *earlier], check=False, timeout=60)
    deadline = time.monotonic() + 60
    while set(earlier) & set(_earlier_jobs()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return earlier


def pytest_terminal_summary(terminalreporter):
    if _slurm_down and _slurm_down[0]:
        terminalreporter.write_line(f"Slurm tests skipped: {_slurm_down[0]}")
    if _cleared and _cleared[0]:
        jobs = ", ".join(_cleared[0])
        terminalreporter.write_line(f"cancelled first, left on the local Slurm before: {jobs}")
