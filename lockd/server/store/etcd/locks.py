"""Locks on etcd: the ``LockStore`` methods of ``EtcdStore`` (a mixin).

A lock is held iff a key in its range exists, bound to an etcd lease: ``<prefix>/locks/<name>``
(the exclusive holder) or its shared holders' keys (``modes``); its fence is the revision of
the one transaction that created the key. Multi-lock leases: ``multi``. docs/stores/etcd.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.etcd.cache import CachedLease, LeaseCache
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.modes import LockModes, Moved, Snapshot, retry_of
from lockd.server.store.etcd.multi import MultiLocks
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import (
    Keys,
    b64,
    fence_of,
    lock_value,
    prefix_end,
    range_kv,
    range_kvs,
    secs,
    to_int,
    unb64,
)
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    Grant,
    Holder,
    LockState,
    MultiGrant,
)

__all__ = ["LockMethods"]


class LockMethods:
    """``LockStore`` on the parts ``EtcdStore`` builds: its transport, leases, key layout,
    lease cache, lock modes and multi-lock leases."""

    _transport: Transport
    _leases: Leases
    _keys: Keys
    _cache: LeaseCache
    _modes: LockModes
    _multi: MultiLocks

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        mode: str = EXCLUSIVE
    ) -> Grant | Holder:
        """Grant ``lock`` in ``mode``. Exclusive: an etcd lease, then one transaction guarded
        on "no key in the lock's range" (no holder of either mode). Shared: see ``modes``."""
        if mode == SHARED:
            return await self._modes.acquire_shared(lock, lease_id=lease_id, ttl_ms=ttl_ms,
                                                    owner=owner, client_id=client_id)
        key = b64(self._keys.lock(lock))
        start, end = self._keys.name_range(lock)
        etcd_lease, granted = await self._leases.grant(secs(ttl_ms))
        keep = False  # the etcd lease is unused until a grant: reused by every attempt
        try:
            for _ in range(5):
                doc = await self._transport.txn(
                    [{"key": start, "range_end": end, "target": "CREATE", "create_revision": "0"}],
                    [{"request_put": {"key": key, "lease": str(etcd_lease),
                                      "value": lock_value(lease_id, owner, client_id, ttl_ms)}},
                     {"request_put": {"key": b64(self._keys.fence(lock)), "value": ""}}],
                    [{"request_range": {"key": start, "range_end": end}},
                     {"request_range": {"key": b64(self._keys.fence(lock))}}])
                if doc.get("succeeded"):
                    keep = True
                    fence = to_int(doc["header"]["revision"])
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms, fence, owner))
                    return Grant(lock, lease_id, fence, granted * 1000, owner)
                exclusive, shared = self._modes.parse(lock, range_kvs(doc, 0))
                if exclusive is not None and exclusive.etcd_lease == etcd_lease:
                    keep = True  # a replay of our own successful put
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms,
                                                          exclusive.fence, owner))
                    return Grant(lock, lease_id, exclusive.fence, granted * 1000, owner)
                mine = retry_of(((exclusive,) if exclusive else ()) + shared, client_id,
                                EXCLUSIVE)  # (this client_id's shared lease: ClientIdConflict)
                if mine is not None:
                    try:
                        return await self._modes.extend(mine, ttl_ms)
                    except (LeaseLost, Moved):
                        continue  # it lapsed or changed meanwhile: try again from the start
                fence_kv = range_kv(doc, 1)
                holder = await self._modes.blocker(Snapshot(
                    lock, exclusive, shared, fence_kv,
                    max(fence_of(fence_kv), exclusive.fence if exclusive else 0), 0))
                if holder is not None:
                    return holder
                # the holders' leases are gone (their keys went with them): try again
        finally:
            if not keep:
                self._leases.revoke_soon(etcd_lease)
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing hands; try again")

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None,
                    mode: str | None = None) -> Grant:
        """Keep this lease's etcd lease alive (or move it to a new TTL; ``None``: keep its own).

        A lease this process granted, moved or renewed before (the lease cache) is ONE
        keep-alive of its etcd lease when the TTL stays; a keep-alive that fails (the etcd lease
        is gone: released, moved or expired elsewhere) or a miss reads the key (the exclusive
        one, or this lease's shared one). ``mode``: only a lease of that mode (a leader's renew:
        EXCLUSIVE). Raises ``LeaseLost``.
        """
        entry = self._cache.get(lease_id, lock)
        if entry is not None and mode is not None and entry.mode != mode:
            raise LeaseLost(f"no live {mode} lease on {lock!r} with that id", lock=lock)
        if entry is not None and (ttl_ms is None or secs(ttl_ms) == secs(entry.ttl_ms)):
            granted = await self._leases.keepalive(entry.etcd_lease)
            if granted > 0:
                return Grant(lock, lease_id, entry.fence, granted * 1000, entry.owner,
                             entry.mode)
            self._cache.drop(lease_id, entry.etcd_lease)
        for _ in range(3):
            held = await self._modes.find(lock, lease_id)
            if held is None or (mode is not None and held.mode != mode):
                self._cache.drop(lease_id)
                raise LeaseLost(f"no live lease on {lock!r} with that id", lock=lock)
            try:
                return await self._modes.extend(held, ttl_ms)
            except Moved:
                continue  # changed under us (a concurrent renew of the same lease): re-read
            except LeaseLost:
                # Its etcd lease is gone. Lost, unless a concurrent renew of this same lease
                # just moved the key to a new etcd lease.
                again = await self._modes.find(lock, lease_id)
                if again is None or again.etcd_lease == held.etcd_lease:
                    raise
        raise StoreUnavailable(f"etcd: lease on {lock!r} kept changing; try again")

    async def release(self, lock: str, lease_id: str) -> None:
        """Revoke the etcd lease that holds the lease's key (exclusive or shared; the key goes
        in the same step): ONE call when the lease cache knows it, else a read of the key first.
        An exclusive lease's release is a clean one: a guarded put of the fence key
        (``LockModes.mark_released``) precedes the revoke, so no new epoch follows it.

        If etcd no longer has that etcd lease, the key expired, was released, or moved to a new
        etcd lease by a renew: read the key again. If a renew moved it after our read but before
        our revoke, that renew finds its old etcd lease revoked and finishes the release
        (``Leases.old_revoked``). A revoke replayed after its answer was lost finds nothing and
        answers ``LeaseLost`` (the lock is free either way). Raises ``LeaseLost``.
        """
        entry = self._cache.get(lease_id, lock)
        etcd_lease = entry.etcd_lease if entry is not None else None
        writer = (entry.fence, entry.mode) if entry is not None else None
        self._cache.drop(lease_id)
        for _ in range(3):
            if etcd_lease is None:
                held = await self._modes.find(lock, lease_id)
                if held is None:
                    raise LeaseLost(f"no live lease on {lock!r} with that id", lock=lock)
                etcd_lease, writer = held.etcd_lease, (held.fence, held.mode)
            if writer is not None and writer[1] == EXCLUSIVE:
                await self._modes.mark_released(lock, etcd_lease, writer[0])
            if await self._leases.revoke_now(etcd_lease):
                return
            etcd_lease = None  # gone (expired, released, moved): read the key again
        raise StoreUnavailable(f"etcd: lease on {lock!r} kept changing; try again")

    async def force_release(self, lock: str) -> Holder | None:
        """Free the lock whoever holds it, every shared holder too; the watch tells every
        listener. ``None`` if the lock was not held. See ``LockModes.force_release``."""
        return await self._modes.force_release(lock)

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None,
                           modes: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
        """See ``LockStore.acquire_many`` and ``multi``: one guarded transaction."""
        return await self._multi.acquire(locks, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner,
                                         client_id=client_id, modes=modes)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """Keep the set's etcd lease alive (or move every key to a new one for a new TTL)."""
        return await self._multi.renew(lease_id, ttl_ms)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """Revoke the set's etcd lease: every key of it goes in one atomic step."""
        return await self._multi.release(lease_id)

    async def get(self, lock: str) -> LockState:
        """Every holder key and the fence key in one linearizable read; time left if held."""
        return await self._modes.state(await self._modes.read(lock))

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """Locks ever acquired (they have a fence key) named ``prefix…`` after ``after``."""
        if limit <= 0:
            return []
        fences = self._keys.fences
        start = prefix if after is None or after < prefix else after + "\x00"
        doc = await self._transport.post("/v3/kv/range", {
            "key": b64(fences + start.encode()),
            "range_end": b64(prefix_end(fences + prefix.encode())),
            "limit": str(limit), "keys_only": True})
        names = [unb64(kv["key"])[len(fences):].decode() for kv in doc.get("kvs") or []]
        snaps = await self._modes.read_many(names)
        return list(await asyncio.gather(*(self._modes.state(snap) for snap in snaps)))
