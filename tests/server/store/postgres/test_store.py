"""``PostgresStore`` called directly, against a fresh PostgreSQL database per test.

Each test runs its coroutine with ``asyncio.run`` (no pytest plugin needed). Expiry is real: short
TTLs (a few hundred ms) judged by the database server's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time

import psycopg
import pytest

from harness import TIMING_SLACK, free_port, wait_for_async
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store import open_store
from lockd.server.store.base import Store
from lockd.server.store.postgres import PostgresStore, libpq_url
from lockd.server.store.values import Grant, Holder, HolderView, LockState


def lease_id() -> str:
    return secrets.token_urlsafe(24)


@contextlib.asynccontextmanager
async def opened(url: str, **kwargs):
    store = PostgresStore(url, **kwargs)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def grant(store: PostgresStore, lock: str, ttl_ms: int = 5000, owner: str = "t",
                client_id: str | None = None) -> Grant:
    got = await store.acquire(lock, lease_id=lease_id(), ttl_ms=ttl_ms, owner=owner,
                              client_id=client_id)
    assert isinstance(got, Grant), got
    return got


def test_store_satisfies_protocol_and_open_store_builds_it(pg_url, pg_dsn):
    store = open_store(pg_url, clock=time.time)
    assert isinstance(store, PostgresStore)
    assert isinstance(store, Store)
    assert isinstance(open_store(pg_dsn, clock=time.time), PostgresStore)


def test_grant_holder_release_and_fence_kept(pg_url):
    async def main():
        async with opened(pg_url) as store:
            first = await grant(store, "jobs/a", ttl_ms=5000, owner="alice")
            assert (first.lock, first.fence, first.owner, first.ttl_ms) == ("jobs/a", 1, "alice", 5000)

            refused = await store.acquire("jobs/a", lease_id=lease_id(), ttl_ms=5000, owner="bob",
                                          client_id=None)
            assert isinstance(refused, Holder)
            assert (refused.owner, refused.fence) == ("alice", 1)
            assert 0 < refused.ttl_ms <= 5000

            state = await store.get("jobs/a")
            assert state == LockState("jobs/a", True, 1, "alice", state.ttl_ms, "exclusive",
                                      (HolderView("alice", state.ttl_ms, "exclusive"),))
            assert 0 < state.ttl_ms <= 5000

            await store.release("jobs/a", first.lease_id)
            assert await store.get("jobs/a") == LockState("jobs/a", False, 1, None, 0)
            with pytest.raises(LeaseLost) as lost:
                await store.release("jobs/a", first.lease_id)
            assert lost.value.extra == {"lock": "jobs/a"}
            with pytest.raises(LeaseLost):
                await store.renew("jobs/a", first.lease_id, 5000)

            second = await grant(store, "jobs/a", owner="bob")
            assert second.fence == 2 and second.owner == "bob"
            assert await store.get("never/used") == LockState("never/used", False, 0, None, 0)

    asyncio.run(main())


def test_renew_keeps_fence_pushes_expiry_and_rejects_strangers(pg_url):
    async def main():
        async with opened(pg_url) as store:
            first_ttl_ms = 300
            lease = await grant(store, "r", ttl_ms=first_ttl_ms)
            renewed = await store.renew("r", lease.lease_id, 60_000)
            assert (renewed.lease_id, renewed.fence, renewed.ttl_ms) == (lease.lease_id, 1, 60_000)
            # proves: past the first TTL (5/3 of it) the renewal is what keeps it
            await asyncio.sleep(first_ttl_ms / 1000 * 5 / 3)
            assert (await store.get("r")).held
            with pytest.raises(LeaseLost):
                await store.renew("r", lease_id(), 1000)
            with pytest.raises(LeaseLost):
                await store.release("r", lease_id())
            with pytest.raises(LeaseLost):
                await store.renew("other", lease.lease_id, 1000)
            assert (await store.get("r")).held

    asyncio.run(main())


def test_same_client_id_retry_returns_same_lease(pg_url):
    async def main():
        async with opened(pg_url) as store:
            first = await grant(store, "c", ttl_ms=1000, owner="w1", client_id="req-1")
            again = await store.acquire("c", lease_id=lease_id(), ttl_ms=30_000, owner="w1",
                                        client_id="req-1")
            assert isinstance(again, Grant)
            assert (again.lease_id, again.fence, again.ttl_ms) == (first.lease_id, 1, 30_000)
            # Another client id, or none, or an empty one, is refused.
            for cid in ("req-2", None, ""):
                other = await store.acquire("c", lease_id=lease_id(), ttl_ms=1000, owner="x",
                                            client_id=cid)
                assert isinstance(other, Holder), cid
            # An empty client id never matches another empty one.
            empty = await grant(store, "c-empty", client_id="")
            refused = await store.acquire("c-empty", lease_id=lease_id(), ttl_ms=1000,
                                          owner="x", client_id="")
            assert isinstance(refused, Holder)
            await store.release("c-empty", empty.lease_id)
            # After release the client id starts a new lease with a higher fence.
            await store.release("c", first.lease_id)
            fresh = await grant(store, "c", client_id="req-1")
            assert fresh.lease_id != first.lease_id and fresh.fence == 2

    asyncio.run(main())


def test_acquire_with_same_lease_id_is_idempotent(pg_url):
    """What makes the internal retry after a broken connection safe."""

    async def main():
        async with opened(pg_url) as store:
            lid = lease_id()
            one = await store.acquire("i", lease_id=lid, ttl_ms=1000, owner="o", client_id=None)
            two = await store.acquire("i", lease_id=lid, ttl_ms=2000, owner="o", client_id=None)
            assert isinstance(two, Grant) and (two.lease_id, two.fence, two.ttl_ms) == (lid, one.fence, 2000)

    asyncio.run(main())


def test_expiry_by_server_clock_and_fence_increases(pg_url, pg_dsn):
    async def main():
        async with opened(pg_url) as store:
            lease = await grant(store, "e", ttl_ms=200)

            async def freed() -> bool:
                return not (await store.get("e")).held

            await wait_for_async(freed, timeout=4.0, what="the 200 ms lease to expire")
            state = await store.get("e")
            assert state == LockState("e", False, 1, None, 0)
            with pytest.raises(LeaseLost):
                await store.renew("e", lease.lease_id, 1000)
            with pytest.raises(LeaseLost):
                await store.release("e", lease.lease_id)
            nxt = await grant(store, "e", ttl_ms=200)
            assert nxt.fence == 2

            # Only the row's expiry against the server's now() decides: push the expiry an hour
            # ahead in the database and the 200 ms lease is live long after lockd's idea of it;
            # move it into the server's past and it is gone at once.
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("UPDATE lockd.locks SET expires_at = now() + interval '1 hour'"
                             " WHERE name = 'e'")
                # proves: the database's expiry, not lockd's 200 ms, decides (past 7/4 of it)
                await asyncio.sleep(nxt.ttl_ms / 1000 * 7 / 4)
                state = await store.get("e")
                assert state.held and 3_500_000 < state.ttl_ms <= 3_600_000
                refused = await store.acquire("e", lease_id=lease_id(), ttl_ms=200, owner="",
                                              client_id=None)
                assert isinstance(refused, Holder) and refused.ttl_ms > 3_500_000
                conn.execute("UPDATE lockd.locks SET expires_at = now() - interval '1 ms'"
                             " WHERE name = 'e'")
            with pytest.raises(LeaseLost):
                await store.renew("e", nxt.lease_id, 1000)
            assert (await grant(store, "e")).fence == 3

    asyncio.run(main())


def test_fence_survives_store_reopen_and_second_instance(pg_url):
    async def main():
        fences = []
        async with opened(pg_url) as a:
            for _ in range(3):
                lease = await grant(a, "f")
                fences.append(lease.fence)
                await a.release("f", lease.lease_id)
        async with opened(pg_url) as b:  # a new process would see the same
            lease = await grant(b, "f", ttl_ms=150)
            fences.append(lease.fence)

            async def expired() -> bool:  # expiry, not release
                return not (await b.get("f")).held

            await wait_for_async(expired, timeout=3.0, what="the 150 ms lease to expire")
            fences.append((await grant(b, "f")).fence)
            assert (await b.get("f")).fence == fences[-1]
        assert fences == [1, 2, 3, 4, 5]

    asyncio.run(main())


def test_concurrent_acquires_on_two_instances_grant_exactly_one(pg_url):
    async def main():
        async with opened(pg_url) as a, opened(pg_url) as b:
            for round_no in range(5):
                name = f"race/{round_no}"  # the first round of each races on the INSERT too
                results = await asyncio.gather(*(
                    (a if i % 2 else b).acquire(name, lease_id=lease_id(), ttl_ms=5000,
                                                owner=f"w{i}", client_id=None)
                    for i in range(16)
                ))
                grants = [r for r in results if isinstance(r, Grant)]
                assert len(grants) == 1, results
                holders = [r for r in results if isinstance(r, Holder)]
                assert all(h.owner == grants[0].owner and h.fence == 1 for h in holders)

    asyncio.run(main())


def test_list_pages_in_name_order_with_literal_wildcards(pg_url):
    names = ["a%b/1", "a%b/2", "a%b/3", "a%bz", "axb/1", "a%", "a_c/1", "abc/1", "a_c",
             "B", "a", "b", "\u00e9t\u00e9", "z%"]

    async def main():
        async with opened(pg_url) as store:
            for name in names:
                lease = await grant(store, name)
                if name.endswith("2"):
                    await store.release(name, lease.lease_id)

            async def pages(prefix, limit):
                seen, after = [], None
                while True:
                    page = await store.list(prefix, limit, after)
                    assert len(page) <= limit
                    seen.extend(page)
                    if len(page) < limit:
                        return seen
                    after = page[-1].lock

            everything = await pages("", 3)
            assert [s.lock for s in everything] == sorted(names)  # code point order
            by_name = {s.lock: s for s in everything}
            assert by_name["a%b/2"] == LockState("a%b/2", False, 1, None, 0)
            assert by_name["a%b/1"].held and by_name["a%b/1"].owner == "t"

            assert [s.lock for s in await pages("a%b", 2)] == ["a%b/1", "a%b/2", "a%b/3", "a%bz"]
            assert [s.lock for s in await pages("a%b/", 1)] == ["a%b/1", "a%b/2", "a%b/3"]
            assert [s.lock for s in await pages("a_c", 1)] == ["a_c", "a_c/1"]
            assert [s.lock for s in await pages("a%", 10)] == ["a%", "a%b/1", "a%b/2", "a%b/3", "a%bz"]
            assert await store.list("nothing", 10, None) == []
            assert await store.list("a", 0, None) == []
            assert [s.lock for s in await store.list("a", 2, "a_c/1")] == ["abc/1", "axb/1"]
            assert await store.list("a\x00", 10, None) == []

    asyncio.run(main())


def test_release_notifies_listener_on_another_instance(pg_url):
    async def main():
        got: list[tuple[str, bool]] = []
        arrived = asyncio.Event()
        loop_thread = threading.get_ident()

        def listener(name: str) -> None:
            asyncio.get_running_loop()  # raises unless called on the event loop
            got.append((name, threading.get_ident() == loop_thread))
            arrived.set()

        async with opened(pg_url) as a, opened(pg_url) as b:
            b.subscribe(listener)
            lease = await grant(a, "n/1")
            await asyncio.sleep(0.1)  # proves: a grant sends no notice (within 100 ms)
            assert got == []  # a grant does not notify
            t0 = time.monotonic()
            await a.release("n/1", lease.lease_id)
            await asyncio.wait_for(arrived.wait(), 5)
            latency = time.monotonic() - t0
            assert got == [("n/1", True)]
            assert latency < 1.0 * TIMING_SLACK, latency
            # A lapsed lease is not "released": nothing is sent, and its release fails.
            short = await grant(a, "n/2", ttl_ms=100)

            async def lapsed() -> bool:
                return not (await a.get("n/2")).held

            await wait_for_async(lapsed, timeout=3.0, what="the 100 ms lease to lapse")
            with pytest.raises(LeaseLost):
                await a.release("n/2", short.lease_id)
            # proves: a lapse sends no notice (within twice the TTL, after it lapsed)
            await asyncio.sleep(short.ttl_ms / 1000 * 2)
            assert got == [("n/1", True)]

    asyncio.run(main())


def test_schema_lives_in_lockd_schema_and_concurrent_opens_are_safe(pg_url, pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.locks (name text PRIMARY KEY, note text)")
        conn.execute("INSERT INTO public.locks VALUES ('mine', 'user data')")

    async def main():
        stores = [PostgresStore(pg_url) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        try:
            await grant(stores[0], "s")
            assert (await stores[3].get("s")).held
        finally:
            for s in stores:
                await s.close()
                await s.close()  # idempotent

    asyncio.run(main())
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM public.locks").fetchall() == [("mine", "user data")]
        assert conn.execute("SELECT to_regclass('lockd.locks') IS NOT NULL").fetchone() == (True,)


def test_unreachable_database_is_store_unavailable_without_secrets():
    url = f"postgresql+psycopg://lockd:s3cr3t-pw@127.0.0.1:{free_port()}/nowhere?pool_timeout=1"

    async def main():
        store = PostgresStore(url)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable) as exc:
            await store.open()
        assert time.monotonic() - t0 < 5
        assert "s3cr3t" not in exc.value.detail and "lockd:" not in exc.value.detail
        assert exc.value.status == 503
        with pytest.raises(StoreUnavailable):
            await store.ping()  # not open
        await store.close()

    asyncio.run(main())
    assert "s3cr3t" not in repr(PostgresStore(url))


def test_url_forms_and_pool_parameters():
    libpq, own = libpq_url("postgresql+psycopg://u:p@h:5/db?pool_max=3&sslmode=disable&pool_timeout=2")
    assert libpq == "postgresql://u:p@h:5/db?sslmode=disable"
    assert own == {"pool_max": "3", "pool_timeout": "2"}
    assert libpq_url("postgresql://h/db")[0] == "postgresql://h/db"
    with pytest.raises(ValueError):
        libpq_url("mysql://h/db")
    store = PostgresStore("postgresql://h/db?pool_min=2&pool_max=4&pool_timeout=1.5", pool_max=6)
    assert (store._pool_min, store._pool_max, store._pool_timeout) == (2, 6, 1.5)


def test_default_pool_serves_32_concurrent_calls_without_queueing(pg_url, pg_dsn):
    """32 clients need 32 connections: with the old default of 10, calls queued in the pool
    (measured as the limit at 32 clients). The pool grows to what the load needs."""

    async def main():
        async with opened(pg_url) as store:
            assert store._pool is not None
            release = asyncio.Event()

            async def hold(conn, retried):  # one call holding its connection, like a slow one
                await release.wait()

            calls = [asyncio.create_task(store._run(hold, retry=False)) for _ in range(32)]
            stats = store._pool.get_stats
            # every call got a connection of its own: none is left waiting in the pool's queue
            await wait_for_async(
                lambda: stats().get("pool_size", 0) == 32 and stats().get("requests_waiting") == 0,
                timeout=10.0, what="32 pool connections and no waiting request")
            assert stats().get("pool_size") == 32, stats()
            assert stats().get("requests_waiting", 0) == 0, stats()
            release.set()
            await asyncio.gather(*calls)

    asyncio.run(main())


def test_kept_connections_all_killed_the_next_call_is_answered_on_a_fresh_one(pg_url, pg_dsn):
    """Idle connections wait in the store between statements, outside the pool. Every one of
    them killed at once (a database restart): the next call's retry must not take another dead
    one; the store hands them all back to the pool, which drops them, and the call is answered."""

    async def main():
        async with opened(pg_url, batch=False) as store:
            gate = asyncio.Event()
            holding = set()

            async def hold(conn, retried):  # three calls at once: three connections
                holding.add(id(conn))
                await gate.wait()

            calls = [asyncio.create_task(store._run(hold, retry=False)) for _ in range(3)]
            # each call holds its own connection before any gives one back (the pool's size
            # alone says nothing: pool_min connections may exist before a call has one)
            await wait_for_async(lambda: len(holding) == 3,
                                 timeout=10.0, what="three calls each holding a connection")
            gate.set()
            await asyncio.gather(*calls)
            assert len(store._idle) >= 3  # kept by the store, not given back to the pool
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = 'lockd'"
                    " AND pid <> pg_backend_pid() AND query NOT ILIKE 'LISTEN%'").fetchone()[0]
            assert killed >= 3
            got = await grant(store, "kept/a")
            assert got.fence == 1

    asyncio.run(main())


def test_a_call_waiting_on_the_pool_gets_the_connection_the_store_would_keep(pg_url):
    """With one connection, a second call waits on the pool: the first call's connection goes
    to the pool, not to the store's idle list, or the second would wait out its timeout."""

    async def main():
        async with opened(pg_url + "?pool_max=1&pool_timeout=2", batch=False) as store:
            got = await asyncio.wait_for(asyncio.gather(
                *(grant(store, f"one/{i}") for i in range(3))), timeout=5)
            assert [g.fence for g in got] == [1, 1, 1]

    asyncio.run(main())


def test_pooled_connections_never_run_with_synchronous_commit_off(pg_url, pg_dsn):
    """An acknowledged grant must be durable, or a crash could hand its fence out again."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = off')

    async def main():
        async with opened(pg_url, pool_min=2) as store:
            assert store._pool is not None
            async with store._pool.connection() as conn:
                cur = await conn.execute("SHOW synchronous_commit")
                assert await cur.fetchone() == ("on",)

    asyncio.run(main())


def test_an_error_inside_an_open_transaction_is_rolled_back_before_the_connection_is_reused(
        pg_url, caplog):
    """``_run`` takes and gives back pooled connections itself: an operation that fails with a
    transaction open (a bug, a cancellation) leaves no transaction to the next user, and the
    pool is not the one to find it (no "rolling back returned connection" warning)."""

    async def main():
        async with opened(pg_url, pool_min=1, pool_max=1) as store:
            async def failing(conn, retried):
                await conn.execute("BEGIN")
                await conn.execute("SELECT 1")
                raise RuntimeError("boom")

            async def status(conn, retried):
                return conn.info.transaction_status

            with pytest.raises(RuntimeError, match="boom"):
                await store._run(failing, retry=False)
            assert await store._run(status, retry=False) == psycopg.pq.TransactionStatus.IDLE
            await grant(store, "tx/a")  # the one connection still serves

    with caplog.at_level("WARNING", logger="psycopg.pool"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "rolling back" in r.getMessage()]
