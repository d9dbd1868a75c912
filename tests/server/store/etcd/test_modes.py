"""EtcdStore lock modes against a real 3-member etcd cluster (shared by the session, one key
prefix a test): shared holders coexist, an exclusive one excludes both ways, fences, expiry of one
shared holder, client_id retries, mixed-mode multi-lock sets, force-release, and two stores on
one cluster.

The test cluster's minimum etcd lease is 1 s: ``ttl_ms=1000`` is a 1 s etcd lease, checked by
etcd about every 500 ms.
"""

from __future__ import annotations

import asyncio

import pytest

from harness import wait_for_async
from lockd.server.errors import ClientIdConflict, LeaseLost
from lockd.server.store.values import EXCLUSIVE, SHARED, Grant, Holder, MultiGrant
from tests.jitter import hold
from tests.server.store.etcd.helpers import lease_id, name, opened, watching


async def shared(store, lock, ttl_ms=5000, owner="r", client_id=None, lid=None):
    return await store.acquire(lock, lease_id=lid or lease_id(), ttl_ms=ttl_ms, owner=owner,
                               client_id=client_id, mode=SHARED)


async def exclusive(store, lock, ttl_ms=5000, owner="w", client_id=None, lid=None):
    return await store.acquire(lock, lease_id=lid or lease_id(), ttl_ms=ttl_ms, owner=owner,
                               client_id=client_id, mode=EXCLUSIVE)


def test_shared_holders_coexist_and_carry_the_current_fence(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            first = await shared(s, lock, owner="r1")
            assert isinstance(first, Grant) and first.mode == SHARED
            assert first.fence == 0  # never written
            second = await shared(s, lock, owner="r2", ttl_ms=9000)
            assert isinstance(second, Grant) and second.fence == 0
            st = await s.get(lock)
            assert st.held and st.mode == SHARED and st.fence == 0
            assert [(h.owner, h.mode) for h in st.holders] == [("r1", SHARED), ("r2", SHARED)]
            assert st.owner == "r2"  # the holder whose lease ends last
            # the lock is listed although only ever held shared
            assert [x.lock for x in await s.list(lock, 10, None)] == [lock]
            for g in (first, second):
                await s.release(lock, g.lease_id)
            w = await exclusive(s, lock)
            assert isinstance(w, Grant) and w.fence > 0
            await s.release(lock, w.lease_id)
            r = await shared(s, lock)
            assert r.fence == w.fence  # the write epoch, not raised
            assert (await s.get(lock)).fence == w.fence
            await s.release(lock, r.lease_id)
            w2 = await exclusive(s, lock)
            assert w2.fence > w.fence

    asyncio.run(body())


def test_exclusive_refused_by_shared_and_shared_refused_by_exclusive(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            r1 = await shared(s, lock, owner="r1", ttl_ms=2000)
            r2 = await shared(s, lock, owner="r2", ttl_ms=6000)
            h = await exclusive(s, lock)
            assert isinstance(h, Holder) and h.mode == SHARED and h.owner == "r2"
            assert 2000 < h.ttl_ms <= 6000
            await s.release(lock, r1.lease_id)
            assert isinstance(await exclusive(s, lock), Holder)
            await s.release(lock, r2.lease_id)
            w = await exclusive(s, lock, owner="w", ttl_ms=3000)
            assert isinstance(w, Grant) and w.mode == EXCLUSIVE
            h = await shared(s, lock)
            assert isinstance(h, Holder) and h.mode == EXCLUSIVE and h.owner == "w"
            assert h.fence == w.fence
            st = await s.get(lock)
            assert st.mode == EXCLUSIVE and [x.owner for x in st.holders] == ["w"]

    asyncio.run(body())


def test_expiry_of_one_shared_holder_leaves_the_others(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            short = await shared(s, lock, owner="short", ttl_ms=1000)
            long = await shared(s, lock, owner="long", ttl_ms=8000)

            async def expired() -> bool:
                return len((await s.get(lock)).holders) <= 1

            await wait_for_async(expired, timeout=4, interval=0.1,
                                 what="the 1 s shared lease to expire")
            st = await s.get(lock)
            assert st.held and [x.owner for x in st.holders] == ["long"]
            with pytest.raises(LeaseLost):
                await s.renew(lock, short.lease_id, None)
            assert (await s.renew(lock, long.lease_id, None)).mode == SHARED
            assert isinstance(await exclusive(s, lock), Holder)

    asyncio.run(body())


def test_renew_release_of_shared_leases_at_another_store(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            g = await shared(a, lock, ttl_ms=2000)
            r = await b.renew(lock, g.lease_id, 5000)  # a new TTL: moved to a new etcd lease
            assert (r.fence, r.ttl_ms, r.mode) == (g.fence, 5000, SHARED)
            again = await a.renew(lock, g.lease_id, None)  # a's cache entry is stale: re-read
            assert again.mode == SHARED and again.ttl_ms == 5000
            await b.release(lock, g.lease_id)
            with pytest.raises(LeaseLost):
                await a.release(lock, g.lease_id)
            assert not (await a.get(lock)).held

    asyncio.run(body())


def test_client_id_retries_return_the_lease_only_in_its_own_mode(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            g = await shared(s, lock, client_id="c1")
            again = await shared(s, lock, client_id="c1", ttl_ms=9000)
            assert (again.lease_id, again.mode, again.ttl_ms) == (g.lease_id, SHARED, 9000)
            assert len((await s.get(lock)).holders) == 1
            # an exclusive retry of the same client is refused; its shared lease stays as is
            with pytest.raises(ClientIdConflict):
                await exclusive(s, lock, client_id="c1")
            assert [h.mode for h in (await s.get(lock)).holders] == [SHARED]
            assert isinstance(await exclusive(s, lock, client_id="c2"), Holder)
            await s.release(lock, g.lease_id)
            w = await exclusive(s, lock, client_id="c3")
            with pytest.raises(ClientIdConflict):
                await shared(s, lock, client_id="c3")
            assert (await exclusive(s, lock, client_id="c3")).lease_id == w.lease_id

    asyncio.run(body())


def test_concurrent_client_id_retries_at_two_stores_grant_once(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            results = await asyncio.gather(*(shared(s, lock, client_id="same")
                                             for s in (a, b) * 4))
            assert len({g.lease_id for g in results}) == 1
            assert len((await a.get(lock)).holders) == 1

    asyncio.run(body())


def test_force_release_ends_every_shared_holder(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            leases = [await shared(s, lock, owner=f"r{i}", ttl_ms=3000 + 2000 * i)
                      for i in range(3)]
            ended = await s.force_release(lock)
            assert ended is not None and ended.owner == "r2" and ended.mode == SHARED
            assert not (await s.get(lock)).held
            for g in leases:
                with pytest.raises(LeaseLost):
                    await s.renew(lock, g.lease_id, None)
            assert await s.force_release(lock) is None

    asyncio.run(body())


def test_mixed_mode_acquire_many_is_all_or_nothing(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            a, b, c = sorted(name() for _ in range(3))
            reader = await shared(s, a, owner="reader")
            m = await s.acquire_many((a, b), lease_id="m." + lease_id(), ttl_ms=4000, owner="m",
                                     client_id=None, modes={a: SHARED})
            assert isinstance(m, MultiGrant) and m.modes == {a: SHARED, b: EXCLUSIVE}
            assert m.fences[a] == 0 and m.fences[b] > 0
            st = await s.get(a)
            assert sorted(x.owner for x in st.holders) == ["m", "reader"]
            # c is free, but a is held shared by others: an exclusive set on (a, c) gets nothing
            refused = await s.acquire_many((a, c), lease_id="m." + lease_id(), ttl_ms=4000,
                                           owner="x", client_id=None)
            assert isinstance(refused, list) and [h.lock for h in refused] == [a]
            assert refused[0].mode == SHARED
            assert not (await s.get(c)).held and (await s.get(c)).fence == 0
            # b is held exclusive by the set: a shared set on (b, c) gets nothing either
            refused = await s.acquire_many((b, c), lease_id="m." + lease_id(), ttl_ms=4000,
                                           owner="y", client_id=None, modes={b: SHARED, c: SHARED})
            assert [h.lock for h in refused] == [b] and refused[0].owner == "m"
            assert not (await s.get(c)).held
            renewed = await s.renew_many(m.lease_id, 6000)  # moves both keys to a new lease
            assert renewed.modes == m.modes and renewed.fences == m.fences
            assert sorted(await s.release_many(m.lease_id)) == [a, b]
            await s.release(a, reader.lease_id)
            assert not (await s.get(a)).held and not (await s.get(b)).held

    asyncio.run(body())


def test_mixed_mode_set_client_id_retry_returns_the_same_lease(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            a, b = sorted(name() for _ in range(2))
            kw = dict(ttl_ms=4000, owner="m", client_id="cid", modes={a: SHARED})
            m = await s.acquire_many((a, b), lease_id="m." + lease_id(), **kw)
            again = await s.acquire_many((a, b), lease_id="m." + lease_id(), **kw)
            assert isinstance(again, MultiGrant) and again.lease_id == m.lease_id
            assert len((await s.get(a)).holders) == 1

    asyncio.run(body())


def test_two_stores_never_grant_exclusive_and_shared_at_once(etcd_url):
    """Readers and writers on two stores race for one lock; a watcher samples the holders and
    every grant records whether it overlapped a grant of the other mode."""

    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            live: dict[str, str] = {}
            violations: list[str] = []
            fences: list[int] = []

            async def worker(store, mode, rounds):
                for _ in range(rounds):
                    g = await store.acquire(lock, lease_id=lease_id(), ttl_ms=5000, owner=mode,
                                            client_id=None, mode=mode)
                    if not isinstance(g, Grant):
                        await hold(None, 0.005)
                        continue
                    others = set(live.values())
                    if mode == EXCLUSIVE and others or mode == SHARED and EXCLUSIVE in others:
                        violations.append(f"{mode} granted beside {others}")
                    if mode == EXCLUSIVE:
                        fences.append(g.fence)
                    live[g.lease_id] = mode
                    await hold(None, 0.01)
                    del live[g.lease_id]
                    await store.release(lock, g.lease_id)

            await asyncio.gather(*(worker(s, m, 12) for s in (a, b)
                                   for m in (SHARED, SHARED, EXCLUSIVE)))
            assert violations == []
            assert fences and fences == sorted(set(fences))  # strictly increasing

    asyncio.run(body())


def test_shared_release_at_one_store_notifies_another(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            await watching(b, etcd_url)
            lock = name()
            heard = asyncio.Event()
            b.subscribe(lambda n: heard.set() if n == lock else None)
            g = await shared(a, lock)
            await a.release(lock, g.lease_id)
            await asyncio.wait_for(heard.wait(), 3)

    asyncio.run(body())


def test_a_set_of_64_shared_locks_fits_one_transaction(etcd_url):
    """64 locks (the most a set may have), all shared, never written, with a client id: the
    grant stays within etcd's default --max-txn-ops of 128; so does the refused exclusive set."""

    async def body():
        async with opened(etcd_url) as s:
            locks = tuple(sorted(name() for _ in range(64)))
            m = await s.acquire_many(locks, lease_id="m." + lease_id(), ttl_ms=4000, owner="m",
                                     client_id="cid", modes={lock: SHARED for lock in locks})
            assert isinstance(m, MultiGrant) and set(m.fences.values()) == {0}
            refused = await s.acquire_many(locks, lease_id="m." + lease_id(), ttl_ms=4000,
                                           owner="x", client_id=None)
            assert isinstance(refused, list) and len(refused) == 64
            assert sorted(await s.release_many(m.lease_id)) == list(locks)
            w = await s.acquire_many(locks, lease_id="m." + lease_id(), ttl_ms=4000, owner="w",
                                     client_id=None)
            assert isinstance(w, MultiGrant) and min(w.fences.values()) > 0

    asyncio.run(body())
