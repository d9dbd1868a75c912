"""Elections on ``PostgresStore``, against a fresh database per test: the leader is the
exclusive holder of the election's lock; the log, proclaim, resign, handover, notifications."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from harness import wait_for_async
from lockd.server.errors import LeaseLost
from lockd.server.store.postgres import PostgresStore
from lockd.server.store.values import (
    EXCLUSIVE,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    HolderView,
)
from tests.server.store.postgres.support import lease_id, opened


async def campaign(store: PostgresStore, name: str, owner: str, value: str, ttl_ms: int = 5000,
                   client_id: str | None = None) -> Grant | Holder:
    return await store.elect_campaign(name, lease_id=lease_id(), ttl_ms=ttl_ms, owner=owner,
                                      client_id=client_id, value=value)


def test_campaign_proclaim_resign_and_the_log(pg_url):
    async def main():
        async with opened(pg_url) as store:
            assert await store.elect_get("e") == ElectionState("e", None, 0, "", 0, None)
            a = await campaign(store, "e", "a", "http://a")
            assert isinstance(a, Grant) and (a.lock, a.fence, a.mode) == ("e", 1, EXCLUSIVE)
            b = await campaign(store, "e", "b", "http://b")
            assert isinstance(b, Holder) and (b.owner, b.fence) == ("a", 1)
            # the leader IS the exclusive holder of the lock
            assert (await store.get("e")).owner == "a"
            state = await store.elect_get("e")
            assert (state.leader.owner, state.fence, state.value, state.seq) == (
                "a", 1, "http://a", 1)
            assert state.handover is None

            proclaimed = await store.elect_proclaim("e", a.lease_id, "http://a2")
            assert proclaimed == ElectionState("e", HolderView("a", proclaimed.leader.ttl_ms),
                                               1, "http://a2", 2, None)
            with pytest.raises(LeaseLost):
                await store.elect_proclaim("e", lease_id(), "x")
            await store.elect_resign("e", a.lease_id)
            with pytest.raises(LeaseLost):
                await store.elect_resign("e", a.lease_id)
            assert await store.elect_get("e") == ElectionState("e", None, 1, "", 3, None)
            b = await campaign(store, "e", "b", "http://b")
            assert isinstance(b, Grant) and b.fence == 2
            assert await store.elect_log("e", 0, 100) == [
                ElectionEvent(1, "leader", "a", "http://a", 1),
                ElectionEvent(2, "proclaim", "a", "http://a2", 1),
                ElectionEvent(3, "resign", "a", "", 1),
                ElectionEvent(4, "leader", "b", "http://b", 2),
            ]
            assert [e.seq for e in await store.elect_log("e", 2, 1)] == [3]
            assert await store.elect_log("e", 4, 10) == []
            assert await store.elect_log("other", 0, 10) == []

    asyncio.run(main())


def test_a_lapsed_leader_shows_no_value_and_the_next_term_is_logged(pg_url):
    async def main():
        async with opened(pg_url) as store:
            a = await campaign(store, "l", "a", "va", ttl_ms=200)

            async def lapsed() -> bool:
                return (await store.elect_get("l")).leader is None

            await wait_for_async(lapsed, timeout=3.0, what="the 200 ms leader lease to lapse")
            state = await store.elect_get("l")
            assert (state.leader, state.value, state.seq) == (None, "", 1)
            with pytest.raises(LeaseLost):
                await store.elect_renew("l", a.lease_id, 1000)
            with pytest.raises(LeaseLost):
                await store.elect_proclaim("l", a.lease_id, "late")
            b = await campaign(store, "l", "b", "vb")
            assert isinstance(b, Grant) and b.fence == 2
            assert [(e.kind, e.owner, e.fence) for e in await store.elect_log("l", 0, 10)] == [
                ("leader", "a", 1), ("leader", "b", 2)]
            # a plain release of the leader's lock ends the term too (no resign entry)
            await store.release("l", b.lease_id)
            assert (await store.elect_get("l")).leader is None

    asyncio.run(main())


def test_client_id_retry_of_a_campaign_appends_nothing(pg_url):
    async def main():
        async with opened(pg_url) as store:
            a = await campaign(store, "c", "a", "v1", client_id="req-1")
            again = await campaign(store, "c", "a", "v1", ttl_ms=30_000, client_id="req-1")
            assert isinstance(again, Grant)
            assert (again.lease_id, again.fence, again.ttl_ms) == (a.lease_id, 1, 30_000)
            assert [e.seq for e in await store.elect_log("c", 0, 10)] == [1]

    asyncio.run(main())


def test_handover_reaches_the_leaders_renewal_and_ends_with_its_term(pg_url):
    async def main():
        async with opened(pg_url) as store:
            with pytest.raises(LeaseLost):
                await store.elect_handover("h", "next")  # nobody leads
            a = await campaign(store, "h", "a", "va")
            grant, handover = await store.elect_renew("h", a.lease_id, 10_000)
            assert (grant.lease_id, grant.fence, grant.ttl_ms, handover) == (
                a.lease_id, 1, 10_000, None)
            state = await store.elect_handover("h", "b")
            assert (state.handover, state.leader.owner) == ("b", "a")
            assert (await store.elect_get("h")).handover == "b"
            assert (await store.elect_renew("h", a.lease_id, None))[1] == "b"
            # a proclaim keeps it; a new term clears it
            assert (await store.elect_proclaim("h", a.lease_id, "va2")).handover == "b"
            await store.elect_resign("h", a.lease_id)
            b = await campaign(store, "h", "b", "vb")
            assert (await store.elect_renew("h", b.lease_id, None))[1] is None
            assert (await store.elect_get("h")).handover is None
            await store.elect_handover("h", "next")
            # a leader that lapsed: its successor does not see the old request
            await store.force_release("h")
            c = await campaign(store, "h", "c", "vc")
            assert (await store.elect_renew("h", c.lease_id, None))[1] is None

    asyncio.run(main())


def test_the_log_keeps_at_least_the_last_thousand_entries(pg_url, pg_dsn):
    async def main():
        async with opened(pg_url) as store:
            a = await campaign(store, "big", "a", "v0", ttl_ms=600_000)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:  # 1,149 proclaims, fast
                conn.execute("INSERT INTO lockd.election_log (name, seq, kind, owner, value, fence)"
                             " SELECT 'big', g, 'proclaim', 'a', 'v' || (g - 1), 1"
                             "   FROM generate_series(2, 1150) AS g")
                conn.execute("UPDATE lockd.elections SET seq = 1150")
            for i in range(1150, 1200):
                await store.elect_proclaim("big", a.lease_id, f"v{i}")
            log = await store.elect_log("big", 0, 5000)
            seqs = [e.seq for e in log]
            assert seqs[-1] == 1200 and seqs == list(range(seqs[0], 1201))
            assert len(seqs) >= 1000 and seqs[0] > 1  # the oldest were trimmed
            assert log[-1].value == "v1199" and (await store.elect_get("big")).seq == 1200

    asyncio.run(main())


def test_every_election_write_notifies_another_instance(pg_url):
    async def main():
        got: list[str] = []
        changed = asyncio.Event()

        def listener(name: str) -> None:
            got.append(name)
            changed.set()

        async def expect(n: int) -> None:
            await wait_for_async(lambda: len(got) >= n, timeout=5.0, what=f"{n} notices, got {got}")

        async with opened(pg_url) as a, opened(pg_url) as b:
            b.subscribe(listener)
            g = await campaign(a, "n", "a", "v")
            await expect(1)
            await a.elect_proclaim("n", g.lease_id, "v2")
            await expect(2)
            await a.elect_handover("n", "next")
            await expect(3)
            await a.elect_renew("n", g.lease_id, None)  # a renewal writes no election state
            await a.elect_resign("n", g.lease_id)
            await expect(4)
            await asyncio.sleep(0.2)  # proves: no notice beyond the four writes (within 200 ms)
            assert got == ["n"] * 4

    asyncio.run(main())


def test_campaigns_on_two_instances_elect_one_leader_per_term(pg_url, pg_dsn):
    async def main():
        async with opened(pg_url) as a, opened(pg_url) as b:
            for term in range(1, 6):
                results = await asyncio.gather(*(
                    campaign(a if i % 2 else b, "race", f"c{i}", f"v{i}") for i in range(10)))
                leaders = [r for r in results if isinstance(r, Grant)]
                assert len(leaders) == 1 and leaders[0].fence == term
                await (a if term % 2 else b).elect_resign("race", leaders[0].lease_id)
            log = await a.elect_log("race", 0, 100)
            assert [e.kind for e in log] == ["leader", "resign"] * 5
            assert [e.seq for e in log] == list(range(1, 11))
            assert [e.fence for e in log] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
        with psycopg.connect(pg_dsn) as conn:  # the log is a table of the store's schema
            assert conn.execute("SELECT count(*) FROM lockd.election_log").fetchone() == (10,)

    asyncio.run(main())
