"""Semaphore waiters at one lockd are served first come, first served
(``lockd.server.core.waiting``), also when a later request's store call lands after a release
whose notification has not arrived yet.

The semaphore here is a counter in memory (``_Semaphore``: the ``Kind`` the queues ask, as
``lockd.server.semaphores.service._Permit`` asks a store), so the test decides exactly when a
permit frees, when a store call lands and when the release's notification is delivered.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from lockd.server.core.waiting import PERMIT, Waiter, WaitQueues
from lockd.server.errors import LockHeld
from lockd.server.store.values import Holder

KEY = "#sem/jobs"
LIMIT = 2


@dataclass
class _Grant:
    lease_id: str
    owner: str


class _Semaphore:
    """``free`` permits; a store call of an owner named in ``gates`` waits for its event."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.gates: dict[str, asyncio.Event] = {}
        self.asked: list[str] = []

    async def ask(self, waiter: Waiter) -> _Grant | list[Holder]:
        self.asked.append(waiter.owner)
        gate = self.gates.get(waiter.owner)
        if gate is not None:
            await gate.wait()
        if self.free > 0:
            self.free -= 1
            return _Grant(waiter.lease_id, waiter.owner)
        return [Holder(KEY, "holder", 60_000, 1, PERMIT)]

    async def release(self, grant: _Grant) -> None:
        self.free += 1

    @staticmethod
    def holder(grant: _Grant, lock: str) -> Holder:
        return Holder(lock, grant.owner, 60_000, 1, PERMIT)

    @staticmethod
    def refused(holders: list[Holder]) -> LockHeld:
        return LockHeld("full")

    async def held_behind_queue(self, locks: tuple[str, ...], waited: bool) -> LockHeld:
        return LockHeld("waiters ahead")


class _Store:
    def subscribe(self, listener) -> None:  # the test delivers notifications itself
        pass


def _waiter(owner: str) -> Waiter:
    return Waiter((KEY,), f"lease-{owner}", 60_000, owner, None, PERMIT, LIMIT)


async def _until(condition, what: str, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.002)


def test_a_later_waiter_does_not_take_the_permit_freed_for_the_one_the_store_refused():
    async def scenario() -> None:
        sem, queues = _Semaphore(free=0), WaitQueues(_Store())
        w1, w2 = _waiter("w1"), _waiter("w2")
        t1 = asyncio.create_task(queues.acquire(sem, w1, 5_000))
        await _until(lambda: w1.refused_asleep, "w1 refused and asleep")
        sem.gates["w2"] = gate = asyncio.Event()  # w2's store call, if it makes one, lands late
        t2 = asyncio.create_task(queues.acquire(sem, w2, 5_000))
        await _until(lambda: "w2" in sem.asked or w2.refused_asleep, "w2 queued")
        sem.free += 1  # a release commits ...
        gate.set()
        await _until(lambda: t2.done() or w2.refused_asleep, "w2's call answered")
        queues.may_be_free(KEY)  # ... and its notification arrives
        await asyncio.wait({t1}, timeout=2)
        assert t1.done() and t1.result().owner == "w1", (sem.asked, t2.done())
        assert not t2.done(), "w2 took the permit freed for w1, who was ahead of it"
        queues.may_be_free(KEY)  # nothing freed: w2 asks and is refused again
        await _until(lambda: w2.refused_asleep, "w2 refused again")
        sem.free += 1
        queues.may_be_free(KEY)
        assert (await asyncio.wait_for(t2, 2)).owner == "w2"

    asyncio.run(scenario())


def test_a_request_that_does_not_wait_does_not_pass_a_refused_waiter():
    async def scenario() -> None:
        sem, queues = _Semaphore(free=0), WaitQueues(_Store())
        w1 = _waiter("w1")
        t1 = asyncio.create_task(queues.acquire(sem, w1, 5_000))
        await _until(lambda: w1.refused_asleep, "w1 refused and asleep")
        sem.free += 1  # a release commits; its notification has not arrived yet
        with pytest.raises(LockHeld):  # one waiter queued, fewer than the limit: still no
            await queues.acquire(sem, _waiter("no-wait"), 0)
        assert sem.free == 1 and "no-wait" not in sem.asked
        queues.may_be_free(KEY)
        assert (await asyncio.wait_for(t1, 2)).owner == "w1"

    asyncio.run(scenario())


def test_permits_freed_together_wake_as_many_waiters_and_a_burst_asks_at_once():
    async def scenario() -> None:
        sem, queues = _Semaphore(free=0), WaitQueues(_Store())
        w1, w2 = _waiter("w1"), _waiter("w2")
        t1 = asyncio.create_task(queues.acquire(sem, w1, 5_000))
        await _until(lambda: w1.refused_asleep, "w1 asleep")
        t2 = asyncio.create_task(queues.acquire(sem, w2, 5_000))
        await _until(lambda: w2.refused_asleep, "w2 asleep")
        assert sem.asked == ["w1"]  # behind a refused waiter, w2 did not ask
        sem.free += 2
        queues.may_be_free(KEY)
        queues.may_be_free(KEY)
        got = await asyncio.wait_for(asyncio.gather(t1, t2), 2)
        assert [g.owner for g in got] == ["w1", "w2"]

        # with nobody refused, arrivals ask the store without waiting for each other
        sem.gates = {"b1": asyncio.Event(), "b2": asyncio.Event()}
        sem.free = 2
        b1, b2 = _waiter("b1"), _waiter("b2")
        tasks = [asyncio.create_task(queues.acquire(sem, b, 5_000)) for b in (b1, b2)]
        await _until(lambda: {"b1", "b2"} <= set(sem.asked), "both in the store at once")
        for gate in sem.gates.values():
            gate.set()
        assert {g.owner for g in await asyncio.wait_for(asyncio.gather(*tasks), 2)} \
            == {"b1", "b2"}

    asyncio.run(scenario())
