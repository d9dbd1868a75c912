"""Request and response bodies of the lock routes (``/v1/locks/...``, ``/v1/leases/...``);
the shared field types and strictness: ``lockd.server.core.schemas``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from lockd.server.core.schemas import AcquireFields, ReleaseFields, RenewFields, StrictRequest

__all__ = ["AcquireManyRequest", "AcquireRequest", "ForceReleasedBody", "HolderBody", "LeaseBody", "LockFence",
           "LockPage", "LockStateBody", "Mode", "MultiLeaseBody", "ReleaseManyRequest",
           "RENEW_EACH_BODY_BYTES", "RENEW_EACH_MAX", "ReleaseRequest", "RenewEachBody", "RenewEachItem", "RenewEachRequest",
           "RenewEachResult", "RenewManyRequest", "RenewRequest"]

RENEW_EACH_MAX = 1000
"""The most leases one ``POST /v1/leases/renew-each`` renews (a client holding more sends
several)."""
RENEW_EACH_BODY_BYTES = 1 << 20
"""The body ``POST /v1/leases/renew-each`` may send even below a smaller
``settings.max_body_bytes``: ``RENEW_EACH_MAX`` items of the longest lock names and lease ids
fit (about 600 bytes each)."""

Mode = Literal["exclusive", "shared"]
"""A lock mode: any number of ``shared`` leases coexist; an ``exclusive`` one excludes all."""


class AcquireRequest(AcquireFields):
    """``POST /v1/locks/{name}/acquire``. ``ttl_ms`` required; ``wait_ms`` 0 means try once;
    ``client_id`` (optional, see ``_ClientId``): a retry with it gets the same live lease;
    ``mode``: ``exclusive`` (default) or ``shared``."""

    mode: Mode = "exclusive"


class RenewRequest(RenewFields):
    """``POST /v1/locks/{name}/renew``. Without ``ttl_ms`` the lease keeps its own TTL."""


class ReleaseRequest(ReleaseFields):
    """``POST /v1/locks/{name}/release``."""


class AcquireManyRequest(AcquireFields):
    """``POST /v1/leases/acquire``: ``locks`` are 1-64 distinct lock names, granted all at once
    or not at all; ``modes`` maps some of them to ``shared`` or ``exclusive`` (a lock it does
    not name is exclusive); the other fields as for a single acquire."""

    locks: list[str]
    modes: dict[str, Mode] | None = None


class RenewManyRequest(RenewRequest):
    """``POST /v1/leases/renew``: every lock of the set; without ``ttl_ms`` it keeps its own."""


class ReleaseManyRequest(ReleaseRequest):
    """``POST /v1/leases/release``: every lock of the set."""


class RenewEachItem(RenewFields):
    """One lease of ``POST /v1/leases/renew-each``: its ``lock``, then what
    ``POST /v1/locks/{name}/renew`` takes."""

    lock: str


class RenewEachRequest(StrictRequest):
    """``POST /v1/leases/renew-each``: 1-1000 single-lock leases, each renewed on its own."""

    leases: list[RenewEachItem] = Field(min_length=1, max_length=RENEW_EACH_MAX)


class RenewEachResult(BaseModel):
    """One lease's answer, in request order: ``status`` 200 and the renewed ``lease``, or the
    status and ``problem`` details ``POST /v1/locks/{name}/renew`` would have answered (410
    ``lease_lost``, 503 ``store_unavailable``)."""

    lock: str
    status: int
    lease: LeaseBody | None = None
    problem: dict[str, Any] | None = None


class RenewEachBody(BaseModel):
    """The answer of ``POST /v1/leases/renew-each``: one result per lease asked, in order."""

    results: list[RenewEachResult]


class LockFence(BaseModel):
    """One lock of a multi-lock lease, its own fence and its mode."""

    lock: str
    fence: int
    mode: Mode = "exclusive"


class MultiLeaseBody(BaseModel):
    """A granted or renewed multi-lock lease: ``locks`` in name order, each with its fence;
    ``token`` carries them all (claim ``locks``; the shared ones also in claim ``shared``).
    ``modes``: each lock's mode. ``lease_id`` is the secret renew/release take."""

    lease_id: str
    locks: list[LockFence]
    modes: dict[str, Mode]
    token: str
    ttl_ms: int
    owner: str


class LeaseBody(BaseModel):
    """A granted or renewed lease. ``lease_id`` is the secret renew/release take. A ``shared``
    lease's ``fence`` is the lock's write epoch (0: never written); its token says ``shared``."""

    lock: str
    lease_id: str
    fence: int
    token: str
    ttl_ms: int
    owner: str
    mode: Mode = "exclusive"


class HolderBody(BaseModel):
    """One live lease of a lock (never its lease id); ``ttl_ms``: time left."""

    owner: str
    ttl_ms: int
    mode: Mode


class LockStateBody(BaseModel):
    """A lock's state: ``fence`` last issued (0: never), ``waiters`` queued at this lockd;
    ``mode`` held (null: free); ``owner``/``ttl_ms``: the exclusive holder, or the shared holder
    whose lease ends last."""

    lock: str
    held: bool
    fence: int
    owner: str | None
    ttl_ms: int
    waiters: int
    mode: Mode | None = None
    holders: list[HolderBody] | None = Field(
        default=None, description="GET /v1/locks/{name} only: every live lease, in grant order")
    waiting_owners: list[str] | None = Field(
        default=None, description="GET /v1/locks/{name} only: the owners of the acquires "
        "waiting at this lockd, head first (\"\" if none given); other replicas' not included")


class LockPage(BaseModel):
    """One page of ``GET /v1/locks``; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    items: list[LockStateBody]
    next_cursor: str | None


class ForceReleasedBody(BaseModel):
    """The answer of a force-release: the lease it ended (``released: false``: none was live)."""

    lock: str
    released: bool
    fence: int | None
    owner: str | None
