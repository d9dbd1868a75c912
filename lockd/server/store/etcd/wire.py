"""etcd's JSON gateway encoding and lockd's key layout under the store's prefix.

The gateway sends keys and values base64-encoded, 64-bit integers as strings, and omits fields
equal to zero or false. A lock key's value is JSON ``{lease_id, owner, client_id, ttl_s,
ttl_ms}`` (a shared holder's adds ``mode`` and ``fence``, the fence it was granted with); an
exclusive holder's ``create_revision`` is the lock's fence. Key names use ``#`` (never in a lock
or semaphore name) to put keys "under" a name. See docs/stores/etcd.md ("Layout").
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

from lockd.server.store.values import EXCLUSIVE

__all__ = ["EPOCH_MARK", "Held", "Keys", "RELEASED_MARK", "SHARED_MARK", "b64", "fence_of",
           "json_object", "lock_value", "notify_name", "prefix_end", "range_kv", "range_kvs",
           "released_value", "secs", "to_int", "unb64", "writer_lapsed"]

SHARED_MARK = b"s"
"""The value of a fence key that a shared grant created: the lock was never written (fence 0).
An exclusive grant puts the fence key with an empty value; its ``mod_revision`` is the fence."""

EPOCH_MARK = b"e"
"""The value of a fence key that a shared grant put to start a new epoch (the last exclusive
lease ended without a clean release): its ``mod_revision`` is the epoch's fence."""

RELEASED_MARK = b"x:"
"""A clean release of the exclusive lease of fence ``n`` puts the fence key ``x:<n>``: the
fence stays ``n`` (the value says it; the put's own revision is not a fence)."""


def released_value(fence: int) -> str:
    """The fence key's value (base64) after a clean release of the lease of ``fence``."""
    return b64(RELEASED_MARK + str(fence).encode())


def writer_lapsed(kv: dict[str, Any] | None) -> bool:
    """Whether a fence key says an exclusive lease holds (or held) its fence and was not
    released cleanly (the empty value an exclusive grant put). With no live exclusive key,
    the next shared grant starts a new epoch."""
    return kv is not None and unb64(kv.get("value")) == b""


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


def fence_of(kv: dict[str, Any] | None) -> int:
    """The fence a fence key records: its ``mod_revision``, 0 if absent or only ever created by
    a shared grant (``SHARED_MARK``), ``n`` after a clean release (``RELEASED_MARK``)."""
    if kv is None:
        return 0
    value = unb64(kv.get("value"))
    if value == SHARED_MARK:
        return 0
    if value.startswith(RELEASED_MARK):
        return int(value[len(RELEASED_MARK):])
    return to_int(kv.get("mod_revision"))


def notify_name(rest: str) -> str:
    """The listener key of a watched key (its part after ``locks/`` or ``elections/``): the
    text before the first ``#`` after position 0 (``a/b#s/x`` → ``a/b``; ``#sem/q#3`` →
    ``#sem/q``; ``a/b`` → ``a/b``)."""
    cut = rest.find("#", 1)
    return rest if cut < 0 else rest[:cut]


def secs(ttl_ms: int) -> int:
    """An etcd lease TTL (whole seconds, at least 1) that covers ``ttl_ms``."""
    return max(1, math.ceil(ttl_ms / 1000))


def range_kv(doc: dict[str, Any], index: int = 0) -> dict[str, Any] | None:
    """The first kv of the ``index``-th range response of a transaction answer."""
    responses = doc.get("responses") or []
    kvs = responses[index].get("response_range", {}).get("kvs") if index < len(responses) else None
    return kvs[0] if kvs else None


def range_kvs(doc: dict[str, Any], index: int = 0) -> list[dict[str, Any]]:
    """Every kv of the ``index``-th range response of a transaction answer."""
    responses = doc.get("responses") or []
    if index >= len(responses):
        return []
    return responses[index].get("response_range", {}).get("kvs") or []


def lock_value(lease_id: str, owner: str, client_id: str | None, ttl_ms: int,
               **more: Any) -> str:
    """A lock key's value, base64-encoded for the gateway (``more``: extra members, e.g. a
    shared holder's ``mode`` and ``fence``)."""
    doc = {"lease_id": lease_id, "owner": owner, "client_id": client_id,
           "ttl_s": secs(ttl_ms), "ttl_ms": ttl_ms, **more}
    return b64(json.dumps(doc, separators=(",", ":")).encode())


@dataclass(frozen=True, slots=True)
class Held:
    """A lock key (or a shared holder's, or a permit's) as read from etcd."""

    name: str
    lease_id: str
    owner: str
    client_id: str | None
    ttl_s: int  # the TTL asked for, in seconds (the etcd lease may have been granted more)
    ttl_ms: int  # the TTL asked for, in milliseconds: what a renew without one keeps
    etcd_lease: int
    fence: int  # create_revision (a shared holder: the fence it was granted with)
    mod_revision: int
    mode: str = EXCLUSIVE
    key: bytes = b""  # the etcd key it was read from
    create_revision: int = 0
    extra: dict[str, Any] | None = None  # any other members of the value (e.g. a slot)

    @classmethod
    def parse(cls, name: str, kv: dict[str, Any]) -> Held:
        value = json.loads(unb64(kv.get("value")))
        created = to_int(kv.get("create_revision"))
        mode = value.get("mode", EXCLUSIVE)
        fence = int(value["fence"]) if "fence" in value else created
        return cls(name=name, lease_id=value["lease_id"], owner=value.get("owner", ""),
                   client_id=value.get("client_id"), ttl_s=int(value.get("ttl_s", 0)),
                   ttl_ms=int(value.get("ttl_ms") or int(value.get("ttl_s", 0)) * 1000),
                   etcd_lease=to_int(kv.get("lease")), fence=fence,
                   mod_revision=to_int(kv.get("mod_revision")), mode=mode,
                   key=unb64(kv.get("key")), create_revision=created, extra=value)


class Keys:
    """lockd's keys under ``prefix``: ``locks/<name>`` (the exclusive holder),
    ``locks/<name>#s/<lease id>`` (a shared holder), ``fences/<name>``, ``leases/<id>``;
    semaphores: ``locks/#sem/<name>#<slot>`` (a permit), ``sems/<name>`` (limit),
    ``semfences/<name>``; elections: ``elections/<name>#…`` (see ``elections``). Everything a
    release deletes lives under ``locks/`` (the watch's range)."""

    __slots__ = ("locks", "fences", "_leases", "sems", "semfences", "elections")

    def __init__(self, prefix: str):
        self.locks = f"{prefix}/locks/".encode()
        self.fences = f"{prefix}/fences/".encode()
        self._leases = f"{prefix}/leases/"
        self.sems = f"{prefix}/sems/".encode()
        self.semfences = f"{prefix}/semfences/".encode()
        self.elections = f"{prefix}/elections/".encode()

    def lock(self, name: str) -> bytes:
        return self.locks + name.encode()

    def shared(self, name: str, lease_id: str = "") -> bytes:
        """A shared holder's key; with no ``lease_id``: the prefix of all of them."""
        return self.locks + f"{name}#s/{lease_id}".encode()

    def shared_range(self, name: str) -> tuple[str, str]:
        """(key, range_end), base64: every shared holder key of ``name``."""
        start = self.shared(name)
        return b64(start), b64(prefix_end(start))

    def name_range(self, name: str) -> tuple[str, str]:
        """(key, range_end), base64: the exclusive key of ``name`` and every ``#`` key under
        it (no lock name has a character that sorts before ``#``, so nothing else)."""
        return b64(self.lock(name)), b64(prefix_end(self.lock(name) + b"#"))

    def permit(self, name: str, slot: int | None = None) -> bytes:
        """A permit key of semaphore ``name``; with no ``slot``: the prefix of all of them."""
        return self.locks + f"#sem/{name}#{'' if slot is None else slot}".encode()

    def election(self, name: str, part: str) -> bytes:
        """An election's key ``part`` (``v``: value, ``h``: handover, ``seq``, ``log/…``)."""
        return self.elections + f"{name}#{part}".encode()

    def fence(self, name: str) -> bytes:
        return self.fences + name.encode()

    def lease(self, lease_id: str) -> bytes:
        return (self._leases + lease_id).encode()
