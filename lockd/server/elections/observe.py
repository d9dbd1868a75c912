"""The election calls of ``lockd.server.observe.ObservedStore`` (a mixin of it), passed through
to the store unchanged: an election service observes its own calls."""

from __future__ import annotations

from typing import Any

from lockd.server.store.values import ElectionEvent, ElectionState, Grant, Holder

__all__ = ["ObservedElections"]


class ObservedElections:
    """``elect_*`` of ``ObservedStore``, forwarded to ``inner``."""

    inner: Any

    async def elect_campaign(self, name: str, *, lease_id: str, ttl_ms: int, owner: str,
                             client_id: str | None, value: str) -> Grant | Holder:
        return await self.inner.elect_campaign(name, lease_id=lease_id, ttl_ms=ttl_ms,
                                               owner=owner, client_id=client_id, value=value)

    async def elect_renew(self, name: str, lease_id: str,
                          ttl_ms: int | None) -> tuple[Grant, str | None]:
        return await self.inner.elect_renew(name, lease_id, ttl_ms)

    async def elect_resign(self, name: str, lease_id: str) -> None:
        await self.inner.elect_resign(name, lease_id)

    async def elect_proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        return await self.inner.elect_proclaim(name, lease_id, value)

    async def elect_handover(self, name: str, target: str) -> ElectionState:
        return await self.inner.elect_handover(name, target)

    async def elect_get(self, name: str) -> ElectionState:
        return await self.inner.elect_get(name)

    async def elect_log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        return await self.inner.elect_log(name, after, limit)
