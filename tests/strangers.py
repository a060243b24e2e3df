"""Clients a run's manager must refuse: no secret, random bytes, an oversized frame."""

import asyncio
import os

import pytest

from learners.resources import Resources
from orchestrator.agent import protocol


async def intrude(address: tuple[str, int], timeout: float = 5) -> None:
    """A client without the run's secret, one sending random bytes, one an oversized frame."""
    reader, writer = await asyncio.open_connection(*address)
    with pytest.raises(protocol.AuthError):
        await protocol.offer(
            protocol.Channel(reader, writer),
            bytes(32),
            protocol.Registration("intruder", "", "x", 1, Resources(1, 1, 1), None),
        )
    writer.close()
    # Random bytes; then an oversized frame's header alone: the manager must not wait for a body.
    for payload in (os.urandom(4096), (protocol.MAX_FRAME * 4).to_bytes(4, "big")):
        reader, writer = await asyncio.open_connection(*address)
        writer.write(payload)
        assert await asyncio.wait_for(reader.read(), timeout) == b""  # closed by the manager
        writer.close()
