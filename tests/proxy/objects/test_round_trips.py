"""On PostgreSQL an object's PUT costs few round trips: ``BEGIN`` and the fence claim go as one
simple query, and an inline body's PUT without preconditions is ONE: the database's write claim
and the pointer move (``EXECUTE``d from a statement the session prepared once) as one simple
query, one transaction. Counted here as waits of the real store's connections
(``WatchedConnection.wait``: one per round trip).

The rules stay: a stale fence changes nothing (the claim refuses it and the transaction aborts
whole: 409 with the highest fence), preconditions are judged before COMMIT, a session whose
prepared statements psycopg deallocated (after a rollback) prepares the move again, and a
connection lost while the claim and the move are in flight is 502 ``outcome_unknown``, not
503."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from lockd.common.fencerule import Fence
from resource_proxy.errors import OutcomeUnknown, PreconditionFailed, StaleToken
from resource_proxy.fencing import create_fence_table
from resource_proxy.idempotency import Keyed, Reply
from resource_proxy.objects.blobs import Stored
from resource_proxy.objects.store import Pointers, Preconditions
from resource_proxy.store.postgres import PostgresStore
from resource_proxy.store.watched import WatchedConnection


@pytest.fixture
def made(pg_dsn: str, pg_url: str) -> str:
    engine = sa.create_engine(pg_url)
    try:
        create_fence_table(engine)
    finally:
        engine.dispose()
    return pg_dsn


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the store's connections waited for the server (round trips)."""
    counted = [0]
    real = WatchedConnection.wait

    async def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(WatchedConnection, "wait", wait)
    return counted


async def _pointers(dsn: str) -> tuple[PostgresStore, Pointers]:
    store = PostgresStore(dsn, {}, pool_size=1)  # one connection: every call on the same session
    await store.open()
    pointers = Pointers(store, postgres=True)
    await pointers.create()
    return store, pointers


def _put(pointers: Pointers, fence: Fence, name: str, inline: bytes | None,
         conditions: Preconditions = Preconditions()) -> Any:
    return pointers.put(fence, "b", "k", Stored(name, 4, "ab" * 32), "text/plain", conditions,
                        None, [], inline=inline)


def test_an_inline_put_without_preconditions_is_one_round_trip(made: str,
                                                                 waits: list[int]) -> None:
    async def main() -> dict[str, int]:
        store, pointers = await _pointers(made)
        fence = Fence("objects/k", 3)
        try:
            await _put(pointers, fence, "n-0", b"warm")  # the session prepares the move once
            counts = {}
            for label, inline, conditions in (
                    ("inline", b"tiny", Preconditions()),
                    ("inline, If-Match: *", b"tiny", Preconditions(if_match=("*",))),
                    ("blob", None, Preconditions())):
                before = waits[0]
                created, pointer = await _put(pointers, fence, f"n-{label}", inline, conditions)
                assert not created and pointer.blob == f"n-{label}"
                counts[label] = waits[0] - before
            now = await pointers.get("b", "k", None)
            assert now is not None and (now.version, now.blob) == (4, "n-blob")
            return counts
        finally:
            await store.close()

    # at first: BEGIN, the claim, the move, COMMIT: 4 each; then 2 for the inline one
    assert uvloop_run(main()) == {"inline": 1, "inline, If-Match: *": 3, "blob": 3}


def test_a_keyed_put_is_three_round_trips_and_its_replay_answers_the_same(
        made: str, waits: list[int]) -> None:
    """With an Idempotency-Key: BEGIN, the key's claim and the fence claim; the move; the
    record and COMMIT. The same key again replays the recorded answer and moves nothing."""

    def render(result: Any) -> Reply:
        created, pointer = result
        return Reply(201 if created else 200, f"v{pointer.version}")

    async def main() -> tuple[list[int], list[Reply]]:
        store, pointers = await _pointers(made)
        fence = Fence("objects/k", 2)
        try:
            counts, replies = [], []
            for key, inline in (("key-1", b"tiny"), ("key-2", None), ("key-1", b"tiny")):
                once = Keyed(key, "PUT", "/v1/objects/b/k", b"same").once([fence], 60_000,
                                                                         render)
                before = waits[0]
                replies.append(await pointers.put(fence, "b", "k", Stored(f"n-{key}", 4,
                                                  "ab" * 32), "text/plain", Preconditions(),
                                                  once, [], inline=inline))
                counts.append(waits[0] - before)
            now = await pointers.get("b", "k", None)
            assert now is not None and (now.version, now.blob) == (2, "n-key-2")
            return counts, replies
        finally:
            await store.close()

    counts, replies = uvloop_run(main())
    # before: BEGIN, the key, the claim, the move, the record, COMMIT: 6
    assert counts[:2] == [3, 3]
    assert [(r.status, r.body, r.replayed) for r in replies] == [
        (201, "v1", False), (200, "v2", False), (201, "v1", True)]


def test_a_stale_fence_changes_nothing_and_the_move_is_prepared_again_after_a_rollback(
        made: str) -> None:
    async def main() -> None:
        store, pointers = await _pointers(made)
        try:
            await _put(pointers, Fence("objects/k", 5), "n-1", b"one")
            for _ in range(6):  # psycopg prepares this read: its rollbacks DEALLOCATE ALL
                await pointers.get("b", "k", None)
            with pytest.raises(StaleToken) as stale:
                await _put(pointers, Fence("objects/k", 4), "n-stale", b"two")
            assert (stale.value.extra["presented"], stale.value.extra["highest"]) == (4, 5)
            with pytest.raises(PreconditionFailed):
                await _put(pointers, Fence("objects/k", 5), "n-412", b"two",
                           Preconditions(if_none_match=True))
            now = await pointers.get("b", "k", None)
            assert now is not None and (now.version, now.blob, now.fence) == (1, "n-1", 5)
            created, pointer = await _put(pointers, Fence("objects/k", 6), "n-2", b"three")
            assert not created and pointer.version == 2
            now = await pointers.get("b", "k", None)
            assert now is not None and (now.blob, now.body, now.fence) == ("n-2", b"three", 6)
        finally:
            await store.close()

    uvloop_run(main())


def test_a_connection_lost_with_the_claim_and_the_move_in_flight_is_outcome_unknown(
        made: str, pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = WatchedConnection.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, bytes) and b"EXECUTE" in query:
            with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (self.info.backend_pid,))
        return await real(self, query, *args, **kwargs)

    async def main() -> None:
        store, pointers = await _pointers(made)
        try:
            await _put(pointers, Fence("objects/k", 1), "n-1", b"one")  # prepared
            monkeypatch.setattr(WatchedConnection, "execute", execute)
            with pytest.raises(OutcomeUnknown):
                await _put(pointers, Fence("objects/k", 1), "n-2", b"two")
        finally:
            await store.close()

    uvloop_run(main())


def uvloop_run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro) if hasattr(uvloop, "run") else asyncio.run(coro)
