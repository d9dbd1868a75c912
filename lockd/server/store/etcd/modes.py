"""Lock modes on etcd: reading a lock's holders of either mode, granting a shared one, moving a
lease to a new etcd lease, the blocking holder and force-release.

The exclusive key ``locks/<name>`` and the shared keys ``locks/<name>#s/<lease id>`` lie in one
key range, so ONE compare over it says "no live holder of either mode". A shared grant is one
transaction guarded on "no exclusive key" and the fence key's ``mod_revision`` as read; after an
unclean end it starts the new epoch (``epoch_ops``). docs/stores/etcd.md, "Lock modes".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.etcd.cache import CachedLease, LeaseCache
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import (
    EPOCH_MARK,
    SHARED_MARK,
    Held,
    Keys,
    b64,
    fence_of,
    lock_value,
    range_kvs,
    released_value,
    secs,
    to_int,
    writer_lapsed,
)
from lockd.server.store.values import (
    EXCLUSIVE,
    MULTI_PREFIX,
    SHARED,
    Grant,
    Holder,
    HolderView,
    LockState,
    other_mode,
)

__all__ = ["LockModes", "Moved", "Snapshot", "retry_of"]

_LIST_CHUNK = 40  # names per read transaction of ``states`` (3 ranges each, within 128 ops)


class Moved(Exception):
    """The key changed between our read and our guarded write."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A lock as one linearizable read saw it at ``revision``: the exclusive holder, the shared
    holders (grant order), the fence key (``None``: absent) and the fence."""

    name: str
    exclusive: Held | None
    shared: tuple[Held, ...]
    fence_kv: dict | None
    fence: int
    revision: int


def retry_of(holders: tuple[Held, ...] | list[Held], client_id: str | None,
             mode: str) -> Held | None:
    """The single-lock lease of ``holders`` that a ``client_id`` acquire in ``mode`` retries
    (``None``: none; a multi-lock lease's key is never one). Raises ``ClientIdConflict`` if
    that client_id holds the lock in the other mode."""
    if not client_id:
        return None
    for held in holders:
        if held.client_id == client_id and not held.lease_id.startswith(MULTI_PREFIX):
            if held.mode != mode:
                raise other_mode(held.name, held.mode, mode)
            return held
    return None


class LockModes:
    """Reads, shared grants, TTL moves and force-release over ``transport``."""

    def __init__(self, transport: Transport, leases: Leases, keys: Keys, cache: LeaseCache):
        self._transport = transport
        self._leases = leases
        self._keys = keys
        self._cache = cache

    # -- reading ---------------------------------------------------------------------------

    def parse(self, lock: str, kvs: list[dict]) -> tuple[Held | None, tuple[Held, ...]]:
        """The kvs of ``Keys.name_range(lock)`` → (exclusive holder, shared holders)."""
        exclusive, shared = None, []
        lock_key = b64(self._keys.lock(lock))
        for kv in kvs:
            held = Held.parse(lock, kv)
            if kv.get("key") == lock_key:
                exclusive = held
            else:
                shared.append(held)
        shared.sort(key=lambda h: h.create_revision)
        return exclusive, tuple(shared)

    async def read(self, lock: str) -> Snapshot:
        """Every holder of ``lock`` and its fence, in one read."""
        return (await self.read_many([lock]))[0]

    async def read_many(self, locks: list[str]) -> list[Snapshot]:
        """``read`` of each lock, ``_LIST_CHUNK`` locks a transaction."""
        snaps: list[Snapshot] = []
        for i in range(0, len(locks), _LIST_CHUNK):
            chunk = locks[i:i + _LIST_CHUNK]
            ops = []
            for lock in chunk:
                start, end = self._keys.name_range(lock)
                ops.append({"request_range": {"key": start, "range_end": end}})
                ops.append({"request_range": {"key": b64(self._keys.fence(lock))}})
            doc = await self._transport.txn([], ops, [])
            revision = to_int(doc["header"].get("revision"))
            for j, lock in enumerate(chunk):
                exclusive, shared = self.parse(lock, range_kvs(doc, 2 * j))
                fence_kvs = range_kvs(doc, 2 * j + 1)
                fence_kv = fence_kvs[0] if fence_kvs else None
                fence = max(fence_of(fence_kv), exclusive.fence if exclusive else 0)
                snaps.append(Snapshot(lock, exclusive, shared, fence_kv, fence, revision))
        return snaps

    async def find(self, lock: str, lease_id: str) -> Held | None:
        """The key of ``lock`` that lease ``lease_id`` holds (exclusive or shared), or None:
        the exclusive key first (one range), then this lease's shared key."""
        for key in (self._keys.lock(lock), self._keys.shared(lock, lease_id)):
            doc = await self._transport.post("/v3/kv/range", {"key": b64(key)})
            kvs = doc.get("kvs") or []
            if kvs and (held := Held.parse(lock, kvs[0])).lease_id == lease_id:
                return held
        return None

    async def live(self, holders: tuple[Held, ...] | list[Held]) -> list[tuple[Held, int]]:
        """Each holder with its time left (ms), dropping those whose etcd lease is gone."""
        leases = list({h.etcd_lease for h in holders})
        remaining = dict(zip(leases, await asyncio.gather(
            *(self._leases.remaining_ms(lease) for lease in leases)), strict=True))
        return [(h, remaining[h.etcd_lease]) for h in holders if remaining[h.etcd_lease] > 0]

    async def blocker(self, snap: Snapshot) -> Holder | None:
        """Why ``snap``'s lock is not grantable: the exclusive holder, else the shared holder
        whose lease ends LAST; ``None`` if every one of them is gone."""
        if snap.exclusive is not None:
            live = await self.live([snap.exclusive])
            if live:
                return Holder(snap.name, snap.exclusive.owner, live[0][1], snap.exclusive.fence)
        live = await self.live(snap.shared)
        if not live:
            return None
        held, remaining = max(live, key=lambda pair: pair[1])
        return Holder(snap.name, held.owner, remaining, snap.fence, SHARED)

    async def state(self, snap: Snapshot) -> LockState:
        """``LockStore.get``'s answer for ``snap``."""
        holders = ([snap.exclusive] if snap.exclusive is not None else []) + list(snap.shared)
        if not holders:
            return LockState(snap.name, False, snap.fence, None, 0)
        live = await self.live(holders)
        if not live:
            return LockState(snap.name, False, snap.fence, None, 0)
        views = tuple(HolderView(h.owner, ms, h.mode) for h, ms in live)
        if live[0][0].mode == EXCLUSIVE:
            held, remaining = live[0]
        else:
            held, remaining = max(live, key=lambda pair: pair[1])
        return LockState(snap.name, True, snap.fence, held.owner, remaining, held.mode, views)

    # -- shared grants ---------------------------------------------------------------------

    def epoch_ops(self, snap: Snapshot) -> tuple[list[dict], list[dict], int | None]:
        """(compares, puts, fence) that a shared grant of ``snap``'s lock adds to its
        transaction (no live exclusive key): the fence key unchanged since the read, and a new
        epoch after an unclean end (``fence`` ``None``: the transaction's revision; the shared
        key is then written without a ``fence`` member, see the module docstring)."""
        fence_key = b64(self._keys.fence(snap.name))
        if snap.fence_kv is None:
            return ([{"key": fence_key, "target": "CREATE", "create_revision": "0"}],
                    [{"request_put": {"key": fence_key, "value": b64(SHARED_MARK)}}], snap.fence)
        compare = [{"key": fence_key, "target": "MOD",
                    "mod_revision": str(to_int(snap.fence_kv.get("mod_revision")))}]
        if writer_lapsed(snap.fence_kv):
            return compare, [{"request_put": {"key": fence_key, "value": b64(EPOCH_MARK)}}], None
        return compare, [], snap.fence

    async def mark_released(self, lock: str, etcd_lease: int, fence: int) -> bool:
        """Record the clean release of the exclusive lease of ``fence`` (its key is on
        ``etcd_lease``) before the release revokes it: the fence key becomes ``x:<fence>``, so
        no new epoch follows. False if the key is not on that etcd lease any more."""
        lock_key = b64(self._keys.lock(lock))
        doc = await self._transport.txn(
            [{"key": lock_key, "target": "LEASE", "lease": str(etcd_lease)}],
            [{"request_put": {"key": b64(self._keys.fence(lock)),
                              "value": released_value(fence)}}], [])
        return bool(doc.get("succeeded"))

    async def acquire_shared(self, lock: str, *, lease_id: str, ttl_ms: int, owner: str,
                             client_id: str | None) -> Grant | Holder:
        """See the module docstring: a read, an etcd lease, one guarded transaction. Raises
        ``ClientIdConflict`` if ``client_id`` holds the lock exclusively (``retry_of``)."""
        key = b64(self._keys.shared(lock, lease_id))
        lock_key = b64(self._keys.lock(lock))
        snap, (etcd_lease, granted) = await asyncio.gather(self.read(lock),
                                                           self._leases.grant(secs(ttl_ms)))
        keep = False  # the etcd lease is unused until a grant: reused by every attempt
        try:
            for attempt in range(6):
                if attempt:
                    snap = await self.read(lock)
                mine = retry_of(((snap.exclusive,) if snap.exclusive else ()) + snap.shared,
                                client_id, SHARED)
                if mine is not None:
                    try:
                        return await self.extend(mine, ttl_ms)
                    except (LeaseLost, Moved):
                        continue
                if snap.exclusive is not None:
                    holder = await self.blocker(snap)
                    if holder is None:
                        continue
                    return holder
                compare = [{"key": lock_key, "target": "CREATE", "create_revision": "0"}]
                epoch, puts, fence = self.epoch_ops(snap)
                more = {"mode": SHARED} if fence is None else {"mode": SHARED, "fence": fence}
                success = [{"request_put": {"key": key, "lease": str(etcd_lease), "value":
                                            lock_value(lease_id, owner, client_id, ttl_ms,
                                                       **more)}}, *puts]
                compare += epoch
                if client_id:
                    start, end = self._keys.shared_range(lock)
                    compare.append({"key": start, "range_end": end, "target": "CREATE",
                                    "result": "LESS", "create_revision": str(snap.revision + 1)})
                doc = await self._transport.txn(compare, success,
                                                [{"request_range": {"key": key}}])
                kvs = range_kvs(doc)
                if doc.get("succeeded") or (kvs and to_int(kvs[0].get("lease")) == etcd_lease):
                    keep = True  # granted (or a replay of our own grant)
                    if fence is None:  # a new epoch: this transaction's revision
                        fence = (Held.parse(lock, kvs[0]).fence if kvs
                                 else to_int(doc["header"]["revision"]))
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms, fence,
                                                          owner, SHARED))
                    return Grant(lock, lease_id, fence, granted * 1000, owner, SHARED)
        finally:
            if not keep:
                self._leases.revoke_soon(etcd_lease)
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing hands; try again")

    # -- renewing with a new TTL -----------------------------------------------------------

    async def extend(self, held: Held, ttl_ms: int | None) -> Grant:
        """Push ``held``'s expiry to ``ttl_ms`` from now (``None``: its own TTL); same fence,
        same mode. Raises ``LeaseLost``, or ``Moved`` if the key changed before a TTL change
        moved it."""
        if ttl_ms is None:
            ttl_ms = held.ttl_ms
        ttl_s = secs(ttl_ms)
        granted = await self._leases.keepalive(held.etcd_lease)
        if granted <= 0:
            raise LeaseLost(f"lease on {held.name!r} expired", lock=held.name)
        entry = CachedLease(held.name, held.etcd_lease, held.ttl_ms, held.fence, held.owner,
                            held.mode)
        if ttl_s == held.ttl_s:  # (a new ttl_ms within the same second is not recorded)
            self._cache.put(held.lease_id, entry)
            return Grant(held.name, held.lease_id, held.fence, granted * 1000, held.owner,
                         held.mode)
        # A different TTL: etcd leases cannot change theirs. Move the key to a new lease; the
        # keep-alive above ensures the old one is live, so nothing lapsed is brought back.
        new_lease, new_granted = await self._leases.grant(ttl_s)
        key = b64(held.key)
        more = {k: v for k, v in (held.extra or {}).items()
                if k not in ("lease_id", "owner", "client_id", "ttl_s", "ttl_ms")}
        moved = False
        try:
            doc = await self._transport.txn(
                [{"key": key, "target": "MOD", "mod_revision": str(held.mod_revision)}],
                [{"request_put": {"key": key, "lease": str(new_lease), "value": lock_value(
                    held.lease_id, held.owner, held.client_id, ttl_ms, **more)}}],
                [{"request_range": {"key": key}}])
            kvs = [] if doc.get("succeeded") else range_kvs(doc)
            moved = bool(doc.get("succeeded")) or (
                bool(kvs) and to_int(kvs[0].get("lease")) == new_lease)
        finally:
            if not moved:
                self._leases.revoke_soon(new_lease)
        if not moved:
            raise Moved
        if not await self._leases.old_revoked(held.etcd_lease, new_lease):
            self._cache.drop(held.lease_id)
            raise LeaseLost(f"lease on {held.name!r} was released while it was renewed",
                            lock=held.name)
        self._cache.put(held.lease_id, entry._replace(etcd_lease=new_lease, ttl_ms=ttl_ms))
        return Grant(held.name, held.lease_id, held.fence, new_granted * 1000, held.owner,
                     held.mode)

    # -- operator override -----------------------------------------------------------------

    async def force_release(self, lock: str) -> Holder | None:
        """End every live lease of ``lock`` (see ``LockStore.force_release``): a single lease's etcd
        lease is revoked; a multi-lock lease's key alone is deleted (guarded on its
        ``mod_revision``). Returns the one that had the most time left."""
        ended: list[tuple[Held, int]] = []
        fence = 0
        for _ in range(3):
            snap = await self.read(lock)
            fence = snap.fence
            holders = ([snap.exclusive] if snap.exclusive else []) + list(snap.shared)
            again = False
            for held, remaining in await self.live(holders):
                if not held.lease_id.startswith(MULTI_PREFIX):
                    self._cache.drop(held.lease_id)
                    if await self._leases.revoke_now(held.etcd_lease):
                        ended.append((held, remaining))
                    else:
                        again = True  # gone meanwhile (expired, released, moved)
                    continue
                key = b64(held.key)
                doc = await self._transport.txn(
                    [{"key": key, "target": "MOD", "mod_revision": str(held.mod_revision)}],
                    [{"request_delete_range": {"key": key}}], [{"request_range": {"key": key}}])
                if doc.get("succeeded"):
                    ended.append((held, remaining))
                elif range_kvs(doc):
                    again = True
            if not again:
                if not ended:
                    return None
                held, remaining = max(ended, key=lambda pair: pair[1])
                return Holder(lock, held.owner, remaining, fence, held.mode)
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing; try again")
