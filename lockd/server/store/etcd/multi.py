"""Multi-lock leases on etcd: a set of locks held by ONE etcd lease, granted all or none.

The grant is one transaction ``if create_revision == 0 for every lock key: put every lock key
and fence key; else range every lock key``, so every lock's fence is that transaction's
revision. The lease key (``leases/<id>``: the set, owner, client id, TTL) is put just before it
on the same etcd lease, keeping the grant within etcd's default ``--max-txn-ops`` (128: 64
locks). Revoking the etcd lease deletes every key of the set in one step. See
docs/stores/etcd.md ("Multi-lock leases").
"""

from __future__ import annotations

import json
from typing import Any

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.base import Holder, MultiGrant
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import Held, Keys, b64, lock_value, range_kv, secs, to_int, unb64

__all__ = ["MultiLocks"]


class MultiLocks:
    """``Store.acquire_many``/``renew_many``/``release_many`` over ``transport``."""

    def __init__(self, transport: Transport, leases: Leases, keys: Keys):
        self._transport = transport
        self._leases = leases
        self._keys = keys

    async def acquire(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                      owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many``: one guarded transaction."""
        keys = [b64(self._keys.lock(lock)) for lock in locks]
        ttl_s = secs(ttl_ms)
        lease_value = b64(json.dumps({"locks": list(locks), "owner": owner,
                                      "client_id": client_id, "ttl_ms": ttl_ms,
                                      "ttl_s": ttl_s}, separators=(",", ":")).encode())
        for _ in range(3):
            etcd_lease, granted = await self._leases.grant(ttl_s)
            keep = False
            try:
                success: list[dict[str, Any]] = []
                for lock, key in zip(locks, keys, strict=True):
                    success.append({"request_put": {"key": key, "lease": str(etcd_lease),
                                                    "value": lock_value(lease_id, owner, None,
                                                                        ttl_ms)}})
                    success.append({"request_put": {"key": b64(self._keys.fence(lock)),
                                                    "value": ""}})
                # The lease record first, on its own (bound to the new etcd lease, so a refused
                # grant's revoke removes it): the grant then has 2 operations a lock, 128 for
                # 64 locks, within etcd's default --max-txn-ops.
                await self._transport.post("/v3/kv/put", {
                    "key": b64(self._keys.lease(lease_id)), "lease": str(etcd_lease),
                    "value": lease_value})
                doc = await self._transport.txn(
                    [{"key": key, "target": "CREATE", "create_revision": "0"} for key in keys],
                    success, [{"request_range": {"key": key}} for key in keys])
                if doc.get("succeeded"):
                    keep = True
                    fence = to_int(doc["header"]["revision"])
                    return MultiGrant(lease_id, {lock: fence for lock in locks},
                                      granted * 1000, owner)
                held = [Held.parse(lock, kv) for i, lock in enumerate(locks)
                        if (kv := range_kv(doc, i)) is not None]
                if len(held) == len(locks) and all(h.etcd_lease == etcd_lease for h in held):
                    keep = True  # a replay of our own successful transaction
                    return MultiGrant(lease_id, {h.name: h.fence for h in held},
                                      granted * 1000, owner)
            finally:
                if not keep:
                    self._leases.revoke_soon(etcd_lease)
            if not held:
                continue  # freed in between: try again
            if (client_id and len(held) == len(locks)
                    and len({h.lease_id for h in held}) == 1):
                theirs = await self._read_lease(held[0].lease_id)
                if (theirs is not None and theirs[0].get("client_id") == client_id
                        and theirs[0].get("locks") == list(locks)):
                    try:
                        return await self.renew(held[0].lease_id, ttl_ms)
                    except LeaseLost:
                        continue
            remaining = {lease: await self._leases.remaining_ms(lease)
                         for lease in {h.etcd_lease for h in held}}
            holders = [Holder(h.name, h.owner, remaining[h.etcd_lease], h.fence)
                       for h in held if remaining[h.etcd_lease] > 0]
            if holders:
                return holders
        raise StoreUnavailable("etcd: the locks kept changing hands; try again")

    async def _read_lease(self, lease_id: str) -> tuple[dict[str, Any], int, int] | None:
        """A multi-lock lease's record: (value, etcd lease, mod_revision), or None."""
        doc = await self._transport.post("/v3/kv/range",
                                         {"key": b64(self._keys.lease(lease_id))})
        kvs = doc.get("kvs") or []
        if not kvs:
            return None
        return (json.loads(unb64(kvs[0].get("value"))), to_int(kvs[0].get("lease")),
                to_int(kvs[0].get("mod_revision")))

    async def _read_set(self, lease_id: str) -> tuple[dict[str, Any], int, int, list[Held]]:
        """The lease record and its lock keys still held by it; ``LeaseLost`` if none is."""
        record = await self._read_lease(lease_id)
        if record is None:
            raise LeaseLost("no live multi-lock lease with that id")
        value, etcd_lease, _ = record
        doc = await self._transport.txn(
            [], [{"request_range": {"key": b64(self._keys.lock(n))}} for n in value["locks"]], [])
        held = [h for i, name in enumerate(value["locks"])
                if (kv := range_kv(doc, i)) is not None
                and (h := Held.parse(name, kv)).lease_id == lease_id]
        return value, etcd_lease, record[2], held

    async def renew(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """Keep the set's etcd lease alive (or move every key to a new one for a new TTL)."""
        for _ in range(3):
            value, etcd_lease, lease_rev, held = await self._read_set(lease_id)
            names = value["locks"]
            if len(held) != len(names):
                raise LeaseLost("a lock of the multi-lock lease is no longer held by it")
            new_ttl = int(value.get("ttl_ms") or 0) if ttl_ms is None else ttl_ms
            granted = await self._leases.keepalive(etcd_lease)
            if granted <= 0:
                raise LeaseLost("the multi-lock lease expired")
            fences = {h.name: h.fence for h in held}
            owner = value.get("owner", "")
            if secs(new_ttl) == int(value.get("ttl_s") or 0):
                return MultiGrant(lease_id, fences, granted * 1000, owner)
            new_lease, new_granted = await self._leases.grant(secs(new_ttl))
            lease_key = b64(self._keys.lease(lease_id))
            compare = [{"key": lease_key, "target": "MOD", "mod_revision": str(lease_rev)}]
            success = [{"request_put": {"key": lease_key, "lease": str(new_lease), "value": b64(
                json.dumps({**value, "ttl_ms": new_ttl, "ttl_s": secs(new_ttl)},
                           separators=(",", ":")).encode())}}]
            for h in held:
                key = b64(self._keys.lock(h.name))
                compare.append({"key": key, "target": "MOD", "mod_revision": str(h.mod_revision)})
                success.append({"request_put": {"key": key, "lease": str(new_lease), "value":
                                                lock_value(lease_id, h.owner, None, new_ttl)}})
            moved = False
            try:
                doc = await self._transport.txn(compare, success,
                                                [{"request_range": {"key": lease_key}}])
                kv = None if doc.get("succeeded") else range_kv(doc)
                moved = bool(doc.get("succeeded")) or (
                    kv is not None and to_int(kv.get("lease")) == new_lease)
            finally:
                if not moved:
                    self._leases.revoke_soon(new_lease)
            if moved:
                if not await self._leases.old_revoked(etcd_lease, new_lease):
                    raise LeaseLost("the multi-lock lease was released while it was renewed")
                return MultiGrant(lease_id, fences, new_granted * 1000, owner)
        raise StoreUnavailable("etcd: the multi-lock lease kept changing; try again")

    async def release(self, lease_id: str) -> tuple[str, ...]:
        """Revoke the set's etcd lease: every key of it goes in one atomic step. If etcd no
        longer has that etcd lease (it expired, or a concurrent renew moved the set to a new
        one), read the set again: ``LeaseLost`` if it is gone."""
        for _ in range(3):
            value, etcd_lease, _, held = await self._read_set(lease_id)
            if await self._leases.revoke_now(etcd_lease):
                if len(held) != len(value["locks"]):
                    raise LeaseLost("a lock of the multi-lock lease was no longer held by it")
                return tuple(h.name for h in held)
        raise StoreUnavailable("etcd: the multi-lock lease kept changing; try again")
