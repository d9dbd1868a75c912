"""Semaphores on ``PostgresStore``, against a fresh database per test (real expiry by the
database's clock; real races on two store instances)."""

from __future__ import annotations

import asyncio
import random
import time

import psycopg
import pytest

from harness import wait_for_async
from lockd.server.errors import LeaseLost, LimitMismatch
from lockd.server.store.postgres import PostgresStore
from lockd.server.store.values import Permit, SemFull, SemGrant, SemState, sem_key
from tests.jitter import hold
from tests.server.store.postgres.support import lease_id, opened, waiting_on_a_row_lock


async def permit(store: PostgresStore, name: str, limit: int, owner: str = "o",
                 ttl_ms: int = 5000, client_id: str | None = None) -> SemGrant | SemFull:
    return await store.sem_acquire(name, limit=limit, lease_id=lease_id(), ttl_ms=ttl_ms,
                                   owner=owner, client_id=client_id)


def test_permits_up_to_the_limit_lowest_free_slot_and_rising_fences(pg_url):
    async def main():
        async with opened(pg_url) as store:
            assert await store.sem_get("pool") == SemState("pool", 0, 0, ())
            p = [await permit(store, "pool", 3, f"w{i}", ttl_ms=5000 + i) for i in range(3)]
            assert all(isinstance(g, SemGrant) for g in p)
            assert [(g.slot, g.fence, g.limit, g.owner) for g in p] == [
                (0, 1, 3, "w0"), (1, 2, 3, "w1"), (2, 3, 3, "w2")]
            full = await permit(store, "pool", 3, "late")
            assert isinstance(full, SemFull)
            assert (full.limit, full.owners) == (3, ("w0", "w1", "w2"))
            assert 4000 < full.ttl_ms <= 5000  # the soonest expiry
            await store.sem_release("pool", p[1].lease_id)
            again = await permit(store, "pool", 3, "late")
            assert isinstance(again, SemGrant) and (again.slot, again.fence) == (1, 4)
            state = await store.sem_get("pool")
            assert (state.limit, state.fence) == (3, 4)
            assert [(x.owner, x.slot, x.fence) for x in state.permits] == [
                ("w0", 0, 1), ("late", 1, 4), ("w2", 2, 3)]
            assert all(isinstance(x, Permit) and x.ttl_ms > 0 for x in state.permits)
            with pytest.raises(LeaseLost):
                await store.sem_release("pool", p[1].lease_id)
            with pytest.raises(LeaseLost):
                await store.sem_renew("pool", p[1].lease_id, 1000)

    asyncio.run(main())


def test_renew_expiry_by_the_database_clock_and_release(pg_url, pg_dsn):
    async def main():
        async with opened(pg_url) as store:
            first_ttl_ms = 300
            g = await permit(store, "s", 1, ttl_ms=first_ttl_ms)
            assert isinstance(g, SemGrant)
            r = await store.sem_renew("s", g.lease_id, 60_000)
            assert (r.lease_id, r.fence, r.slot, r.limit, r.ttl_ms) == (
                g.lease_id, g.fence, 0, 1, 60_000)
            # proves: the renewal keeps the permit past its first TTL (4/3 of it)
            await asyncio.sleep(first_ttl_ms / 1000 * 4 / 3)
            assert (await store.sem_renew("s", g.lease_id, None)).ttl_ms > 59_000  # own TTL
            assert isinstance(await permit(store, "s", 1), SemFull)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("UPDATE lockd.sem_permits SET expires_at = now() - interval '1 ms'")
            with pytest.raises(LeaseLost):
                await store.sem_renew("s", g.lease_id, 1000)
            nxt = await permit(store, "s", 1, ttl_ms=200)
            assert isinstance(nxt, SemGrant) and nxt.fence == 2

            async def expired() -> bool:  # expiry, not release
                return (await store.sem_get("s")).permits == ()

            await wait_for_async(expired, timeout=3.0, what="the 200 ms permit to expire")
            last = await permit(store, "s", 1)
            assert isinstance(last, SemGrant) and last.fence == 3

    asyncio.run(main())


def test_limit_mismatch_while_live_permits_hold_another_limit(pg_url):
    async def main():
        async with opened(pg_url) as store:
            a = await permit(store, "m", 2)
            with pytest.raises(LimitMismatch) as exc:
                await permit(store, "m", 3)
            assert exc.value.limit == 2 and exc.value.extra["limit"] == 2
            assert exc.value.status == 409 and exc.value.code == "limit_mismatch"
            assert (await store.sem_get("m")).fence == 1  # nothing raised
            await store.sem_release("m", a.lease_id)
            b = await permit(store, "m", 3)  # no live permit: the new limit
            assert isinstance(b, SemGrant) and (b.limit, b.fence) == (3, 2)
            assert (await store.sem_get("m")).limit == 3

    asyncio.run(main())


def test_a_smaller_limit_never_revives_a_permit_judged_gone(pg_url, pg_dsn):
    async def main():
        async with opened(pg_url) as store:
            gs = [await permit(store, "k", 3, f"w{i}") for i in range(3)]
            for g in gs:
                await store.sem_release("k", g.lease_id)
            # a permit of slot 2 dated live though released would be judged gone by the limit
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("UPDATE lockd.sem_permits SET expires_at = now() + interval '1 h'"
                             " WHERE slot = 2")
            assert [x.slot for x in (await store.sem_get("k")).permits] == [2]
            with pytest.raises(LimitMismatch):
                await permit(store, "k", 2)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("UPDATE lockd.semaphores SET lim = 2")  # slot 2 is above it
            assert (await store.sem_get("k")).permits == ()
            with pytest.raises(LeaseLost):
                await store.sem_renew("k", gs[2].lease_id, 1000)
            one = await permit(store, "k", 3)  # back to 3: slot 2 stays gone
            assert isinstance(one, SemGrant) and one.slot == 0
            assert [x.slot for x in (await store.sem_get("k")).permits] == [0]

    asyncio.run(main())


def test_client_id_retry_returns_the_same_permit(pg_url):
    async def main():
        async with opened(pg_url) as store:
            first = await permit(store, "c", 2, "w", ttl_ms=1000, client_id="req-1")
            again = await permit(store, "c", 2, "w", ttl_ms=30_000, client_id="req-1")
            assert isinstance(first, SemGrant) and isinstance(again, SemGrant)
            assert (again.lease_id, again.fence, again.slot, again.ttl_ms) == (
                first.lease_id, first.fence, first.slot, 30_000)
            other = await permit(store, "c", 2, "x", client_id="req-2")
            assert isinstance(other, SemGrant) and other.slot == 1
            assert isinstance(await permit(store, "c", 2, "y", client_id=""), SemFull)
            lid = lease_id()  # the same lease id again: the same permit
            await store.sem_release("c", other.lease_id)
            one = await store.sem_acquire("c", limit=2, lease_id=lid, ttl_ms=1000, owner="o",
                                          client_id=None)
            two = await store.sem_acquire("c", limit=2, lease_id=lid, ttl_ms=2000, owner="o",
                                          client_id=None)
            assert isinstance(one, SemGrant) and isinstance(two, SemGrant)
            assert (two.lease_id, two.fence, two.slot) == (lid, one.fence, one.slot)

    asyncio.run(main())


def test_release_notifies_sem_key_on_another_instance(pg_url):
    async def main():
        got: list[str] = []
        arrived = asyncio.Event()

        def listener(name: str) -> None:
            got.append(name)
            arrived.set()

        async with opened(pg_url) as a, opened(pg_url) as b:
            b.subscribe(listener)
            g = await permit(a, "jobs/x", 2)
            await asyncio.sleep(0.1)  # proves: a grant sends no notice (within 100 ms)
            assert got == []
            await a.sem_release("jobs/x", g.lease_id)
            await asyncio.wait_for(arrived.wait(), 5)
            assert got == [sem_key("jobs/x")] == ["#sem/jobs/x"]

    asyncio.run(main())


def test_two_instances_never_exceed_the_limit_and_slots_are_unique(pg_url):
    """Workers on two store instances take and release permits of one semaphore (limit 3).
    A permit's span is [acquire returned, release called]: at no instant do more than 3 spans
    overlap, and no two overlapping spans share a slot. Fences strictly increase."""

    async def main():
        spans: list[tuple[float, float, int, int]] = []
        fences: list[int] = []
        async with opened(pg_url) as a, opened(pg_url) as b:
            stop = time.monotonic() + 3.0

            async def worker(i: int) -> None:
                store = a if i % 2 else b
                rnd = random.Random(i)
                while time.monotonic() < stop:
                    got = await permit(store, "hot", 3, f"w{i}")
                    if isinstance(got, SemFull):
                        await hold(rnd, 0.005)
                        continue
                    fences.append(got.fence)
                    start = time.monotonic()
                    await hold(rnd, 0.03, min_s=0.02)
                    end = time.monotonic()
                    await store.sem_release("hot", got.lease_id)
                    spans.append((start, end, got.slot, got.fence))

            await asyncio.gather(*(worker(i) for i in range(12)))
            final = await a.sem_get("hot")
        assert len(spans) > 30
        assert len(set(fences)) == len(fences) and final.fence == max(fences)
        events = sorted([(s, 1, slot) for s, _, slot, _ in spans] +
                        [(e, -1, slot) for _, e, slot, _ in spans], key=lambda x: (x[0], x[1]))
        live: list[int] = []
        peak = 0
        for _, step, slot in events:
            if step == 1:
                assert slot not in live and 0 <= slot < 3, (slot, live)
                live.append(slot)
            else:
                live.remove(slot)
            peak = max(peak, len(live))
        assert peak == 3  # the limit was reached, never passed

    asyncio.run(main())


def test_a_renewal_judged_by_an_earlier_now_loses_to_a_new_limit(pg_url, pg_dsn):
    """A permit renewal waits on the semaphore row while its permit ran out and the limit was
    lowered below its slot: by its own (earlier) ``now()`` the permit still looks live, but the
    limit it reads once the row is free refuses it."""

    async def main():
        async with opened(pg_url) as store:
            gs = [await permit(store, "race", 2, f"w{i}", ttl_ms=60_000) for i in range(2)]
            with psycopg.connect(pg_dsn) as conn:  # one transaction holding the semaphore row
                conn.execute("SELECT 1 FROM lockd.semaphores WHERE name = 'race' FOR UPDATE")
                renewal = asyncio.create_task(store.sem_renew("race", gs[1].lease_id, 60_000))
                # the renewal's transaction began; it waits
                await wait_for_async(lambda: waiting_on_a_row_lock(pg_dsn), timeout=10.0,
                                     what="the renewal to wait on the locked row")
                assert not renewal.done()
                conn.execute("UPDATE lockd.sem_permits SET expires_at = clock_timestamp()")
                conn.execute("UPDATE lockd.semaphores SET lim = 1")
                conn.commit()
            with pytest.raises(LeaseLost):
                await renewal
            assert (await store.sem_get("race")).permits == ()

    asyncio.run(main())
