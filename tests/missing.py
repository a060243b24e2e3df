"""What a test does when a part it needs is missing here: skip, with the reason, except
under CI, which always has every part (the traces beside the clone, the local Slurm with
its second node), where a missing part is a failure."""

import os
from typing import NoReturn

import pytest


def missing(why: str) -> NoReturn:
    """Skip the test for ``why``, or fail it under CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs {why}")
    pytest.skip(f"needs {why}")
