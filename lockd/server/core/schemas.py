"""What every primitive's request and response bodies share: strict requests and the text
field types, checked once for every route.

Requests are strict: integers must be JSON integers (``"30"`` and ``30.0`` are refused),
unknown fields are refused (a typo such as ``wait`` for ``wait_ms`` would otherwise silently
mean "do not wait"); settings-dependent bounds (TTL, wait) are the services'. ``Label`` and
``LeaseId`` hold no control character (``U+0000-U+001F``, ``U+007F-U+009F``), ``Text`` none but
tab, line feed and carriage return: no store keeps a NUL, and control characters garble logs
and pages. Every failure is 422 ``invalid_request``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator

__all__ = ["CLIENT_ID_PATTERN", "AcquireFields", "ClientId", "Label", "LeaseId", "ReleaseFields",
           "ReleasedBody", "RenewFields", "StrictRequest", "Text", "label"]

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


class StrictRequest(BaseModel):
    """A request body: unknown fields refused, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AcquireFields(StrictRequest):
    """What every acquire takes: ``ttl_ms`` (required), ``wait_ms`` (0: try once), ``owner``
    and ``client_id`` (an empty one is none)."""

    ttl_ms: StrictInt
    wait_ms: StrictInt = 0
    owner: Label = ""
    client_id: ClientId | None = None

    @field_validator("client_id", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return value or None


class RenewFields(StrictRequest):
    """What every renew takes: the ``lease_id``; without ``ttl_ms`` the lease keeps its own."""

    lease_id: LeaseId
    ttl_ms: StrictInt | None = None


class ReleaseFields(StrictRequest):
    """What every release takes: the ``lease_id``."""

    lease_id: LeaseId


class ReleasedBody(BaseModel):
    released: bool = True
