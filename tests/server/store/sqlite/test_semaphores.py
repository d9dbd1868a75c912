"""Semaphores in the SQLite store (store level, lockd's clock injected)."""

from __future__ import annotations

import asyncio
import random

import pytest

from lockd.server.errors import LeaseLost, LimitMismatch
from lockd.server.store.sqlite import SqliteStore
from lockd.server.store.values import Permit, SemFull, SemGrant, SemState, sem_key
from tests.jitter import hold
from tests.server.store.sqlite.support import run_with_store


async def _sem(store: SqliteStore, name: str, lease: str, limit: int, *, ttl: int = 1_000,
               client_id: str | None = None) -> SemGrant | SemFull:
    return await store.sem_acquire(name, limit=limit, lease_id=lease, ttl_ms=ttl, owner=lease,
                                   client_id=client_id)


def test_slots_are_lowest_free_fences_strictly_increase_and_full_names_the_soonest(tmp_path):
    async def scenario(store, clock, notified):
        assert await store.sem_get("s") == SemState("s", 0, 0, ())
        a = await _sem(store, "s", "a", 3, ttl=3_000)
        b = await _sem(store, "s", "b", 3, ttl=1_000)
        c = await _sem(store, "s", "c", 3, ttl=2_000)
        assert [(g.slot, g.fence, g.limit) for g in (a, b, c)] == [(0, 1, 3), (1, 2, 3), (2, 3, 3)]
        clock.advance_ms(100)
        assert await _sem(store, "s", "d", 3) == SemFull("s", 3, 900, ("a", "b", "c"))
        await store.sem_release("s", "b")
        assert notified == [sem_key("s")]
        d = await _sem(store, "s", "d", 3, ttl=4_000)
        assert (d.slot, d.fence) == (1, 4)  # the lowest free slot, a new fence
        clock.advance_ms(2_900)  # a (slot 0) and c (slot 2) have expired; d has not
        state = await store.sem_get("s")
        assert state == SemState("s", 3, 4, (Permit("d", 1, 1_100, 4),))
        e = await _sem(store, "s", "e", 3)
        f = await _sem(store, "s", "f", 3)
        assert [(g.slot, g.fence) for g in (e, f)] == [(0, 5), (2, 6)]
        with pytest.raises(LeaseLost):  # expired: cannot be renewed or released
            await store.sem_renew("s", "a", None)
        with pytest.raises(LeaseLost):
            await store.sem_release("s", "c")
        renewed = await store.sem_renew("s", "d", 5_000)
        assert renewed == SemGrant("s", "d", 4, 1, 3, 5_000, "d")
        assert (await store.sem_renew("s", "d", None)).ttl_ms == 5_000  # its own TTL now

    run_with_store(tmp_path, scenario)


def test_limit_mismatch_only_while_live_permits_hold_another_limit(tmp_path):
    async def scenario(store, clock, notified):
        await _sem(store, "L", "a", 2, ttl=100)
        with pytest.raises(LimitMismatch) as err:
            await _sem(store, "L", "b", 5)
        assert err.value.limit == 2 and err.value.status == 409
        assert [p.owner for p in (await store.sem_get("L")).permits] == ["a"]  # nothing changed
        clock.advance_ms(100)  # no live permit: the semaphore takes the new limit
        b = await _sem(store, "L", "b", 5)
        assert (b.limit, b.slot, b.fence) == (5, 0, 2)
        assert (await store.sem_get("L")).limit == 5
        await store.sem_release("L", "b")
        one = await _sem(store, "L", "c", 1)  # released: free to change again
        assert (one.limit, one.fence) == (1, 3)
        assert await _sem(store, "L", "d", 1) == SemFull("L", 1, 1_000, ("c",))

    run_with_store(tmp_path, scenario)


def test_client_id_retry_returns_the_same_permit(tmp_path):
    async def scenario(store, clock, notified):
        first = await _sem(store, "r", "a", 1, client_id="k")
        clock.advance_ms(400)
        again = await _sem(store, "r", "a2", 1, ttl=9_000, client_id="k")
        assert again == SemGrant("r", "a", first.fence, 0, 1, 9_000, "a")
        assert isinstance(await _sem(store, "r", "b", 1, client_id="other"), SemFull)
        assert (await store.sem_get("r")).fence == 1

    run_with_store(tmp_path, scenario)


def test_permits_and_fences_survive_a_reopen(tmp_path):
    async def first(store, clock, notified):
        await _sem(store, "p", "a", 2, ttl=60_000)
        await store.sem_release("p", (await _sem(store, "p", "b", 2)).lease_id)

    async def second(store, clock, notified):
        assert await store.sem_get("p") == SemState("p", 2, 2, (Permit("a", 0, 60_000, 1),))
        assert (await _sem(store, "p", "c", 2)).fence == 3

    run_with_store(tmp_path, first)
    run_with_store(tmp_path, second)


def test_many_concurrent_acquirers_never_exceed_the_limit(tmp_path):
    limit, workers, rounds = 3, 24, 6

    async def scenario(store, clock, notified):
        held: dict[int, str] = {}  # slot -> lease, between a grant and its release's return
        fences: list[int] = []
        peak = [0]
        rng = random.Random(7)

        async def worker(w: int) -> None:
            for r in range(rounds):
                lease = f"w{w}r{r}"
                while True:
                    got = await _sem(store, "c", lease, limit, ttl=60_000)
                    if isinstance(got, SemGrant):
                        break
                    assert len(got.owners) == limit
                    await hold(None, 0)
                assert got.slot not in held, (got.slot, held)
                assert 0 <= got.slot < limit
                held[got.slot] = lease
                peak[0] = max(peak[0], len(held))
                fences.append(got.fence)
                assert len(held) <= limit
                for _ in range(rng.randrange(3)):
                    await hold(None, 0)
                await store.sem_release("c", lease)
                del held[got.slot]

        await asyncio.gather(*(worker(w) for w in range(workers)))
        assert fences == sorted(set(fences)) and len(fences) == workers * rounds
        assert peak[0] == limit  # the workload really contended
        state = await store.sem_get("c")
        assert state.permits == () and state.fence == workers * rounds

    run_with_store(tmp_path, scenario)
