"""How the manager scales with the number of tasks: workflows of 10k, 100k and 1M simulated
tasks run on the mock backend (virtual time, an idle cluster of 20 nodes x 28 cores, or
``--nodes``), each in a process of its own through ``leadtime run``, as a user runs them.

For each shape (one stage; four stages in a chain, wide, narrow, wide, narrow) and size, it
prints the wall time, the peak resident memory of the run's process, tasks per second of wall
time, and the ratio of wall time per task to the size before it (1.00: the cost per task is
flat; above: it grows with the number of tasks). The tasks declare their cores, memory and
disk and the stages get a pilot each (``per-stage``); ``--strategy`` plans otherwise (the
default strategy, ``elastic``, holds a unit per task's cores: here one per core), and
``--sized`` leaves memory and disk to the task sizer.

    python bench/scale.py [--sizes 10000,100000,1000000] [--shapes one,chain] [--nodes 20]
                          [--strategy per-stage] [--sized] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LEADTIME = [sys.executable, "-c", "from orchestrator.cli import main; main()"]

ONE = """
name = "scale-one"
[[stage]]
name = "work"
allocation = {{ cores = {cores}, nodes = {nodes}, memory = "{nodes} * 100G", time = "24h" }}
tasks = {{ command = "true", count = {n}, cores = 1{sizes} }}
simulate = {{ duration = "lognormal(60, 0.3)", memory = "normal(500, 50)", disk = "10" }}
"""

CHAIN_STAGE = """
[[stage]]
name = "s{i}"
{after}
allocation = {{ cores = {cores}, nodes = {nodes}, memory = "{nodes} * 100G", time = "24h" }}
tasks = {{ command = "true", count = {n}, cores = 1{sizes} }}
simulate = {{ duration = "lognormal(60, 0.3)", memory = "normal(500, 50)", disk = "10" }}
"""

DECLARED = ', memory = "1G", disk = "100M"'


def workflow(shape: str, n: int, nodes: int = 20, sized: bool = False) -> str:
    """The TOML of a workflow of ``n`` tasks of ``shape`` on ``nodes`` nodes of 28 cores;
    ``sized``: their memory and disk left to the sizer."""
    sizes = "" if sized else DECLARED
    if shape == "one":
        return ONE.format(n=n, cores=28 * nodes, nodes=nodes, sizes=sizes)
    text = 'name = "scale-chain"\n'
    for i, width in enumerate((nodes, nodes // 5, nodes, nodes // 5)):
        after = f'after = ["s{i - 1}"]' if i else ""
        text += CHAIN_STAGE.format(
            i=i, after=after, cores=28 * width, nodes=width, n=n // 4, sizes=sizes
        )
    return text


@dataclass(frozen=True)
class Measure:
    shape: str
    tasks: int
    wall_s: float
    rss_mb: float
    status: str

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.wall_s


def measure(
    shape: str, n: int, nodes: int, timeout: float, strategy: str = "per-stage", sized: bool = False
) -> Measure:
    """Run the workflow in a child process; its wall time and its peak RSS (from wait4)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "wf.toml").write_text(workflow(shape, n, nodes, sized))
        command = [
            *LEADTIME, "run", str(root / "wf.toml"), "--backend", "mock", "--load", "0",
            "--cluster", f"{nodes}x28:128G", "--strategy", strategy, "--quiet", "--json",
            "--db", str(root / "store.db"),
        ]  # fmt: skip
        with open(root / "out", "wb") as out, open(root / "err", "wb") as err:
            start = time.monotonic()
            child = subprocess.Popen(command, stdout=out, stderr=err)
            while True:
                pid, code, usage = os.wait4(child.pid, os.WNOHANG)
                wall = time.monotonic() - start
                if pid:
                    break
                if wall > timeout:
                    child.kill()
                    _, code, usage = os.wait4(child.pid, 0)
                    return Measure(shape, n, wall, usage.ru_maxrss / 1024, "timeout")
                time.sleep(0.05)
        rss = usage.ru_maxrss / 1024  # KiB on Linux
        if os.waitstatus_to_exitcode(code) != 0:
            tail = (root / "err").read_text()[-300:].strip()
            return Measure(shape, n, wall, rss, f"exit {os.waitstatus_to_exitcode(code)}: {tail}")
        return Measure(shape, n, wall, rss, json.loads((root / "out").read_text())["status"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--shapes", default="one,chain")
    parser.add_argument("--nodes", type=int, default=20, help="nodes of 28 cores (at least 5)")
    parser.add_argument("--strategy", default="per-stage", help="as leadtime run's")
    parser.add_argument(
        "--sized", action="store_true", help="leave the tasks' memory and disk to the sizer"
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.nodes < 5:
        parser.error("--nodes: at least 5 (the chain's narrow stages have a fifth of them)")
    print(f"{'shape':<6} {'tasks':>9} {'wall':>9} {'peak RSS':>9} {'tasks/s':>8} "
          f"{'cost/task vs previous':>22}  status")  # fmt: skip
    for shape in args.shapes.split(","):
        previous: Measure | None = None
        for n in sizes:
            m = measure(shape, n, args.nodes, args.timeout, args.strategy, args.sized)
            ratio = "-"
            if previous is not None:
                ratio = f"{(m.wall_s / m.tasks) / (previous.wall_s / previous.tasks):.2f}"
            print(
                f"{shape:<6} {n:>9,} {m.wall_s:>8.1f}s {m.rss_mb:>7.0f}MB "
                f"{m.tasks_per_s:>8,.0f} {ratio:>22}  {m.status}",
                flush=True,
            )
            previous = m


if __name__ == "__main__":
    main()
