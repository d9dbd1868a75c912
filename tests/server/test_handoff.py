"""Handoff on a store that applies operations in call order (SQLite): the head waiter's acquire
is queued right behind the release, before the release has completed.

Order is observed at the store's own entry point; no timing is asserted (figures are in
bench/notes/waiters.md).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path

from harness import wait_for_async
from lockd.server.core.base import Core
from lockd.server.locks.service import LockService
from lockd.server.settings import Settings
from lockd.server.store.sqlite import SqliteStore
from lockd.server.store.values import Grant
from lockd.tokens import KeyRing


def _service(tmp_path: Path) -> tuple[LockService, SqliteStore, list[tuple[str, str]]]:
    store = SqliteStore(str(tmp_path / "h.db"))
    calls: list[tuple[str, str]] = []
    real = store._call
    acquire_sent = threading.Event()

    def held_open(op):
        """``op`` (a release), run in the store's thread once an acquire has been sent (5 s at
        most): the store thread cannot finish the release before the loop has had its turn, so
        the order below shows when the head is woken, not how fast the thread is."""
        @functools.wraps(op)
        def run(*args):
            acquire_sent.wait(5)
            return op(*args)
        return run

    async def recorded(op, *args):
        calls.append(("sent", op.__name__))
        if op.__name__ == "_acquire":
            acquire_sent.set()
        elif op.__name__ == "_release":
            op = held_open(op)
        try:
            return await real(op, *args)
        finally:
            calls.append(("done", op.__name__))

    store._call = recorded  # type: ignore[method-assign]
    settings = Settings(store=f"sqlite:///{tmp_path / 'h.db'}", key_dir=tmp_path / "keys")
    return LockService(Core(store, KeyRing.generate(), settings)), store, calls


def test_the_head_acquire_is_queued_behind_the_release_before_it_completes(tmp_path):
    async def main() -> None:
        service, store, calls = _service(tmp_path)
        await store.open()
        try:
            held = await service.acquire("h/1", ttl_ms=10_000)
            waiting = asyncio.ensure_future(service.acquire("h/1", ttl_ms=10_000,
                                                            wait_ms=10_000, owner="next"))
            # queued, and its first try was refused
            await wait_for_async(lambda: service.waiters("h/1") == 1
                                 and ("done", "_acquire") in calls[2:],
                                 interval=0.001, what="the waiter queued after a refused try")
            del calls[:]
            await service.release("h/1", held.lease_id)
            granted = await waiting
            assert granted.owner == "next" and granted.fence == held.fence + 1
            assert calls[:3] == [("sent", "_release"), ("sent", "_acquire"),
                                 ("done", "_release")], calls
            assert [c for c in calls if c[0] == "sent"] == [("sent", "_release"),
                                                             ("sent", "_acquire")], calls
        finally:
            await store.close()

    asyncio.run(main())


def test_a_failed_release_does_not_hand_the_lock_over(tmp_path):
    async def main() -> None:
        service, store, calls = _service(tmp_path)
        await store.open()
        try:
            held = await service.acquire("h/2", ttl_ms=10_000, owner="holder")
            waiting = asyncio.ensure_future(service.acquire("h/2", ttl_ms=10_000,
                                                            wait_ms=300, owner="next"))
            await wait_for_async(lambda: service.waiters("h/2") == 1, interval=0.001,
                                 what="the waiter queued")
            try:
                await service.release("h/2", "not-the-lease-id-000000000000000")
            except Exception as exc:  # LeaseLost: 410
                assert type(exc).__name__ == "LeaseLost"
            else:
                raise AssertionError("a release with a wrong lease id succeeded")
            try:
                await waiting
            except Exception as exc:  # LockHeld after its wait_ms: the holder kept it
                assert type(exc).__name__ == "LockHeld"
            else:
                raise AssertionError("the waiter was granted a held lock")
            state = await store.get("h/2")
            assert state.owner == "holder" and state.fence == held.fence
            late = await store.acquire("h/2", lease_id="x" * 32, ttl_ms=1000, owner="late",
                                       client_id=None)
            assert not isinstance(late, Grant)  # still held by the holder
        finally:
            await store.close()

    asyncio.run(main())
