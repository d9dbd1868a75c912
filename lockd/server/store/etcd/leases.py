"""etcd leases as the store uses them: grant, keep-alive, revoke, time to live.

Every lockd lease is held by an etcd lease of its own (a multi-lock lease: one etcd lease for
the whole set), and an etcd lease that ever held a lock key is revoked BEFORE any operation that
takes the key off it answers. That invariant is what lets the lease cache skip reading the key:
see docs/stores/etcd.md ("The lease cache").
"""

from __future__ import annotations

import asyncio
import logging

from lockd.server.errors import StoreUnavailable
from lockd.server.store.etcd.transport import EtcdError, Transport
from lockd.server.store.etcd.wire import to_int

__all__ = ["Leases"]

log = logging.getLogger("lockd.server.store.etcd")


class Leases:
    """etcd lease calls over ``transport``; tracks the revokes left running in the background."""

    def __init__(self, transport: Transport):
        self._transport = transport
        self._background: set[asyncio.Task] = set()  # revokes in flight

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the background revokes."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new etcd lease of ``ttl_s`` seconds → (id, granted TTL in seconds)."""
        doc = await self._transport.post("/v3/lease/grant", {"TTL": ttl_s})
        if doc.get("error"):
            raise StoreUnavailable(f"etcd refused a lease: {doc['error']}")
        return to_int(doc["ID"]), to_int(doc["TTL"])

    async def keepalive(self, etcd_lease: int) -> int:
        """Refresh an etcd lease; its granted TTL in seconds, 0 if it is gone or expired."""
        doc = await self._transport.post("/v3/lease/keepalive", {"ID": str(etcd_lease)})
        return to_int(doc.get("result", {}).get("TTL"))

    def revoke_soon(self, etcd_lease: int) -> None:
        """Revoke an etcd lease that holds no lock key (any more) without waiting for it."""
        task = asyncio.get_running_loop().create_task(self._revoke(etcd_lease))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _revoke(self, etcd_lease: int) -> None:
        """Revoke an etcd lease (deleting its keys); best effort: it expires anyway."""
        try:
            await self._transport.post("/v3/lease/revoke", {"ID": str(etcd_lease)})
        except StoreUnavailable as exc:  # not found, or unreachable: its TTL ends it
            log.debug("revoke of an etcd lease failed: %s", exc)

    async def revoke_now(self, etcd_lease: int) -> bool:
        """Revoke an etcd lease (its keys are deleted in the same step) and wait for it: True,
        or False if etcd has no such lease (expired, or revoked by someone else; also our own
        revoke replayed after its answer was lost). Raises ``StoreUnavailable``."""
        try:
            await self._transport.post("/v3/lease/revoke", {"ID": str(etcd_lease)})
        except EtcdError as exc:
            if "lease not found" in str(exc.detail):
                return False
            raise
        return True

    async def remaining_ms(self, etcd_lease: int) -> int:
        """Upper bound of an etcd lease's time left (etcd reports truncated whole seconds, so
        this rounds up, capped at the granted TTL): 0 if it is gone."""
        doc = await self._transport.post("/v3/lease/timetolive", {"ID": str(etcd_lease)})
        ttl = to_int(doc.get("TTL"))
        if ttl < 0:
            return 0
        return min((ttl + 1) * 1000, to_int(doc.get("grantedTTL")) * 1000)

    async def old_revoked(self, old: int, new: int) -> bool:
        """After a move of keys from etcd lease ``old`` to ``new``: revoke ``old`` before the
        renew answers (the invariant above). False if etcd no longer had ``old``: a release (or
        force-release) revoked it after our keep-alive, and that revoke missed the keys we had
        just moved, so finish that release by revoking ``new`` (its keys go with it); the renew
        then answers ``LeaseLost``. (Also when ``old`` expired in between, or our revoke was
        replayed: a spurious 410, never a false success.)
        """
        try:
            if await self.revoke_now(old):
                return True
        except StoreUnavailable:
            self.revoke_soon(old)  # best effort; until then it lives at most its TTL
            raise
        await self.revoke_now(new)
        return False
