"""EtcdStore against a real 3-member etcd cluster (shared by the session, one key prefix a test).

The test cluster runs with a 700 ms election timeout, so etcd's minimum lease TTL is 1 s: a
``ttl_ms`` of 300 becomes a 1 s etcd lease, 1500 becomes 2 s.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from harness import TIMING_SLACK, free_port, wait_for_async
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.base import Store
from lockd.server.store.etcd import EtcdStore, parse_etcd_url
from lockd.server.store.values import Grant, Holder
from tests.jitter import hold
from tests.server.store.etcd.helpers import acquire, lease_id, name, opened, watching

# -- URL -------------------------------------------------------------------------------------


def test_url_parsing():
    eps, prefix, timeout = parse_etcd_url("etcd://a:1,b,c:3/app/locks?timeout=1.5")
    assert eps == ["http://a:1", "http://b:2379", "http://c:3"]
    assert prefix == "app/locks" and timeout == 1.5
    assert parse_etcd_url("etcd://h:2379")[1:] == ("lockd", 2.5)
    for bad in ("etcd://", "http://h:1", "etcd://h:1?timeout=x", "etcd://h:1?timeout=0"):
        with pytest.raises(ValueError):
            parse_etcd_url(bad)


def test_open_store_builds_an_etcd_store(etcd_url):
    from lockd.server.store import open_store

    store = open_store(etcd_url, clock=time.time)
    assert isinstance(store, EtcdStore) and isinstance(store, Store)


# -- grants, fences, holders --------------------------------------------------------------


def test_acquire_grants_then_reports_holder(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            g = await acquire(s, lock, ttl_ms=1500, owner="alice")
            assert isinstance(g, Grant) and g.lock == lock and g.owner == "alice"
            assert g.fence > 0
            assert g.ttl_ms == 2000  # whole seconds, rounded UP (never shorter than asked)
            h = await acquire(s, lock, ttl_ms=5000, owner="bob")
            assert isinstance(h, Holder)
            assert h.owner == "alice" and h.fence == g.fence and 0 < h.ttl_ms <= 2000
            st = await s.get(lock)
            assert st.held and st.owner == "alice" and st.fence == g.fence
            assert 0 < st.ttl_ms <= 2000

    asyncio.run(body())


def test_ttl_below_a_second_rounds_up_and_is_reported(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            g = await acquire(s, name(), ttl_ms=300)
            assert g.ttl_ms == 1000

    asyncio.run(body())


def test_fence_increases_across_release_and_is_remembered(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock, other = name(), name()
            fences = []
            for _ in range(4):
                g = await acquire(s, lock)
                await acquire(s, other)  # other locks' grants in between: still increasing
                fences.append(g.fence)
                await s.release(lock, g.lease_id)
                st = await s.get(lock)
                assert not st.held and st.owner is None and st.ttl_ms == 0
                assert st.fence == g.fence  # the last fence issued, after the key is gone
            assert fences == sorted(set(fences))
            assert (await s.get(name("never"))).fence == 0

    asyncio.run(body())


def test_same_client_id_returns_the_same_lease(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            g = await acquire(s, lock, client_id="c1", owner="w")
            again = await acquire(s, lock, client_id="c1", owner="w", ttl_ms=5000)
            assert isinstance(again, Grant)
            assert (again.lease_id, again.fence) == (g.lease_id, g.fence)
            other = await acquire(s, lock, client_id="c2")
            assert isinstance(other, Holder)
            # A retry with a different TTL also returns the same lease, on the new TTL.
            third = await acquire(s, lock, client_id="c1", ttl_ms=9000)
            assert (third.lease_id, third.fence, third.ttl_ms) == (g.lease_id, g.fence, 9000)

    asyncio.run(body())


# -- renew, release, expiry ------------------------------------------------------------


def test_renew_keeps_fence_and_extends(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            ttl_ms = 1000
            g = await acquire(s, lock, ttl_ms=ttl_ms)
            for _ in range(3):
                # proves: across 3 × 0.7 TTL (> the TTL) only renewals keep it
                await asyncio.sleep(ttl_ms / 1000 * 0.7)
                r = await s.renew(lock, g.lease_id, ttl_ms)
                assert (r.lease_id, r.fence, r.ttl_ms) == (g.lease_id, g.fence, 1000)
            assert (await s.get(lock)).held

    asyncio.run(body())


def test_renew_with_a_new_ttl_moves_to_a_new_etcd_lease(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            old_ttl_ms = 1000
            g = await acquire(s, lock, ttl_ms=old_ttl_ms)
            longer = await s.renew(lock, g.lease_id, 4000)
            assert (longer.fence, longer.ttl_ms) == (g.fence, 4000)
            # proves: the old lease (2.2 × its TTL, past etcd's reaping) no longer decides
            await asyncio.sleep(old_ttl_ms / 1000 * 2.2)
            st = await s.get(lock)
            assert st.held and st.fence == g.fence and st.ttl_ms <= 4000
            again = await s.renew(lock, g.lease_id, 4000)  # same TTL now: a keep-alive
            assert again.fence == g.fence
            shorter = await s.renew(lock, g.lease_id, 1000)
            assert shorter.ttl_ms == 1000
            t0 = time.monotonic()

            async def freed() -> bool:
                return not (await s.get(lock)).held

            await wait_for_async(freed, timeout=3.0 * TIMING_SLACK, interval=0.1,
                                 what="the shortened lease to expire")
            # 1 s + etcd's ~0.5 s expiry check
            assert time.monotonic() - t0 < 2.0 * TIMING_SLACK
            g2 = await acquire(s, lock)
            assert g2.fence > g.fence

    asyncio.run(body())


def test_expired_lease_is_gone(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            g = await acquire(s, lock, ttl_ms=1000)
            t0 = time.monotonic()

            async def freed() -> bool:
                return not (await s.get(lock)).held

            await wait_for_async(freed, timeout=5.0 * TIMING_SLACK, interval=0.05,
                                 what="the 1 s lease to expire")
            waited = time.monotonic() - t0
            # etcd's clock: 1 s TTL, reaped every ~0.5 s
            assert 0.9 <= waited < 2.5 * TIMING_SLACK, waited
            with pytest.raises(LeaseLost):
                await s.renew(lock, g.lease_id, 1000)
            with pytest.raises(LeaseLost):
                await s.release(lock, g.lease_id)
            st = await s.get(lock)
            assert not st.held and st.fence == g.fence
            g2 = await acquire(s, lock)
            assert isinstance(g2, Grant) and g2.fence > g.fence

    asyncio.run(body())


def test_renew_and_release_need_the_live_lease_id(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            g = await acquire(s, lock)
            with pytest.raises(LeaseLost):
                await s.renew(lock, lease_id(), 5000)
            with pytest.raises(LeaseLost):
                await s.release(lock, lease_id())
            with pytest.raises(LeaseLost):
                await s.release(name(), g.lease_id)  # right id, wrong lock
            assert (await s.get(lock)).held  # nothing changed
            await s.release(lock, g.lease_id)
            with pytest.raises(LeaseLost):
                await s.release(lock, g.lease_id)  # released is gone
            with pytest.raises(LeaseLost):
                await s.renew(lock, g.lease_id, 5000)

    asyncio.run(body())


# -- list ------------------------------------------------------------------------------


def test_list_pages_in_name_order(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            names = [f"jobs/{i:02d}" for i in range(7)]
            grants = {}
            for n in names:
                grants[n] = await acquire(s, n, owner=n)
            await acquire(s, "other/x")
            await s.release("jobs/03", grants["jobs/03"].lease_id)
            seen, after = [], None
            while True:
                page = await s.list("jobs/", 3, after)
                assert len(page) <= 3
                seen += page
                if len(page) < 3:
                    break
                after = page[-1].lock
            assert [st.lock for st in seen] == names
            by = {st.lock: st for st in seen}
            assert not by["jobs/03"].held and by["jobs/03"].fence == grants["jobs/03"].fence
            assert by["jobs/05"].held and by["jobs/05"].owner == "jobs/05"
            assert all(st.fence == grants[st.lock].fence for st in seen)
            assert [st.lock for st in await s.list("", 100, None)] == [*names, "other/x"]
            assert await s.list("jobs/", 0, None) == []
            assert await s.list("nope/", 10, None) == []

    asyncio.run(body())


# -- races, replicas, watch --------------------------------------------------------------


def test_concurrent_acquires_on_two_stores_grant_once(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            for _ in range(5):
                lock = name("race")
                results = await asyncio.gather(*(
                    acquire(store, lock, owner=str(i)) for i, store in enumerate([a, b] * 8)))
                grants = [r for r in results if isinstance(r, Grant)]
                assert len(grants) == 1
                holders = [r for r in results if isinstance(r, Holder)]
                assert all(h.fence == grants[0].fence for h in holders)

    asyncio.run(body())


def test_mutual_exclusion_and_fences_under_contention(etcd_url):
    """Workers on two stores loop acquire/work/release: never two inside, fences ascend."""

    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name("mutex")
            inside: list[str] = []
            overlaps = 0
            fences: list[int] = []

            async def worker(store, wid):
                nonlocal overlaps
                done = 0
                while done < 4:
                    g = await acquire(store, lock, owner=wid)
                    if not isinstance(g, Grant):
                        await hold(None, 0.01)
                        continue
                    inside.append(wid)
                    if len(inside) > 1:
                        overlaps += 1
                    fences.append(g.fence)
                    await hold(None, 0.01)
                    inside.remove(wid)
                    await store.release(lock, g.lease_id)
                    done += 1

            await asyncio.gather(*(worker(st, f"{i}") for i, st in enumerate([a, b, a, b])))
            assert overlaps == 0
            assert len(fences) == 16 and fences == sorted(set(fences))

    asyncio.run(body())


def test_release_on_one_store_notifies_another_promptly(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            await watching(b, etcd_url)
            heard: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
            b.subscribe(lambda n: heard.put_nowait((n, time.monotonic())))
            lock = name("wake")
            g = await acquire(a, lock, ttl_ms=30_000)
            renewed = await a.renew(lock, g.lease_id, 60_000)  # a move (put): not a release
            assert renewed.fence == g.fence
            t0 = time.monotonic()
            await a.release(lock, g.lease_id)
            got, at = await asyncio.wait_for(heard.get(), 5)
            assert got == lock
            assert at - t0 < 0.5, f"watch took {at - t0:.3f}s"
            assert heard.empty()  # the renew's move produced no event

    asyncio.run(body())


def test_expiry_notifies_subscribers(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            await watching(s, etcd_url)
            heard: asyncio.Queue[str] = asyncio.Queue()
            s.subscribe(heard.put_nowait)
            lock = name("exp")
            await acquire(s, lock, ttl_ms=1000)
            assert await asyncio.wait_for(heard.get(), 4) == lock

    asyncio.run(body())


# -- availability ------------------------------------------------------------------------


def test_dead_endpoints_are_skipped(etcd_shared_cluster):
    dead = f"127.0.0.1:{free_port()}"
    url = f"etcd://{dead},{','.join(etcd_shared_cluster.endpoints)}/t-{uuid.uuid4().hex[:8]}"

    async def body():
        async with opened(url) as s:
            g = await acquire(s, name())
            assert isinstance(g, Grant)

    asyncio.run(body())


def test_no_endpoint_answers_is_store_unavailable_quickly():
    url = f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/x?timeout=1"

    async def body():
        store = EtcdStore(url)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.open()
        assert time.monotonic() - t0 < 2.0
        await store.close()

    asyncio.run(body())


def test_open_ping_and_close_are_idempotent(etcd_url):
    async def body():
        s = EtcdStore(etcd_url)
        await s.open()
        await s.ping()
        await s.close()
        await s.close()
        with pytest.raises(StoreUnavailable):
            await s.ping()

    asyncio.run(body())


def test_lease_value_holds_no_more_than_it_needs(etcd_shared_cluster, etcd_url):
    """The lock key's value carries the lockd lease id (for renew/release checks), labels and
    the TTL asked for (what a renew without one keeps); the fence comes from etcd's revision,
    not from the value."""

    async def body():
        async with opened(etcd_url) as s:
            lock = name()
            g = await acquire(s, lock, owner="me", client_id="cid")
            prefix = etcd_url.rsplit("/", 1)[1]
            import base64
            import json

            r = httpx.post(f"http://{etcd_shared_cluster.endpoints[0]}/v3/kv/range",
                           json={"key": base64.b64encode(f"{prefix}/locks/{lock}".encode()).decode()})
            kv = r.json()["kvs"][0]
            assert int(kv["create_revision"]) == g.fence
            assert json.loads(base64.b64decode(kv["value"])) == {
                "lease_id": g.lease_id, "owner": "me", "client_id": "cid", "ttl_s": 5,
                "ttl_ms": 5000}

    asyncio.run(body())
