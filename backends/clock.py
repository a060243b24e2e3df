"""Real time or virtual time: the only module that reads a clock or sleeps.

Simulated runs use :class:`VirtualTimeLoop`, an asyncio event loop whose clock
jumps to the next scheduled callback whenever nothing is ready, so the same
engine code runs a day of cluster time in seconds.

The trap of virtual time: while a thread-backed call (the store's SQLite, an executor)
is outstanding, the loop looks idle although a result is on its way. Jumping
the clock then would reorder simulated events. Such calls run inside
:func:`hold`, which makes the loop wait for real until they finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that advances the loop's clock instead of blocking."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self._loop
        if timeout is not None and timeout <= 0:
            return super().select(0)
        if timeout is None or loop._holds:
            # Nothing scheduled, or a thread is working for us: wait for real I/O.
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0:
            loop._now += timeout
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, starting at ``start`` seconds."""

    def __init__(self, start: float = 0.0, epoch: float = 0.0) -> None:
        self._now = start
        self._holds = 0
        self.epoch = epoch
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def run_in_executor(
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._holds += 1
        future.add_done_callback(self._release)
        return future

    def _release(self, _: object = None) -> None:
        self._holds -= 1


def now() -> float:
    """Seconds on the running loop's clock (virtual or monotonic)."""
    return asyncio.get_running_loop().time()


def epoch_now() -> float:
    """Unix time: real, or the virtual loop's epoch plus its clock."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, VirtualTimeLoop):
        return loop.epoch + loop.time()
    return time.time()


def from_epoch(t: float) -> float:
    """The running loop's clock reading at Unix time ``t`` (e.g. a time Slurm reported)."""
    return now() + (t - epoch_now())


def to_epoch(t: float) -> float:
    """The Unix time at which the running loop's clock reads ``t``."""
    return epoch_now() + (t - now())


def monotonic() -> float:
    """Real monotonic seconds, whatever loop runs (for rate limits and benchmarks)."""
    return time.monotonic()


def wall() -> float:
    """Real Unix time, whatever loop runs (for records a human reads)."""
    return time.time()


async def sleep(seconds: float) -> None:
    await asyncio.sleep(max(0.0, seconds))


async def sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - now()))


@contextlib.asynccontextmanager
async def hold() -> AsyncIterator[None]:
    """Keep virtual time still while a thread-backed call is outstanding."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        yield
        return
    loop._holds += 1
    try:
        yield
    finally:
        loop._release()


async def held(awaitable: Awaitable[T]) -> T:
    """Await a thread-backed call without letting virtual time move."""
    async with hold():
        return await awaitable


def run(main: Coroutine[Any, Any, T], *, virtual: bool, epoch: float | None = None) -> T:
    """Run ``main`` to completion on a fresh loop, virtual or real."""
    if not virtual:
        return asyncio.run(main)
    loop = VirtualTimeLoop(epoch=time.time() if epoch is None else epoch)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
