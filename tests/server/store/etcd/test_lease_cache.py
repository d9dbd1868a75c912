"""The etcd store's lease cache (``lockd.server.store.etcd.cache``): a renew is one keep-alive
and a release one revoke (an exclusive lease's: after one put that marks it clean) for a lease
this process knows, and a stale entry never gives a false
success. Two ``EtcdStore`` objects on one prefix play two lockd replicas (A grants, B is the
other replica); real 3-member etcd cluster.

Several tests check that an etcd lease is already revoked when an operation ANSWERS, with a
blocking HTTP call straight after it: the event loop cannot run anything in between, so a
revoke left to a background task would still be pending and the check fails.
"""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from lockd.server.errors import LeaseLost
from lockd.server.store.etcd import EtcdStore, cache_size
from lockd.server.store.etcd.cache import CachedLease, LeaseCache
from lockd.server.store.values import SHARED, Grant
from tests.server.store.etcd.helpers import acquire, lease_id, name, opened


def _etcd_lease_alive(cluster, etcd_lease: int) -> bool:
    """Blocking (see the module docstring): does etcd still have this lease?"""
    r = httpx.post(f"http://{cluster.endpoints[0]}/v3/lease/timetolive",
                   json={"ID": str(etcd_lease)}, timeout=5)
    return int(r.json().get("TTL", -1)) > 0


def _key_lease(cluster, url: str, lock: str) -> int | None:
    """The etcd lease the lock key is bound to, or None if the key is absent (blocking)."""
    prefix = url.rsplit("/", 1)[1]
    key = base64.b64encode(f"{prefix}/locks/{lock}".encode()).decode()
    r = httpx.post(f"http://{cluster.endpoints[0]}/v3/kv/range", json={"key": key}, timeout=5)
    kvs = r.json().get("kvs") or []
    return int(kvs[0].get("lease", 0)) if kvs else None


class _Calls:
    """Counts the etcd gateway calls a store makes, by path (wraps its transport's ``post``)."""

    def __init__(self, store: EtcdStore):
        self.paths: list[str] = []
        inner = store._transport.post

        async def post(path, body):
            self.paths.append(path)
            return await inner(path, body)

        store._transport.post = post  # type: ignore[method-assign]


# -- the cache itself ---------------------------------------------------------------------


def test_cache_is_a_bounded_lru_keyed_by_lease_and_lock():
    cache = LeaseCache(2)
    cache.put("a", CachedLease("x", 1, 1000, 5, "o"))
    cache.put("b", CachedLease("y", 2, 1000, 6, "o"))
    assert cache.get("a", "x").etcd_lease == 1  # now the most recently used
    assert cache.get("a", "other-lock") is None
    cache.put("c", CachedLease("z", 3, 1000, 7, "o"))
    assert len(cache) == 2 and cache.get("b", "y") is None  # the least recently used went
    cache.drop("a", etcd_lease=99)  # points elsewhere: kept
    assert cache.get("a", "x") is not None
    cache.drop("a")
    assert cache.get("a", "x") is None
    off = LeaseCache(0)
    off.put("a", CachedLease("x", 1, 1000, 5, "o"))
    assert len(off) == 0


def test_cache_size_comes_from_the_url():
    assert cache_size("etcd://h:1/p") == 16384
    assert cache_size("etcd://h:1/p?timeout=2&cache=0") == 0
    for bad in ("etcd://h:1/p?cache=x", "etcd://h:1/p?cache=-1"):
        with pytest.raises(ValueError):
            cache_size(bad)


# -- one call a renew, one a release ------------------------------------------------------


def test_renew_is_one_keepalive_and_release_one_revoke(etcd_url):
    """An exclusive lease's release first records that it is a clean one (one guarded put of
    the fence key: no new epoch for the readers after it), then revokes; a shared one only
    revokes."""
    async def body():
        async with opened(etcd_url) as a:
            lock = name()
            g = await acquire(a, lock, ttl_ms=3000)
            calls = _Calls(a)
            r = await a.renew(lock, g.lease_id, 3000)
            r2 = await a.renew(lock, g.lease_id, None)
            assert calls.paths == ["/v3/lease/keepalive"] * 2
            assert (r.fence, r.ttl_ms, r2.ttl_ms) == (g.fence, 3000, 3000)
            calls.paths.clear()
            await a.release(lock, g.lease_id)
            assert calls.paths == ["/v3/kv/txn", "/v3/lease/revoke"]
            assert not (await a.get(lock)).held
            s = await a.acquire(lock, lease_id=lease_id(), ttl_ms=3000, owner="o",
                                client_id=None, mode=SHARED)
            assert s.fence == g.fence  # after a clean release: the same epoch
            calls.paths.clear()
            await a.release(lock, s.lease_id)
            assert calls.paths == ["/v3/lease/revoke"]

    asyncio.run(body())


def test_renew_and_release_at_another_replica_take_the_read_path(etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            g = await acquire(a, lock, ttl_ms=3000)
            calls = _Calls(b)
            r = await b.renew(lock, g.lease_id, 3000)
            assert (r.fence, r.ttl_ms) == (g.fence, 3000)
            assert calls.paths == ["/v3/kv/range", "/v3/lease/keepalive"]
            calls.paths.clear()
            await b.renew(lock, g.lease_id, 3000)  # B knows it now
            assert calls.paths == ["/v3/lease/keepalive"]
            assert (await a.renew(lock, g.lease_id, None)).fence == g.fence
            with pytest.raises(LeaseLost):
                await b.renew(name(), g.lease_id, 3000)  # right id, wrong lock
            await b.release(lock, g.lease_id)
            assert not (await a.get(lock)).held

    asyncio.run(body())


# -- a stale entry never gives a false success -------------------------------------------


def test_renew_after_force_release_at_another_replica_is_lost(etcd_shared_cluster, etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            g = await acquire(a, lock, ttl_ms=30_000)
            etcd_lease = _key_lease(etcd_shared_cluster, etcd_url, lock)
            ended = await b.force_release(lock)
            assert ended is not None and ended.fence == g.fence
            assert not _etcd_lease_alive(etcd_shared_cluster, etcd_lease)  # before any await
            with pytest.raises(LeaseLost):
                await a.renew(lock, g.lease_id, None)
            with pytest.raises(LeaseLost):
                await a.release(lock, g.lease_id)
            assert not (await a.get(lock)).held

    asyncio.run(body())


def test_stale_entry_after_release_and_a_new_holder_elsewhere(etcd_shared_cluster, etcd_url):
    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            g = await acquire(a, lock, ttl_ms=30_000)
            etcd_lease = _key_lease(etcd_shared_cluster, etcd_url, lock)
            await b.release(lock, g.lease_id)
            assert not _etcd_lease_alive(etcd_shared_cluster, etcd_lease)  # before any await
            g2 = await acquire(b, lock, ttl_ms=30_000, owner="next")
            assert isinstance(g2, Grant) and g2.fence > g.fence
            with pytest.raises(LeaseLost):
                await a.renew(lock, g.lease_id, None)
            with pytest.raises(LeaseLost):
                await a.release(lock, g.lease_id)
            st = await a.get(lock)
            assert st.held and st.owner == "next" and st.fence == g2.fence  # untouched
            await b.release(lock, g2.lease_id)

    asyncio.run(body())


def test_ttl_change_elsewhere_then_renew_and_release_at_the_granting_replica(
        etcd_shared_cluster, etcd_url):
    """B moves the key to a new etcd lease (new TTL): the old one is revoked before B answers,
    so A's cached keep-alive cannot report the OLD TTL; A reads the key and keeps the new one,
    and A's release (cached entry stale) still frees the lock."""

    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            g = await acquire(a, lock, ttl_ms=30_000)
            old = _key_lease(etcd_shared_cluster, etcd_url, lock)
            moved = await b.renew(lock, g.lease_id, 2000)
            assert (moved.fence, moved.ttl_ms) == (g.fence, 2000)
            assert not _etcd_lease_alive(etcd_shared_cluster, old)  # before any await
            again = await a.renew(lock, g.lease_id, None)  # the lease's own TTL: now 2 s
            assert (again.fence, again.ttl_ms) == (g.fence, 2000)
            await a.release(lock, g.lease_id)
            assert _key_lease(etcd_shared_cluster, etcd_url, lock) is None
            assert not (await b.get(lock)).held

    asyncio.run(body())


def test_ttl_change_then_release_at_the_same_replica_frees_the_lock(etcd_url):
    async def body():
        async with opened(etcd_url) as a:
            lock = name()
            g = await acquire(a, lock, ttl_ms=30_000)
            await a.renew(lock, g.lease_id, 5000)
            calls = _Calls(a)
            await a.release(lock, g.lease_id)
            assert calls.paths == ["/v3/kv/txn", "/v3/lease/revoke"]  # the cache followed the move
            assert not (await a.get(lock)).held
            with pytest.raises(LeaseLost):
                await a.renew(lock, g.lease_id, None)

    asyncio.run(body())


def _gate_revoke(store: EtcdStore, etcd_lease: int, gate: asyncio.Event,
                 reached: asyncio.Event) -> None:
    """Make ``store`` wait for ``gate`` before it revokes ``etcd_lease`` (setting ``reached``)."""
    inner = store._leases.revoke_now

    async def revoke(lease: int) -> bool:
        if lease == etcd_lease:
            reached.set()
            await gate.wait()
        return await inner(lease)

    store._leases.revoke_now = revoke  # type: ignore[method-assign]


def test_release_racing_a_ttl_change_still_frees_the_lock(etcd_shared_cluster, etcd_url):
    """B's renew has moved the key to a new etcd lease but not yet revoked the old one when A
    releases by revoking the old one (which deletes nothing): B then finds its old lease gone,
    finishes the release (revokes the new one) and answers LeaseLost. The lock ends free."""

    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            lock = name()
            g = await acquire(a, lock, ttl_ms=30_000)
            old = _key_lease(etcd_shared_cluster, etcd_url, lock)
            gate, reached = asyncio.Event(), asyncio.Event()
            _gate_revoke(b, old, gate, reached)
            renew = asyncio.create_task(b.renew(lock, g.lease_id, 5000))
            await asyncio.wait_for(reached.wait(), 5)  # moved, old lease not yet revoked
            assert _key_lease(etcd_shared_cluster, etcd_url, lock) not in (None, old)
            await a.release(lock, g.lease_id)  # revokes `old`: the key is not on it
            gate.set()
            with pytest.raises(LeaseLost):
                await renew
            assert _key_lease(etcd_shared_cluster, etcd_url, lock) is None
            assert not (await a.get(lock)).held

    asyncio.run(body())


def test_release_many_racing_a_ttl_change_still_frees_every_lock(etcd_shared_cluster,
                                                                 etcd_url):
    """A reads the set (old etcd lease) and is about to revoke it; B's renew moves the set to a
    new etcd lease and revokes the old one; A's revoke then finds nothing and must read the
    set again and revoke the new lease, not answer success with the set still held."""

    async def body():
        async with opened(etcd_url) as a, opened(etcd_url) as b:
            locks = (name(), name())
            mg = await a.acquire_many(locks, lease_id="m." + name("id").replace("/", ""),
                                      ttl_ms=30_000, owner="o", client_id=None)
            old = _key_lease(etcd_shared_cluster, etcd_url, locks[0])
            gate, reached = asyncio.Event(), asyncio.Event()
            _gate_revoke(a, old, gate, reached)
            release = asyncio.create_task(a.release_many(mg.lease_id))
            await asyncio.wait_for(reached.wait(), 5)
            renewed = await b.renew_many(mg.lease_id, 5000)  # moves the set, revokes `old`
            assert renewed.ttl_ms == 5000
            gate.set()
            assert set(await release) == set(locks)
            for lock in locks:
                assert _key_lease(etcd_shared_cluster, etcd_url, lock) is None

    asyncio.run(body())


def test_lease_id_of_another_lock_in_the_cache_is_not_used(etcd_url):
    async def body():
        async with opened(etcd_url) as a:
            lock, other = name(), name()
            g = await acquire(a, lock, ttl_ms=30_000)
            h = await acquire(a, other, ttl_ms=30_000)
            with pytest.raises(LeaseLost):
                await a.release(other, g.lease_id)
            with pytest.raises(LeaseLost):
                await a.renew(other, g.lease_id, None)
            assert (await a.get(lock)).held and (await a.get(other)).held
            await a.release(lock, g.lease_id)
            await a.release(other, h.lease_id)

    asyncio.run(body())


def test_cache_off_still_works(etcd_url):
    async def body():
        async with opened(etcd_url + "?cache=0") as a:
            lock = name()
            g = await acquire(a, lock, ttl_ms=3000)
            calls = _Calls(a)
            await a.renew(lock, g.lease_id, None)
            assert calls.paths == ["/v3/kv/range", "/v3/lease/keepalive"]
            await a.release(lock, g.lease_id)
            assert not (await a.get(lock)).held
            assert json.dumps(len(a._cache)) == "0"

    asyncio.run(body())
