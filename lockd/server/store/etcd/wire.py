"""etcd's JSON gateway encoding and lockd's key layout under the store's prefix.

The gateway sends keys and values base64-encoded, 64-bit integers as strings, and omits fields
equal to zero or false. A lock key's value is JSON ``{lease_id, owner, client_id, ttl_s,
ttl_ms}``; its ``create_revision`` is the lock's fence. See docs/stores/etcd.md ("Layout").
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Held", "Keys", "b64", "json_object", "lock_value", "prefix_end", "range_kv",
           "secs", "to_int", "unb64"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def to_int(value: Any) -> int:
    """etcd's JSON gateway sends 64-bit integers as strings and omits zeros."""
    return int(value or 0)


def prefix_end(key: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``key`` (etcd's range_end)."""
    stripped = key.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else b"\x00"


def json_object(data: bytes) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object, or None."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def secs(ttl_ms: int) -> int:
    """An etcd lease TTL (whole seconds, at least 1) that covers ``ttl_ms``."""
    return max(1, math.ceil(ttl_ms / 1000))


def range_kv(doc: dict[str, Any], index: int = 0) -> dict[str, Any] | None:
    """The first kv of the ``index``-th range response of a transaction answer."""
    responses = doc.get("responses") or []
    kvs = responses[index].get("response_range", {}).get("kvs") if index < len(responses) else None
    return kvs[0] if kvs else None


def lock_value(lease_id: str, owner: str, client_id: str | None, ttl_ms: int) -> str:
    """A lock key's value, base64-encoded for the gateway."""
    doc = {"lease_id": lease_id, "owner": owner, "client_id": client_id,
           "ttl_s": secs(ttl_ms), "ttl_ms": ttl_ms}
    return b64(json.dumps(doc, separators=(",", ":")).encode())


@dataclass(frozen=True, slots=True)
class Held:
    """A lock key as read from etcd."""

    name: str
    lease_id: str
    owner: str
    client_id: str | None
    ttl_s: int  # the TTL asked for, in seconds (the etcd lease may have been granted more)
    ttl_ms: int  # the TTL asked for, in milliseconds: what a renew without one keeps
    etcd_lease: int
    fence: int  # create_revision
    mod_revision: int

    @classmethod
    def parse(cls, name: str, kv: dict[str, Any]) -> Held:
        value = json.loads(unb64(kv.get("value")))
        return cls(name=name, lease_id=value["lease_id"], owner=value.get("owner", ""),
                   client_id=value.get("client_id"), ttl_s=int(value.get("ttl_s", 0)),
                   ttl_ms=int(value.get("ttl_ms") or int(value.get("ttl_s", 0)) * 1000),
                   etcd_lease=to_int(kv.get("lease")), fence=to_int(kv.get("create_revision")),
                   mod_revision=to_int(kv.get("mod_revision")))


class Keys:
    """lockd's keys under ``prefix``: ``locks/<name>``, ``fences/<name>``, ``leases/<id>``."""

    __slots__ = ("locks", "fences", "_leases")

    def __init__(self, prefix: str):
        self.locks = f"{prefix}/locks/".encode()
        self.fences = f"{prefix}/fences/".encode()
        self._leases = f"{prefix}/leases/"

    def lock(self, name: str) -> bytes:
        return self.locks + name.encode()

    def fence(self, name: str) -> bytes:
        return self.fences + name.encode()

    def lease(self, lease_id: str) -> bytes:
        return (self._leases + lease_id).encode()
