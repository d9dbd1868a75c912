"""EtcdStore semaphores against a real 3-member etcd cluster (one key prefix a test): the limit
holds under concurrent acquirers on two stores, slots are the lowest free and unique, fences
strictly increase, limit mismatch, client_id retries, expiry, and release notifications.

The test cluster's minimum etcd lease is 1 s (checked by etcd about every 500 ms).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from harness import wait_for_async
from harness.etcd import EtcdCluster
from lockd.server.errors import LeaseLost, LimitMismatch
from lockd.server.store.values import SemFull, SemGrant, sem_key
from tests.jitter import hold
from tests.server.store.etcd.helpers import lease_id, name, opened, watching


async def permit(store, sem, limit=3, ttl_ms=5000, owner="p", client_id=None):
    return await store.sem_acquire(sem, limit=limit, lease_id=lease_id(), ttl_ms=ttl_ms,
                                   owner=owner, client_id=client_id)


def test_permits_take_the_lowest_free_slot_until_full(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            sem = name("sem")
            assert await s.sem_get(sem) == type(await s.sem_get(sem))(sem, 0, 0, ())
            grants = [await permit(s, sem, owner=f"p{i}", ttl_ms=2000 + 1000 * i)
                      for i in range(3)]
            assert all(isinstance(g, SemGrant) for g in grants)
            assert [g.slot for g in grants] == [0, 1, 2] and grants[0].limit == 3
            fences = [g.fence for g in grants]
            assert fences == sorted(set(fences)) and fences[0] > 0
            full = await permit(s, sem, owner="late")
            assert isinstance(full, SemFull) and full.limit == 3
            assert sorted(full.owners) == ["p0", "p1", "p2"]
            assert 0 < full.ttl_ms <= 2000  # the soonest expiry
            await s.sem_release(sem, grants[1].lease_id)
            again = await permit(s, sem, owner="next")
            assert again.slot == 1 and again.fence > fences[-1]
            st = await s.sem_get(sem)
            assert (st.limit, st.fence) == (3, again.fence)
            assert [(p.owner, p.slot) for p in st.permits] == [("p0", 0), ("next", 1), ("p2", 2)]

    asyncio.run(body())


def test_limit_mismatch_only_while_permits_are_live(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            sem = name("sem")
            g = await permit(s, sem, limit=2)
            with pytest.raises(LimitMismatch) as err:
                await permit(s, sem, limit=5)
            assert err.value.limit == 2
            await s.sem_release(sem, g.lease_id)
            g5 = await permit(s, sem, limit=5)  # no live permit: the new limit is taken
            assert isinstance(g5, SemGrant) and g5.limit == 5 and g5.fence > g.fence
            assert (await s.sem_get(sem)).limit == 5
            with pytest.raises(LimitMismatch):
                await permit(s, sem, limit=2)

    asyncio.run(body())


def test_renew_release_client_id_and_expiry(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            sem = name("sem")
            g = await permit(a, sem, limit=2, ttl_ms=1000, client_id="c1")
            same = await permit(b, sem, limit=2, ttl_ms=1000, client_id="c1")
            assert (same.lease_id, same.slot, same.fence) == (g.lease_id, g.slot, g.fence)
            r = await b.sem_renew(sem, g.lease_id, 4000)  # another store: a TTL move
            assert (r.slot, r.fence, r.limit, r.ttl_ms) == (g.slot, g.fence, 2, 4000)
            assert (await a.sem_renew(sem, g.lease_id, None)).ttl_ms == 4000
            short = await permit(a, sem, limit=2, ttl_ms=1000, owner="short")
            assert short.slot == 1

            async def expired() -> bool:
                return len((await a.sem_get(sem)).permits) <= 1

            await wait_for_async(expired, timeout=4, interval=0.1, what="the 1 s permit to expire")
            with pytest.raises(LeaseLost):
                await a.sem_renew(sem, short.lease_id, None)
            with pytest.raises(LeaseLost):
                await b.sem_release(sem, short.lease_id)
            await b.sem_release(sem, g.lease_id)
            with pytest.raises(LeaseLost):
                await a.sem_release(sem, g.lease_id)
            assert (await a.sem_get(sem)).permits == ()

    asyncio.run(body())


def test_never_more_than_limit_under_concurrent_acquirers_on_two_stores(etcd_url):
    """16 workers on two stores cycle permits of a limit-3 semaphore; each grant checks what is
    held at that moment (recorded in memory before release), and slots stay unique."""

    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            sem = name("sem")
            held: dict[str, int] = {}
            violations: list[str] = []
            fences: list[int] = []
            grants = 0

            async def worker(store, i):
                nonlocal grants
                for _ in range(8):
                    g = await permit(store, sem, limit=3, owner=f"w{i}")
                    if not isinstance(g, SemGrant):
                        await hold(None, 0.005)
                        continue
                    grants += 1
                    if len(held) >= 3 or g.slot in held.values():
                        violations.append(f"slot {g.slot} granted beside {sorted(held.values())}")
                    held[g.lease_id] = g.slot
                    fences.append(g.fence)
                    await hold(None, 0.01)
                    del held[g.lease_id]
                    await store.sem_release(sem, g.lease_id)

            await asyncio.gather(*(worker(s, i) for i, s in enumerate((a, b) * 8)))
            assert violations == []
            assert grants >= 8
            assert len(fences) == len(set(fences))  # never reused
            assert (await a.sem_get(sem)).permits == ()

    asyncio.run(body())


def test_fences_strictly_increase_in_grant_order(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            sem = name("sem")
            last = 0
            for i in range(6):
                g = await permit((a, b)[i % 2], sem, limit=1)
                assert g.slot == 0 and g.fence > last
                last = g.fence
                await (a, b)[(i + 1) % 2].sem_release(sem, g.lease_id)

    asyncio.run(body())


def test_release_notifies_the_semaphore_key_at_another_store(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            await watching(b, etcd_url)
            sem = name("sem")
            heard: list[str] = []
            got = asyncio.Event()

            def listener(key: str) -> None:
                heard.append(key)
                if key == sem_key(sem):
                    got.set()

            b.subscribe(listener)
            g = await permit(a, sem)
            await a.sem_release(sem, g.lease_id)
            await asyncio.wait_for(got.wait(), 3)
            assert sem not in heard  # the semaphore key, never its bare name

    asyncio.run(body())


@pytest.mark.slow
def test_a_permit_released_in_a_compacted_watch_gap_still_wakes_listeners(
        etcd_cluster: EtcdCluster):
    """The watch of store ``a`` is cut off (its member paused, then killed) while a permit of a
    semaphore that stays partly held is released and the history compacted: on resuming, ``a``
    wakes the semaphore's listeners anyway (a waiter needs one free slot, not a free semaphore)."""
    victim = (etcd_cluster.leader() + 1) % 3  # a follower: the cluster keeps its quorum
    others = [i for i in range(3) if i != victim]
    order = [victim] + others
    url_a = "etcd://" + ",".join(etcd_cluster.endpoints[i] for i in order) + "/gap"
    url_b = "etcd://" + ",".join(etcd_cluster.endpoints[i] for i in others) + "/gap"

    async def body():
        async with opened(url_a) as a, opened(url_b) as b:
            await watching(a, url_a)
            heard: asyncio.Queue[str] = asyncio.Queue()
            a.subscribe(heard.put_nowait)
            first = await permit(b, "gap-sem", limit=2, ttl_ms=30_000)
            await permit(b, "gap-sem", limit=2, ttl_ms=30_000)  # stays held
            etcd_cluster.pause_member(victim)  # a's watch stream stalls without breaking
            try:
                await b.sem_release("gap-sem", first.lease_id)
                ep = etcd_cluster.members[others[0]].client_url
                rev = httpx.post(f"{ep}/v3/kv/put", json={"key": "dW5yZWxhdGVk", "value": ""})
                httpx.post(f"{ep}/v3/kv/compaction", json={
                    "revision": rev.json()["header"]["revision"], "physical": True})
            finally:
                etcd_cluster.kill_member(victim)  # the stream now breaks; a reconnects
            while await asyncio.wait_for(heard.get(), 8) != sem_key("gap-sem"):
                pass

    asyncio.run(body())
