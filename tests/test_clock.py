import asyncio
import threading
import time

from backends import clock


def test_virtual_time_jumps_over_sleeps():
    async def main():
        start = clock.now()
        await clock.sleep(10 * 3600)
        return clock.now() - start

    real = time.monotonic()
    assert clock.run(main(), virtual=True) == 10 * 3600
    assert time.monotonic() - real < 1.0


def test_timers_fire_in_virtual_order():
    order = []

    async def after(delay, name):
        await asyncio.sleep(delay)
        order.append((name, clock.now()))

    async def main():
        await asyncio.gather(after(30, "c"), after(10, "a"), after(20, "b"))

    clock.run(main(), virtual=True)
    assert order == [("a", 10), ("b", 20), ("c", 30)]


def test_held_thread_calls_do_not_let_time_jump():
    """While a thread works for the loop, a 1 s timer must not fire first."""

    def in_thread(seconds: float) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def work() -> None:
            time.sleep(seconds)
            loop.call_soon_threadsafe(future.set_result, None)

        threading.Thread(target=work).start()
        return future

    async def main():
        order = []

        async def worker():
            for _ in range(20):
                await clock.held(in_thread(0.005))
            order.append(("worker", clock.now()))

        async def timer():
            await asyncio.sleep(1)
            order.append(("timer", clock.now()))

        await asyncio.gather(worker(), timer())
        return order

    assert clock.run(main(), virtual=True) == [("worker", 0), ("timer", 1)]


def test_executor_calls_hold_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        seen = []

        async def timer():
            await asyncio.sleep(0.5)
            seen.append("timer")

        t = asyncio.ensure_future(timer())
        await loop.run_in_executor(None, time.sleep, 0.05)
        seen.append("executor")
        await t
        return seen

    assert clock.run(main(), virtual=True) == ["executor", "timer"]


def test_epoch_follows_virtual_clock():
    async def main():
        await clock.sleep(100)
        return clock.epoch_now()

    assert clock.run(main(), virtual=True, epoch=1_000_000.0) == 1_000_100.0


def test_real_loop_is_untouched():
    async def main():
        assert not isinstance(asyncio.get_running_loop(), clock.VirtualTimeLoop)
        start = clock.now()
        await clock.sleep(0.01)
        return clock.now() - start

    assert clock.run(main(), virtual=False) >= 0.01


def test_epoch_conversions_are_exact_on_virtual_time():
    async def main():
        await clock.sleep(100)
        return clock.from_epoch(1_000_050.0), clock.to_epoch(20.0)

    assert clock.run(main(), virtual=True, epoch=1_000_000.0) == (50.0, 1_000_020.0)


def test_epoch_conversions_round_trip_on_real_time():
    async def main():
        t = time.time() - 30
        return t, clock.to_epoch(clock.from_epoch(t)), clock.now() - clock.from_epoch(t)

    t, back, age = clock.run(main(), virtual=False)
    assert abs(back - t) < 0.01
    assert 29.9 < age < 30.1
