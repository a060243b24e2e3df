"""Where the task and queue traces for tests and benchmarks live: ``$LEADTIME_DATA``, else
``../shared/data`` beside the checkout. leadtime itself needs none of them: the queue logs behind
``--trace HPC2N|KTH|CTC`` ship with the package (``backends/sim/traces``)."""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


class DataNotFound(FileNotFoundError):
    pass


def data_dir() -> Path:
    """The directory holding ``swf/``, ``ipdps2024/``, ``nfcore/`` ..."""
    candidates = [Path(p) for p in [os.environ.get("LEADTIME_DATA")] if p]
    candidates += [_CHECKOUT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    candidates = list(dict.fromkeys(p.resolve() for p in candidates))
    for path in candidates:
        if path.is_dir():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise DataNotFound(f"trace data not found (tried {tried}); set LEADTIME_DATA")
