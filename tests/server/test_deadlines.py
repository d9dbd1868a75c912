"""``lockd.server.core.waiting.Deadlines``: one loop timer for every sleeping waiter's timeout."""

from __future__ import annotations

import asyncio

from lockd.server.core.waiting import Deadlines, Waiter


def test_futures_resolve_at_their_deadlines_in_order_and_done_ones_are_left_alone():
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        order: list[int] = []
        futures = []
        for i, delay in enumerate((0.06, 0.02, 0.04)):
            future = loop.create_future()
            future.add_done_callback(lambda f, i=i: order.append(i) if not f.cancelled() else None)
            deadlines.add(loop, loop.time() + delay, future)
            futures.append(future)
        futures[2].cancel()  # a waiter that left early: its entry is stale
        start = loop.time()
        await asyncio.wait_for(asyncio.gather(futures[0], futures[1]), 2)
        assert loop.time() - start >= 0.05
        return order

    assert asyncio.run(main()) == [1, 0]


def test_stale_entries_are_dropped_when_the_heap_outgrows_its_limit():
    async def main() -> int:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        for _ in range(5000):  # woken early: done long before their 60 s deadline
            future = loop.create_future()
            deadlines.add(loop, loop.time() + 60, future)
            future.set_result(None)
        live = loop.create_future()
        deadlines.add(loop, loop.time() + 0.01, live)
        await asyncio.wait_for(live, 2)
        return len(deadlines._heap)

    assert asyncio.run(main()) <= 1024


def test_a_waiter_naps_on_the_shared_timer_until_its_flag_or_its_timeout():
    async def main() -> tuple[bool, bool]:
        deadlines = Deadlines()
        waiter = Waiter(("a",), "lease", 1000)
        nap = waiter.nap("turn", 0.02, deadlines)
        assert nap is not None
        await asyncio.wait_for(nap, 2)  # the timeout
        waiter.woke()
        nap = waiter.nap("wake", 30, deadlines)
        assert nap is not None
        asyncio.get_running_loop().call_soon(waiter.set_wake)
        await asyncio.wait_for(nap, 2)  # the flag, long before 30 s
        waiter.woke()
        return waiter.wake, waiter.nap("wake", 30, deadlines) is None

    assert asyncio.run(main()) == (True, True)
