"""``EtcdStore``: lockd's ``Store`` on an etcd v3 cluster (Raft), through etcd's JSON gateway.

Invariant: a lock is held iff its key ``<prefix>/locks/<name>`` exists, bound to an etcd lease
(etcd deletes it when that lease expires); the fence of a grant is the revision of the one
transaction that created the key (etcd's store-wide revision only grows, across leader changes
and restarts), so every grant of a lock gets a higher fence than any earlier one. Every request
may be replayed on another member and every write recognises its own replay. The mapping of each
operation onto etcd, TTL rounding and availability: docs/stores/etcd.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.base import (
    MULTI_PREFIX,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
)
from lockd.server.store.etcd.cache import CachedLease, LeaseCache
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.multi import MultiLocks
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.url import cache_size, etcd_tls, parse_etcd_url
from lockd.server.store.etcd.watch import Watch
from lockd.server.store.etcd.wire import (
    Held,
    Keys,
    b64,
    lock_value,
    prefix_end,
    range_kv,
    secs,
    to_int,
    unb64,
)

__all__ = ["EtcdStore"]


class _Moved(Exception):
    """The lock key changed between our read and our guarded write."""


class EtcdStore:
    """A lock ``Store`` on an etcd v3 cluster. See docs/stores/etcd.md for the mapping.

    ``url``: ``etcd://host:port,host:port,…[/prefix][?timeout=seconds][&cache=entries]``
    (and TLS: ``ca``, ``cert``/``key``, ``tls=1``). ``timeout`` (seconds; default: the URL's,
    else 2.5) bounds every store call, all endpoint retries included, before
    ``StoreUnavailable``; ``cache`` sizes the lease cache (0 turns it off). Raises
    ``ValueError`` for a malformed URL.
    """

    def __init__(self, url: str, *, timeout: float | None = None):
        endpoints, prefix, url_timeout = parse_etcd_url(url)
        self._cache = LeaseCache(cache_size(url))
        self._keys = Keys(prefix)
        self._transport = Transport(endpoints, timeout if timeout is not None else url_timeout,
                                    etcd_tls(url))
        self._leases = Leases(self._transport)
        self._multi = MultiLocks(self._transport, self._leases, self._keys)
        self._watch = Watch(self._transport, self._keys)

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (a linearizable read must succeed) and start the watch stream."""
        self._transport.open()
        try:
            revision = await self._ping()
        except BaseException:
            await self.close()
            raise
        self._watch.start(revision + 1)

    async def close(self) -> None:
        """Stop the watch, finish pending revokes, close every connection; idempotent."""
        await self._leases.drain(self._transport.timeout)
        await self._watch.stop()
        await self._transport.aclose()

    # -- small etcd calls ----------------------------------------------------------------

    async def _ping(self) -> int:
        """A linearizable read (needs a quorum); returns the store revision."""
        doc = await self._transport.post("/v3/kv/range",
                                         {"key": b64(self._keys.fences), "count_only": True})
        return to_int(doc["header"].get("revision"))

    async def _read_lock(self, lock: str) -> Held | None:
        doc = await self._transport.post("/v3/kv/range", {"key": b64(self._keys.lock(lock))})
        kvs = doc.get("kvs") or []
        return Held.parse(lock, kvs[0]) if kvs else None

    # -- single locks --------------------------------------------------------------------

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None
    ) -> Grant | Holder:
        """Grant ``lock`` if its key is absent: an etcd lease, then one guarded transaction."""
        key = b64(self._keys.lock(lock))
        ttl_s = secs(ttl_ms)
        for _ in range(3):
            etcd_lease, granted = await self._leases.grant(ttl_s)
            keep = False
            try:
                doc = await self._transport.txn(
                    [{"key": key, "target": "CREATE", "create_revision": "0"}],
                    [{"request_put": {"key": key, "lease": str(etcd_lease),
                                      "value": lock_value(lease_id, owner, client_id, ttl_ms)}},
                     {"request_put": {"key": b64(self._keys.fence(lock)), "value": ""}}],
                    [{"request_range": {"key": key}}])
                if doc.get("succeeded"):
                    keep = True
                    fence = to_int(doc["header"]["revision"])
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms, fence, owner))
                    return Grant(lock, lease_id, fence, granted * 1000, owner)
                kv = range_kv(doc)
                if kv is None:
                    continue  # cannot happen (the range is in the same transaction); retry
                holder = Held.parse(lock, kv)
                if holder.etcd_lease == etcd_lease:  # a replay of our own successful put
                    keep = True
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms, holder.fence,
                                                          owner))
                    return Grant(lock, lease_id, holder.fence, granted * 1000, owner)
            finally:
                if not keep:
                    self._leases.revoke_soon(etcd_lease)
            if client_id and holder.client_id == client_id:
                try:
                    return await self._extend(holder, ttl_ms)
                except (LeaseLost, _Moved):
                    continue  # it lapsed or changed meanwhile: try again from the start
            remaining = await self._leases.remaining_ms(holder.etcd_lease)
            if remaining == 0:
                continue  # the holder's lease is gone: its key went with it
            return Holder(lock, holder.owner, remaining, holder.fence)
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing hands; try again")

    async def _extend(self, held: Held, ttl_ms: int | None) -> Grant:
        """Push ``held``'s expiry to ``ttl_ms`` from now (``None``: its own TTL); same fence.

        Raises ``LeaseLost``, or ``_Moved`` if the key changed before a TTL change moved it.
        """
        if ttl_ms is None:
            ttl_ms = held.ttl_ms
        ttl_s = secs(ttl_ms)
        granted = await self._leases.keepalive(held.etcd_lease)
        if granted <= 0:
            raise LeaseLost(f"lease on {held.name!r} expired", lock=held.name)
        if ttl_s == held.ttl_s:  # (a new ttl_ms within the same second is not recorded)
            self._cache.put(held.lease_id, CachedLease(held.name, held.etcd_lease, held.ttl_ms,
                                                       held.fence, held.owner))
            return Grant(held.name, held.lease_id, held.fence, granted * 1000, held.owner)
        # A different TTL: etcd leases cannot change theirs. Move the key to a new lease; the
        # keep-alive above ensures the old one is live, so nothing lapsed is brought back.
        new_lease, new_granted = await self._leases.grant(ttl_s)
        key = b64(self._keys.lock(held.name))
        moved = False
        try:
            doc = await self._transport.txn(
                [{"key": key, "target": "MOD", "mod_revision": str(held.mod_revision)}],
                [{"request_put": {"key": key, "lease": str(new_lease), "value": lock_value(
                    held.lease_id, held.owner, held.client_id, ttl_ms)}}],
                [{"request_range": {"key": key}}])
            kv = None if doc.get("succeeded") else range_kv(doc)
            moved = doc.get("succeeded") or (kv is not None and to_int(kv.get("lease")) == new_lease)
        finally:
            if not moved:
                self._leases.revoke_soon(new_lease)
        if not moved:
            raise _Moved
        if not await self._leases.old_revoked(held.etcd_lease, new_lease):
            self._cache.drop(held.lease_id)
            raise LeaseLost(f"lease on {held.name!r} was released while it was renewed",
                            lock=held.name)
        self._cache.put(held.lease_id, CachedLease(held.name, new_lease, ttl_ms, held.fence,
                                                   held.owner))
        return Grant(held.name, held.lease_id, held.fence, new_granted * 1000, held.owner)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """Keep this lease's etcd lease alive (or move it to a new TTL; ``None``: keep its own).

        A lease this process granted, moved or renewed before (the lease cache) is ONE
        keep-alive of its etcd lease when the TTL stays; a keep-alive that fails (the etcd lease
        is gone: released, moved or expired elsewhere) or a miss reads the key. Raises
        ``LeaseLost``.
        """
        entry = self._cache.get(lease_id, lock)
        if entry is not None and (ttl_ms is None or secs(ttl_ms) == secs(entry.ttl_ms)):
            granted = await self._leases.keepalive(entry.etcd_lease)
            if granted > 0:
                return Grant(lock, lease_id, entry.fence, granted * 1000, entry.owner)
            self._cache.drop(lease_id, entry.etcd_lease)
        for _ in range(3):
            held = await self._read_lock(lock)
            if held is None or held.lease_id != lease_id:
                self._cache.drop(lease_id)
                raise LeaseLost(f"no live lease on {lock!r} with that id", lock=lock)
            try:
                return await self._extend(held, ttl_ms)
            except _Moved:
                continue  # changed under us (a concurrent renew of the same lease): re-read
            except LeaseLost:
                # Its etcd lease is gone. Lost, unless a concurrent renew of this same lease
                # just moved the key to a new etcd lease.
                again = await self._read_lock(lock)
                if again is None or again.lease_id != lease_id or again.etcd_lease == held.etcd_lease:
                    raise
        raise StoreUnavailable(f"etcd: lease on {lock!r} kept changing; try again")

    async def release(self, lock: str, lease_id: str) -> None:
        """Revoke the etcd lease that holds the lock key for this lease (the key goes in the
        same step): ONE call when the lease cache knows it, else a read of the key first.

        If etcd no longer has that etcd lease, the key expired, was released, or moved to a new
        etcd lease by a renew: read the key again. If a renew moved it after our read but before
        our revoke, that renew finds its old etcd lease revoked and finishes the release
        (``Leases.old_revoked``). A revoke replayed after its answer was lost finds nothing and
        answers ``LeaseLost`` (the lock is free either way). Raises ``LeaseLost``.
        """
        entry = self._cache.get(lease_id, lock)
        etcd_lease = entry.etcd_lease if entry is not None else None
        self._cache.drop(lease_id)
        for _ in range(3):
            if etcd_lease is None:
                held = await self._read_lock(lock)
                if held is None or held.lease_id != lease_id:
                    raise LeaseLost(f"no live lease on {lock!r} with that id", lock=lock)
                etcd_lease = held.etcd_lease
            if await self._leases.revoke_now(etcd_lease):
                return
            etcd_lease = None  # gone (expired, released, moved): read the key again
        raise StoreUnavailable(f"etcd: lease on {lock!r} kept changing; try again")

    async def force_release(self, lock: str) -> Holder | None:
        """Free the lock whoever holds it; the watch tells every listener. ``None`` if the lock
        was not held. A single lease: revoke its etcd lease (the key goes with it; a keep-alive
        from any replica's lease cache fails from then on), as ``release`` does. A lock of a
        multi-lock lease: delete only its key (guarded on its ``mod_revision``; the set's etcd
        lease is shared with the other locks, and its renew sees the missing key)."""
        for _ in range(3):
            held = await self._read_lock(lock)
            if held is None:
                return None
            remaining = await self._leases.remaining_ms(held.etcd_lease)
            if not held.lease_id.startswith(MULTI_PREFIX):
                self._cache.drop(held.lease_id)
                if await self._leases.revoke_now(held.etcd_lease):
                    return Holder(lock, held.owner, remaining, held.fence)
                continue  # gone meanwhile (expired, released, moved): read again
            key = b64(self._keys.lock(lock))
            doc = await self._transport.txn(
                [{"key": key, "target": "MOD", "mod_revision": str(held.mod_revision)}],
                [{"request_delete_range": {"key": key}}],
                [{"request_range": {"key": key}}])
            if doc.get("succeeded"):
                return Holder(lock, held.owner, remaining, held.fence)
            if range_kv(doc) is None:
                return None  # released or expired meanwhile
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing; try again")

    # -- multi-lock leases ---------------------------------------------------------------

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many`` and ``multi``: one guarded transaction."""
        return await self._multi.acquire(locks, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner,
                                         client_id=client_id)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """Keep the set's etcd lease alive (or move every key to a new one for a new TTL)."""
        return await self._multi.renew(lease_id, ttl_ms)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """Revoke the set's etcd lease: every key of it goes in one atomic step."""
        return await self._multi.release(lease_id)

    # -- reads and the rest of the protocol ----------------------------------------------

    async def clock_offset(self) -> float | None:
        """etcd's wall clock (the HTTP ``Date`` header of a gateway answer, whole seconds, so
        within about ±0.5 s) minus lockd's; ``None`` if no member sends one. Informational:
        etcd expires leases on its leader's monotonic timer, so wall-clock skew moves no expiry.
        """
        return await self._transport.clock_offset()

    async def get(self, lock: str) -> LockState:
        """Lock key and fence key in one linearizable read; the holder's time left if held."""
        doc = await self._transport.txn(
            [], [{"request_range": {"key": b64(self._keys.lock(lock))}},
                 {"request_range": {"key": b64(self._keys.fence(lock))}}], [])
        lock_kv, fence_kv = range_kv(doc, 0), range_kv(doc, 1)
        fence = to_int(fence_kv.get("mod_revision")) if fence_kv else 0
        if lock_kv is None:
            return LockState(lock, False, fence, None, 0)
        held = Held.parse(lock, lock_kv)
        return await self._state(held, max(fence, held.fence))

    async def _state(self, held: Held, fence: int) -> LockState:
        remaining = await self._leases.remaining_ms(held.etcd_lease)
        if remaining == 0:
            return LockState(held.name, False, fence, None, 0)
        return LockState(held.name, True, fence, held.owner, remaining)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """Locks ever acquired (they have a fence key) named ``prefix…`` after ``after``."""
        if limit <= 0:
            return []
        locks, fences = self._keys.locks, self._keys.fences
        start = prefix if after is None or after < prefix else after + "\x00"
        end_f = b64(prefix_end(fences + prefix.encode()))
        end_l = b64(prefix_end(locks + prefix.encode()))
        # Held locks are a subset of fenced ones (both keys are put by the same transaction),
        # so the first ``limit`` held names after ``start`` cover every held name on the page.
        doc = await self._transport.txn([], [
            {"request_range": {"key": b64(fences + start.encode()), "range_end": end_f,
                               "limit": str(limit), "keys_only": True}},
            {"request_range": {"key": b64(locks + start.encode()), "range_end": end_l,
                               "limit": str(limit)}},
        ], [])
        responses: list[dict[str, Any]] = doc.get("responses") or [{}, {}]
        fence_kvs = responses[0].get("response_range", {}).get("kvs") or []
        lock_kvs = responses[1].get("response_range", {}).get("kvs") or []
        held = {}
        for kv in lock_kvs:
            name = unb64(kv["key"])[len(locks):].decode()
            held[name] = Held.parse(name, kv)
        names = [(unb64(kv["key"])[len(fences):].decode(), to_int(kv.get("mod_revision")))
                 for kv in fence_kvs]
        states = await asyncio.gather(*(
            self._state(held[name], max(fence, held[name].fence)) if name in held
            else _resolved(LockState(name, False, fence, None, 0))
            for name, fence in names))
        return list(states)

    def subscribe(self, listener: ReleaseListener) -> None:
        """Register ``listener``; the store's single watch stream calls it on every delete."""
        self._watch.subscribe(listener)

    async def ping(self) -> None:
        """A linearizable read: raises ``StoreUnavailable`` without a quorum."""
        await self._ping()


async def _resolved(value: LockState) -> LockState:
    return value
