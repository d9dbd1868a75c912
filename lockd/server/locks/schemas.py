"""Request and response bodies of lockd's HTTP API (pydantic models), and the lock-name rule.

Requests are strict: integers must be JSON integers (``"30"`` and ``30.0`` are refused), unknown
fields are refused (a typo such as ``wait`` for ``wait_ms`` would otherwise silently mean "do not
wait"). Bounds that depend on settings (TTL, wait) are checked by ``LockService``; both kinds of
failure are 422 ``invalid_request``.

Text fields are checked here, once for every route (the election bodies use the same types):
``Label`` (``owner``, a handover ``target``) and ``LeaseId`` hold no control character
(``U+0000-U+001F``, ``U+007F-U+009F``), ``Text`` (an election ``value``) none but tab, line feed
and carriage return. No store can keep a NUL (PostgreSQL's ``text`` refuses it) and a control
character in a label garbles logs and pages, so such text is 422 before any store is asked.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator

__all__ = [
    "CLIENT_ID_PATTERN",
    "ClientId",
    "Label",
    "LeaseId",
    "Text",
    "label",
    "NAME_PATTERN",
    "NAME_RE",
    "PREFIX_RE",
    "AcquireRequest",
    "AcquireManyRequest",
    "Mode",
    "HolderBody",
    "SemAcquireRequest",
    "SemRenewRequest",
    "SemReleaseRequest",
    "PermitLeaseBody",
    "PermitBody",
    "SemStateBody",
    "RenewManyRequest",
    "ReleaseManyRequest",
    "MultiLeaseBody",
    "LockFence",
    "RenewRequest",
    "ReleaseRequest",
    "LeaseBody",
    "ReleasedBody",
    "LockStateBody",
    "LockPage",
    "HealthBody",
]

NAME_PATTERN = r"^[A-Za-z0-9._:/-]{1,255}$"
NAME_RE = re.compile(NAME_PATTERN)
"""The characters of lock names (1-255 of ``A-Za-z0-9._:/-``); ``lockd.common.names.is_lock_name``
adds the segment rule (no empty, ``.`` or ``..`` segment)."""
PREFIX_RE = re.compile(r"^[A-Za-z0-9._:/-]{0,255}$")

_LABEL_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
_TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]*$"
_LABEL_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TEXT_BAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _no_control(value: str) -> str:
    if _LABEL_BAD.search(value):
        raise ValueError("must not contain control characters (U+0000-U+001F, U+007F-U+009F)")
    return value


def _text(value: str) -> str:
    if _TEXT_BAD.search(value):
        raise ValueError("must not contain control characters (U+0000-U+001F, U+007F-U+009F) "
                         "other than tab, line feed and carriage return")
    return value


def label(min_length: int | None = None, max_length: int = 255) -> Any:
    """A string field of ``min_length`` (default 0) to ``max_length`` characters with no
    control character (the rule and its pattern in the OpenAPI document)."""
    return Annotated[str, Field(min_length=min_length, max_length=max_length,
                                json_schema_extra={"pattern": _LABEL_PATTERN}),
                     AfterValidator(_no_control)]


Label = label()
"""A label for humans (``owner``): at most 255 characters, no control character."""
LeaseId = label(1)
"""A lease id as a request carries it: 1-255 characters, no control character (lockd's own are
32 URL-safe characters; anything else is simply not live)."""
Text = Annotated[str, Field(json_schema_extra={"pattern": _TEXT_PATTERN}), AfterValidator(_text)]
"""Free text (an election's ``value``): no control character but tab, line feed and carriage
return; its size is bounded where it is used."""
CLIENT_ID_PATTERN = r"^[A-Za-z0-9_-]{22,255}$"
ClientId = Annotated[str, Field(pattern=CLIENT_ID_PATTERN)]
"""An acquire's idempotency key, and a per-attempt SECRET: whoever sends the same ``client_id``
while the lease is live receives that lease (id and token). 22+ characters of ``[A-Za-z0-9_-]``
hold 128 random bits when drawn at random (``secrets.token_urlsafe(16)``, as the client library
does for every attempt); a hostname or a counter is not one. With API keys configured, lockd
binds it to the key that sent it, so another key's identical ``client_id`` is another lease."""
_Label, _LeaseId, _ClientId = Label, LeaseId, ClientId


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Mode = Literal["exclusive", "shared"]
"""A lock mode: any number of ``shared`` leases coexist; an ``exclusive`` one excludes all."""


class _Acquire(_Request):
    ttl_ms: StrictInt
    wait_ms: StrictInt = 0
    owner: _Label = ""
    client_id: _ClientId | None = None

    @field_validator("client_id", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return value or None


class AcquireRequest(_Acquire):
    """``POST /v1/locks/{name}/acquire``. ``ttl_ms`` required; ``wait_ms`` 0 means try once;
    ``client_id`` (optional, see ``_ClientId``): a retry with it gets the same live lease;
    ``mode``: ``exclusive`` (default) or ``shared``."""

    mode: Mode = "exclusive"


class RenewRequest(_Request):
    """``POST /v1/locks/{name}/renew``. Without ``ttl_ms`` the lease keeps its own TTL."""

    lease_id: _LeaseId
    ttl_ms: StrictInt | None = None


class ReleaseRequest(_Request):
    """``POST /v1/locks/{name}/release``."""

    lease_id: _LeaseId


class AcquireManyRequest(_Acquire):
    """``POST /v1/leases/acquire``: ``locks`` are 1-64 distinct lock names, granted all at once
    or not at all; ``modes`` maps some of them to ``shared`` or ``exclusive`` (a lock it does
    not name is exclusive); the other fields as for a single acquire."""

    locks: list[str]
    modes: dict[str, Mode] | None = None


class RenewManyRequest(RenewRequest):
    """``POST /v1/leases/renew``: every lock of the set; without ``ttl_ms`` it keeps its own."""


class ReleaseManyRequest(ReleaseRequest):
    """``POST /v1/leases/release``: every lock of the set."""


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


class ReleasedBody(BaseModel):
    released: bool = True


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


class HealthBody(BaseModel):
    status: str = "ok"


# --- semaphores -----------------------------------------------------------------------------


class SemAcquireRequest(_Acquire):
    """``POST /v1/semaphores/{name}/acquire``: one permit of a semaphore of ``limit`` permits
    (1-10,000; must equal the limit live permits hold: else 409 ``limit_mismatch``)."""

    limit: StrictInt


class SemRenewRequest(RenewRequest):
    """``POST /v1/semaphores/{name}/renew``. Without ``ttl_ms`` the permit keeps its own TTL."""


class SemReleaseRequest(ReleaseRequest):
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
