"""Counting semaphores on etcd: one key per permit slot (``locks/#sem/<name>#<slot>``), bound
to its permit's etcd lease; the permit's fence is its key's ``create_revision``. A grant is a
read and ONE transaction guarded on the chosen slot's key being absent and the limit key
unchanged, so never more than ``limit`` permits are live, whatever number of lockd processes
grant at once. docs/stores/etcd.md, "Lock modes, semaphores and elections".
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

from lockd.server.errors import LeaseLost, LimitMismatch, StoreUnavailable
from lockd.server.store.etcd.cache import CachedLease, LeaseCache
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.modes import LockModes, Moved
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import (
    Held,
    Keys,
    b64,
    fence_of,
    lock_value,
    prefix_end,
    range_kvs,
    secs,
    to_int,
    unb64,
)
from lockd.server.store.values import Permit, SemFull, SemGrant, SemState, sem_key

__all__ = ["SemaphoreMethods", "Semaphores"]

_ATTEMPTS = 40  # guarded grants tried before StoreUnavailable (another grant won the slot)


@dataclass(frozen=True, slots=True)
class _Sem:
    """A semaphore as one read saw it at ``revision``: live-looking permits (slot order), the
    limit (0: never set), the limit key's ``mod_revision`` (0: absent), the last fence."""

    permits: tuple[Held, ...]
    limit: int
    limit_rev: int
    fence: int
    revision: int


def _slot(held: Held) -> int:
    return int((held.extra or {}).get("slot", -1))


class Semaphores:
    """``SemaphoreStore.sem_acquire``/``sem_renew``/``sem_release``/``sem_get`` over ``transport``."""

    def __init__(self, transport: Transport, leases: Leases, keys: Keys, cache: LeaseCache,
                 modes: LockModes):
        self._transport = transport
        self._leases = leases
        self._keys = keys
        self._cache = cache
        self._modes = modes

    async def _read(self, name: str) -> _Sem:
        prefix = self._keys.permit(name)
        doc = await self._transport.txn([], [
            {"request_range": {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}},
            {"request_range": {"key": b64(self._keys.sems + name.encode())}},
            {"request_range": {"key": b64(self._keys.semfences + name.encode())}}], [])
        permits = sorted((Held.parse(sem_key(name), kv) for kv in range_kvs(doc, 0)), key=_slot)
        limit_kvs, fence_kvs = range_kvs(doc, 1), range_kvs(doc, 2)
        limit = int(json.loads(unb64(limit_kvs[0].get("value")))["limit"]) if limit_kvs else 0
        limit_rev = to_int(limit_kvs[0].get("mod_revision")) if limit_kvs else 0
        return _Sem(tuple(permits), limit, limit_rev, fence_of(fence_kvs[0] if fence_kvs else None),
                    to_int(doc["header"].get("revision")))

    def _grant_of(self, name: str, held: Held, granted_ms: int) -> SemGrant:
        extra = held.extra or {}
        self._cache.put(held.lease_id, CachedLease(
            sem_key(name), held.etcd_lease, held.ttl_ms, held.fence, held.owner,
            slot=_slot(held), limit=int(extra.get("limit", 0))))
        return SemGrant(name, held.lease_id, held.fence, _slot(held), int(extra.get("limit", 0)),
                        granted_ms, held.owner)

    async def _extend(self, name: str, held: Held, ttl_ms: int | None) -> SemGrant:
        grant = await self._modes.extend(held, ttl_ms)
        entry = self._cache.get(held.lease_id, sem_key(name))
        extra = held.extra or {}
        if entry is not None:  # ``extend`` cached it as a lock: add the slot and limit
            self._cache.put(held.lease_id, entry._replace(slot=_slot(held),
                                                          limit=int(extra.get("limit", 0))))
        return SemGrant(name, held.lease_id, held.fence, _slot(held), int(extra.get("limit", 0)),
                        grant.ttl_ms, held.owner)

    async def acquire(self, name: str, *, limit: int, lease_id: str, ttl_ms: int, owner: str,
                      client_id: str | None) -> SemGrant | SemFull:
        """See ``SemaphoreStore.sem_acquire`` and the module docstring. Raises ``LimitMismatch``."""
        limit_key = b64(self._keys.sems + name.encode())
        prefix = self._keys.permit(name)
        etcd_lease, granted = await self._leases.grant(secs(ttl_ms))
        keep = False  # the etcd lease is unused until a grant: reused by every attempt
        try:
            for attempt in range(_ATTEMPTS):
                if attempt:  # lost a race for the slot: let the winners' grants land
                    await asyncio.sleep(random.uniform(0, 0.004 * min(attempt, 5)))
                sem = await self._read(name)
                if client_id:
                    mine = [h for h in sem.permits if h.client_id == client_id]
                    if mine:
                        try:
                            return await self._extend(name, mine[0], ttl_ms)
                        except (LeaseLost, Moved):
                            continue
                if sem.permits and sem.limit != limit:
                    raise LimitMismatch(f"semaphore {name!r} is held with limit {sem.limit}",
                                        limit=sem.limit)
                taken = {_slot(h) for h in sem.permits}
                free = [slot for slot in range(limit) if slot not in taken]
                if not free:
                    live = await self._modes.live(sem.permits)
                    if not live:
                        continue  # every holder lapsed meanwhile
                    return SemFull(name, limit, min(ms for _, ms in live),
                                   tuple(h.owner for h, _ in live))
                # The lowest free slot; after a lost race, one of the lowest few, so that
                # acquirers racing from the same read stop colliding on one slot.
                slot = free[0] if not attempt else random.choice(free[:attempt + 1])
                key = b64(self._keys.permit(name, slot))
                compare = [{"key": key, "target": "CREATE", "create_revision": "0"},
                           {"key": limit_key, "target": "MOD", "mod_revision": str(sem.limit_rev)}]
                success = [
                    {"request_put": {"key": key, "lease": str(etcd_lease), "value": lock_value(
                        lease_id, owner, client_id, ttl_ms, slot=slot, limit=limit)}},
                    {"request_put": {"key": b64(self._keys.semfences + name.encode()),
                                     "value": ""}}]
                if sem.limit != limit:  # a new limit: only with no permit at all
                    compare.append({"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                    "target": "CREATE", "create_revision": "0"})
                    success.append({"request_put": {"key": limit_key, "value": b64(
                        json.dumps({"limit": limit}).encode())}})
                elif client_id:  # and no second grant of this client_id since the read
                    compare.append({"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                    "target": "CREATE", "result": "LESS",
                                    "create_revision": str(sem.revision + 1)})
                doc = await self._transport.txn(compare, success,
                                                [{"request_range": {"key": key}}])
                kvs = [] if doc.get("succeeded") else range_kvs(doc)
                if doc.get("succeeded") or (kvs and to_int(kvs[0].get("lease")) == etcd_lease):
                    keep = True  # granted (or a replay of our own grant)
                    fence = to_int(kvs[0].get("create_revision")) if kvs else \
                        to_int(doc["header"]["revision"])
                    self._cache.put(lease_id, CachedLease(sem_key(name), etcd_lease, ttl_ms,
                                                          fence, owner, slot=slot, limit=limit))
                    return SemGrant(name, lease_id, fence, slot, limit, granted * 1000, owner)
        finally:
            if not keep:
                self._leases.revoke_soon(etcd_lease)
        raise StoreUnavailable(f"etcd: semaphore {name!r} kept changing; try again")

    async def _find(self, name: str, lease_id: str) -> Held | None:
        sem = await self._read(name)
        return next((h for h in sem.permits if h.lease_id == lease_id), None)

    async def renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        """As ``EtcdStore.renew``, for a permit: one keep-alive on a cache hit. ``LeaseLost``."""
        entry = self._cache.get(lease_id, sem_key(name))
        if entry is not None and (ttl_ms is None or secs(ttl_ms) == secs(entry.ttl_ms)):
            granted = await self._leases.keepalive(entry.etcd_lease)
            if granted > 0:
                return SemGrant(name, lease_id, entry.fence, entry.slot, entry.limit,
                                granted * 1000, entry.owner)
            self._cache.drop(lease_id, entry.etcd_lease)
        for _ in range(3):
            held = await self._find(name, lease_id)
            if held is None:
                self._cache.drop(lease_id)
                raise LeaseLost(f"no live permit of {name!r} with that id", lock=name)
            try:
                return await self._extend(name, held, ttl_ms)
            except Moved:
                continue
            except LeaseLost:
                again = await self._find(name, lease_id)
                if again is None or again.etcd_lease == held.etcd_lease:
                    raise
        raise StoreUnavailable(f"etcd: permit of {name!r} kept changing; try again")

    async def release(self, name: str, lease_id: str) -> None:
        """Revoke the permit's etcd lease (its key goes with it; the watch notifies
        ``sem_key(name)``). Raises ``LeaseLost``."""
        entry = self._cache.get(lease_id, sem_key(name))
        etcd_lease = entry.etcd_lease if entry is not None else None
        self._cache.drop(lease_id)
        for _ in range(3):
            if etcd_lease is None:
                held = await self._find(name, lease_id)
                if held is None:
                    raise LeaseLost(f"no live permit of {name!r} with that id", lock=name)
                etcd_lease = held.etcd_lease
            if await self._leases.revoke_now(etcd_lease):
                return
            etcd_lease = None
        raise StoreUnavailable(f"etcd: permit of {name!r} kept changing; try again")

    async def get(self, name: str) -> SemState:
        """Limit, last fence and live permits (slot order)."""
        sem = await self._read(name)
        live = await self._modes.live(sem.permits)
        return SemState(name, sem.limit, sem.fence, tuple(
            Permit(h.owner, _slot(h), ms, h.fence) for h, ms in live))


class SemaphoreMethods:
    """The ``SemaphoreStore`` methods of ``EtcdStore`` (a mixin), on its ``Semaphores``."""

    _sems: Semaphores

    async def sem_acquire(self, name: str, *, limit: int, lease_id: str, ttl_ms: int,
                          owner: str, client_id: str | None) -> SemGrant | SemFull:
        """One permit: a read, an etcd lease, one guarded transaction. ``LimitMismatch``."""
        return await self._sems.acquire(name, limit=limit, lease_id=lease_id, ttl_ms=ttl_ms,
                                        owner=owner, client_id=client_id)

    async def sem_renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        """Keep the permit's etcd lease alive (or move it to a new TTL). ``LeaseLost``."""
        return await self._sems.renew(name, lease_id, ttl_ms)

    async def sem_release(self, name: str, lease_id: str) -> None:
        """Revoke the permit's etcd lease; the watch notifies ``sem_key(name)``."""
        await self._sems.release(name, lease_id)

    async def sem_get(self, name: str) -> SemState:
        """Limit, last fence and live permits in slot order."""
        return await self._sems.get(name)
