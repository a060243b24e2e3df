"""leadtime's asyncio shell around its learners (docs/architecture.md is the map).

leadtime installs four top-level packages, ``orchestrator``, ``backends``, ``learners`` and
``workflows``: names general enough that another distribution may install one of them too,
and then whichever comes first on the path would be imported, silently. So this package checks,
as it is imported, that its three siblings are the ones installed beside it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SIBLINGS = ("backends", "learners", "workflows")


def check_siblings() -> None:
    """Raise ImportError naming the package of another distribution that shadows one of
    leadtime's, or that leadtime's shadows."""
    here = Path(__file__).resolve().parent.parent
    for name in SIBLINGS:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is None or Path(origin).resolve().parent.parent != here:
            raise ImportError(
                f"leadtime's package {name!r} is not the one Python finds ({origin or 'none'}, "
                f"not under {here}): another distribution installs a package of that name; "
                "install leadtime in a virtual environment of its own"
            )


check_siblings()
