"""EtcdStore under real etcd faults: kill -9 of the leader, quorum loss, compacted watch history.

Each test gets a 3-member cluster of its own (``etcd_cluster``) because it breaks it.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid

import httpx
import pytest

from harness import TIMING_SLACK, wait_for_async
from harness.etcd import EtcdCluster
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.values import Grant, Holder
from tests.jitter import hold
from tests.server.store.etcd.helpers import acquire, opened, watching

pytestmark = pytest.mark.slow


def url_with_first(cluster: EtcdCluster, first: int) -> str:
    """A store URL that lists member ``first`` first, so the store talks to it first."""
    order = [first] + [i for i in range(len(cluster.members)) if i != first]
    return "etcd://" + ",".join(cluster.endpoints[i] for i in order) + "/faults"


def test_leader_kill_holders_keep_renewing_and_fences_increase(etcd_cluster: EtcdCluster):
    leader = etcd_cluster.leader()
    url = url_with_first(etcd_cluster, leader)  # both stores (and their watches) on the leader
    report: dict[str, float] = {}
    ttl_s = 2.0  # the held leases' TTL

    async def body():
        async with opened(url) as a, opened(url) as b:
            await watching(a, url)
            await watching(b, url)
            heard: asyncio.Queue[str] = asyncio.Queue()
            b.subscribe(heard.put_nowait)
            held = {}
            for i in range(4):
                lock = f"held/{i}"
                g = await acquire(a if i % 2 else b, lock, ttl_ms=int(ttl_s * 1000), owner=f"h{i}")
                assert isinstance(g, Grant)
                held[lock] = g
            fence_before = max(g.fence for g in held.values())
            lost: list[str] = []
            renewed_after: dict[str, float] = {}
            stolen: list[str] = []
            renewed_before: set[str] = set()
            kill_at = 0.0
            stop = asyncio.Event()

            async def renewer(lock: str, store):
                while not stop.is_set():
                    try:
                        r = await store.renew(lock, held[lock].lease_id, int(ttl_s * 1000))
                        assert r.fence == held[lock].fence
                        if not kill_at:
                            renewed_before.add(lock)
                        if kill_at and lock not in renewed_after:
                            renewed_after[lock] = time.monotonic() - kill_at
                    except LeaseLost:
                        lost.append(lock)
                        return
                    except StoreUnavailable:
                        pass
                    await hold(None, ttl_s / 7)  # renewal pacing

            async def contender(lock: str, store):
                while not stop.is_set():
                    try:
                        r = await acquire(store, lock, ttl_ms=2000, owner="thief")
                        if isinstance(r, Grant):
                            stolen.append(lock)
                            return
                    except StoreUnavailable:
                        pass
                    await hold(None, 0.1)  # a pause before the next try

            tasks = [asyncio.create_task(renewer(lock, a if i % 2 else b))
                     for i, lock in enumerate(held)]
            tasks += [asyncio.create_task(contender(lock, b if i % 2 else a))
                      for i, lock in enumerate(held)]
            await wait_for_async(lambda: len(renewed_before) == len(held), timeout=10,
                                 what="every held lease renewed once before the kill")
            kill_at = time.monotonic()
            etcd_cluster.kill_member(leader)
            # The first fresh grant after the kill: how long until the store serves again.

            async def fresh_grant():
                try:
                    return await acquire(a, f"fresh/{uuid.uuid4().hex[:6]}", ttl_ms=2000)
                except StoreUnavailable:
                    return None

            fresh = await wait_for_async(fresh_grant, timeout=15, interval=0.05,
                                         what="a fresh grant after the leader kill")
            report["first_grant_after_kill_s"] = time.monotonic() - kill_at
            assert isinstance(fresh, Grant) and fresh.fence > fence_before
            # proves: past the TTL (5/4 of it) after the kill, only renewals keep the leases
            await asyncio.sleep(ttl_s * 5 / 4)
            stop.set()
            await asyncio.gather(*tasks)
            assert lost == [], f"held leases lost across the failover: {lost}"
            assert stolen == [], f"granted while held: {stolen}"
            assert set(renewed_after) == set(held)
            report["all_renewed_after_kill_s"] = max(renewed_after.values())
            # The watch moved to a live member: a release on a is heard on b.
            t0 = time.monotonic()
            await a.release("held/1", held["held/1"].lease_id)
            while (name := await asyncio.wait_for(heard.get(), 5)) != "held/1":
                assert name.startswith("fresh/")
            report["watch_after_failover_s"] = time.monotonic() - t0
            assert report["watch_after_failover_s"] < 1.0 * TIMING_SLACK
            g = await acquire(b, "held/1", ttl_ms=2000)
            assert isinstance(g, Grant) and g.fence > fresh.fence

    asyncio.run(body())
    assert etcd_cluster.leader() != leader
    print(f"etcd leader kill -9: {report}")


def test_quorum_loss_is_unavailable_and_grants_nothing(etcd_cluster: EtcdCluster):
    url = etcd_cluster.url("quorum")
    timings: dict[str, float] = {}

    async def body():
        async with opened(url) as s:
            g = await acquire(s, "q/held", ttl_ms=5000, owner="holder")
            leader = etcd_cluster.leader()
            down = [leader, (leader + 1) % 3]
            for i in down:
                etcd_cluster.kill_member(i)
            async def outage(what, call):
                t0 = time.monotonic()
                with pytest.raises(StoreUnavailable) as info:
                    await call
                timings[what] = round(time.monotonic() - t0, 2)
                assert timings[what] < 4.0, (what, timings[what])
                assert info.value.code == "store_unavailable" and info.value.status == 503

            await asyncio.gather(
                outage("acquire", acquire(s, "q/new", ttl_ms=2000)),
                outage("acquire_held", acquire(s, "q/held", ttl_ms=2000)),
                outage("renew", s.renew("q/held", g.lease_id, 5000)),
                outage("release", s.release("q/held", g.lease_id)),
                outage("get", s.get("q/held")),
                outage("ping", s.ping()),
            )
            for i in down:
                etcd_cluster.restart_member(i)
            t0 = time.monotonic()
            while True:
                try:
                    await s.ping()
                    break
                except StoreUnavailable:
                    assert time.monotonic() - t0 < 20
            timings["back_after_restart_s"] = round(time.monotonic() - t0, 2)
            # Nothing was granted during the outage, and the holder's lease survived it (etcd's
            # new leader extends every lease on election).
            assert not (await s.get("q/new")).held
            r = await s.renew("q/held", g.lease_id, 5000)
            assert r.fence == g.fence
            assert isinstance(await acquire(s, "q/held"), Holder)
            assert isinstance(await acquire(s, "q/new"), Grant)

    asyncio.run(body())
    print(f"etcd quorum loss timings: {timings}")


def test_compacted_watch_history_still_wakes_listeners(etcd_cluster: EtcdCluster):
    """A release that happened while the watch was cut off AND whose history was compacted is
    still reported: the store wakes listeners for every free lock after resuming."""
    victim = (etcd_cluster.leader() + 1) % 3  # a follower: the cluster keeps its quorum
    url_a = url_with_first(etcd_cluster, victim)
    others = [i for i in range(3) if i != victim]
    url_b = "etcd://" + ",".join(etcd_cluster.endpoints[i] for i in others) + "/faults"

    async def body():
        async with opened(url_a) as a, opened(url_b) as b:
            await watching(a, url_a)
            heard: asyncio.Queue[str] = asyncio.Queue()
            a.subscribe(heard.put_nowait)
            g = await acquire(b, "gap/lock", ttl_ms=30_000)
            still = await acquire(b, "gap/still-held", ttl_ms=30_000)
            assert isinstance(still, Grant)
            etcd_cluster.pause_member(victim)  # a's watch stream stalls without breaking
            try:
                await b.release("gap/lock", g.lease_id)
                ep = etcd_cluster.members[others[0]].client_url
                rev = httpx.post(f"{ep}/v3/kv/put", json={
                    "key": base64.b64encode(b"unrelated").decode(), "value": ""}).json()
                httpx.post(f"{ep}/v3/kv/compaction",
                           json={"revision": rev["header"]["revision"], "physical": True})
            finally:
                etcd_cluster.kill_member(victim)  # the stream now breaks; a reconnects
            assert await asyncio.wait_for(heard.get(), 8) == "gap/lock"
            await asyncio.sleep(0.3)  # proves: no false free notice for the held lock (300 ms)
            assert heard.empty()  # the held lock was not reported free

    asyncio.run(body())
