"""``Idempotency-Key``: a retried write returns the original answer instead of writing twice.

Why: when the connection to the database breaks while a write's COMMIT is in flight, nobody
knows whether it committed (``outcome_unknown``, 502). A retry of a POST would then insert a
second row. With ``Idempotency-Key: <key>`` on a write (POST/PUT/PATCH/DELETE rows) or a batch,
the store records ``key -> (digest of the request, fences, status, body)`` in the SAME
transaction as the write, so exactly one of these holds after any failure: the write and its record
committed (a retry finds the record and gets the original status and body, with
``Idempotency-Replayed: true``), or neither did (a retry writes).

- The key: 1-255 characters of visible ASCII (``!`` to ``~``); anything else is 422. Clients
  should make it random (``FencedSession`` sends 128 random bits, ``uuid4().hex``).
- The digest (SHA-256) covers the method, the path as sent, the token's lock (for a multi-lock
  token: the locks the write touches, in name order) and the body bytes:
  the same key with another body, route, method or lock is 422 ``idempotency_key_reused``.
- Only successful writes are recorded: a rejected write (stale token, conflict, bad value) is
  rolled back whole, record included, so its retry is evaluated afresh.
- The record keeps the fence of each lock the write checked (``fences``: JSON ``{lock: fence}``,
  ``{}`` for an unfenced table). A replay answers the recorded result only to a token holding
  each of those locks at a fence >= the recorded one. It is looked up before the fence check, so
  the holder that wrote still gets its answer after a newer holder has fenced the lock off (the
  write was honoured when it was made). A LOWER fence gets 409 ``stale_token``, as its own write
  would: the digest omits the fence, so without this a stale holder that never wrote (fence 1,
  after fence 2 committed the same key and body) would be told it succeeded. Its ``highest`` is
  the lock's highest honoured fence (read on that path only; >= the recorded one), the value
  ``highest`` carries in every other ``stale_token``, so a client acts on one meaning. A record
  written before fences were recorded (``fences`` NULL) replays as it did then, to the lock.
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
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa

from resource_proxy.errors import InvalidRequest, StaleToken

__all__ = [
    "HEADER",
    "DEFAULT_TTL_MS",
    "PG_TABLE",
    "SQLITE_TABLE",
    "Once",
    "Keyed",
    "Reply",
    "KeyReused",
    "StaleReplay",
    "parse_key",
    "digest",
    "idempotency_table",
    "add_fences_column",
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


class Fence(Protocol):
    """A fence a token presents: ``fencing.Fence`` (named structurally here, because ``fencing``
    creates the record table with its own and so imports this module)."""

    @property
    def lock(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def multi(self) -> bool: ...


class StaleReplay(Exception):
    """Raised by ``Once.replay``: the request is the recorded one, but the token presents a fence
    below the recorded fence of ``below`` (each ``(presented Fence, recorded fence)``). The store
    reads each lock's highest and raises ``refusal(highest)``."""

    def __init__(self, below: list[tuple[Fence, int]]):
        super().__init__("stale replay")
        self.below = below

    @property
    def locks(self) -> list[str]:
        return [fence.lock for fence, _ in self.below]

    def refusal(self, highest: Sequence[int]) -> StaleToken:
        """The 409 for the stale locks; ``highest``: each lock's highest honoured fence (the
        recorded fence if that is higher: it was honoured, whatever the fence table says)."""
        stale = [(fence, max(h, recorded))
                 for (fence, recorded), h in zip(self.below, highest, strict=True)]
        first, top = stale[0]
        if not any(fence.multi for fence, _ in stale):
            return StaleToken(first.lock, first.fence, top)
        return StaleToken(first.lock, first.fence, top, stale=[
            {"lock": f.lock, "presented": f.fence, "highest": h} for f, h in stale])


@dataclass(frozen=True, slots=True)
class Once:
    """A keyed write: the ``key``, the request's ``digest``, the ``fences`` it presents (one per
    lock it touches, lock order; none for an unfenced table), how long records live
    (``ttl_ms``) and ``render`` (the store's result -> the ``Reply`` to record and send)."""

    key: str
    digest: str
    fences: tuple[Fence, ...]
    ttl_ms: int
    render: Callable[[Any], Reply]

    @property
    def recorded_fences(self) -> str:
        """What the record keeps of the fences: JSON ``{lock: fence}``."""
        return json.dumps({f.lock: f.fence for f in self.fences}, separators=(",", ":"))

    def replay(self, digest: str, status: int, body: str, fences: str | None) -> Reply:
        """The recorded answer; ``KeyReused`` if it answered another request, ``StaleReplay``
        if this token presents a fence below a recorded one (``fences`` None: recorded before
        fences were, no check)."""
        if digest != self.digest:
            raise KeyReused("this Idempotency-Key was used for another request (body, route, "
                            "method or lock differ); use a new key for a new request")
        recorded: dict[str, int] = json.loads(fences) if fences else {}
        below = [(f, recorded[f.lock]) for f in self.fences
                 if f.lock in recorded and f.fence < recorded[f.lock]]
        if below:
            raise StaleReplay(below)
        return Reply(status, body, replayed=True)


@dataclass(frozen=True, slots=True)
class Keyed:
    """What the HTTP layer knows of a keyed request: the key and the request's method, path (as
    sent) and body bytes; ``once`` adds the token's fences once it is verified."""

    key: str
    method: str
    path: str
    body: bytes

    def once(self, fences: Sequence[Fence], ttl_ms: int, render: Callable[[Any], Reply]) -> Once:
        """The ``Once`` of this request under ``fences`` (lock order; the digest covers their
        locks, not their fences: a replay's fence is judged against the record's)."""
        lock = ",".join(f.lock for f in fences)
        return Once(self.key, digest(self.method, self.path, lock, self.body), tuple(fences),
                    ttl_ms, render)


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
        sa.Column("fences", sa.Text),  # JSON {lock: fence}; NULL in records older than it
        schema=schema,
    )


def add_fences_column(conn: sa.Connection, records: sa.Table) -> None:
    """Give a record table created before fences were recorded its ``fences`` column (at start,
    in the transaction that creates the tables; a no-op when it is there). PostgreSQL: ``ADD
    COLUMN IF NOT EXISTS`` (only when the catalog lacks it, so a normal start takes no ACCESS
    EXCLUSIVE lock); SQLite, which has no IF NOT EXISTS there: added if ``table_info`` lacks it."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(records.name, schema=records.schema)}
    if "fences" in present:
        return
    name = conn.dialect.identifier_preparer.format_table(records)
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS fences text"))
        return
    try:  # an error leaves SQLite's transaction open (unlike PostgreSQL's)
        conn.execute(sa.text(f"ALTER TABLE {name} ADD COLUMN fences TEXT"))
    except sa.exc.OperationalError as exc:  # another proxy on the same file added it first
        if "duplicate column" not in str(exc):
            raise
