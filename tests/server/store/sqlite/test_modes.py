"""Shared and exclusive leases in the SQLite store (store level, lockd's clock injected)."""

from __future__ import annotations

import pytest

from lockd.server.errors import ClientIdConflict, LeaseLost
from lockd.server.store.sqlite import SqliteStore
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    Grant,
    Holder,
    HolderView,
    LockState,
    MultiGrant,
)
from tests.jitter import hold
from tests.server.store.sqlite.support import run_with_store


async def _acq(store: SqliteStore, lock: str, lease: str, mode: str, *, ttl: int = 1_000,
               owner: str | None = None, client_id: str | None = None) -> Grant | Holder:
    return await store.acquire(lock, lease_id=lease, ttl_ms=ttl, owner=owner or lease,
                               client_id=client_id, mode=mode)


def test_shared_holders_coexist_and_exclusive_excludes_both_ways(tmp_path):
    async def scenario(store, clock, notified):
        ex = await _acq(store, "a", "e1", EXCLUSIVE)
        assert ex == Grant("a", "e1", 1, 1_000, "e1", EXCLUSIVE)
        clock.advance_ms(100)
        # a live exclusive lease refuses a shared request, and names its own mode
        assert await _acq(store, "a", "s0", SHARED) == Holder("a", "e1", 900, 1, EXCLUSIVE)
        await store.release("a", "e1")

        s1 = await _acq(store, "a", "s1", SHARED, ttl=500)
        s2 = await _acq(store, "a", "s2", SHARED, ttl=2_000)
        s3 = await _acq(store, "a", "s3", SHARED, ttl=1_000)
        # shared grants carry the current fence and do not raise it
        assert [g.fence for g in (s1, s2, s3)] == [1, 1, 1]
        assert all(isinstance(g, Grant) and g.mode == SHARED for g in (s1, s2, s3))
        clock.advance_ms(100)
        # refused by shared holders: the one whose lease ends LAST
        assert await _acq(store, "a", "e2", EXCLUSIVE) == Holder("a", "s2", 1_900, 1, SHARED)
        state = await store.get("a")
        assert state == LockState("a", True, 1, "s2", 1_900, SHARED, (
            HolderView("s1", 400, SHARED), HolderView("s2", 1_900, SHARED),
            HolderView("s3", 900, SHARED)))  # grant order
        assert (await store.get("a")).fence == 1

        for lease in ("s1", "s2", "s3"):
            await store.release("a", lease)
        assert notified == ["a", "a", "a", "a"]
        assert await store.get("a") == LockState("a", False, 1, None, 0)
        ex2 = await _acq(store, "a", "e3", EXCLUSIVE)
        assert ex2.fence == 2  # the exclusive grant raises it
        state = await store.get("a")
        assert (state.mode, state.holders) == (EXCLUSIVE, (HolderView("e3", 1_000, EXCLUSIVE),))

    run_with_store(tmp_path, scenario)


def test_a_shared_grant_on_a_never_written_lock_carries_fence_zero_and_is_listed(tmp_path):
    async def scenario(store, clock, notified):
        g = await _acq(store, "fresh/x", "s1", SHARED)
        assert g.fence == 0
        assert [(s.lock, s.held, s.mode, s.fence) for s in await store.list("fresh/", 10, None)] \
            == [("fresh/x", True, SHARED, 0)]
        await store.release("fresh/x", "s1")
        assert (await _acq(store, "fresh/x", "e1", EXCLUSIVE)).fence == 1

    run_with_store(tmp_path, scenario)


def test_expiry_frees_one_shared_holder_without_disturbing_the_others(tmp_path):
    async def scenario(store, clock, notified):
        await _acq(store, "b", "e0", EXCLUSIVE, ttl=10)
        clock.advance_ms(10)  # expired: never released
        short = await _acq(store, "b", "short", SHARED, ttl=300)
        assert short.fence == 2  # after an unclean end: a new epoch
        await _acq(store, "b", "long", SHARED, ttl=3_000)
        clock.advance_ms(300)  # "short" has just expired
        with pytest.raises(LeaseLost):
            await store.renew("b", "short", 1_000)
        with pytest.raises(LeaseLost):
            await store.release("b", "short")
        state = await store.get("b")
        assert state.holders == (HolderView("long", 2_700, SHARED),)
        renewed = await store.renew("b", "long", None)  # own TTL
        assert renewed == Grant("b", "long", 2, 3_000, "long", SHARED)
        assert await _acq(store, "b", "e1", EXCLUSIVE) == Holder("b", "long", 3_000, 2, SHARED)
        await _acq(store, "b", "again", SHARED, ttl=100)  # the expired row makes no trouble
        clock.advance_ms(3_000)
        assert (await store.get("b")).held is False
        ex = await _acq(store, "b", "e1", EXCLUSIVE)
        assert ex.fence == 3
        with pytest.raises(LeaseLost):
            await store.renew("b", "long", None)

    run_with_store(tmp_path, scenario)


def test_client_id_retry_returns_the_live_lease_only_in_its_own_mode(tmp_path):
    async def scenario(store, clock, notified):
        s = await _acq(store, "c", "s1", SHARED, client_id="cid", ttl=1_000)
        await _acq(store, "c", "s2", SHARED, client_id="other")
        clock.advance_ms(500)
        again = await _acq(store, "c", "s9", SHARED, client_id="cid", ttl=4_000)
        assert again == Grant("c", "s1", s.fence, 4_000, "s1", SHARED)
        # an exclusive retry with the same client_id is refused, its shared lease untouched
        with pytest.raises(ClientIdConflict):
            await _acq(store, "c", "e9", EXCLUSIVE, client_id="cid", ttl=2_000)
        assert [(h.owner, h.ttl_ms) for h in (await store.get("c")).holders] == [
            ("s1", 4_000), ("s2", 500)]
        await store.release("c", "s1")
        await store.release("c", "s2")
        e = await _acq(store, "c", "e1", EXCLUSIVE, client_id="x", ttl=3_000)
        with pytest.raises(ClientIdConflict):
            await _acq(store, "c", "s8", SHARED, client_id="x", ttl=9_000)
        assert (await store.get("c")).holders == (HolderView("e1", 3_000, EXCLUSIVE),)
        back = await _acq(store, "c", "e8", EXCLUSIVE, client_id="x")
        assert (back.lease_id, back.mode, back.fence) == ("e1", EXCLUSIVE, e.fence)

    run_with_store(tmp_path, scenario)


def test_force_release_ends_every_shared_holder_and_keeps_the_fence(tmp_path):
    async def scenario(store, clock, notified):
        await _acq(store, "f", "e", EXCLUSIVE)
        await store.release("f", "e")
        await _acq(store, "f", "s1", SHARED, ttl=5_000)
        await _acq(store, "f", "s2", SHARED, ttl=1_000)
        ended = await store.force_release("f")
        assert ended == Holder("f", "s1", 5_000, 1, SHARED)
        assert notified[-1] == "f"
        assert (await store.get("f")).held is False
        for lease in ("s1", "s2"):
            with pytest.raises(LeaseLost):
                await store.renew("f", lease, None)
        assert await store.force_release("f") is None
        assert (await _acq(store, "f", "e2", EXCLUSIVE)).fence == 2

    run_with_store(tmp_path, scenario)


def test_mixed_mode_acquire_many_is_atomic(tmp_path):
    async def scenario(store, clock, notified):
        await _acq(store, "m/a", "e", EXCLUSIVE)
        await store.release("m/a", "e")  # m/a: fence 1
        await _acq(store, "m/b", "sb", SHARED, ttl=700)
        modes = {"m/a": SHARED, "m/b": SHARED}  # m/c: exclusive (missing)
        got = await store.acquire_many(("m/a", "m/b", "m/c"), lease_id="m.1", ttl_ms=1_000,
                                       owner="o", client_id="k", modes=modes)
        assert got == MultiGrant("m.1", {"m/a": 1, "m/b": 0, "m/c": 1}, 1_000, "o",
                                 {"m/a": SHARED, "m/b": SHARED, "m/c": EXCLUSIVE})
        state = await store.get("m/b")
        assert [h.owner for h in state.holders] == ["sb", "o"]

        # exclusive on m/b (shared-held) and m/c (exclusive-held) refused: nothing written
        refused = await store.acquire_many(("m/b", "m/c", "m/d"), lease_id="m.2", ttl_ms=1_000,
                                           owner="p", client_id=None)
        assert refused == [Holder("m/b", "o", 1_000, 0, SHARED),
                           Holder("m/c", "o", 1_000, 1, EXCLUSIVE)]
        assert (await store.get("m/d")).fence == 0
        # shared on m/a with another shared holder there: fine; m/c exclusive blocks
        refused = await store.acquire_many(("m/a", "m/c"), lease_id="m.3", ttl_ms=1_000,
                                           owner="p", client_id=None,
                                           modes={"m/a": SHARED, "m/c": SHARED})
        assert refused == [Holder("m/c", "o", 1_000, 1, EXCLUSIVE)]
        assert len((await store.get("m/a")).holders) == 1

        clock.advance_ms(200)
        retry = await store.acquire_many(("m/a", "m/b", "m/c"), lease_id="m.9", ttl_ms=2_000,
                                         owner="o", client_id="k", modes=modes)
        assert retry.lease_id == "m.1" and retry.ttl_ms == 2_000 and retry.modes == got.modes
        renewed = await store.renew_many("m.1", None)
        assert renewed.fences == got.fences and renewed.modes == got.modes
        assert (await store.get("m/a")).ttl_ms == 2_000
        assert await store.release_many("m.1") == ("m/a", "m/b", "m/c")
        assert {"m/a", "m/b", "m/c"} <= set(notified)
        assert [h.owner for h in (await store.get("m/b")).holders] == ["sb"]
        assert (await store.get("m/a")).held is False
        exclusive = await store.acquire_many(("m/a", "m/c"), lease_id="m.4", ttl_ms=1_000,
                                             owner="q", client_id=None)
        assert exclusive.fences == {"m/a": 2, "m/c": 2} and exclusive.modes is None

    run_with_store(tmp_path, scenario)


def test_a_multi_lease_whose_shared_part_expired_or_was_forced_is_lost(tmp_path):
    async def scenario(store, clock, notified):
        await store.acquire_many(("x/a", "x/b"), lease_id="m.1", ttl_ms=1_000, owner="o",
                                 client_id=None, modes={"x/a": SHARED})
        ended = await store.force_release("x/a")
        assert ended is not None and ended.mode == SHARED
        with pytest.raises(LeaseLost):
            await store.renew_many("m.1", None)
        with pytest.raises(LeaseLost):  # frees what is left, then says the set was not whole
            await store.release_many("m.1")
        assert (await store.get("x/b")).held is False

        await store.acquire_many(("y/a", "y/b"), lease_id="m.2", ttl_ms=100, owner="o",
                                 client_id=None, modes={"y/a": SHARED, "y/b": SHARED})
        clock.advance_ms(100)
        with pytest.raises(LeaseLost):
            await store.renew_many("m.2", 1_000)
        assert (await store.get("y/a")).held is False

    run_with_store(tmp_path, scenario)


def test_shared_leases_and_fences_survive_a_reopen(tmp_path):
    async def first(store, clock, notified):
        await _acq(store, "r", "e", EXCLUSIVE)
        await store.release("r", "e")
        await _acq(store, "r", "s1", SHARED, ttl=60_000)

    async def second(store, clock, notified):
        assert (await store.get("r")).holders == (HolderView("s1", 60_000, SHARED),)
        assert (await store.renew("r", "s1", None)).fence == 1
        assert (await _acq(store, "r", "e2", EXCLUSIVE)).mode == SHARED  # refused by s1
        await store.release("r", "s1")
        assert (await _acq(store, "r", "e2", EXCLUSIVE)).fence == 2

    run_with_store(tmp_path, first)
    run_with_store(tmp_path, second)


def test_many_concurrent_acquirers_of_both_modes_never_overlap_wrongly(tmp_path):
    workers, rounds = 16, 5

    async def scenario(store, clock, notified):
        import asyncio
        import random

        exclusive: set[str] = set()
        shared: set[str] = set()
        last_fence = [0]
        seen = {EXCLUSIVE: 0, SHARED: 0, "both_shared": 0}
        rng = random.Random(11)

        async def worker(w: int) -> None:
            for r in range(rounds):
                lease, mode = f"w{w}r{r}", SHARED if rng.random() < 0.6 else EXCLUSIVE
                while not isinstance(got := await _acq(store, "k", lease, mode, ttl=60_000),
                                     Grant):
                    assert got.mode == (SHARED if exclusive == set() else EXCLUSIVE)
                    await hold(None, 0)
                if mode == EXCLUSIVE:
                    assert not exclusive and not shared, (exclusive, shared)
                    assert got.fence == last_fence[0] + 1  # raised by exactly one
                    last_fence[0] = got.fence
                    exclusive.add(lease)
                else:
                    assert not exclusive, exclusive
                    assert got.fence == last_fence[0]  # carried, not raised
                    seen["both_shared"] += bool(shared)
                    shared.add(lease)
                seen[mode] += 1
                for _ in range(rng.randrange(3)):
                    await hold(None, 0)
                await store.release("k", lease)
                (exclusive if mode == EXCLUSIVE else shared).discard(lease)

        await asyncio.gather(*(worker(w) for w in range(workers)))
        assert seen[EXCLUSIVE] + seen[SHARED] == workers * rounds
        assert seen["both_shared"] > 0 and seen[EXCLUSIVE] > 0  # both cases really happened
        assert (await store.get("k")).fence == seen[EXCLUSIVE]

    run_with_store(tmp_path, scenario)


def test_a_database_of_the_previous_schema_opens_and_keeps_its_fences(tmp_path):
    import sqlite3

    from lockd.server.store.sqlite import locks

    with sqlite3.connect(tmp_path / "s.db") as old:  # as a lockd before modes left it
        old.execute("CREATE TABLE locks (name TEXT PRIMARY KEY, fence INTEGER NOT NULL,"
                    " lease_id TEXT, owner TEXT NOT NULL DEFAULT '', client_id TEXT,"
                    " expires_ms INTEGER NOT NULL DEFAULT 0, ttl_ms INTEGER NOT NULL DEFAULT 0)"
                    " WITHOUT ROWID")
        old.execute(locks.SCHEMA[1])  # the leases table
        old.execute("INSERT INTO locks (name, fence) VALUES ('old', 7)")

    async def scenario(store, clock, notified):
        # The old file cannot say whether the writer of fence 7 released cleanly: the first
        # shared grant starts a new epoch (raising once more than needed, never less).
        assert (await _acq(store, "old", "s1", SHARED)).fence == 8
        assert (await _acq(store, "old", "s2", SHARED)).fence == 8
        await store.release("old", "s1")
        await store.release("old", "s2")
        assert (await _acq(store, "old", "e1", EXCLUSIVE)).fence == 9
        assert (await store.sem_get("any")).limit == 0
        assert (await store.elect_get("old")).leader.owner == "e1"

    run_with_store(tmp_path, scenario)
