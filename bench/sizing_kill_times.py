"""The calibrated kill-time table of the replay, recomputed from the bucketing paper's logs.

Reads the TaskVine transaction logs of Phung & Thain (IPDPS 2024), as published with
the paper (``synthetic_workflows/txn_logs/<workflow>/<algorithm>.txn.log``), and
prints the quantiles :mod:`learners.kill_times` keeps as ``CALIBRATED``.

    python bench/sizing_kill_times.py PATH/synthetic_workflows/txn_logs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from learners.kill_times import CALIBRATED, LEVELS, RATIO_EDGES, fit
from workflows.traces import taskvine_kills


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="directory of <workflow>/<algorithm>.txn.log")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.logs.glob("*/*.txn.log") if not p.name.startswith("whole"))
    if not files:
        print(f"no <workflow>/<algorithm>.txn.log under {args.logs}", file=sys.stderr)
        return 2
    samples = [s for path in files for s in taskvine_kills(path)]
    table = fit(samples)
    print(f"{len(samples)} killed attempts in {len(files)} logs; quantiles at {LEVELS}")
    bins = [f"<{e:g}" for e in RATIO_EDGES] + [f">={RATIO_EDGES[-1]:g}"]
    for resource, rows in table.fraction.items():
        ratios = np.array([s[1] for s in samples if s[0] == resource])
        counts = np.bincount(np.searchsorted(RATIO_EDGES, ratios, side="right"), minlength=5)
        for label, row, n in zip(bins, rows, counts, strict=True):
            print(f"{resource:<7} alloc/peak {label:<6} n={n:<5} fraction {row}")
        print(f"{resource:<7} reached {table.reached[resource]}")
    same = table == CALIBRATED
    print(f"\nas learners.kill_times.CALIBRATED: {'yes' if same else 'NO'}")
    print(f"CALIBRATED = {table!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
