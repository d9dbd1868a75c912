"""The audit trail: what admins did, and identities that keep knocking on locks outside their scope.

``AuditTrail.record(identity, action, target, result, request_id)`` is the one entry point for
every admin action (``force_release`` here; key rotation and handover call it too). Each entry
is, at once:

* one structured log line on the ``lockd.audit`` logger (``audit {json}``: with
  ``LOCKD_LOG_FORMAT=json`` the JSON sits in ``msg``), the durable record: ship the logs;
* an ``audit`` event on the admin event streams (``EventHub.publish_audit``);
* an entry of an in-memory ring of the last ``size`` entries (default 10 000), read with
  ``GET /v1/audit?since=ID&limit=N`` (admins): entries with an id above ``since``, oldest
  first, and ``next_since`` to page on (``null``: nothing more now).

From a route: ``request.app.state.audit.record(identity_name(request.scope), "key_rotate", kid,
"ok", request.scope.get(REQUEST_ID_KEY))`` (``lockd.server.access.identity_name``,
``lockd.common.middleware.REQUEST_ID_KEY``). A command that runs outside the server (``lockd
keys ...``) can use ``AuditTrail().record(...)``: the same log line, no event stream.

Why a ring in memory and not the store: the trail must not make an admin action fail or wait
when the store is slow, nor add a table to three stores; an auditor's record of truth is the
log line, which every deployment already collects. The ring is per process and starts empty
at each start: ``GET /v1/audit`` shows recent history for a quick look, not all of it.

Scope denials (403 ``forbidden_lock``) are many and cheap to cause, so they are not recorded
one by one: ``denied`` counts them per identity in windows of ``window_s`` (60 s) and records
one ``scope_denied`` entry when an identity's count in a window reaches ``denial_rate`` (10),
with the count so far and the last lock asked for; at most one entry per identity and window.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from lockd.server.events import EventHub

__all__ = ["AuditEntry", "AuditTrail"]

log = logging.getLogger("lockd.audit")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audited action. ``id`` increases per process; ``at`` is unix milliseconds."""

    id: int
    at: int
    identity: str
    action: str
    target: str
    result: str
    request_id: str | None
    detail: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        doc = asdict(self)
        if doc["detail"] is None:
            del doc["detail"]
        return doc


class AuditTrail:
    """Audit entries: log line, admin event, bounded ring (see the module docstring)."""

    def __init__(self, events: EventHub | None = None, *, size: int = 10_000,
                 denial_rate: int = 10, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._events = events
        self._ring: deque[AuditEntry] = deque(maxlen=size)
        self._seq = 0
        self._denial_rate = denial_rate
        self._window_s = window_s
        self._clock = clock
        self._denials: dict[str, list[float]] = {}  # identity -> [window start, count, recorded]

    def record(self, identity: str, action: str, target: str, result: str,
               request_id: str | None = None, **detail: Any) -> AuditEntry:
        """Record one action by ``identity`` (its name, never a key) on ``target`` (a lock
        name, a key id...) with ``result`` (``ok``, ``none``, ``denied``...)."""
        self._seq += 1
        entry = AuditEntry(self._seq, int(time.time() * 1000), identity, action, target, result,
                           request_id, detail or None)
        self._ring.append(entry)
        body = entry.body()
        log.info("audit %s", json.dumps(body, separators=(",", ":"), ensure_ascii=False))
        if self._events is not None:
            self._events.publish_audit(body)
        return entry

    def denied(self, identity: str, lock: str, request_id: str | None = None) -> None:
        """Count one scope denial of ``identity``; record it when the window's count reaches
        ``denial_rate`` (once per window)."""
        now = self._clock()
        window = self._denials.get(identity)
        if window is None or now - window[0] >= self._window_s:
            if len(self._denials) > 10_000:  # identities are configured: never many; be safe
                self._denials.clear()
            window = self._denials[identity] = [now, 0, 0]
        window[1] += 1
        if window[1] >= self._denial_rate and not window[2]:
            window[2] = 1
            self.record(identity, "scope_denied", lock, "denied", request_id,
                        count=int(window[1]), window_s=self._window_s)

    def since(self, since: int = 0, limit: int = 100) -> tuple[list[AuditEntry], int | None]:
        """Entries with an id above ``since``, oldest first, at most ``limit``; and the
        ``since`` of the next page (``None`` when this page reached the newest entry)."""
        picked = [e for e in self._ring if e.id > since][:limit + 1]
        more = len(picked) > limit
        picked = picked[:limit]
        return picked, (picked[-1].id if more and picked else None)
