"""The SQLite store's hand-over to its thread: the operations called during one turn of the
event loop reach the store thread together (one queue item, one wake-up, one transaction), in
call order; those called in the turn that closes the store still run."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lockd.server.store.sqlite import SqliteStore
from lockd.server.store.sqlite import store as store_mod
from lockd.server.store.values import Grant


class _CountingQueue:
    """The store's queue, counting the items put on it."""

    def __init__(self, inner) -> None:
        self.inner, self.puts = inner, 0

    def put(self, item) -> None:
        self.puts += item is not None
        self.inner.put(item)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_one_turns_operations_are_one_queue_item_and_one_transaction(tmp_path: Path,
                                                                     monkeypatch) -> None:
    batches: list[int] = []
    run_batch = store_mod._run_batch

    def spy(conn, clock, batch):
        batches.append(len(batch))
        return run_batch(conn, clock, batch)

    monkeypatch.setattr(store_mod, "_run_batch", spy)

    async def main() -> None:
        store = SqliteStore(str(tmp_path / "h.db"))
        await store.open()
        try:
            counting = store._queue = _CountingQueue(store._queue)
            batches.clear()
            grants = await asyncio.gather(*(
                store.acquire(f"h/{i}", lease_id=f"l{i}", ttl_ms=5000, owner="o",
                              client_id=None) for i in range(6)))
            assert all(isinstance(g, Grant) for g in grants)
            assert counting.puts == 1  # one wake-up of the store thread for the six
            assert batches == [6]  # one transaction, so one fsync
            # call order within a turn holds: the release is applied before the acquire
            freed, again = await asyncio.gather(store.release("h/0", "l0"), store.acquire(
                "h/0", lease_id="l0b", ttl_ms=5000, owner="o", client_id=None))
            assert freed is None and isinstance(again, Grant)
            assert again.fence == grants[0].fence + 1
        finally:
            await store.close()

    asyncio.run(main())


def test_operations_called_in_the_closing_turn_still_run(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(str(tmp_path / "c.db"))
        await store.open()
        call = asyncio.ensure_future(store.acquire("c/a", lease_id="l1", ttl_ms=5000,
                                                   owner="o", client_id=None))
        await asyncio.sleep(0)  # the acquire has called the store; its hand-over is not run yet
        assert store._pending
        await store.close()
        grant = await asyncio.wait_for(call, 5)
        assert isinstance(grant, Grant) and grant.fence == 1

    asyncio.run(main())
