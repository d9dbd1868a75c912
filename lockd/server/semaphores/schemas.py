"""Request and response bodies of the semaphore routes (``/v1/semaphores/{name}/...``)."""

from __future__ import annotations

from pydantic import BaseModel, StrictInt

from lockd.server.core.schemas import AcquireFields, ReleaseFields, RenewFields

__all__ = ["PermitBody", "PermitLeaseBody", "SemAcquireRequest", "SemReleaseRequest",
           "SemRenewRequest", "SemStateBody"]

class SemAcquireRequest(AcquireFields):
    """``POST /v1/semaphores/{name}/acquire``: one permit of a semaphore of ``limit`` permits
    (1-10,000; must equal the limit live permits hold: else 409 ``limit_mismatch``)."""

    limit: StrictInt


class SemRenewRequest(RenewFields):
    """``POST /v1/semaphores/{name}/renew``. Without ``ttl_ms`` the permit keeps its own TTL."""


class SemReleaseRequest(ReleaseFields):
    """``POST /v1/semaphores/{name}/release``."""


class PermitLeaseBody(BaseModel):
    """A granted or renewed permit: ``slot`` in 0..limit-1 (unique among live permits),
    ``fence`` strictly increasing per semaphore; ``token`` fences lock ``sem/{name}/{slot}``."""

    semaphore: str
    lock: str
    lease_id: str
    fence: int
    slot: int
    limit: int
    token: str
    ttl_ms: int
    owner: str


class PermitBody(BaseModel):
    """One live permit (never its lease id); ``ttl_ms``: time left."""

    owner: str
    slot: int
    ttl_ms: int
    fence: int


class SemStateBody(BaseModel):
    """A semaphore: ``limit`` (0: no permit live and never created), ``fence`` last issued,
    live ``permits`` in slot order, ``waiters`` queued at this lockd (their owners head first)."""

    semaphore: str
    limit: int
    fence: int
    permits: list[PermitBody]
    waiters: int
    waiting_owners: list[str]
