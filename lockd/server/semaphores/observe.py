"""The semaphore calls of ``lockd.server.observe.ObservedStore`` (a mixin of it): permits are
tracked by lease id like shared leases (metrics: grants, renewals, releases, hold times and
expiries, confirmed by the sweeper from the semaphore's permits); their events name the slot's
lock ``sem/{name}/{slot}`` with ``mode: "permit"``."""

from __future__ import annotations

from typing import Any

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.values import SemFull, SemGrant, SemState

__all__ = ["PERMIT", "ObservedSemaphores", "semaphore_of", "slot_lock"]

PERMIT = "permit"
"""The tracking mode of a semaphore's permit."""
_PERMIT = PERMIT


def slot_lock(name: str, slot: int) -> str:
    """The lock name of slot ``slot`` of semaphore ``name`` (what its permit's token fences)."""
    return f"sem/{name}/{slot}"


def semaphore_of(lock: str) -> str | None:
    """The semaphore whose slot ``lock`` is (``sem/{name}/{slot}`` -> ``name``); ``None`` for
    any other lock name."""
    if not lock.startswith("sem/"):
        return None
    name, _, slot = lock[4:].rpartition("/")
    return name if name and slot.isascii() and slot.isdigit() else None


class ObservedSemaphores:
    """``sem_*`` of ``ObservedStore``; it supplies the tracking helpers used here."""

    inner: Any
    metrics: Any
    _keyed: Any
    _renewed: Any
    _track_permit: Any
    _renew_failed: Any
    _still: Any
    _end: Any
    _now: Any

    async def sem_acquire(self, name: str, *, limit: int, lease_id: str, ttl_ms: int,
                          owner: str, client_id: str | None) -> SemGrant | SemFull:
        result = await self.inner.sem_acquire(name, limit=limit, lease_id=lease_id,
                                              ttl_ms=ttl_ms, owner=owner, client_id=client_id)
        if isinstance(result, SemGrant):
            tracked = self._keyed(name, result.lease_id, _PERMIT)
            if tracked is not None:  # a retried acquire: the same permit
                self._renewed(name, tracked, result.lease_id, result.fence, result.owner,
                              result.ttl_ms, _PERMIT, None)
            else:
                self._track_permit(name, result)
        return result

    async def sem_renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        before = self._now()
        tracked = self._keyed(name, lease_id, _PERMIT)
        try:
            grant = await self.inner.sem_renew(name, lease_id, ttl_ms)
        except (LeaseLost, StoreUnavailable) as exc:
            self._renew_failed(exc, [(name, tracked)] if tracked is not None else [])
            raise
        self.metrics.renewals["ok"].inc()
        self._renewed(name, tracked, lease_id, grant.fence, grant.owner, grant.ttl_ms, _PERMIT,
                      before, grant.slot)
        return grant

    async def sem_release(self, name: str, lease_id: str) -> None:
        tracked = self._keyed(name, lease_id, _PERMIT)
        try:
            await self.inner.sem_release(name, lease_id)
        except LeaseLost:
            if self._still(name, tracked):
                self._end(name, tracked, "expired", self._now())
            raise
        self.metrics.releases["released"].inc()
        if self._still(name, tracked):
            self._end(name, tracked, "released", self._now())

    async def sem_get(self, name: str) -> SemState:
        return await self.inner.sem_get(name)
