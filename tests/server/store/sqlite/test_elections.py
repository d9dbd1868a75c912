"""Elections in the SQLite store (store level, lockd's clock injected)."""

from __future__ import annotations

import pytest

from lockd.server.errors import LeaseLost
from lockd.server.store.base import Store
from lockd.server.store.sqlite import SqliteStore
from lockd.server.store.sqlite.elections import LOG_KEEP
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    HolderView,
)
from tests.server.store.sqlite.support import run_with_store


async def _run(store: SqliteStore, name: str, lease: str, value: str, *, ttl: int = 1_000,
               client_id: str | None = None) -> Grant | Holder:
    return await store.elect_campaign(name, lease_id=lease, ttl_ms=ttl, owner=lease,
                                      client_id=client_id, value=value)


def test_the_store_implements_the_whole_protocol():
    assert isinstance(SqliteStore(":memory:"), Store)
    for method in ("sem_acquire", "sem_renew", "sem_release", "sem_get", "elect_campaign",
                   "elect_renew", "elect_resign", "elect_proclaim", "elect_handover",
                   "elect_get", "elect_log"):
        assert callable(getattr(SqliteStore, method)), method


def test_campaign_proclaim_resign_log_and_notifications(tmp_path):
    async def scenario(store, clock, notified):
        assert await store.elect_get("e") == ElectionState("e", None, 0, "", 0, None)
        alice = await _run(store, "e", "alice", "host-a:1")
        assert alice == Grant("e", "alice", 1, 1_000, "alice", EXCLUSIVE)
        assert notified == ["e"]
        clock.advance_ms(200)
        assert await _run(store, "e", "bob", "host-b") == Holder("e", "alice", 800, 1)
        assert notified == ["e"]  # a refused campaign writes nothing
        state = await store.elect_proclaim("e", "alice", "host-a:2")
        assert state == ElectionState("e", HolderView("alice", 800), 1, "host-a:2", 2, None)
        assert notified == ["e", "e"]
        with pytest.raises(LeaseLost):
            await store.elect_proclaim("e", "bob", "nope")
        with pytest.raises(LeaseLost):
            await store.elect_resign("e", "bob")
        assert (await store.elect_get("e")).value == "host-a:2"
        await store.elect_resign("e", "alice")
        assert notified == ["e", "e", "e"]
        assert await store.elect_get("e") == ElectionState("e", None, 1, "", 3, None)
        with pytest.raises(LeaseLost):
            await store.elect_resign("e", "alice")
        bob = await _run(store, "e", "bob", "host-b")
        assert bob.fence == 2 and notified[-1] == "e"
        assert await store.elect_log("e", 0, 100) == [
            ElectionEvent(1, "leader", "alice", "host-a:1", 1),
            ElectionEvent(2, "proclaim", "alice", "host-a:2", 1),
            ElectionEvent(3, "resign", "alice", "", 1),
            ElectionEvent(4, "leader", "bob", "host-b", 2),
        ]
        assert [e.seq for e in await store.elect_log("e", 1, 2)] == [2, 3]
        assert await store.elect_log("e", 4, 10) == []
        assert await store.elect_log("other", 0, 10) == []

    run_with_store(tmp_path, scenario)


def test_a_lapsed_leader_shows_up_as_the_next_leader_entry(tmp_path):
    async def scenario(store, clock, notified):
        await _run(store, "x", "a", "va", ttl=100)
        clock.advance_ms(100)
        state = await store.elect_get("x")
        assert (state.leader, state.value, state.fence) == (None, "", 1)  # lapsed: no value
        with pytest.raises(LeaseLost):
            await store.elect_proclaim("x", "a", "late")
        with pytest.raises(LeaseLost):
            await store.elect_renew("x", "a", None)
        b = await _run(store, "x", "b", "vb")
        assert b.fence == 2
        assert [(e.kind, e.owner, e.fence) for e in await store.elect_log("x", 0, 10)] == [
            ("leader", "a", 1), ("leader", "b", 2)]

    run_with_store(tmp_path, scenario)


def test_campaign_retry_by_client_id_returns_the_same_term_without_a_log_entry(tmp_path):
    async def scenario(store, clock, notified):
        first = await _run(store, "r", "a", "v1", client_id="k")
        again = await _run(store, "r", "a2", "v2", client_id="k", ttl=5_000)
        assert (again.lease_id, again.fence, again.ttl_ms) == ("a", first.fence, 5_000)
        assert len(await store.elect_log("r", 0, 10)) == 1
        assert (await store.elect_get("r")).value == "v1"
        assert notified == ["r"]

    run_with_store(tmp_path, scenario)


def test_handover_is_seen_at_renewal_and_cleared_by_a_new_leader(tmp_path):
    async def scenario(store, clock, notified):
        with pytest.raises(LeaseLost):  # nobody leads
            await store.elect_handover("h", "bob")
        assert notified == []
        await _run(store, "h", "alice", "va", ttl=1_000)
        grant, asked = await store.elect_renew("h", "alice", None)
        assert (grant.fence, grant.ttl_ms, asked) == (1, 1_000, None)
        state = await store.elect_handover("h", "bob")
        assert state.handover == "bob" and notified[-1] == "h"
        grant, asked = await store.elect_renew("h", "alice", 2_000)
        assert (grant.lease_id, grant.ttl_ms, asked) == ("alice", 2_000, "bob")
        assert (await store.elect_handover("h", "next")).handover == "next"  # the latest wins
        assert (await store.elect_renew("h", "alice", None))[1] == "next"
        clock.advance_ms(2_000)  # alice lapses without resigning: still pending for the next
        assert (await store.elect_get("h")).handover == "next"
        await _run(store, "h", "carol", "vc")
        state = await store.elect_get("h")
        assert (state.handover, state.value, state.leader.owner) == (None, "vc", "carol")
        assert (await store.elect_renew("h", "carol", None))[1] is None

        await store.elect_handover("h", "dave")
        await store.elect_resign("h", "carol")  # resign clears the handover too
        assert (await store.elect_get("h")).handover is None

    run_with_store(tmp_path, scenario)


def test_the_leader_is_the_exclusive_holder_of_the_lock(tmp_path):
    async def scenario(store, clock, notified):
        await store.acquire("L", lease_id="s", ttl_ms=500, owner="reader", client_id=None,
                            mode=SHARED)
        assert await _run(store, "L", "a", "va") == Holder("L", "reader", 500, 0, SHARED)
        await store.release("L", "s")
        plain = await store.acquire("L", lease_id="p", ttl_ms=500, owner="plain",
                                    client_id=None)
        state = await store.elect_get("L")
        assert (state.leader, state.value, state.fence) == (HolderView("plain", 500), "", 1)
        proclaimed = await store.elect_proclaim("L", "p", "pv")  # the holder leads
        assert (proclaimed.value, proclaimed.fence, proclaimed.seq) == ("pv", plain.fence, 1)
        await store.release("L", "p")  # a plain release: no resign entry, no value left
        assert (await store.elect_get("L")).value == ""
        a = await _run(store, "L", "a", "va")
        assert a.fence == 2 and (await store.get("L")).owner == "a"
        await store.elect_resign("L", "a")
        await store.acquire("L", lease_id="s2", ttl_ms=500, owner="reader", client_id=None,
                            mode=SHARED)
        assert (await store.elect_get("L")).leader is None  # a shared lease never leads
        with pytest.raises(LeaseLost):
            await store.elect_renew("L", "s2", None)
        with pytest.raises(LeaseLost):
            await store.elect_proclaim("L", "s2", "x")
        with pytest.raises(LeaseLost):
            await store.elect_handover("L", "bob")

    run_with_store(tmp_path, scenario)


def test_the_log_keeps_the_newest_entries_and_seq_survives_a_reopen(tmp_path):
    extra = 30

    async def first(store, clock, notified):
        await _run(store, "big", "a", "v0", ttl=600_000)
        for i in range(LOG_KEEP + extra - 1):
            await store.elect_proclaim("big", "a", f"v{i + 1}")
        assert (await store.elect_get("big")).seq == LOG_KEEP + extra

    async def second(store, clock, notified):
        log = await store.elect_log("big", 0, 2 * LOG_KEEP)
        assert len(log) == LOG_KEEP
        assert [e.seq for e in log] == list(range(extra + 1, LOG_KEEP + extra + 1))
        assert log[-1] == ElectionEvent(LOG_KEEP + extra, "proclaim", "a",
                                        f"v{LOG_KEEP + extra - 1}", 1)
        await store.elect_resign("big", "a")
        assert (await store.elect_log("big", LOG_KEEP + extra, 5))[0].seq == LOG_KEEP + extra + 1

    run_with_store(tmp_path, first)
    run_with_store(tmp_path, second)
