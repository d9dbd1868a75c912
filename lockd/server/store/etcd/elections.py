"""Elections on etcd: the leader IS the exclusive holder of lock ``name``; its value, pending
handover, log counter and log entries are keys under ``elections/<name>#``. Every log append is
ONE transaction guarded on the counter's version (seqs 1, 2, ... with no gap across lockd
processes); a campaign's grant and ``"leader"`` entry are that one transaction. A value or
handover counts only while its fence is the live leader's. docs/stores/etcd.md, "Lock modes,
semaphores and elections".
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.etcd.cache import LeaseCache
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.modes import LockModes, Moved, Snapshot, retry_of
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import (
    Held,
    Keys,
    b64,
    fence_of,
    lock_value,
    prefix_end,
    range_kvs,
    released_value,
    secs,
    to_int,
    unb64,
)
from lockd.server.store.values import (
    EXCLUSIVE,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    HolderView,
    not_a_leader,
)

__all__ = ["ElectionMethods", "Elections", "KEEP"]

KEEP = 1000  # log entries kept at least, per election
_TRIM_EVERY = 100
_ATTEMPTS = 24  # guarded appends tried before StoreUnavailable (another append won the seq)


async def _backoff(attempt: int) -> None:
    """After losing a race for the next seq: a short random pause (none the first time)."""
    if attempt:
        await asyncio.sleep(random.uniform(0, 0.004 * min(attempt, 5)))


def _json(kv: dict[str, Any] | None) -> dict[str, Any]:
    return json.loads(unb64(kv.get("value"))) if kv else {}


def _value_fence(kv: dict[str, Any] | None) -> int:
    """The fence of the leader whose value ``kv`` (the ``#v`` key) holds: its ``fence`` member
    (a proclaim's), else the revision of the campaign that put it (its leader's fence)."""
    if kv is None:
        return 0
    return int(_json(kv).get("fence") or to_int(kv.get("mod_revision")))


class Elections:
    """``ElectionStore`` over ``transport``; renew/release/get come from the store."""

    def __init__(self, transport: Transport, leases: Leases, keys: Keys, modes: LockModes):
        self._transport = transport
        self._leases = leases
        self._keys = keys
        self._modes = modes

    def _key(self, name: str, part: str) -> str:
        return b64(self._keys.election(name, part))

    def _log_key(self, name: str, seq: int) -> str:
        return self._key(name, f"log/{seq:020d}")

    def _append(self, name: str, seq: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """The operations that append ``entry`` as ``seq`` (and trim, every 100th)."""
        ops = [{"request_put": {"key": self._key(name, "seq"), "value": ""}},
               {"request_put": {"key": self._log_key(name, seq), "value": b64(
                   json.dumps(entry, separators=(",", ":")).encode())}}]
        if seq % _TRIM_EVERY == 0 and seq > KEEP:
            ops.append({"request_delete_range": {"key": self._key(name, "log/"),
                                                 "range_end": self._log_key(name, seq - KEEP)}})
        return ops

    async def _read(self, name: str) -> tuple[Held | None, tuple[Held, ...], dict, dict, dict, int]:
        """(exclusive holder, shared holders, fence kv, value kv, handover kv, last seq)."""
        start, end = self._keys.name_range(name)
        doc = await self._transport.txn([], [
            {"request_range": {"key": start, "range_end": end}},
            {"request_range": {"key": b64(self._keys.fence(name))}},
            {"request_range": {"key": self._key(name, "v")}},
            {"request_range": {"key": self._key(name, "h")}},
            {"request_range": {"key": self._key(name, "seq")}}], [])
        exclusive, shared = self._modes.parse(name, range_kvs(doc, 0))
        kvs = [(range_kvs(doc, i) or [None])[0] for i in (1, 2, 3, 4)]
        seq = to_int(kvs[3].get("version")) if kvs[3] else 0
        return exclusive, shared, kvs[0], kvs[1], kvs[2], seq

    async def campaign(self, name: str, *, lease_id: str, ttl_ms: int, owner: str,
                       client_id: str | None, value: str) -> Grant | Holder:
        """See ``ElectionStore.elect_campaign``: a read, an etcd lease, one guarded transaction."""
        start, end = self._keys.name_range(name)
        lock_key = b64(self._keys.lock(name))
        read, (etcd_lease, granted) = await asyncio.gather(self._read(name),
                                                           self._leases.grant(secs(ttl_ms)))
        keep = False  # the etcd lease is unused until a grant: reused by every attempt
        try:
            for attempt in range(_ATTEMPTS):
                await _backoff(attempt)
                exclusive, shared, fence_kv, value_kv, _, seq = read if not attempt else \
                    await self._read(name)
                if exclusive is not None or shared:
                    # a retry: only this client_id's leadership (its shared lease, or a lock
                    # route's lease of it: ClientIdConflict)
                    mine = retry_of(((exclusive,) if exclusive else ()) + shared, client_id,
                                    EXCLUSIVE)
                    if mine is not None:
                        if _value_fence(value_kv) != mine.fence:
                            raise not_a_leader(name)
                        try:
                            return await self._modes.extend(mine, ttl_ms)
                        except (LeaseLost, Moved):
                            continue
                    fence = max([fence_of(fence_kv)] + [h.fence for h in shared])
                    holder = await self._modes.blocker(
                        Snapshot(name, exclusive, shared, fence_kv, fence, 0))
                    if holder is None:
                        continue
                    return holder
                entry = {"kind": "leader", "owner": owner, "value": value}
                doc = await self._transport.txn(
                    [{"key": start, "range_end": end, "target": "CREATE", "create_revision": "0"},
                     {"key": self._key(name, "seq"), "target": "VERSION", "version": str(seq)}],
                    [{"request_put": {"key": lock_key, "lease": str(etcd_lease),
                                      "value": lock_value(lease_id, owner, client_id, ttl_ms)}},
                     {"request_put": {"key": b64(self._keys.fence(name)), "value": ""}},
                     {"request_put": {"key": self._key(name, "v"), "value": b64(json.dumps(
                         {"owner": owner, "value": value}, separators=(",", ":")).encode())}},
                     {"request_delete_range": {"key": self._key(name, "h")}},
                     *self._append(name, seq + 1, entry)],
                    [{"request_range": {"key": lock_key}}])
                kvs = [] if doc.get("succeeded") else range_kvs(doc)
                if doc.get("succeeded") or (kvs and to_int(kvs[0].get("lease")) == etcd_lease):
                    keep = True  # elected (or a replay of our own campaign)
                    fence = to_int(kvs[0].get("create_revision")) if kvs else \
                        to_int(doc["header"]["revision"])
                    return Grant(name, lease_id, fence, granted * 1000, owner)
        finally:
            if not keep:
                self._leases.revoke_soon(etcd_lease)
        raise StoreUnavailable(f"etcd: election {name!r} kept changing hands; try again")

    async def handover_of(self, name: str, fence: int) -> str | None:
        """The pending handover target for the leader of ``fence``, or None."""
        doc = await self._transport.post("/v3/kv/range", {"key": self._key(name, "h")})
        handover = _json((doc.get("kvs") or [None])[0])
        return handover.get("target") if handover.get("fence") == fence else None

    async def _leader(self, name: str, lease_id: str) -> tuple[Held, int, int, str | None]:
        """(key, last seq, ms left, handover target) of the live leader ``lease_id``;
        ``LeaseLost`` otherwise."""
        exclusive, _, _, _, handover_kv, seq = await self._read(name)
        live = await self._modes.live([exclusive]) if exclusive is not None else []
        if exclusive is None or exclusive.lease_id != lease_id or not live:
            raise LeaseLost(f"no live leader of {name!r} with that lease id", lock=name)
        handover = _json(handover_kv)
        return exclusive, seq, live[0][1], (handover.get("target")
                                            if handover.get("fence") == exclusive.fence else None)

    async def _logged(self, name: str, seq: int, op: str) -> bool:
        """Whether log entry ``seq`` was written by the write ``op`` (a random id each write
        carries): a replay of our own write whose answer was lost."""
        doc = await self._transport.post("/v3/kv/range", {"key": self._log_key(name, seq)})
        return _json((doc.get("kvs") or [None])[0]).get("op") == op

    async def resign(self, name: str, lease_id: str) -> None:
        """Delete the leader's key, value and handover and append ``"resign"``, in one
        transaction guarded on the key's ``mod_revision``; then revoke its etcd lease."""
        for attempt in range(_ATTEMPTS):
            await _backoff(attempt)
            held, seq, _, _ = await self._leader(name, lease_id)
            entry = {"kind": "resign", "owner": held.owner, "value": "", "fence": held.fence,
                     "op": secrets.token_hex(8)}
            lock_key = b64(self._keys.lock(name))
            doc = await self._transport.txn(
                [{"key": lock_key, "target": "MOD", "mod_revision": str(held.mod_revision)},
                 {"key": self._key(name, "seq"), "target": "VERSION", "version": str(seq)}],
                [{"request_delete_range": {"key": lock_key}},
                 {"request_put": {"key": b64(self._keys.fence(name)),  # a clean release
                                  "value": released_value(held.fence)}},
                 {"request_delete_range": {"key": self._key(name, "v")}},
                 {"request_delete_range": {"key": self._key(name, "h")}},
                 *self._append(name, seq + 1, entry)], [])
            if doc.get("succeeded") or await self._logged(name, seq + 1, entry["op"]):
                # The key is gone; its etcd lease must go before we answer (a replica's lease
                # cache would keep it alive otherwise: see ``leases``).
                try:
                    await self._leases.revoke_now(held.etcd_lease)
                except StoreUnavailable:
                    self._leases.revoke_soon(held.etcd_lease)
                    raise
                return
        raise StoreUnavailable(f"etcd: election {name!r} kept changing; try again")

    async def proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """Set the live leader's value and append ``"proclaim"``: one transaction guarded on
        the leader's key and the counter. Raises ``LeaseLost``."""
        for attempt in range(_ATTEMPTS):
            await _backoff(attempt)
            held, seq, remaining, handover = await self._leader(name, lease_id)
            entry = {"kind": "proclaim", "owner": held.owner, "value": value,
                     "fence": held.fence, "op": secrets.token_hex(8)}
            doc = await self._transport.txn(
                [{"key": b64(self._keys.lock(name)), "target": "MOD",
                  "mod_revision": str(held.mod_revision)},
                 {"key": self._key(name, "seq"), "target": "VERSION", "version": str(seq)}],
                [{"request_put": {"key": self._key(name, "v"), "value": b64(json.dumps(
                    {"owner": held.owner, "value": value, "fence": held.fence},
                    separators=(",", ":")).encode())}},
                 *self._append(name, seq + 1, entry)], [])
            if doc.get("succeeded") or await self._logged(name, seq + 1, entry["op"]):
                return ElectionState(name, HolderView(held.owner, remaining), held.fence, value,
                                     seq + 1, handover)
        raise StoreUnavailable(f"etcd: election {name!r} kept changing; try again")

    async def handover(self, name: str, target: str) -> None:
        """Record ``target`` for the current leader's term (guarded on its key's
        ``create_revision``). Raises ``LeaseLost`` when nobody leads."""
        for _ in range(5):
            exclusive, *_ = await self._read(name)
            if exclusive is None or not await self._modes.live([exclusive]):
                raise LeaseLost(f"election {name!r} has no leader", lock=name)
            doc = await self._transport.txn(
                [{"key": b64(self._keys.lock(name)), "target": "CREATE",
                  "create_revision": str(exclusive.create_revision)}],
                [{"request_put": {"key": self._key(name, "h"), "value": b64(json.dumps(
                    {"target": target, "fence": exclusive.fence}).encode())}}], [])
            if doc.get("succeeded"):
                return
        raise StoreUnavailable(f"etcd: election {name!r} kept changing; try again")

    async def get(self, name: str) -> ElectionState:
        """See ``ElectionStore.elect_get``."""
        exclusive, shared, fence_kv, value_kv, handover_kv, seq = await self._read(name)
        fence = max([fence_of(fence_kv), exclusive.fence if exclusive else 0]
                    + [h.fence for h in shared])
        live = await self._modes.live([exclusive]) if exclusive is not None else []
        if not live:
            return ElectionState(name, None, fence, "", seq, None)
        leader = HolderView(exclusive.owner, live[0][1])
        value = _json(value_kv)
        handover = _json(handover_kv)
        return ElectionState(
            name, leader, fence,
            value.get("value", "") if _value_fence(value_kv) == exclusive.fence else "",
            seq, handover.get("target") if handover.get("fence") == exclusive.fence else None)

    async def log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        """Up to ``limit`` entries with ``seq > after``, in seq order."""
        if limit <= 0:
            return []
        prefix = self._keys.election(name, "log/")
        doc = await self._transport.post("/v3/kv/range", {
            "key": self._log_key(name, max(after, 0) + 1), "range_end": b64(prefix_end(prefix)),
            "limit": str(limit)})
        events = []
        for kv in doc.get("kvs") or []:
            entry = _json(kv)
            seq = int(unb64(kv["key"])[len(prefix):])
            events.append(ElectionEvent(seq, entry["kind"], entry.get("owner", ""),
                                        entry.get("value", ""),
                                        int(entry.get("fence") or to_int(kv["create_revision"]))))
        return events


class ElectionMethods:
    """The ``ElectionStore`` methods of ``EtcdStore`` (a mixin), on its ``Elections``; a
    leader's renewal is the lock's (``renew`` in ``EXCLUSIVE`` mode: ``locks``)."""

    _elections: Elections
    _cache: LeaseCache
    renew: Callable[..., Awaitable[Grant]]

    async def elect_campaign(self, name: str, *, lease_id: str, ttl_ms: int, owner: str,
                             client_id: str | None, value: str) -> Grant | Holder:
        """An exclusive acquire of ``name`` that sets the value, clears the handover and logs
        ``"leader"`` in the same transaction."""
        return await self._elections.campaign(name, lease_id=lease_id, ttl_ms=ttl_ms,
                                              owner=owner, client_id=client_id, value=value)

    async def elect_renew(self, name: str, lease_id: str,
                          ttl_ms: int | None) -> tuple[Grant, str | None]:
        """``renew`` of the leader's (exclusive) lease and the handover pending for its term."""
        grant = await self.renew(name, lease_id, ttl_ms, EXCLUSIVE)
        return grant, await self._elections.handover_of(name, grant.fence)

    async def elect_resign(self, name: str, lease_id: str) -> None:
        """Free the lock, clear value and handover, log ``"resign"``: one transaction."""
        self._cache.drop(lease_id)
        await self._elections.resign(name, lease_id)

    async def elect_proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """Set the live leader's value and log ``"proclaim"``. Raises ``LeaseLost``."""
        return await self._elections.proclaim(name, lease_id, value)

    async def elect_handover(self, name: str, target: str) -> ElectionState:
        """Record a handover request for the leader's term. ``LeaseLost`` with no leader."""
        await self._elections.handover(name, target)
        return await self._elections.get(name)

    async def elect_get(self, name: str) -> ElectionState:
        """Leader, value, fence, last seq and pending handover, from one read."""
        return await self._elections.get(name)

    async def elect_log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        """Log entries after ``after`` (at least the last 1,000 are kept)."""
        return await self._elections.log(name, after, limit)
