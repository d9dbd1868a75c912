"""Semaphore permits as leases (``PermitLease`` / ``AsyncPermitLease``) and what
``GET /v1/semaphores/{name}`` shows (``SemaphoreStatus``). No I/O here.

A permit is a lease like a lock's: renewed in the background every ttl/3, ``lost`` when lockd
answers 410 or the local deadline passes, released on ``with`` exit. Its token is an ordinary
single-lock token whose lock is the permit's slot, ``sem/{name}/{slot}`` (``lease.lock``), so a
resource can be fenced per slot: a holder whose permit lapsed and whose slot was granted again
is refused there as stale. ``fence`` strictly increases per semaphore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lockd.client.errors import ProtocolError
from lockd.client.lease import AsyncLease, AsyncLeaseClient, Lease, LeaseRef, SyncLeaseClient
from lockd.client.wire import check_permit_body, sem_path

__all__ = ["PermitLease", "AsyncPermitLease", "PermitInfo", "SemaphoreStatus"]


class _Permit:
    """What a permit adds to ``Lease``/``AsyncLease``: ``semaphore`` (its name), ``slot`` (0 ..
    limit-1, unique among the live permits), ``limit``; the ``/v1/semaphores/...`` routes."""

    _parse = staticmethod(check_permit_body)
    semaphore: str
    slot: int
    limit: int

    def _init_permit(self, body: Mapping[str, Any]) -> None:
        data = check_permit_body(body)
        self.semaphore, self.slot, self.limit = data["semaphore"], data["slot"], data["limit"]

    def _path(self, op: str) -> str:
        return sem_path(self.semaphore) + "/" + op

    def as_dict(self) -> dict[str, Any]:
        """The permit in the contract's shape (includes the secret ``lease_id``)."""
        base: Any = super()
        return {**base.as_dict(), "semaphore": self.semaphore, "slot": self.slot,
                "limit": self.limit}

    def ref(self) -> LeaseRef:
        base: Any = self
        return LeaseRef(self.semaphore, base.lease_id, kind="semaphore")

    def __repr__(self) -> str:
        base: Any = self
        return (f"{type(self).__name__}(semaphore={self.semaphore!r}, slot={self.slot}, "
                f"fence={base.fence}, state={base._state.value!r}, ttl={base.ttl})")


class PermitLease(_Permit, Lease):
    """A permit from ``LockClient.acquire_permit`` (or a ``Semaphore``): a ``Lease`` (states,
    renewal thread, ``lost`` event, ``on_lost``, ``renew()``, ``release()``, ``with``)."""

    def __init__(self, client: SyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_permit(body)

    def __enter__(self) -> PermitLease:
        return self


class AsyncPermitLease(_Permit, AsyncLease):
    """The ``AsyncLease`` twin of ``PermitLease`` (``AsyncLockClient.acquire_permit``)."""

    def __init__(self, client: AsyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_permit(body)

    async def __aenter__(self) -> AsyncPermitLease:
        return self


@dataclass(frozen=True, slots=True)
class PermitInfo:
    """One live permit as lockd shows it (never its lease id): ``ttl`` in seconds."""

    owner: str
    slot: int
    ttl: float
    fence: int


@dataclass(frozen=True, slots=True)
class SemaphoreStatus:
    """``GET /v1/semaphores/{name}``: ``limit`` (0: never used), ``fence`` (last issued, 0:
    never), live ``permits`` in slot order, ``waiters`` and their owners at this lockd."""

    semaphore: str
    limit: int
    fence: int
    permits: tuple[PermitInfo, ...]
    waiters: int = 0
    waiting_owners: tuple[str, ...] = ()

    @property
    def available(self) -> int:
        """Permits free now (0 for a semaphore never used: its limit is not known yet)."""
        return max(0, self.limit - len(self.permits))

    @classmethod
    def from_json(cls, body: Any) -> SemaphoreStatus:
        try:
            permits = tuple(PermitInfo(owner=str(p.get("owner") or ""), slot=int(p["slot"]),
                                       ttl=int(p.get("ttl_ms") or 0) / 1000,
                                       fence=int(p["fence"]))
                            for p in body.get("permits") or ())
            return cls(semaphore=str(body["semaphore"]), limit=int(body.get("limit") or 0),
                       fence=int(body.get("fence") or 0), permits=permits,
                       waiters=int(body.get("waiters") or 0),
                       waiting_owners=tuple(map(str, body.get("waiting_owners") or ())))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed semaphore status: {exc!r}") from exc

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``ttl_ms`` in milliseconds)."""
        return {"semaphore": self.semaphore, "limit": self.limit, "fence": self.fence,
                "permits": [{"owner": p.owner, "slot": p.slot, "ttl_ms": round(p.ttl * 1000),
                             "fence": p.fence} for p in self.permits],
                "waiters": self.waiters, "waiting_owners": list(self.waiting_owners)}
