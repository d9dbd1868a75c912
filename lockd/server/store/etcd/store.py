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
from collections.abc import Mapping

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.etcd.cache import CachedLease, LeaseCache
from lockd.server.store.etcd.elections import Elections
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.modes import LockModes, Moved, Snapshot, retry_of
from lockd.server.store.etcd.multi import MultiLocks
from lockd.server.store.etcd.semaphores import Semaphores
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.url import cache_size, etcd_tls, parse_etcd_url
from lockd.server.store.etcd.watch import Watch
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
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
    SemFull,
    SemGrant,
    SemState,
)

__all__ = ["EtcdStore"]


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
        self._modes = LockModes(self._transport, self._leases, self._keys, self._cache)
        self._multi = MultiLocks(self._transport, self._leases, self._keys, self._modes)
        self._sems = Semaphores(self._transport, self._leases, self._keys, self._cache,
                                self._modes)
        self._elections = Elections(self._transport, self._leases, self._keys, self._modes)
        self._watch = Watch(self._transport, self._keys)
        self._election_watch = Watch(self._transport, self._keys, self._keys.elections,
                                     deletes_only=False)

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
        self._election_watch.start(revision + 1)

    async def close(self) -> None:
        """Stop the watch, finish pending revokes, close every connection; idempotent."""
        await self._leases.drain(self._transport.timeout)
        await self._watch.stop()
        await self._election_watch.stop()
        await self._transport.aclose()

    # -- small etcd calls ----------------------------------------------------------------

    async def _ping(self) -> int:
        """A linearizable read (needs a quorum); returns the store revision."""
        doc = await self._transport.post("/v3/kv/range",
                                         {"key": b64(self._keys.fences), "count_only": True})
        return to_int(doc["header"].get("revision"))

    # -- single locks --------------------------------------------------------------------

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

    # -- multi-lock leases ---------------------------------------------------------------

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

    # -- reads and the rest of the protocol ----------------------------------------------

    async def clock_offset(self) -> float | None:
        """etcd's wall clock (the HTTP ``Date`` header of a gateway answer, whole seconds, so
        within about ±0.5 s) minus lockd's; ``None`` if no member sends one. Informational:
        etcd expires leases on its leader's monotonic timer, so wall-clock skew moves no expiry.
        """
        return await self._transport.clock_offset()

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

    def subscribe(self, listener: ReleaseListener) -> None:
        """Register ``listener``; the store's watch streams call it on every delete of a holder
        or permit key and on every election write."""
        self._watch.subscribe(listener)
        self._election_watch.subscribe(listener)

    async def ping(self) -> None:
        """A linearizable read: raises ``StoreUnavailable`` without a quorum."""
        await self._ping()

    # -- semaphores (see ``semaphores``) -------------------------------------------------

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

    # -- elections (see ``elections``) ---------------------------------------------------

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


