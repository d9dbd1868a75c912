"""The wait queues' preference hook (``WaitQueues.prefer``: an election's handover target goes
first), on a real queue: a ``LockService`` on SQLite, acquires waiting as tasks."""

from __future__ import annotations

import asyncio

from harness import wait_for_async
from lockd.server.core.base import Core
from lockd.server.locks.service import LockService
from lockd.server.settings import Settings
from lockd.server.store.sqlite import SqliteStore
from lockd.tokens import KeyRing


def test_the_preference_moves_only_a_waiter_for_that_lock_alone(tmp_path):
    """``WaitQueues.prefer`` on a real queue (a LockService on SQLite): a multi-lock waiter
    keeps its place (rule 3), a preferred single-lock one goes first now or when it joins."""

    async def main() -> None:
        settings = Settings(store=f"sqlite:///{tmp_path / 'p.db'}", key_dir=tmp_path / "keys")
        store = SqliteStore(str(tmp_path / "p.db"))
        await store.open()
        core = Core(store, KeyRing.generate(), settings)
        service = LockService(core)
        queues, owners = core.waiting, lambda: service.waiting_owners("p/1")
        held = await service.acquire("p/1", ttl_ms=10_000)
        tasks = {}

        async def join(owner: str, *more: str) -> None:
            locks = ["p/1", *more]
            tasks[owner] = asyncio.ensure_future(
                service.acquire_many(locks, ttl_ms=10_000, wait_ms=10_000, owner=owner) if more
                else service.acquire("p/1", ttl_ms=10_000, wait_ms=10_000, owner=owner))
            await wait_for_async(lambda: owner in owners(), interval=0.005,
                                 what=f"{owner} queued")

        try:
            for owner, more in (("a", ()), ("set", ("p/2",)), ("b", ())):
                await join(owner, *more)
            queues.prefer("p/1", "set")
            assert owners() == ["a", "set", "b"]  # a set keeps its place
            queues.prefer("p/1", "b")
            assert owners() == ["b", "a", "set"]
            queues.prefer("p/1", "c")
            await join("c")  # preferred before it arrived: it goes first on arrival
            assert owners() == ["c", "b", "a", "set"]
            await service.release("p/1", held.lease_id)
            first = await asyncio.wait_for(tasks["c"], 5)
            assert first.owner == "c" and first.fence > held.fence
            queues.prefer("p/1", None)
            await join("d")
            assert owners() == ["b", "a", "set", "d"] and not queues.preferred
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await store.close()

    asyncio.run(main())
