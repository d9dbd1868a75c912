"""``PostgresStore`` through outages: a PostgreSQL crash and restart, a killed LISTEN connection.

The crash is real (``pg_ctl -m immediate stop`` on a throwaway cluster, then recovery at start),
and grants keep being attempted while it happens, so the test checks that fences strictly
increase across it, for the fences acknowledged right up to the crash.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import psycopg
import pytest

from harness import sqlalchemy_url, wait_for, wait_for_async
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.postgres import PostgresStore
from lockd.server.store.values import Grant, Holder
from tests.jitter import hold

LISTEN_QUERIES = ("LISTEN lockd_release", "SELECT now()")


def lease_id() -> str:
    return secrets.token_urlsafe(24)


def listen_backends(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND (query = ANY(%s) OR query LIKE 'SELECT name FROM lockd.locks WHERE released_at%%')",
            [list(LISTEN_QUERIES)],
        ).fetchall()
    return [r[0] for r in rows]


def test_postgres_crash_unavailable_then_recovers_with_higher_fences(throwaway_pg):
    url = sqlalchemy_url(throwaway_pg.dsn) + "?pool_timeout=1&op_timeout=4"

    async def main():
        a, b = PostgresStore(url), PostgresStore(url)
        await a.open()
        await b.open()
        released: list[str] = []
        b.subscribe(released.append)
        try:
            held = await a.acquire("held", lease_id=lease_id(), ttl_ms=120_000, owner="survivor",
                                   client_id=None)
            assert isinstance(held, Grant) and held.fence == 1

            acked: list[int] = []  # fences of grants the store acknowledged, in order
            stop = asyncio.Event()

            async def hammer():
                while not stop.is_set():
                    try:
                        got = await a.acquire("hot", lease_id=lease_id(), ttl_ms=500,
                                              owner="hammer", client_id=None)
                        if isinstance(got, Grant):
                            acked.append(got.fence)
                            await a.release("hot", got.lease_id)
                        else:
                            await hold(None, 0.02)
                    except (StoreUnavailable, LeaseLost):
                        await hold(None, 0.02)

            task = asyncio.create_task(hammer())
            await wait_for_async(lambda: len(acked) >= 20, timeout=10, what="grants before the crash")
            await asyncio.to_thread(throwaway_pg.stop, "immediate")
            before_crash = max(acked)

            # Down: every call answers StoreUnavailable promptly (pool timeout 1 s), no hang.
            for call in (a.ping(), a.acquire("x", lease_id=lease_id(), ttl_ms=1000, owner="",
                                             client_id=None), b.get("held"), a.list("", 10, None)):
                t0 = time.monotonic()
                with pytest.raises(StoreUnavailable) as exc:
                    await call
                assert time.monotonic() - t0 < 4.5
                assert exc.value.status == 503 and "postgres@" not in exc.value.detail

            await asyncio.to_thread(throwaway_pg.start)
            t0 = time.monotonic()
            await wait_for_async(lambda: _answers(a), timeout=15, what="store a back")
            await wait_for_async(lambda: _answers(b), timeout=15, what="store b back")
            recovered_in = time.monotonic() - t0
            await wait_for_async(lambda: len(acked) and acked[-1] > before_crash, timeout=10,
                             what="a grant after recovery")
            stop.set()
            await task

            # Fences strictly increase across the crash: the hammer's grants came in strictly increasing
            # fences, and every grant after recovery is above every one acknowledged before.
            assert all(x < y for x, y in zip(acked, acked[1:], strict=False)), acked
            assert acked[-1] > before_crash

            # The committed lease survived the crash, with its fence.
            state = await a.get("held")
            assert state.held and state.fence == 1 and state.owner == "survivor"
            refused = await a.acquire("held", lease_id=lease_id(), ttl_ms=1000, owner="",
                                      client_id=None)
            assert isinstance(refused, Holder)

            # b's LISTEN connection came back by itself: a release on a reaches b's listener.
            await a.release("held", held.lease_id)
            await wait_for_async(lambda: "held" in released, timeout=10, what="notification after restart")
            again = await a.acquire("held", lease_id=lease_id(), ttl_ms=1000, owner="",
                                    client_id=None)
            assert isinstance(again, Grant) and again.fence == 2
            assert recovered_in < 10
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


def test_killed_listen_connection_reconnects_and_still_delivers(pg_url, pg_dsn):
    async def main():
        a, b = PostgresStore(pg_url), PostgresStore(pg_url)
        await a.open()
        await b.open()
        got: list[str] = []
        for _ in range(5):  # many subscribers share the one LISTEN connection
            b.subscribe(got.append)
        try:
            assert len(listen_backends(pg_dsn)) == 2  # one per store, not per listener
            lease = await a.acquire("k", lease_id=lease_id(), ttl_ms=30_000, owner="",
                                    client_id=None)
            assert isinstance(lease, Grant)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                for pid in listen_backends(pg_dsn):
                    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
            # Released while b may still be reconnecting: the LISTEN catch-up covers the gap.
            await a.release("k", lease.lease_id)
            await wait_for_async(lambda: got.count("k") >= 5, timeout=10, what="notification of k")
            await wait_for_async(lambda: len(listen_backends(pg_dsn)) == 2, timeout=10,
                             what="LISTEN connections back")
            second = await a.acquire("k2", lease_id=lease_id(), ttl_ms=30_000, owner="",
                                     client_id=None)
            await a.release("k2", second.lease_id)
            await wait_for_async(lambda: got.count("k2") == 5, timeout=10, what="notification of k2")
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


async def _answers(store: PostgresStore) -> bool:
    try:
        await store.ping()
    except StoreUnavailable:
        return False
    return True


def _wal_syncs(dsn: str) -> int:
    """WAL flushes (``pg_stat_wal.wal_sync``) of the whole cluster, once no lockd backend is left
    (a backend reports its WAL statistics when it exits)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_for(lambda: not conn.execute("SELECT count(*) FROM pg_stat_activity"
                                          " WHERE application_name = 'lockd'").fetchone()[0],
                 timeout=20, what="lockd backends to exit")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]


def test_release_commits_without_waiting_for_its_flush_and_a_crash_keeps_fences(throwaway_pg):
    """A release's commit does not wait for its WAL flush (with the NOTIFY, a synchronous
    release held PostgreSQL's notify queue lock across an fsync: releases serialized on the disk).
    Safe, because every later grant commits synchronously and so flushes the release before it is
    acknowledged: a crash can lose a release only together with every grant that followed it.
    Checked: the releases add (almost) no WAL flushes of their own where grants add one each, and
    a crash right after a release never loses an acknowledged grant nor lowers a fence."""
    url = sqlalchemy_url(throwaway_pg.dsn) + "?pool_max=1&pool_timeout=2&op_timeout=6"
    locks = [f"flush/{i}" for i in range(40)]

    async def grants() -> list[Grant]:
        store = PostgresStore(url)
        await store.open()
        try:
            return [await store.acquire(n, lease_id=lease_id(), ttl_ms=120_000, owner="w",
                                        client_id=None) for n in locks]
        finally:
            await store.close()

    async def releases(leases: list[Grant]) -> None:
        store = PostgresStore(url)
        await store.open()
        try:
            for g in leases:
                await store.release(g.lock, g.lease_id)
        finally:
            await store.close()

    asyncio.run(releases(asyncio.run(grants())))  # rows exist: the measured calls only update
    leases = asyncio.run(grants())
    before = _wal_syncs(throwaway_pg.dsn)
    asyncio.run(releases(leases))
    after_releases = _wal_syncs(throwaway_pg.dsn)
    regrants = asyncio.run(grants())
    after_grants = _wal_syncs(throwaway_pg.dsn)
    assert after_grants - after_releases >= len(locks)  # each grant waited for its own flush
    assert after_releases - before < len(locks) // 2, (before, after_releases, after_grants)
    assert all(g.fence == 3 for g in regrants)

    # A release, a grant that follows it, another release, then a crash (no clean shutdown).
    async def release_grant_release_crash() -> tuple[Grant, Grant]:
        store = PostgresStore(url)
        await store.open()
        try:
            await store.release(regrants[0].lock, regrants[0].lease_id)
            second = await store.acquire(locks[0], lease_id=lease_id(), ttl_ms=500, owner="b",
                                         client_id=None)
            assert isinstance(second, Grant) and second.fence == 4
            await store.release(second.lock, second.lease_id)
            throwaway_pg.stop("immediate")
            return regrants[0], second
        finally:
            await store.close()

    first, second = asyncio.run(release_grant_release_crash())
    throwaway_pg.start()

    async def after_crash() -> Grant:
        store = PostgresStore(url)
        await store.open()
        try:
            state = await store.get(locks[0])
            assert state.fence == 4  # the acknowledged grant survived (and so did the release before it)
            if state.held:  # its release was lost: held by that lease until its expiry, no longer
                assert state.owner == "b" and state.ttl_ms <= 500
            with pytest.raises(LeaseLost):
                await store.renew(locks[0], first.lease_id, None)  # released for good

            async def granted() -> Grant | None:
                got = await store.acquire(locks[0], lease_id=lease_id(), ttl_ms=5000, owner="c",
                                          client_id=None)
                return got if isinstance(got, Grant) else None

            return await wait_for_async(granted, timeout=10, interval=0.1,
                                        what="a grant once the lost release's lease expires")
        finally:
            await store.close()

    assert asyncio.run(after_crash()).fence == 5
