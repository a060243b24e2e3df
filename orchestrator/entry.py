"""The ``leadtime`` console script: the command line, loaded so that Ctrl-C while it loads
(the first second or so: its imports, then typer building its commands) leaves at once and
quietly, as it does later, not with a traceback from the middle of an import."""

from __future__ import annotations

import os
import signal
from types import FrameType

INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it."""


def _leave(signum: int, frame: FrameType | None) -> None:
    """Leaves without unwinding: an exception raised here can land in a weakref callback of the
    import machinery, where Python prints it as ignored and goes on. While the command line
    loads, nothing is open or written that unwinding would close or flush."""
    os._exit(INTERRUPTED)


def loaded() -> None:
    """Gives Ctrl-C back to Python once a command is about to run: from there each command
    handles it (a run releases its pilots)."""
    if signal.getsignal(signal.SIGINT) is _leave:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    # not where Ctrl-C is ignored (``nohup``, ``&``)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _leave)
    from orchestrator import cli

    cli.main()
