"""``Idempotency-Key``: a retried write returns the original answer instead of writing twice.

Why: when the connection to the database breaks while a write's COMMIT is in flight, nobody
knows whether it committed (``outcome_unknown``, 502). A retry of a POST would then insert a
second row. With ``Idempotency-Key: <key>`` on a write (POST/PUT/PATCH/DELETE rows) or a batch,
the store records ``key -> (lock, digest of the request, status, body)`` in the SAME transaction
as the write, so exactly one of these holds after any failure: the write and its record
committed (a retry finds the record and gets the original status and body, with
``Idempotency-Replayed: true``), or neither did (a retry writes).

- The key: 1-255 characters of visible ASCII (``!`` to ``~``); anything else is 422. Clients
  should make it random (``FencedSession`` sends 128 random bits, ``uuid4().hex``).
- The digest (SHA-256) covers the method, the path as sent, the token's lock (for a multi-lock
  token: the locks the write touches, in name order) and the body bytes:
  the same key with another body, route, method or lock is 422 ``idempotency_key_reused``.
- Only successful writes are recorded: a rejected write (stale token, conflict, bad value) is
  rolled back whole, record included, so its retry is evaluated afresh.
- The record is looked up before the fence check: a replay returns the original answer even if
  a newer holder has fenced the lock off since (the write was honoured when it was made).
- Kept ``ttl_ms`` (default 24 h, ``PROXY_IDEMPOTENCY_TTL_MS``), by the database's clock on
  PostgreSQL and the proxy's on SQLite; an expired record is as good as absent and is deleted
  by the next write that reuses its key, or by a purge (at most every 10 s, 10 000 records at
  a time, off the write's transaction; every ``ttl_ms / 2`` if that is shorter). Each record is about the size of the answer, which is
  about the size of the request (at most ``max_body_bytes``) plus column defaults.
- Concurrent requests with one key (PostgreSQL): the first inserts the record row and holds
  its row lock until COMMIT; the second waits on it, then finds the record (replay) or, if the
  first rolled back, proceeds itself. SQLite serializes writers anyway (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from resource_proxy.errors import InvalidRequest

__all__ = [
    "HEADER",
    "DEFAULT_TTL_MS",
    "PG_TABLE",
    "SQLITE_TABLE",
    "Once",
    "Keyed",
    "Reply",
    "KeyReused",
    "parse_key",
    "digest",
    "idempotency_table",
]

HEADER = "idempotency-key"
DEFAULT_TTL_MS = 24 * 3600 * 1000
PURGE_INTERVAL_S = 10.0  # a keyed write starts a purge of expired records at most this often
PURGE_BATCH = 10_000  # records one purge deletes at most (~1000 keyed writes/s sustained)
PG_TABLE = "idempotency"  # in the proxy's schema, next to the fences
SQLITE_TABLE = "resource_proxy_idempotency"
_KEY = re.compile(r"[!-~]{1,255}")


class KeyReused(InvalidRequest):
    """The key was used before for another request (other body, route, method or lock): 422."""

    code, title = "idempotency_key_reused", "Idempotency key reused"


@dataclass(frozen=True, slots=True)
class Reply:
    """A write's answer: HTTP ``status`` and JSON ``body`` text ("" for 204); ``replayed`` when
    it is the recorded answer of an earlier request with the same key."""

    status: int
    body: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Once:
    """A keyed write: the ``key``, the request's ``digest``, how long records live (``ttl_ms``)
    and ``render`` (the store's result -> the ``Reply`` to record and send)."""

    key: str
    digest: str
    ttl_ms: int
    render: Callable[[Any], Reply]

    def replay(self, digest: str, status: int, body: str) -> Reply:
        """The recorded answer, or ``KeyReused`` if it answered another request."""
        if digest != self.digest:
            raise KeyReused("this Idempotency-Key was used for another request (body, route, "
                            "method or lock differ); use a new key for a new request")
        return Reply(status, body, replayed=True)


@dataclass(frozen=True, slots=True)
class Keyed:
    """What the HTTP layer knows of a keyed request: the key and the request's method, path (as
    sent) and body bytes; ``once`` adds the token's lock once it is verified."""

    key: str
    method: str
    path: str
    body: bytes

    def once(self, lock: str, ttl_ms: int, render: Callable[[Any], Reply]) -> Once:
        return Once(self.key, digest(self.method, self.path, lock, self.body), ttl_ms, render)


def parse_key(raw: str | None) -> str | None:
    """The header's key (None if absent); ``InvalidRequest`` unless 1-255 visible ASCII chars."""
    if raw is None:
        return None
    if not _KEY.fullmatch(raw):
        raise InvalidRequest("Idempotency-Key must be 1-255 visible ASCII characters")
    return raw


def digest(method: str, path: str, lock: str, body: bytes) -> str:
    """SHA-256 (hex) of what makes a request the same request."""
    h = hashlib.sha256()
    for part in (method.encode(), path.encode("latin-1", "replace"), lock.encode()):
        h.update(len(part).to_bytes(4, "big") + part)
    h.update(body)
    return h.hexdigest()


def idempotency_table(dialect: str, metadata: sa.MetaData, schema: str | None) -> sa.Table:
    """The record table (created at start with the fence table)."""
    return sa.Table(
        PG_TABLE if dialect == "postgresql" else SQLITE_TABLE,
        metadata,
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("digest", sa.Text, nullable=False),
        sa.Column("status", sa.Integer),
        sa.Column("body", sa.Text),
        sa.Column("created_ms", sa.BigInteger, nullable=False, index=True),
        schema=schema,
    )
