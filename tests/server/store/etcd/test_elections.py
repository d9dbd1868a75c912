"""EtcdStore elections against a real 3-member etcd cluster (one key prefix a test): campaign is
the exclusive grant plus value and a ``leader`` log entry in one step; proclaim, resign,
handover; the log's seqs across two stores; trimming; watch notifications at a second store.

The test cluster's minimum etcd lease is 1 s (checked by etcd about every 500 ms).
"""

from __future__ import annotations

import asyncio

import pytest

from harness import wait_for_async
from lockd.server.errors import LeaseLost
from lockd.server.store.etcd.elections import KEEP
from lockd.server.store.values import Grant, Holder
from tests.jitter import hold
from tests.server.store.etcd.helpers import lease_id, name, opened, watching


async def campaign(store, election, value="v", ttl_ms=5000, owner="c", client_id=None):
    return await store.elect_campaign(election, lease_id=lease_id(), ttl_ms=ttl_ms, owner=owner,
                                      client_id=client_id, value=value)


def test_campaign_proclaim_resign_and_the_log(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            e = name("elect")
            assert (await s.elect_get(e)).leader is None and (await s.elect_get(e)).seq == 0
            g = await campaign(s, e, value="one", owner="alice")
            assert isinstance(g, Grant) and g.fence > 0
            lock = await s.get(e)  # the leader IS the exclusive holder of lock ``e``
            assert lock.held and lock.owner == "alice" and lock.fence == g.fence
            st = await s.elect_get(e)
            assert (st.leader.owner, st.value, st.fence, st.seq, st.handover) == (
                "alice", "one", g.fence, 1, None)
            h = await campaign(s, e, owner="bob")
            assert isinstance(h, Holder) and h.owner == "alice"
            st = await s.elect_proclaim(e, g.lease_id, "two")
            assert (st.value, st.seq, st.fence) == ("two", 2, g.fence)
            await s.elect_resign(e, g.lease_id)
            st = await s.elect_get(e)
            assert (st.leader, st.value, st.seq) == (None, "", 3)
            assert not (await s.get(e)).held
            with pytest.raises(LeaseLost):
                await s.elect_proclaim(e, g.lease_id, "late")
            with pytest.raises(LeaseLost):
                await s.elect_resign(e, g.lease_id)
            g2 = await campaign(s, e, value="b", owner="bob")
            assert g2.fence > g.fence
            log = await s.elect_log(e, 0, 100)
            assert [(x.seq, x.kind, x.owner, x.value, x.fence) for x in log] == [
                (1, "leader", "alice", "one", g.fence), (2, "proclaim", "alice", "two", g.fence),
                (3, "resign", "alice", "", g.fence), (4, "leader", "bob", "b", g2.fence)]
            assert [x.seq for x in await s.elect_log(e, 2, 1)] == [3]
            assert await s.elect_log(e, 4, 10) == []

    asyncio.run(body())


def test_lapsed_leader_value_is_gone_and_the_next_leader_is_logged(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            e = name("elect")
            g = await campaign(s, e, value="old", ttl_ms=1000, owner="a")

            async def lapsed() -> bool:
                return (await s.elect_get(e)).leader is None

            await wait_for_async(lapsed, timeout=4, interval=0.1,
                                 what="the 1 s leader lease to expire")
            st = await s.elect_get(e)
            assert (st.value, st.seq, st.fence) == ("", 1, g.fence)
            with pytest.raises(LeaseLost):
                await s.elect_renew(e, g.lease_id, None)
            g2 = await campaign(s, e, value="new", owner="b")
            assert [(x.kind, x.owner) for x in await s.elect_log(e, 0, 10)] == [
                ("leader", "a"), ("leader", "b")]
            assert (await s.elect_get(e)).value == "new" and g2.fence > g.fence

    asyncio.run(body())


def test_handover_is_seen_by_the_leaders_renewal_and_cleared_by_the_next_term(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            e = name("elect")
            with pytest.raises(LeaseLost):
                await a.elect_handover(e, "next")
            g = await campaign(a, e, owner="a")
            assert (await a.elect_renew(e, g.lease_id, None))[1] is None
            st = await b.elect_handover(e, "bob")
            assert st.handover == "bob"
            grant, target = await a.elect_renew(e, g.lease_id, 3000)
            assert target == "bob" and grant.fence == g.fence
            await a.elect_resign(e, g.lease_id)
            assert (await b.elect_get(e)).handover is None
            g2 = await campaign(b, e, owner="bob")
            assert (await b.elect_renew(e, g2.lease_id, None))[1] is None

    asyncio.run(body())


def test_client_id_retry_returns_the_leader_lease_without_a_log_entry(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            e = name("elect")
            g = await campaign(s, e, client_id="c1")
            again = await campaign(s, e, client_id="c1", ttl_ms=8000)
            assert (again.lease_id, again.fence, again.ttl_ms) == (g.lease_id, g.fence, 8000)
            assert (await s.elect_get(e)).seq == 1

    asyncio.run(body())


def test_concurrent_campaigns_and_proclaims_on_two_stores_keep_seqs_gapless(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            e = name("elect")
            leaders = 0

            async def candidate(store, i):
                nonlocal leaders
                for _ in range(3):
                    g = await campaign(store, e, value=f"c{i}", owner=f"c{i}")
                    if not isinstance(g, Grant):
                        await hold(None, 0.01)
                        continue
                    leaders += 1
                    await store.elect_proclaim(e, g.lease_id, f"c{i}-2")
                    await store.elect_resign(e, g.lease_id)

            await asyncio.gather(*(candidate(s, i) for i, s in enumerate((a, b) * 3)))
            log = await a.elect_log(e, 0, 1000)
            assert [x.seq for x in log] == list(range(1, len(log) + 1))
            assert len(log) == 3 * leaders
            kinds = [x.kind for x in log]
            assert kinds == ["leader", "proclaim", "resign"] * leaders  # terms never interleave
            fences = [x.fence for x in log if x.kind == "leader"]
            assert fences == sorted(set(fences))

    asyncio.run(body())


def test_concurrent_proclaims_of_one_leader_at_two_stores_get_distinct_seqs(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            e = name("elect")
            g = await campaign(a, e, value="v0", ttl_ms=30_000)
            states = await asyncio.gather(*(s.elect_proclaim(e, g.lease_id, f"v{i}")
                                            for i, s in enumerate((a, b) * 6, start=1)))
            assert sorted(st.seq for st in states) == list(range(2, 14))
            log = await b.elect_log(e, 0, 100)
            assert [x.seq for x in log] == list(range(1, 14))
            assert sorted(x.value for x in log) == sorted(f"v{i}" for i in range(13))

    asyncio.run(body())


def test_log_keeps_at_least_the_last_thousand_entries(etcd_url):
    async def body():
        async with opened(etcd_url) as s:
            e = name("elect")
            g = await campaign(s, e, ttl_ms=60_000)
            for i in range(KEEP + 150):
                await s.elect_proclaim(e, g.lease_id, str(i))
            last = (await s.elect_get(e)).seq
            assert last == KEEP + 151
            log = await s.elect_log(e, 0, 5000)
            assert log[-1].seq == last and len(log) >= KEEP
            assert log[0].seq > 1  # older ones were trimmed
            assert [x.seq for x in log] == list(range(log[0].seq, last + 1))

    asyncio.run(body())


def test_every_election_write_notifies_a_second_store(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            await watching(b, etcd_url)
            e = name("elect")
            heard = asyncio.Queue()
            b.subscribe(lambda n: heard.put_nowait(n) if n == e else None)

            async def expect_one():
                await asyncio.wait_for(heard.get(), 3)
                # settles: repeats of that notice (a watch may send one twice) come within 200 ms
                await asyncio.sleep(0.2)
                while not heard.empty():
                    heard.get_nowait()

            g = await campaign(a, e)
            await expect_one()
            await a.elect_proclaim(e, g.lease_id, "x")
            await expect_one()
            await a.elect_handover(e, "next")
            await expect_one()
            await a.elect_resign(e, g.lease_id)
            await expect_one()

    asyncio.run(body())
