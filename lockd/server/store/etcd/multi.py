"""Multi-lock leases on etcd: a set of locks held by ONE etcd lease, granted all or none.

The grant is one transaction ``if no holder key of any exclusive lock and no exclusive key of
any shared lock (whose fence key is unchanged since a read): put every lock key and fence key
(shared locks: a shared key each); else range every lock's keys``, so every exclusive lock's
fence is that transaction's revision and every shared one carries its current fence (or starts
a new epoch at that revision, by the single-lock rule: ``LockModes.epoch_ops``). The lease key
(``leases/<id>``: the set, owner, client id, TTL) is put just before it on the same etcd lease,
keeping the grant within etcd's default ``--max-txn-ops`` (128: 64 locks). Revoking the etcd lease deletes every key of the set in one step. See
docs/stores/etcd.md ("Multi-lock leases").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.modes import LockModes, Snapshot
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import (
    Held,
    Keys,
    b64,
    lock_value,
    range_kv,
    range_kvs,
    released_value,
    secs,
    to_int,
    unb64,
)
from lockd.server.store.values import (
    EXCLUSIVE,
    MULTI_PREFIX,
    SHARED,
    Holder,
    MultiGrant,
    other_modes,
)

__all__ = ["MultiLocks"]


class MultiLocks:
    """``LockStore.acquire_many``/``renew_many``/``release_many`` over ``transport``."""

    def __init__(self, transport: Transport, leases: Leases, keys: Keys, modes: LockModes):
        self._transport = transport
        self._leases = leases
        self._keys = keys
        self._modes = modes

    async def acquire(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                      owner: str, client_id: str | None,
                      modes: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
        """See ``LockStore.acquire_many``: one guarded transaction. Locks held shared are read
        first (their fence keys guard the fences they carry; see ``modes``)."""
        shared = [lock for lock in locks if modes and modes.get(lock) == SHARED]
        mode_map = {lock: SHARED if lock in shared else EXCLUSIVE for lock in locks} \
            if shared else None
        ttl_s = secs(ttl_ms)
        record: dict[str, Any] = {"locks": list(locks), "owner": owner, "client_id": client_id,
                                  "ttl_ms": ttl_ms, "ttl_s": ttl_s}
        if shared:
            record["shared"] = shared
        lease_value = b64(json.dumps(record, separators=(",", ":")).encode())
        for _ in range(3):
            snaps: dict[str, Snapshot] = {}
            if shared:
                snaps = {snap.name: snap for snap in await self._modes.read_many(shared)}
                if client_id:
                    mine = await self._retry_of(
                        [h for snap in snaps.values()
                         for h in ((snap.exclusive,) if snap.exclusive else ()) + snap.shared],
                        record, ttl_ms)
                    if mine is not None:
                        return mine
                if any(snap.exclusive is not None for snap in snaps.values()):
                    holders = await self._holders(locks, shared)
                    if holders:
                        return holders
                    continue
            etcd_lease, granted = await self._leases.grant(ttl_s)
            keep = False
            try:
                compare, success, fences = self._grant_ops(
                    locks, shared, snaps, lease_id, owner, client_id, ttl_ms, etcd_lease)
                # The lease record first, on its own (bound to the new etcd lease, so a refused
                # grant's revoke removes it): the grant then has at most 2 operations a lock,
                # 128 for 64 locks, within etcd's default --max-txn-ops.
                await self._transport.post("/v3/kv/put", {
                    "key": b64(self._keys.lease(lease_id)), "lease": str(etcd_lease),
                    "value": lease_value})
                doc = await self._transport.txn(compare, success, [
                    {"request_range": dict(zip(("key", "range_end"),
                                               self._keys.name_range(lock), strict=True))}
                    for lock in locks])
                if doc.get("succeeded"):
                    keep = True
                    revision = to_int(doc["header"]["revision"])
                    return MultiGrant(lease_id, {lock: fences.get(lock, revision)
                                                 for lock in locks}, granted * 1000, owner,
                                      mode_map)
                parsed = [self._modes.parse(lock, range_kvs(doc, i))
                          for i, lock in enumerate(locks)]
                ours = [_held_by(lock, parsed[i], lease_id, lock in shared)
                        for i, lock in enumerate(locks)]
                if all(h is not None and h.etcd_lease == etcd_lease for h in ours):
                    keep = True  # a replay of our own successful transaction
                    return MultiGrant(lease_id, {h.name: h.fence for h in ours if h},
                                      granted * 1000, owner, mode_map)
            finally:
                if not keep:
                    self._leases.revoke_soon(etcd_lease)
            if client_id:
                mine = await self._retry_of(
                    [h for ex, sharers in parsed for h in ((ex,) if ex else ()) + sharers],
                    record, ttl_ms)
                if mine is not None:
                    return mine
            holders = await self._blockers(locks, shared, parsed)
            if holders:
                return holders
        raise StoreUnavailable("etcd: the locks kept changing hands; try again")

    def _grant_ops(self, locks: tuple[str, ...], shared: list[str], snaps: dict[str, Snapshot],
                   lease_id: str, owner: str, client_id: str | None, ttl_ms: int,
                   etcd_lease: int) -> tuple[list, list, dict[str, int]]:
        """(compare, success, fences of the shared locks that carry one) of the grant
        transaction; a shared lock that starts a new epoch (``LockModes.epoch_ops``) is left
        out of the fences: its fence is the transaction's revision."""
        compare: list[dict[str, Any]] = []
        success: list[dict[str, Any]] = []
        fences: dict[str, int] = {}
        for lock in locks:
            start, end = self._keys.name_range(lock)
            if lock not in shared:  # no holder of either mode
                compare.append({"key": start, "range_end": end, "target": "CREATE",
                                "create_revision": "0"})
                success.append({"request_put": {"key": b64(self._keys.lock(lock)),
                                                "lease": str(etcd_lease), "value": lock_value(
                                                    lease_id, owner, None, ttl_ms)}})
                success.append({"request_put": {"key": b64(self._keys.fence(lock)),
                                                "value": ""}})
                continue
            snap = snaps[lock]
            if client_id and lock == shared[0]:  # no holder created since the read (which
                # saw no exclusive one): also no second grant of this client_id
                compare.append({"key": start, "range_end": end, "target": "CREATE",
                                "result": "LESS", "create_revision": str(snap.revision + 1)})
            else:
                compare.append({"key": b64(self._keys.lock(lock)), "target": "CREATE",
                                "create_revision": "0"})
            epoch, puts, fence = self._modes.epoch_ops(snap)
            compare += epoch
            success += puts
            more: dict[str, Any] = {"mode": SHARED}
            if fence is not None:
                fences[lock] = more["fence"] = fence
            success.append({"request_put": {
                "key": b64(self._keys.shared(lock, lease_id)), "lease": str(etcd_lease),
                "value": lock_value(lease_id, owner, client_id, ttl_ms, **more)}})
        return compare, success, fences

    async def _retry_of(self, holders: list[Held], record: dict[str, Any],
                        ttl_ms: int) -> MultiGrant | None:
        """The live multi-lock lease of ``record``'s client id and locks that holds one of
        ``holders`` (keys of the wanted locks), renewed; or None. ``ClientIdConflict`` if it
        holds them in other modes (a retry gets only the modes it asks for)."""
        for lid in dict.fromkeys(h.lease_id for h in holders  # (exclusive keys carry none)
                                 if h.lease_id.startswith(MULTI_PREFIX)
                                 and h.client_id in (None, record["client_id"])):
            theirs = await self._read_lease(lid)
            if (theirs is None or theirs[0].get("client_id") != record["client_id"]
                    or theirs[0].get("locks") != record["locks"]):
                continue
            if sorted(theirs[0].get("shared") or ()) != sorted(record.get("shared") or ()):
                raise other_modes(record["locks"])
            try:
                return await self.renew(lid, ttl_ms)
            except LeaseLost:
                return None
        return None

    async def _holders(self, locks: tuple[str, ...], shared: list[str]) -> list[Holder]:
        """The holder blocking each lock of the set, read now."""
        snaps = await self._modes.read_many(list(locks))
        return await self._blockers(locks, shared, [(s.exclusive, s.shared) for s in snaps])

    async def _blockers(self, locks: tuple[str, ...], shared: list[str],
                        parsed: list[tuple[Held | None, tuple[Held, ...]]]) -> list[Holder]:
        """Each lock's blocking holder (a lock wanted shared: only an exclusive one)."""
        holders = []
        for lock, (exclusive, sharers) in zip(locks, parsed, strict=True):
            if lock in shared:
                sharers = ()
            fence = max([exclusive.fence if exclusive else 0] + [h.fence for h in sharers])
            holder = await self._modes.blocker(Snapshot(lock, exclusive, sharers, None, fence, 0))
            if holder is not None:
                holders.append(holder)
        return holders

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
        shared = set(value.get("shared") or ())
        doc = await self._transport.txn([], [
            {"request_range": {"key": b64(self._keys.shared(n, lease_id) if n in shared
                                          else self._keys.lock(n))}}
            for n in value["locks"]], [])
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
            shared = value.get("shared") or ()
            modes = {n: SHARED if n in shared else EXCLUSIVE for n in names} if shared else None
            if secs(new_ttl) == int(value.get("ttl_s") or 0):
                return MultiGrant(lease_id, fences, granted * 1000, owner, modes)
            new_lease, new_granted = await self._leases.grant(secs(new_ttl))
            lease_key = b64(self._keys.lease(lease_id))
            compare = [{"key": lease_key, "target": "MOD", "mod_revision": str(lease_rev)}]
            success = [{"request_put": {"key": lease_key, "lease": str(new_lease), "value": b64(
                json.dumps({**value, "ttl_ms": new_ttl, "ttl_s": secs(new_ttl)},
                           separators=(",", ":")).encode())}}]
            for h in held:
                key = b64(h.key)
                more = {"mode": SHARED, "fence": h.fence} if h.mode == SHARED else {}
                compare.append({"key": key, "target": "MOD", "mod_revision": str(h.mod_revision)})
                success.append({"request_put": {"key": key, "lease": str(new_lease), "value":
                                                lock_value(lease_id, h.owner, h.client_id,
                                                           new_ttl, **more)}})
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
                return MultiGrant(lease_id, fences, new_granted * 1000, owner, modes)
        raise StoreUnavailable("etcd: the multi-lock lease kept changing; try again")

    async def release(self, lease_id: str) -> tuple[str, ...]:
        """Revoke the set's etcd lease: every key of it goes in one atomic step. Before that,
        the clean release of each exclusive lock it still holds is recorded (``_mark``). If
        etcd no longer has that etcd lease (it expired, or a concurrent renew moved the set to
        a new one), read the set again: ``LeaseLost`` if it is gone."""
        for _ in range(3):
            value, etcd_lease, _, held = await self._read_set(lease_id)
            await self._mark([h for h in held if h.mode == EXCLUSIVE], etcd_lease)
            if await self._leases.revoke_now(etcd_lease):
                if len(held) != len(value["locks"]):
                    raise LeaseLost("a lock of the multi-lock lease was no longer held by it")
                return tuple(h.name for h in held)
        raise StoreUnavailable("etcd: the multi-lock lease kept changing; try again")


    async def _mark(self, writers: list[Held], etcd_lease: int) -> None:
        """``LockModes.mark_released`` of each of ``writers`` (exclusive keys on
        ``etcd_lease``): one transaction for them all (at most 128 operations for 64 locks);
        if one key moved meanwhile, lock by lock."""
        if not writers:
            return
        doc = await self._transport.txn(
            [{"key": b64(h.key), "target": "LEASE", "lease": str(etcd_lease)} for h in writers],
            [{"request_put": {"key": b64(self._keys.fence(h.name)),
                              "value": released_value(h.fence)}} for h in writers], [])
        if not doc.get("succeeded"):
            for h in writers:
                await self._modes.mark_released(h.name, etcd_lease, h.fence)


def _held_by(lock: str, parsed: tuple[Held | None, tuple[Held, ...]], lease_id: str,
             shared: bool) -> Held | None:
    """The key of ``lock`` that lease ``lease_id`` holds in the wanted mode, or None."""
    exclusive, sharers = parsed
    if not shared:
        return exclusive if exclusive is not None and exclusive.lease_id == lease_id else None
    return next((h for h in sharers if h.lease_id == lease_id), None)
