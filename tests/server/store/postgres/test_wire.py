"""The hot statements sent with libpq directly (``lockd.server.store.postgres.wire``) and the
LISTEN connection read without psycopg's ``notifies()``, on a real PostgreSQL: parameters
written as text (arrays quoted by hand), named statements prepared per connection (again after
a ``DEALLOCATE ALL``; never with ``prepare_threshold=none``), a statement cancelled in flight,
notifications across heartbeats."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from harness import wait_for_async
from lockd.server.store.postgres import PostgresStore
from lockd.server.store.postgres.wire import Statement, text
from lockd.server.store.values import Grant
from tests.server.store.postgres.support import lease_id, opened, waiting_on_a_row_lock

ODD = ['a"b', "a\\b", 'a\\"', "a,b", "{x}", "NULL", "null", " sp ", "é/ü/字", "x" * 300,
       "'", "a b\tc", ""]


async def _prepared(store: PostgresStore) -> list[str]:
    """The named statements of lockd's (only, with ``pool_max=1``) pooled connection."""

    async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[str]:
        cur = await conn.execute("SELECT name FROM pg_prepared_statements"
                                 " WHERE name LIKE 'lockd%' ORDER BY name")
        return [r[0] for r in await cur.fetchall()]

    return await store._run(op, retry=False)


def test_statement_numbers_its_placeholders_in_first_use_order():
    st = Statement("s", "SELECT %(b)s, %(a)s, %(b)s::int")
    assert (st.query, st.keys) == (b"SELECT $1, $2, $1::int", ("b", "a"))
    with pytest.raises(ValueError):
        Statement("s", "SELECT %s")


def test_text_values():
    assert text(None, "utf-8") is None
    assert text(12, "utf-8") == b"12"
    assert text("é", "utf-8") == "é".encode()
    assert text(['a"b', None, "a\\b", "NULL"], "utf-8") == b'{"a\\"b",NULL,"a\\\\b","NULL"}'
    assert text([1, None, 3], "utf-8") == b"{1,NULL,3}"
    with pytest.raises(psycopg.DataError):
        text(["a\x00"], "utf-8")


def test_odd_names_and_owners_round_trip_in_one_batch_each(pg_url):
    """Quotes, backslashes, commas, braces, the word NULL, spaces, non-ASCII, long and empty
    text in the batch statements' array parameters: each request gets its own row back."""
    names = [f"odd/{i}/{s}" for i, s in enumerate(ODD)]

    async def main():
        async with opened(pg_url) as store:
            got = await asyncio.gather(*(
                store.acquire(n, lease_id=lease_id(), ttl_ms=5000, owner=o, client_id=o or None)
                for n, o in zip(names, ODD, strict=True)))
            assert [(g.lock, g.owner, g.fence) for g in got] == [
                (n, o, 1) for n, o in zip(names, ODD, strict=True)]
            assert all(isinstance(g, Grant) for g in got)
            assert store._acquires is not None and store._acquires.stats["batches"] == 1
            for n, o in zip(names, ODD, strict=True):
                state = await store.get(n)
                assert (state.held, state.owner) == (True, o)
            await asyncio.gather(*(store.release(g.lock, g.lease_id) for g in got))
            assert store._releases is not None and store._releases.stats["batched"] == len(ODD) - 1
            assert not any([(await store.get(n)).held for n in names])

    asyncio.run(main())


def test_statements_deallocated_behind_the_store_are_prepared_again(pg_url):
    """psycopg sends ``DEALLOCATE ALL`` on a connection after a rollback there: the next hot
    statement finds its name gone, prepares it again and is answered."""

    async def main():
        async with opened(pg_url + "?pool_max=1") as store:
            lid = lease_id()
            await store.acquire("p/a", lease_id=lid, ttl_ms=5000, owner="o", client_id=None)
            await store.release("p/a", lid)
            assert await _prepared(store) == ["lockd_acquire", "lockd_release"]

            async def deallocate(conn: psycopg.AsyncConnection, retried: bool) -> None:
                await conn.execute("DEALLOCATE ALL")

            await store._run(deallocate, retry=False)
            assert await _prepared(store) == []
            got = await store.acquire("p/a", lease_id=lease_id(), ttl_ms=5000, owner="o",
                                      client_id=None)
            assert isinstance(got, Grant) and got.fence == 2
            await store.release("p/a", got.lease_id)
            assert await _prepared(store) == ["lockd_acquire", "lockd_release"]

    asyncio.run(main())


def test_prepare_threshold_none_sends_every_statement_unnamed(pg_url):
    """Behind a transaction pooler named statements do not survive: with
    ``prepare_threshold=none`` none is created, batched or alone."""

    async def main():
        async with opened(pg_url + "?pool_max=1&prepare_threshold=none") as store:
            got = await asyncio.gather(*(
                store.acquire(f"u/{i}", lease_id=lease_id(), ttl_ms=5000, owner="o",
                              client_id=None) for i in range(3)))
            await asyncio.gather(*(store.release(g.lock, g.lease_id) for g in got))
            assert [g.fence for g in got] == [1, 1, 1]
            assert store._acquires is not None and store._acquires.stats["batches"] == 1
            assert await _prepared(store) == []

    asyncio.run(main())


def test_a_statement_cancelled_in_flight_leaves_no_answer_to_the_next(pg_url, pg_dsn):
    """An acquire waiting on a row lock is cancelled (its caller's timeout): its connection is
    not reused with that statement's answer still to come; the next request is answered."""

    async def main():
        async with opened(pg_url + "?pool_max=1") as store:
            first = await store.acquire("c/a", lease_id=lease_id(), ttl_ms=5000, owner="o",
                                        client_id=None)
            await store.release("c/a", first.lease_id)
            blocker = await psycopg.AsyncConnection.connect(pg_dsn)
            await blocker.execute("SELECT 1 FROM lockd.locks WHERE name = 'c/a' FOR UPDATE")
            stuck = asyncio.ensure_future(store.acquire(
                "c/a", lease_id=lease_id(), ttl_ms=5000, owner="stuck", client_id=None))
            await wait_for_async(lambda: asyncio.to_thread(waiting_on_a_row_lock, pg_dsn),
                                 timeout=5)
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
            got = await store.acquire("c/b", lease_id=lease_id(), ttl_ms=5000, owner="next",
                                      client_id=None)
            assert (got.lock, got.owner, got.fence) == ("c/b", "next", 1)
            await blocker.rollback()
            await blocker.close()

    asyncio.run(main())


def test_notifications_keep_coming_across_heartbeats(pg_url):
    """The LISTEN socket is watched between heartbeats and psycopg reads it during them:
    every release reaches the subscriber, over many heartbeats."""

    async def main():
        async with opened(pg_url, heartbeat=0.02) as store:
            heard: list[str] = []
            store.subscribe(heard.append)
            names = [f"h/{i}" for i in range(40)]
            for n in names:
                got = await store.acquire(n, lease_id=lease_id(), ttl_ms=5000, owner="o",
                                          client_id=None)
                await store.release(n, got.lease_id)
                await asyncio.sleep(0.005)
            await wait_for_async(lambda: set(names) <= set(heard), timeout=5)

    asyncio.run(main())


def test_a_statement_the_session_holds_but_the_store_forgot_is_used_not_prepared_twice(pg_url):
    """The store's record of what a connection has prepared and the server's can part (a
    cleared record, a prepare whose answer was not read): a name the server already holds is
    the same statement, taken as prepared, and the request is answered (not a 503)."""
    from lockd.server.store.postgres import wire

    async def main():
        async with opened(pg_url + "?pool_max=1") as store:
            lid = lease_id()
            await store.acquire("f/a", lease_id=lid, ttl_ms=5000, owner="o", client_id=None)
            await store.release("f/a", lid)

            async def forget(conn: psycopg.AsyncConnection, retried: bool) -> None:
                wire._state[conn].prepared.clear()

            await store._run(forget, retry=False)
            got = await store.acquire("f/a", lease_id=lease_id(), ttl_ms=5000, owner="o",
                                      client_id=None)
            assert isinstance(got, Grant) and got.fence == 2
            await store.release("f/a", got.lease_id)
            assert await _prepared(store) == ["lockd_acquire", "lockd_release"]

    asyncio.run(main())
