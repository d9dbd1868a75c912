"""lockd's HTTP contract as the client writes and reads it: units, paths, names and lease bodies.

No I/O and nothing of the clients: the leases (``lease.py``), the client rules (``core.py``), both
clients and ``fenced.py`` build on these. Durations in the client API are **seconds as float**;
on the wire they are integer milliseconds (``ttl_ms``, ``wait_ms``), converted by ``ms``.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from lockd.client.errors import ProtocolError, ValidationError
from lockd.common.names import LOCK_NAME_RULE, bad_segment

__all__ = [
    "DEFAULT_URL",
    "DEFAULT_CONNECT_TIMEOUT",
    "request_timeout",
    "MAX_WAIT",
    "MAX_WAIT_MS",
    "Clock",
    "ms",
    "new_client_id",
    "check_segments",
    "lock_path",
    "multi_names",
    "check_lease_body",
    "check_multi_body",
    "shared_modes",
    "EXCLUSIVE",
    "SHARED",
    "sem_path",
    "election_path",
    "check_permit_body",
    "check_leader_body",
    "SseEvent",
    "SseParser",
]

EXCLUSIVE = "exclusive"
SHARED = "shared"
"""The two lock modes: any number of ``shared`` holders at once, or one ``exclusive`` holder."""

DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds a client keeps trying to reach a server it cannot connect to before it raises
``TransportError`` (``connect_timeout``): the whole retry budget of a call, a waiting acquire's
included, and the bound of each request's connect phase. ``None`` keeps retrying (the opt-in
for workers that should outlast a lockd restart)."""
MAX_WAIT = 300.0
"""lockd caps one request's ``wait_ms`` at 300 000 ms; longer waits are split into several requests."""

MAX_WAIT_MS = int(MAX_WAIT * 1000)

Clock = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic`` unless a test injects another)."""


def request_timeout(seconds: float, connect_timeout: float | None) -> Any:
    """An ``httpx`` timeout of ``seconds`` whose connect phase is at most ``connect_timeout``."""
    if connect_timeout is None or connect_timeout >= seconds:
        return seconds
    import httpx

    return httpx.Timeout(seconds, connect=connect_timeout)


def ms(seconds: float, what: str) -> int:
    """Seconds (float) -> integer milliseconds for the wire; ``math.inf`` is ``MAX_WAIT_MS``.

    ``TypeError`` for a non-number (or NaN), ``ValueError`` for a negative one: both are
    programming errors, raised before any request."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise TypeError(f"{what} must be a number of seconds, got {seconds!r}")
    if seconds < 0:
        raise ValueError(f"{what} must be >= 0 seconds, got {seconds!r}")
    return round(seconds * 1000) if seconds != math.inf else MAX_WAIT_MS


def new_client_id() -> str:
    """A fresh acquire ``client_id``: 128 random bits as 22 URL-safe characters (lockd refuses
    shorter ones). It is a per-attempt secret: every retry of one acquire call reuses it (so a
    retry after a lost answer gets the same lease), no two calls share one."""
    return secrets.token_urlsafe(16)


def check_segments(name: str) -> str:
    """``name``, unless it has an empty, ``.`` or ``..`` segment (``a//b``, ``a/../b``, a leading
    or trailing ``/``): such a name is refused here with ``ValidationError`` before any request,
    because HTTP clients rewrite it in the URL (``a/../b`` would reach the server as ``b``) and
    lockd and the proxy answer 422 to it anyway (``lockd.common.names``)."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a string, got {name!r}")
    if bad_segment(name):
        raise ValidationError(f"{LOCK_NAME_RULE} (got {name[:300]!r})", code="invalid_request")
    return name


def lock_path(name: str) -> str:
    """The URL path of lock ``name``. Allowed names are URL-safe as they are ("/" separates
    segments and lockd routes on the full path); other characters are percent-encoded so lockd
    answers 422 instead of routing somewhere unexpected. Segment errors: see ``check_segments``."""
    return _path_of("/v1/locks/", name)


def _path_of(root: str, name: str) -> str:
    return root + "/".join(quote(seg, safe=":") for seg in check_segments(name).split("/"))


def sem_path(name: str) -> str:
    """The URL path of semaphore ``name`` (the lock-name rules apply; see ``lock_path``)."""
    return _path_of("/v1/semaphores/", name)


def election_path(name: str) -> str:
    """The URL path of election ``name`` (an election name is a lock name)."""
    return _path_of("/v1/elections/", name)


def multi_names(locks: Any) -> list[str]:
    """The lock names of an ``acquire_many`` call, checked (``ValidationError`` for none, a
    duplicate or a bad name: before any request)."""
    if isinstance(locks, str) or not isinstance(locks, list | tuple):
        raise TypeError(f"locks must be a list of lock names, got {locks!r}")
    names = [check_segments(name) for name in locks]
    if not names:
        raise ValidationError("locks must name at least one lock", code="invalid_request")
    if len(set(names)) != len(names):
        raise ValidationError(f"locks must be distinct (got {names!r})", code="invalid_request")
    return names


def shared_modes(names: list[str], shared: Any) -> dict[str, str]:
    """The ``modes`` of a multi-lock acquire holding ``shared`` (some of ``names``) shared;
    ``ValidationError`` for a name not among ``names``, before any request."""
    if isinstance(shared, str):
        raise TypeError(f"shared must be a collection of lock names, got {shared!r}")
    stray = sorted(set(shared) - set(names))
    if stray:
        raise ValidationError(f"shared names locks not in the set: {stray!r}",
                              code="invalid_request")
    return {name: SHARED for name in shared}


def check_lease_body(body: Any) -> dict[str, Any]:
    """A single-lock lease body (acquire or renew answer), checked: ``ProtocolError`` if not."""
    if not isinstance(body, Mapping):
        raise ProtocolError("lease body is not an object")
    try:
        out = {"lock": str(body["lock"]), "lease_id": str(body["lease_id"]),
               "fence": int(body["fence"]), "token": str(body["token"]),
               "ttl_ms": int(body["ttl_ms"]), "owner": str(body.get("owner") or ""),
               "mode": str(body.get("mode") or EXCLUSIVE)}
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed lease body: missing or bad {exc}") from exc
    return out


def check_permit_body(body: Any) -> dict[str, Any]:
    """A semaphore permit body (acquire or renew answer): ``check_lease_body``'s shape (``lock``
    is the permit's slot lock ``sem/{name}/{slot}``, the lock its token names) plus
    ``semaphore``, ``slot`` and ``limit``."""
    out = check_lease_body(body)
    try:
        out.update(semaphore=str(body["semaphore"]), slot=int(body["slot"]),
                   limit=int(body["limit"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed permit body: missing or bad {exc}") from exc
    return out


def check_leader_body(body: Any) -> dict[str, Any]:
    """A leader's lease body (campaign or renew answer): ``check_lease_body``'s shape plus
    ``election``, ``value`` and, from a renewal, ``handover_requested`` / ``handover_to``
    (False / None when absent)."""
    out = check_lease_body(body)
    try:
        to = body.get("handover_to")
        out.update(election=str(body.get("election") or out["lock"]),
                   value=str(body.get("value") or ""),
                   handover_requested=bool(body.get("handover_requested")),
                   handover_to=None if to is None else str(to))
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed leader body: missing or bad {exc}") from exc
    return out


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: ``type`` (the ``event:`` field, ``message`` if none), ``id`` (the
    ``id:`` field, ``None`` if none) and ``data`` decoded from JSON."""

    type: str
    id: str | None
    data: Any


class SseParser:
    """Server-sent events from lines (``text/event-stream``, without the line ends): ``feed``
    each line, get an ``SseEvent`` when a blank line ends one (``None`` otherwise). Comment
    lines (``: keepalive``) and events without data are skipped. ``ProtocolError`` when an
    event's data is not JSON."""

    def __init__(self) -> None:
        self._kind, self._id, self._data = "message", None, ""

    def feed(self, line: str) -> SseEvent | None:
        if line:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                self._kind = value.strip()
            elif field == "data":
                self._data += value if not self._data else "\n" + value
            elif field == "id":
                self._id = value.strip()
            return None
        kind, ident, data = self._kind, self._id, self._data
        self._kind, self._id, self._data = "message", None, ""
        if not data:
            return None
        try:
            decoded = json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"event data is not JSON: {data[:100]!r}") from exc
        return SseEvent(kind, ident, decoded)


def check_multi_body(body: Any) -> dict[str, Any]:
    """A multi-lock lease body, in the shape of ``check_lease_body`` plus ``fences`` (lock ->
    fence): ``lock`` is the names joined with ``,``, ``fence`` the highest fence."""
    if not isinstance(body, Mapping):
        raise ProtocolError("lease body is not an object")
    try:
        fences = {str(item["lock"]): int(item["fence"]) for item in body["locks"]}
        if not fences:
            raise ValueError("locks is empty")
        modes = {name: str((body.get("modes") or {}).get(name) or EXCLUSIVE) for name in fences}
        out = {"lock": ",".join(fences), "lease_id": str(body["lease_id"]),
               "fence": max(fences.values()), "token": str(body["token"]),
               "ttl_ms": int(body["ttl_ms"]), "owner": str(body.get("owner") or ""),
               "fences": fences, "modes": modes, "mode": EXCLUSIVE}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed multi-lock lease body: missing or bad {exc}") from exc
    return out
