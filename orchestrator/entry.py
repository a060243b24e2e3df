"""The ``leadtime`` console script: the command line, loaded so that Ctrl-C while it loads
(the first second or so) leaves at once and quietly, as it does later, not with a traceback
from the middle of an import."""

from __future__ import annotations

import signal
import sys
from types import FrameType

INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it."""


def _leave(signum: int, frame: FrameType | None) -> None:
    sys.exit(INTERRUPTED)


def main() -> None:
    before = signal.getsignal(signal.SIGINT)
    if before is signal.default_int_handler:  # not where Ctrl-C is ignored (``nohup``, ``&``)
        signal.signal(signal.SIGINT, _leave)
    from orchestrator import cli

    signal.signal(signal.SIGINT, before)
    cli.main()
