"""Request and response bodies of the election routes (``/v1/elections/...``): strict, with
the shared text field types (``lockd.server.core.schemas``); the value's size in bytes is the
service's check."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictInt, field_validator

from lockd.server.core.schemas import (
    ClientId,
    Label,
    LeaseId,
    ReleaseFields,
    RenewFields,
    StrictRequest,
    Text,
    label,
)

__all__ = ["CampaignRequest", "ElectionLeaseBody", "ElectionListBody", "ElectionRenewBody",
           "ElectionStateBody", "HandoverBody", "HandoverRequest", "LeaderBody",
           "ProclaimRequest", "ProclaimedBody", "ResignRequest", "ResignedBody",
           "ElectionRenewRequest"]

_Label, _LeaseId, _ClientId = Label, LeaseId, ClientId
_Value = Annotated[Text, Field(max_length=4096)]  # characters; the 4096-BYTE rule is the service's


class CampaignRequest(StrictRequest):
    """``POST /v1/elections/{name}/campaign``: ``value`` (at most 4096 UTF-8 bytes) is what
    observers see while this candidate leads; ``ttl_ms`` required; ``wait_ms`` 0: try once;
    ``client_id``: a retry with it gets the same live lease (as for a lock acquire)."""

    value: _Value = ""
    ttl_ms: StrictInt
    wait_ms: StrictInt = 0
    owner: _Label = ""
    client_id: _ClientId | None = None

    @field_validator("client_id", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return value or None


class ElectionRenewRequest(RenewFields):
    """``POST /v1/elections/{name}/renew``. Without ``ttl_ms`` the lease keeps its own TTL."""


class ResignRequest(ReleaseFields):
    """``POST /v1/elections/{name}/resign``."""


class ProclaimRequest(StrictRequest):
    """``POST /v1/elections/{name}/proclaim``: the leader's new value (same lease, same fence)."""

    lease_id: _LeaseId
    value: _Value


class HandoverRequest(StrictRequest):
    """``POST /v1/elections/{name}/handover``: ``target`` is a candidate's ``owner`` or
    ``"next"`` (the longest-waiting candidate). ``lease_id``: the leader's own lease (then no
    admin key is needed)."""

    target: label(1)  # type: ignore[valid-type]
    lease_id: _LeaseId | None = None


class ElectionLeaseBody(BaseModel):
    """The leader's lease: ``lock`` is the election's name, ``fence`` its lock fence (strictly
    higher every term), ``token`` fences its writes at the proxy like any lock's."""

    election: str
    lock: str
    lease_id: str
    fence: int
    token: str
    ttl_ms: int
    owner: str
    value: str


class ElectionRenewBody(BaseModel):
    """A renewed leader lease; ``handover_requested``: step down (resign) soon, the lead is
    wanted by ``handover_to`` (an owner, or ``"next"``)."""

    election: str
    lock: str
    lease_id: str
    fence: int
    token: str
    ttl_ms: int
    owner: str
    handover_requested: bool
    handover_to: str | None


class ResignedBody(BaseModel):
    resigned: bool = True


class ProclaimedBody(BaseModel):
    """The election after a proclaim: same owner and fence, the new value, its log ``seq``."""

    election: str
    owner: str
    value: str
    fence: int
    seq: int


class HandoverBody(BaseModel):
    """A recorded handover request: the leader sees ``handover_to`` at its next renewal."""

    election: str
    handover_to: str


class LeaderBody(BaseModel):
    owner: str
    ttl_ms: int


class ElectionStateBody(BaseModel):
    """An election now: ``leader`` (null: none), its ``value``, the last ``fence`` issued, the
    last log ``seq``, a pending ``handover_to``, and the candidates waiting at this lockd."""

    election: str
    leader: LeaderBody | None
    value: str
    fence: int
    seq: int
    handover_to: str | None
    waiters: int
    waiting_owners: list[str]


class ElectionListBody(BaseModel):
    """The elections led through this lockd process (a campaign granted or a leader renewed
    here; the 1,000 most recent), for the status page's list."""

    items: list[ElectionStateBody]
