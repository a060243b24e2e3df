"""Crashing a manager mid-run and resuming its run, for the local and Slurm end-to-end tests
and the sweep in bench/resume_sweep.py.

A three-stage workflow of real tasks: each appends its id to one file and writes its own
output, so a task completed twice shows as a duplicate id. The manager runs as a separate
process (``leadtime run``), is SIGKILLed at a chosen moment, and ``leadtime resume`` must
finish the run with every task completed exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LEADTIME = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
FAST = ["--sample-interval", "0.25", "--first-sample", "0.05"]

WORKFLOW = """
name = "crashy"

[[stage]]
name = "a"
allocation = {{ cores = 2, memory = "1G", time = "10m" }}
[stage.tasks]
command = "sleep {nap_a} && echo a{{index}} >> ids.txt && echo > out/a{{index}}"
count = {tasks}
cores = 1
memory = "50M"
disk = "10M"
outputs = ["out/a{{index}}"]

[[stage]]
name = "b"
allocation = {{ cores = 2, memory = "1G", time = "10m" }}
[stage.tasks]
command = "sleep {nap_b} && echo b{{index}} >> ids.txt && echo > out/b{{index}}"
count = {tasks}
cores = 1
memory = "50M"
disk = "10M"
outputs = ["out/b{{index}}"]

[[stage]]
name = "c"
allocation = {{ cores = 1, memory = "1G", time = "10m" }}
[stage.tasks]
command = "ls out | wc -l > total && echo c0 >> ids.txt"
count = 1
cores = 1
memory = "50M"
disk = "10M"
outputs = ["total"]
"""


@dataclass
class Crash:
    """One run crashed and resumed in ``root``."""

    root: Path
    backend: str
    tasks: int = 8
    extra: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    """The manager's environment (a PATH with a slow sbatch in front, say)."""
    naps: tuple[str, str] = ("0.$(( 4 + {index} % 5 ))", "0.$(( 3 + {index} % 6 ))")
    """How long the tasks of stages a and b sleep, in seconds (a shell word)."""

    def __post_init__(self) -> None:
        (self.root / "out").mkdir(parents=True, exist_ok=True)
        nap_a, nap_b = self.naps
        (self.root / "wf.toml").write_text(
            WORKFLOW.format(tasks=self.tasks, nap_a=nap_a, nap_b=nap_b)
        )
        self.db = self.root / "store.db"
        self.manager: subprocess.Popen | None = None
        self.run_id: str | None = None

    def command(self, *args: str) -> list[str]:
        return [*LEADTIME, *args, "--db", str(self.db)]

    def start(self) -> None:
        run = ["run", str(self.root / "wf.toml"), "--backend", self.backend, "--quiet"]
        self.manager = subprocess.Popen(
            self.command(*run, *self.extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(self.env or {})},
        )

    def wait_for(self, ready: Callable[[Crash], bool], timeout: float = 120.0) -> bool:
        """Wait until ``ready(self)`` or the manager ends; whether it was ready."""
        assert self.manager is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.manager.poll() is None:
            if self.run_id is None and (runs := self.runs()):
                self.run_id = runs[0]
            if ready(self):
                return True
            time.sleep(0.01)
        return False

    def kill(self) -> None:
        assert self.manager is not None
        self.manager.send_signal(signal.SIGKILL)
        self.manager.wait()

    def interrupt(self) -> None:
        """Ctrl-C: the manager releases its pilots and records the run as interrupted."""
        assert self.manager is not None
        self.manager.send_signal(signal.SIGINT)
        self.manager.wait(timeout=60)

    def resume(self, timeout: float = 300.0, *, named: bool = True) -> dict:
        """``leadtime resume RUN_ID``, or without RUN_ID (``named=False``): the store's one
        run that can be resumed."""
        assert self.run_id is not None
        done = subprocess.run(
            self.command("resume", *([self.run_id] if named else []), "--json"),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        if not named:
            assert f"resuming run {self.run_id} of " in done.stderr
        return json.loads(done.stdout)

    def status(self) -> str:
        assert self.run_id is not None
        return subprocess.run(
            self.command("status"), capture_output=True, text=True, check=True
        ).stdout

    def runs(self) -> list[str]:
        runs = self.root / ".leadtime"
        return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.exists() else []

    def done(self, prefix: str) -> int:
        """Outputs of stage ``prefix`` present now."""
        return sum(1 for p in (self.root / "out").iterdir() if p.name.startswith(prefix))

    def ids(self) -> list[str]:
        path = self.root / "ids.txt"
        return path.read_text().split() if path.exists() else []

    def expected_ids(self) -> list[str]:
        return sorted([f"a{i}" for i in range(self.tasks)] + [f"b{i}" for i in range(self.tasks)]
                      + ["c0"])  # fmt: skip

    def leftovers(self) -> list[int]:
        """Processes of this run still alive (workers, tasks, sentinels)."""
        found = subprocess.run(
            ["pgrep", "-f", str(self.root)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [int(p) for p in found if int(p) != os.getpid()]


SLOW_SBATCH = """#!/bin/sh
# sbatch, one second late to submit a job: {mark} exists while the second runs, and counts the
# submissions. A test submission (--test-only, the run's checks before it submits) is not one.
case " $* " in *" --test-only "*) exec {sbatch} "$@";; esac
echo >> "{mark}.count"
{before}
{sbatch} "$@"
status=$?
{after}
rm -f "{mark}"
exit $status
"""
LATE = 'touch "{mark}"; sleep 1'


def slow_sbatch(
    directory: Path, answer_late: bool = False
) -> tuple[dict[str, str], Callable[[int], bool]]:
    """A PATH whose sbatch is a second slow to queue a job (``answer_late``: to tell its id,
    the job queued), and whether the n-th submission (the run's n-th pilot: its test
    submissions do not count) is in that second now."""
    directory.mkdir(parents=True, exist_ok=True)
    mark = directory / "submitting"
    script = directory / "sbatch"
    late = LATE.format(mark=mark)
    before, after = (":", late) if answer_late else (late, ":")
    sbatch = shutil.which("sbatch")
    script.write_text(SLOW_SBATCH.format(mark=mark, sbatch=sbatch, before=before, after=after))
    script.chmod(0o755)

    def submitting(n: int) -> bool:
        count = mark.with_name("submitting.count")
        return mark.exists() and count.exists() and len(count.read_text().split("\n")) - 1 == n

    return {"PATH": f"{directory}:{os.environ['PATH']}"}, submitting
