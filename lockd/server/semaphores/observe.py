"""The semaphore calls of ``lockd.server.observe.ObservedStore`` (a mixin of it): permits are
tracked by lease id like shared leases (metrics: grants, renewals, releases, hold times and
expiries, confirmed by the sweeper from the semaphore's permits); their events name the slot's
lock ``sem/{name}/{slot}`` with ``mode: "permit"``."""

from __future__ import annotations

from typing import Any

from lockd.server.core.waiting import PERMIT as _PERMIT
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.semaphores.service import slot_lock
from lockd.server.store.values import SemFull, SemGrant, SemState

__all__ = ["ObservedSemaphores"]


class ObservedSemaphores:
    """``sem_*`` of ``ObservedStore``; it supplies the tracking helpers used here."""

    inner: Any
    metrics: Any
    events: Any
    _keyed: Any
    _tracked_permit: Any
    _renewed: Any
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

    def _track_permit(self, name: str, grant: SemGrant) -> None:
        self._tracked_permit(name, grant.lease_id, grant.fence, grant.owner, grant.ttl_ms,
                             grant.slot, slot_lock(name, grant.slot))
        self.metrics.lease_ttl.observe(grant.ttl_ms / 1000)
        self.events.publish("acquired", slot_lock(name, grant.slot), grant.fence, grant.owner,
                            grant.ttl_ms, mode=_PERMIT)

    async def _permit_left(self, name: str, fence: int) -> list[int]:
        """The time left (ms) of the semaphore's live permits of ``fence`` (the sweeper's
        confirmation that a tracked permit lapsed: empty)."""
        state = await self.inner.sem_get(name)
        return [p.ttl_ms for p in state.permits if p.fence == fence]

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
                      before, grant.slot, slot_lock(name, grant.slot))
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
