"""Semaphores of the SQLite store: a ``semaphores`` row per semaphore (its limit and fence
counter, never deleted) and a ``permits`` row per occupied slot; a grant takes the lowest slot
no live permit holds. docs/stores/sqlite.md, "Modes, semaphores, elections".
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from lockd.server.errors import LeaseLost, LimitMismatch
from lockd.server.store.values import Permit, SemFull, SemGrant, SemState, sem_key

__all__ = ["LAZY_OPS", "SCHEMA", "SemaphoreMethods"]

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS semaphores (
    name  TEXT PRIMARY KEY,
    lim   INTEGER NOT NULL,
    fence INTEGER NOT NULL
) WITHOUT ROWID
""",
    """
CREATE TABLE IF NOT EXISTS permits (
    name       TEXT NOT NULL,
    slot       INTEGER NOT NULL,
    lease_id   TEXT NOT NULL,
    owner      TEXT NOT NULL DEFAULT '',
    client_id  TEXT,
    fence      INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    PRIMARY KEY (name, slot)
) WITHOUT ROWID
""",
)

_LOST = "the permit is not live (expired, released or unknown)"


def _limit_and_fence(conn: sqlite3.Connection, name: str) -> tuple[int, int]:
    row = conn.execute("SELECT lim, fence FROM semaphores WHERE name = ?", (name,)).fetchone()
    return (row[0], row[1]) if row is not None else (0, 0)


def _sem_acquire(conn: sqlite3.Connection, now: int, name: str, limit: int, lease_id: str,
                 ttl_ms: int, owner: str, client_id: str | None) -> SemGrant | SemFull:
    current, fence = _limit_and_fence(conn, name)
    live = conn.execute(
        "SELECT slot, lease_id, owner, client_id, fence, expires_ms FROM permits"
        " WHERE name = ? AND expires_ms > ? ORDER BY slot", (name, now)).fetchall()
    if client_id:
        for slot, live_id, live_owner, live_client, live_fence, _ in live:
            if live_client == client_id:  # a retried acquire: the same permit, expiry pushed
                conn.execute("UPDATE permits SET expires_ms = ?, ttl_ms = ? WHERE name = ?"
                             " AND slot = ?", (now + ttl_ms, ttl_ms, name, slot))
                return SemGrant(name, live_id, live_fence, slot, current, ttl_ms, live_owner)
    if live and current != limit:
        raise LimitMismatch(
            f"semaphore {name!r} has {len(live)} live permit(s) under limit {current}, "
            f"not {limit}", limit=current)
    if len(live) >= limit:
        return SemFull(name, limit, min((r[5] for r in live), default=now) - now,
                       tuple(r[2] for r in live))
    taken = {r[0] for r in live}
    slot = next(s for s in range(limit) if s not in taken)
    fence += 1
    conn.execute(
        "INSERT INTO semaphores (name, lim, fence) VALUES (?, ?, ?) ON CONFLICT (name)"
        " DO UPDATE SET lim = excluded.lim, fence = excluded.fence", (name, limit, fence))
    conn.execute("DELETE FROM permits WHERE name = ? AND expires_ms <= ?", (name, now))
    conn.execute(
        "INSERT INTO permits (name, slot, lease_id, owner, client_id, fence, expires_ms, ttl_ms)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (name, slot, lease_id, owner, client_id, fence, now + ttl_ms, ttl_ms))
    return SemGrant(name, lease_id, fence, slot, limit, ttl_ms, owner)


def _sem_renew(conn: sqlite3.Connection, now: int, name: str, lease_id: str,
               ttl_ms: int | None) -> SemGrant:
    row = conn.execute(
        "UPDATE permits SET expires_ms = ? + coalesce(?, ttl_ms), ttl_ms = coalesce(?, ttl_ms)"
        " WHERE name = ? AND lease_id = ? AND expires_ms > ?"
        " RETURNING slot, fence, owner, ttl_ms",
        (now, ttl_ms, ttl_ms, name, lease_id, now)).fetchone()
    if row is None:
        raise LeaseLost(_LOST)
    slot, fence, owner, ttl = row
    return SemGrant(name, lease_id, fence, slot, _limit_and_fence(conn, name)[0], ttl, owner)


def _sem_release(conn: sqlite3.Connection, now: int, name: str, lease_id: str) -> None:
    cur = conn.execute("DELETE FROM permits WHERE name = ? AND lease_id = ? AND expires_ms > ?",
                       (name, lease_id, now))
    if cur.rowcount != 1:
        raise LeaseLost(_LOST)


def _sem_get(conn: sqlite3.Connection, now: int, name: str) -> SemState:
    limit, fence = _limit_and_fence(conn, name)
    permits = tuple(Permit(owner, slot, expires - now, pfence) for slot, owner, pfence, expires
                    in conn.execute("SELECT slot, owner, fence, expires_ms FROM permits"
                                    " WHERE name = ? AND expires_ms > ? ORDER BY slot",
                                    (name, now)))
    return SemState(name, limit, fence, permits)


LAZY_OPS = frozenset({_sem_release, _sem_get})
"""Operations whose commit need not be fsynced before the caller hears of it (see
docs/stores/sqlite.md, "Durable grants"): a permit release undone by a power loss only delays the next
grant of its slot."""


class SemaphoreMethods:
    """The ``Store`` protocol's semaphore methods, mixed into ``SqliteStore`` (which supplies
    ``_call``: run one operation in the store's next group-commit transaction, and
    ``_notify``: tell the release listeners)."""

    _call: Callable[..., Awaitable[Any]]
    _notify: Callable[[str], None]

    async def sem_acquire(self, name: str, *, limit: int, lease_id: str, ttl_ms: int,
                          owner: str, client_id: str | None) -> SemGrant | SemFull:
        """See ``SemaphoreStore.sem_acquire``. Raises ``LimitMismatch``."""
        return await self._call(_sem_acquire, name, limit, lease_id, ttl_ms, owner, client_id)

    async def sem_renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        """See ``SemaphoreStore.sem_renew``. Raises ``LeaseLost``."""
        return await self._call(_sem_renew, name, lease_id, ttl_ms)

    async def sem_release(self, name: str, lease_id: str) -> None:
        """End a live permit and notify ``sem_key(name)``. Raises ``LeaseLost``."""
        await self._call(_sem_release, name, lease_id)
        self._notify(sem_key(name))

    async def sem_get(self, name: str) -> SemState:
        """See ``SemaphoreStore.sem_get``."""
        return await self._call(_sem_get, name)
