"""Shared and exclusive leases on ``PostgresStore``, against a fresh database per test.

Expiry is real (short TTLs judged by the database's clock); races run for real on two store
instances (two pools, like two lockd processes on one database).
"""

from __future__ import annotations

import asyncio
import random
import time

import psycopg
import pytest

from harness import wait_for_async
from lockd.server.errors import ClientIdConflict, LeaseLost
from lockd.server.store.postgres import PostgresStore
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    SHARED_PREFIX,
    Grant,
    Holder,
    HolderView,
    LockState,
    MultiGrant,
)
from tests.jitter import hold
from tests.server.store.postgres.support import lease_id, opened, waiting_on_a_row_lock


async def take(store: PostgresStore, lock: str, mode: str, owner: str = "o", ttl_ms: int = 5000,
               client_id: str | None = None) -> Grant | Holder:
    return await store.acquire(lock, lease_id=lease_id(), ttl_ms=ttl_ms, owner=owner,
                               client_id=client_id, mode=mode)


def quiet() -> bool:
    """In the races below, readers pause every other 100 ms, so writers surely get in."""
    return int(time.monotonic() * 10) % 2 == 1


def test_shared_holders_coexist_and_exclusive_excludes_both_ways(pg_url):
    async def main():
        async with opened(pg_url) as store:
            a = await take(store, "doc", SHARED, "a", ttl_ms=3000)
            b = await take(store, "doc", SHARED, "b", ttl_ms=6000)
            assert isinstance(a, Grant) and isinstance(b, Grant)
            # never written: the epoch is 0, and a shared grant does not raise it
            assert (a.mode, a.fence, b.mode, b.fence) == (SHARED, 0, SHARED, 0)
            state = await store.get("doc")
            assert (state.held, state.mode, state.fence, state.owner) == (True, SHARED, 0, "b")
            assert [(h.owner, h.mode) for h in state.holders] == [("a", SHARED), ("b", SHARED)]

            refused = await take(store, "doc", EXCLUSIVE, "w")
            assert isinstance(refused, Holder)
            # the holder whose lease ends LAST
            assert (refused.owner, refused.mode, refused.fence) == ("b", SHARED, 0)
            assert 5000 < refused.ttl_ms <= 6000
            assert (await store.get("doc")).fence == 0  # the refusal raised nothing

            await store.release("doc", b.lease_id)
            refused = await take(store, "doc", EXCLUSIVE, "w")
            assert isinstance(refused, Holder) and refused.owner == "a"
            await store.release("doc", a.lease_id)
            w = await take(store, "doc", EXCLUSIVE, "w")
            assert isinstance(w, Grant) and (w.fence, w.mode) == (1, EXCLUSIVE)

            r = await take(store, "doc", SHARED, "r")
            assert isinstance(r, Holder) and (r.owner, r.mode, r.fence) == ("w", EXCLUSIVE, 1)
            state = await store.get("doc")
            assert state == LockState("doc", True, 1, "w", state.ttl_ms, EXCLUSIVE,
                                      (HolderView("w", state.ttl_ms, EXCLUSIVE),))
            await store.release("doc", w.lease_id)
            r = await take(store, "doc", SHARED, "r")
            assert isinstance(r, Grant) and (r.fence, r.mode) == (1, SHARED)  # carried
            w2 = await take(store, "doc", EXCLUSIVE, "w2")
            assert isinstance(w2, Holder)
            await store.release("doc", r.lease_id)
            w2 = await take(store, "doc", EXCLUSIVE, "w2")
            assert isinstance(w2, Grant) and w2.fence == 2
            assert [(h.owner, h.mode) for h in (await store.get("doc")).holders] == [
                ("w2", EXCLUSIVE)]

    asyncio.run(main())


def test_one_shared_holder_expires_by_the_database_clock(pg_url, pg_dsn):
    async def main():
        async with opened(pg_url) as store:
            short = await take(store, "x", SHARED, "short", ttl_ms=200)
            long = await take(store, "x", SHARED, "long", ttl_ms=5000)

            async def short_gone() -> bool:
                return [h.owner for h in (await store.get("x")).holders] == ["long"]

            await wait_for_async(short_gone, timeout=4.0, what="the 200 ms shared lease to expire")
            state = await store.get("x")
            assert [h.owner for h in state.holders] == ["long"] and state.owner == "long"
            with pytest.raises(LeaseLost):
                await store.renew("x", short.lease_id, 1000)
            with pytest.raises(LeaseLost):
                await store.release("x", short.lease_id)
            refused = await take(store, "x", EXCLUSIVE)
            assert isinstance(refused, Holder) and refused.owner == "long"
            # only the database's clock decides: age the live holder in the database
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("UPDATE lockd.shared SET expires_at = now() - interval '1 ms'")
            got = await take(store, "x", EXCLUSIVE)
            assert isinstance(got, Grant) and got.fence == 1
            with pytest.raises(LeaseLost):
                await store.renew("x", long.lease_id, 1000)

    asyncio.run(main())


def test_shared_renew_release_and_a_release_frees_the_lock_at_once(pg_url):
    async def main():
        async with opened(pg_url) as store:
            first_ttl_ms = 300
            s = await take(store, "r", SHARED, ttl_ms=first_ttl_ms)
            renewed = await store.renew("r", s.lease_id, 60_000)
            assert (renewed.lease_id, renewed.mode, renewed.fence, renewed.ttl_ms) == (
                s.lease_id, SHARED, 0, 60_000)
            # proves: the renewal keeps the lease past its first TTL (4/3 of it)
            await asyncio.sleep(first_ttl_ms / 1000 * 4 / 3)
            again = await store.renew("r", s.lease_id, None)  # its own TTL now: 60 s
            assert again.ttl_ms > 59_000
            assert isinstance(await take(store, "r", EXCLUSIVE), Holder)
            await store.release("r", s.lease_id)  # 60 s early: the exclusive is free now
            got = await take(store, "r", EXCLUSIVE)
            assert isinstance(got, Grant)
            with pytest.raises(LeaseLost):
                await store.release("r", s.lease_id)
            with pytest.raises(LeaseLost):
                await store.renew("r", s.lease_id, 1000)

    asyncio.run(main())


def test_the_shared_prefix_is_only_a_hint_either_mode_renews_and_releases_by_any_id(pg_url):
    """``SHARED_PREFIX`` makes renew/release try the shared statements first; a shared lease
    without it (an older lockd's) and an exclusive one with it still renew, release (freeing the
    lock for the other mode) and end once."""
    async def main():
        async with opened(pg_url) as store:
            for lock, mode, lid, other in (("p1", SHARED, lease_id(), EXCLUSIVE),
                                           ("p2", EXCLUSIVE, SHARED_PREFIX + lease_id(), SHARED),
                                           ("p3", SHARED, SHARED_PREFIX + lease_id(), EXCLUSIVE),
                                           ("p4", EXCLUSIVE, lease_id(), SHARED)):
                got = await store.acquire(lock, lease_id=lid, ttl_ms=5000, owner="o",
                                          client_id=None, mode=mode)
                assert isinstance(got, Grant) and (got.lease_id, got.mode) == (lid, mode)
                renewed = await store.renew(lock, lid, 60_000)
                assert (renewed.mode, renewed.fence, renewed.ttl_ms) == (mode, got.fence, 60_000)
                assert isinstance(await take(store, lock, other), Holder)
                await store.release(lock, lid)
                assert not (await store.get(lock)).held
                assert isinstance(await take(store, lock, other), Grant)
                with pytest.raises(LeaseLost):
                    await store.release(lock, lid)
                with pytest.raises(LeaseLost):
                    await store.renew(lock, lid, 1000)

    asyncio.run(main())


def test_client_id_retry_returns_the_live_lease_only_in_its_own_mode(pg_url):
    async def main():
        async with opened(pg_url) as store:
            s = await take(store, "c", SHARED, "w", ttl_ms=1000, client_id="req-1")
            again = await take(store, "c", SHARED, "w", ttl_ms=30_000, client_id="req-1")
            assert isinstance(again, Grant)
            assert (again.lease_id, again.mode, again.ttl_ms) == (s.lease_id, SHARED, 30_000)
            with pytest.raises(ClientIdConflict):  # another mode: refused, nothing changed
                await take(store, "c", EXCLUSIVE, "w", ttl_ms=90_000, client_id="req-1")
            assert (await store.get("c")).ttl_ms <= 30_000
            other = await take(store, "c", SHARED, "x", client_id="req-2")
            assert isinstance(other, Grant) and other.lease_id != s.lease_id
            assert len((await store.get("c")).holders) == 2
            await store.release("c", s.lease_id)
            await store.release("c", other.lease_id)

            e = await take(store, "c", EXCLUSIVE, "w", ttl_ms=10_000, client_id="req-3")
            again = await take(store, "c", EXCLUSIVE, "w", client_id="req-3")
            assert isinstance(again, Grant)
            assert (again.lease_id, again.mode, again.fence) == (e.lease_id, EXCLUSIVE, 1)
            with pytest.raises(ClientIdConflict):
                await take(store, "c", SHARED, "w", ttl_ms=90_000, client_id="req-3")
            assert (await store.get("c")).mode == EXCLUSIVE
            assert isinstance(await take(store, "c", SHARED, client_id=""), Holder)
            # the same lease id again (a retry after a lost answer) is the same shared lease
            lid = lease_id()
            await store.release("c", e.lease_id)
            one = await store.acquire("c", lease_id=lid, ttl_ms=1000, owner="o",
                                      client_id=None, mode=SHARED)
            two = await store.acquire("c", lease_id=lid, ttl_ms=2000, owner="o",
                                      client_id=None, mode=SHARED)
            assert isinstance(two, Grant) and (two.lease_id, two.ttl_ms) == (lid, 2000)
            assert len((await store.get("c")).holders) == 1 and one.lease_id == lid

    asyncio.run(main())


def test_force_release_ends_every_shared_holder_and_notifies(pg_url):
    async def main():
        got: list[str] = []
        arrived = asyncio.Event()

        def listener(name: str) -> None:
            got.append(name)
            arrived.set()

        async with opened(pg_url) as a, opened(pg_url) as b:
            b.subscribe(listener)
            one = await take(a, "f", SHARED, "one", ttl_ms=4000)
            two = await take(a, "f", SHARED, "two", ttl_ms=8000)
            ended = await a.force_release("f")
            assert ended is not None and (ended.owner, ended.mode) == ("two", SHARED)
            assert 7000 < ended.ttl_ms <= 8000
            await asyncio.wait_for(arrived.wait(), 5)
            assert got == ["f"]
            for lease in (one, two):
                with pytest.raises(LeaseLost):
                    await a.renew("f", lease.lease_id, 1000)
            assert not (await a.get("f")).held
            assert await a.force_release("f") is None
            w = await take(a, "f", EXCLUSIVE)
            assert isinstance(w, Grant) and w.fence == 1

    asyncio.run(main())


def test_shared_release_notifies_another_instance(pg_url):
    async def main():
        got: list[str] = []
        arrived = asyncio.Event()

        def listener(name: str) -> None:
            got.append(name)
            arrived.set()

        async with opened(pg_url) as a, opened(pg_url) as b:
            b.subscribe(listener)
            s = await take(a, "n/1", SHARED)
            await asyncio.sleep(0.1)  # proves: no release notice for a grant (within 100 ms)
            assert got == []
            await a.release("n/1", s.lease_id)
            await asyncio.wait_for(arrived.wait(), 5)
            assert got == ["n/1"]

    asyncio.run(main())


def test_mixed_mode_acquire_many_is_all_or_nothing(pg_url):
    async def main():
        async with opened(pg_url) as store:
            ex_b = await take(store, "b", EXCLUSIVE, "old")  # b's fence: 1
            await store.release("b", ex_b.lease_id)
            reader = await take(store, "b", SHARED, "reader", ttl_ms=7000)
            other = await take(store, "a", SHARED, "other")
            modes = {"a": SHARED, "b": EXCLUSIVE, "c": SHARED}
            refused = await store.acquire_many(("a", "b", "c"), lease_id=lease_id(), ttl_ms=5000,
                                               owner="m", client_id=None, modes=modes)
            # only b refuses (a is shared with a shared holder): the last-ending shared holder
            assert isinstance(refused, list) and len(refused) == 1
            assert (refused[0].lock, refused[0].owner, refused[0].mode) == ("b", "reader", SHARED)
            # nothing was written: no holder on a or c, b's fence unraised
            assert [h.owner for h in (await store.get("a")).holders] == ["other"]
            assert not (await store.get("c")).held and (await store.get("b")).fence == 1

            await store.release("b", reader.lease_id)
            lid = lease_id()
            got = await store.acquire_many(("a", "b", "c"), lease_id=lid, ttl_ms=5000,
                                           owner="m", client_id="mc", modes=modes)
            assert isinstance(got, MultiGrant)
            assert got.fences == {"a": 0, "b": 2, "c": 0} and got.modes == modes
            assert [h.owner for h in (await store.get("a")).holders] == ["other", "m"]
            assert (await store.get("b")).mode == EXCLUSIVE
            listed = await store.list("", 10, None)
            assert [(x.lock, x.mode, [h.owner for h in x.holders]) for x in listed] == [
                ("a", SHARED, ["other", "m"]), ("b", EXCLUSIVE, ["m"]), ("c", SHARED, ["m"])]
            assert [(x.fence, x.owner, x.held) for x in listed] == [(0, "m", True),
                                                                    (2, "m", True),
                                                                    (0, "m", True)]
            # the set's shared locks refuse an exclusive lease, its exclusive lock a shared one
            assert isinstance(await take(store, "c", EXCLUSIVE), Holder)
            assert isinstance(await take(store, "b", SHARED), Holder)
            assert isinstance(await take(store, "c", SHARED), Grant)
            # a client_id retry is the same lease
            again = await store.acquire_many(("a", "b", "c"), lease_id=lease_id(), ttl_ms=9000,
                                             owner="m", client_id="mc", modes=modes)
            assert isinstance(again, MultiGrant) and again.lease_id == lid
            assert again.fences == got.fences and again.ttl_ms == 9000

            renewed = await store.renew_many(lid, 20_000)
            assert renewed.modes == modes and renewed.fences == got.fences
            assert renewed.ttl_ms == 20_000
            assert await store.release_many(lid) == ("a", "b", "c")
            assert [h.owner for h in (await store.get("a")).holders] == ["other"]
            assert not (await store.get("b")).held
            with pytest.raises(LeaseLost):
                await store.renew_many(lid, None)
            with pytest.raises(LeaseLost):
                await store.release_many(lid)
            # the shared part of the released set no longer refuses an exclusive lease
            await store.release("a", other.lease_id)
            assert isinstance(await take(store, "a", EXCLUSIVE), Grant)

    asyncio.run(main())


def test_exclusive_acquire_many_is_refused_by_shared_holders(pg_url):
    async def main():
        async with opened(pg_url) as store:
            s = await take(store, "y", SHARED, "reader")
            refused = await store.acquire_many(("x", "y"), lease_id=lease_id(), ttl_ms=5000,
                                               owner="m", client_id=None)
            assert isinstance(refused, list)
            assert [(h.lock, h.owner, h.mode) for h in refused] == [("y", "reader", SHARED)]
            assert not (await store.get("x")).held and (await store.get("x")).fence == 0
            await store.release("y", s.lease_id)
            got = await store.acquire_many(("x", "y"), lease_id=lease_id(), ttl_ms=5000,
                                           owner="m", client_id=None)
            assert isinstance(got, MultiGrant) and got.fences == {"x": 1, "y": 1}
            # a shared acquire is refused by the set's exclusive lock
            assert isinstance(await take(store, "y", SHARED), Holder)

    asyncio.run(main())


def test_shared_lease_of_a_set_force_released_makes_the_set_lost(pg_url):
    async def main():
        async with opened(pg_url) as store:
            lid = lease_id()
            got = await store.acquire_many(("p", "q"), lease_id=lid, ttl_ms=5000, owner="m",
                                           client_id=None, modes={"p": SHARED})
            assert isinstance(got, MultiGrant)
            assert await store.force_release("p") is not None
            with pytest.raises(LeaseLost):
                await store.renew_many(lid, None)
            with pytest.raises(LeaseLost):
                await store.release_many(lid)
            assert not (await store.get("q")).held  # the rest was freed

    asyncio.run(main())


def test_two_instances_never_grant_exclusive_alongside_any_other_lease(pg_url):
    """Workers on two store instances take one lock in random modes, hold it briefly and
    release. A lease's span is [acquire returned, release called]: the store's real grant and
    release lie outside it, so with a correct store an exclusive span overlaps no other span."""

    async def main():
        spans: list[tuple[float, float, str, int]] = []
        async with opened(pg_url) as a, opened(pg_url) as b:
            stop = time.monotonic() + 3.0

            async def worker(i: int) -> None:
                store = a if i % 2 else b
                rnd = random.Random(i)
                while time.monotonic() < stop:
                    mode = SHARED if rnd.random() < 0.6 else EXCLUSIVE
                    if mode == SHARED and quiet():
                        await hold(None, 0.01)
                        continue
                    got = await take(store, "hot", mode, f"w{i}")
                    if isinstance(got, Holder):
                        await hold(rnd, 0.01)
                        continue
                    start = time.monotonic()
                    await hold(rnd, 0.01)
                    end = time.monotonic()
                    await store.release("hot", got.lease_id)
                    spans.append((start, end, got.mode, got.fence))
                    await hold(rnd, 0.02)  # readers pause: writers get in

            await asyncio.gather(*(worker(i) for i in range(12)))
        kinds = {m for _, _, m, _ in spans}
        assert kinds == {SHARED, EXCLUSIVE}, kinds
        assert sum(1 for s in spans if s[2] == SHARED) > 20
        spans.sort()
        for i, (s1, e1, m1, f1) in enumerate(spans):
            for s2, e2, m2, f2 in spans[i + 1:]:
                if s2 >= e1:
                    break
                assert m1 == m2 == SHARED, ((s1, e1, m1, f1), (s2, e2, m2, f2))
        # fences: exclusive grants strictly increase in time; a shared lease carries the last
        # exclusive fence granted before it
        last = 0
        for _, _, mode, fence in spans:
            if mode == EXCLUSIVE:
                assert fence > last
                last = fence
            else:
                assert fence == last

    asyncio.run(main())


def test_a_database_of_the_previous_version_upgrades_in_place(pg_url, pg_dsn):
    from lockd.server.store.postgres import sql

    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the previous version's schema
        conn.execute(sql.DDL)
        conn.execute("INSERT INTO lockd.locks (name, fence) VALUES ('old', 7)")
        # a live multi-lock lease of the previous version
        conn.execute("INSERT INTO lockd.locks (name, fence, lease_id, owner, expires_at, ttl_ms)"
                     " SELECT n, 3, 'm.old', 'set', now() + interval '1 hour', 60000"
                     "   FROM unnest(ARRAY['p', 'q']) AS n")
        conn.execute("INSERT INTO lockd.leases (lease_id, locks, owner, expires_at, ttl_ms)"
                     " VALUES ('m.old', ARRAY['p', 'q'], 'set', now() + interval '1 hour', 60000)")

    async def main():
        async with opened(pg_url) as a, opened(pg_url) as b:  # two processes upgrade at once
            # The previous version did not record whether fence 7's writer released cleanly:
            # the first shared grant starts a new epoch (once more than needed, never less).
            s = await take(a, "old", SHARED)
            assert isinstance(s, Grant) and s.fence == 8
            await a.release("old", s.lease_id)
            e = await take(b, "old", EXCLUSIVE)
            assert isinstance(e, Grant) and e.fence == 9
            n = await take(a, "new", SHARED)
            assert isinstance(n, Grant) and n.fence == 0
            assert (await b.sem_get("s")).limit == 0 and (await b.elect_get("e")).seq == 0
            assert isinstance(await take(a, "p", SHARED), Holder)
            renewed = await b.renew_many("m.old", 5000)
            assert (renewed.fences, renewed.modes, renewed.ttl_ms) == ({"p": 3, "q": 3}, None, 5000)
            assert await a.release_many("m.old") == ("p", "q")
            p = await take(a, "p", SHARED)  # after a clean release: the same epoch
            assert isinstance(p, Grant) and p.fence == 3
        async with opened(pg_url) as again:  # a current schema: opened as is
            assert (await again.get("old")).fence == 9

    asyncio.run(main())


def test_listen_catch_up_names_every_kind_of_release(pg_url, pg_dsn):
    """After a LISTEN reconnect the listener replays what was released meanwhile (notifications
    sent while it was away are lost): shared releases, semaphore releases (``#sem/`` keys) and
    election writes are found like exclusive releases."""
    from lockd.server.store.postgres import sql_modes

    async def main():
        async with opened(pg_url) as store:
            e = await take(store, "excl", EXCLUSIVE)
            s = await take(store, "shr", SHARED)
            p = await store.sem_acquire("pool", limit=2, lease_id=lease_id(), ttl_ms=5000,
                                        owner="o", client_id=None)
            await take(store, "quiet", SHARED)  # not released: not replayed
            await store.release("excl", e.lease_id)
            await store.release("shr", s.lease_id)
            await store.sem_release("pool", p.lease_id)
            await store.elect_campaign("boss", lease_id=lease_id(), ttl_ms=5000, owner="o",
                                       client_id=None, value="v")

    asyncio.run(main())
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        since = conn.execute("SELECT now() - interval '1 minute'").fetchone()[0]
        names = [r[0] for r in conn.execute(sql_modes.CATCH_UP, {"since": since})]
    assert names == ["#sem/pool", "boss", "excl", "shr"]


def test_mixed_sets_and_single_leases_on_two_instances_never_conflict(pg_url):
    """Like the test above, with lock sets in random modes among the single leases: per lock,
    an exclusive span overlaps no other span (a set's spans count for each of its locks)."""

    async def main():
        spans: dict[str, list[tuple[float, float, str]]] = {"a": [], "b": []}
        sets = 0
        async with opened(pg_url) as one, opened(pg_url) as two:
            stop = time.monotonic() + 3.0

            async def worker(i: int) -> None:
                nonlocal sets
                store = one if i % 2 else two
                rnd = random.Random(100 + i)
                while time.monotonic() < stop:
                    pick = {n: (SHARED if rnd.random() < 0.6 else EXCLUSIVE) for n in "ab"}
                    if SHARED in pick.values() and quiet():
                        await hold(None, 0.01)
                        continue
                    if rnd.random() < 0.5:
                        got = await store.acquire_many(("a", "b"), lease_id=lease_id(),
                                                       ttl_ms=5000, owner=f"w{i}",
                                                       client_id=None, modes=pick)
                        held = pick if isinstance(got, MultiGrant) else None
                    else:
                        name = rnd.choice("ab")
                        got = await take(store, name, pick[name], f"w{i}")
                        held = {name: pick[name]} if isinstance(got, Grant) else None
                    if held is None:
                        await hold(rnd, 0.01)
                        continue
                    start = time.monotonic()
                    await hold(rnd, 0.01)
                    end = time.monotonic()
                    if isinstance(got, MultiGrant):
                        sets += 1
                        assert await store.release_many(got.lease_id) == ("a", "b")
                    else:
                        await store.release(got.lock, got.lease_id)
                    for name, mode in held.items():
                        spans[name].append((start, end, mode))
                    await hold(rnd, 0.02)  # readers pause: writers get in

            await asyncio.gather(*(worker(i) for i in range(12)))
        assert sets > 10
        for name, found in spans.items():
            found.sort()
            assert {m for _, _, m in found} == {SHARED, EXCLUSIVE}, name
            for i, (s1, e1, m1) in enumerate(found):
                for s2, e2, m2 in found[i + 1:]:
                    if s2 >= e1:
                        break
                    assert m1 == m2 == SHARED, (name, (s1, e1, m1), (s2, e2, m2))

    asyncio.run(main())


def test_a_shared_renewal_judged_by_an_earlier_now_loses_to_an_exclusive_grant(pg_url, pg_dsn):
    """A renewal waits on the lock row while, meanwhile, its lease ran out and an exclusive
    lease was granted: by its own (earlier) ``now()`` the lease still looks live, but the
    exclusive lease on the row it locked first refuses it."""

    async def main():
        async with opened(pg_url) as store:
            s = await take(store, "race", SHARED, ttl_ms=60_000)
            with psycopg.connect(pg_dsn) as conn:  # one transaction holding the lock row
                conn.execute("SELECT 1 FROM lockd.locks WHERE name = 'race' FOR UPDATE")
                renewal = asyncio.create_task(store.renew("race", s.lease_id, 60_000))
                # the renewal's transaction began; it waits
                await wait_for_async(lambda: waiting_on_a_row_lock(pg_dsn), timeout=10.0,
                                     what="the renewal to wait on the locked row")
                assert not renewal.done()
                # the shared lease ends after the renewal's now(), then an exclusive grant
                conn.execute("UPDATE lockd.shared SET expires_at = clock_timestamp()"
                             " WHERE name = 'race'")
                conn.execute("UPDATE lockd.locks SET shared_until = clock_timestamp()"
                             " WHERE name = 'race'")
                conn.execute("UPDATE lockd.locks SET fence = fence + 1, lease_id = 'x',"
                             " owner = 'writer', expires_at = clock_timestamp() + interval '1 h'"
                             " WHERE name = 'race'")
                conn.commit()
            with pytest.raises(LeaseLost):
                await renewal
            state = await store.get("race")
            assert (state.mode, state.owner, [h.mode for h in state.holders]) == (
                EXCLUSIVE, "writer", [EXCLUSIVE])

    asyncio.run(main())
