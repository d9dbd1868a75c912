"""Elections of the SQLite store: the leader IS the live exclusive lease of lock ``name`` (its
``locks`` row); the ``elections`` row adds the value, the pending handover and the log's last
``seq``, and ``election_log`` the log itself (the newest ``LOG_KEEP`` entries kept). Every
write is fsynced like a grant. docs/stores/sqlite.md, "Modes, semaphores, elections".
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from lockd.server.errors import LeaseLost
from lockd.server.store.values import (
    EXCLUSIVE,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    HolderView,
    not_a_leader,
)

__all__ = ["LAZY_OPS", "LOG_KEEP", "SCHEMA", "ElectionMethods"]

LOG_KEEP = 1_000
"""Log entries kept per election (the newest ones)."""

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS elections (
    name           TEXT PRIMARY KEY,
    lease_id       TEXT,
    value          TEXT NOT NULL DEFAULT '',
    handover       TEXT,
    handover_lease TEXT,
    seq            INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID
""",
    """
CREATE TABLE IF NOT EXISTS election_log (
    name  TEXT NOT NULL,
    seq   INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    owner TEXT NOT NULL,
    value TEXT NOT NULL,
    fence INTEGER NOT NULL,
    PRIMARY KEY (name, seq)
) WITHOUT ROWID
""",
)

_LOST = "the lease is not the live leader of the election (expired, released or unknown)"


def _leader(conn: sqlite3.Connection, now: int, name: str,
            lease_id: str | None = None) -> tuple[str, str, int, int]:
    """The live leader ``(lease_id, owner, fence, expires_ms)``; ``LeaseLost`` if nobody leads
    (or, with ``lease_id``, if that lease does not)."""
    row = conn.execute("SELECT lease_id, owner, fence, expires_ms FROM locks WHERE name = ?"
                       " AND lease_id IS NOT NULL AND expires_ms > ?", (name, now)).fetchone()
    if row is None or (lease_id is not None and row[0] != lease_id):
        raise LeaseLost(_LOST if lease_id is not None else f"nobody leads election {name!r}",
                        lock=name)
    return row[0], row[1], row[2], row[3]


def _append(conn: sqlite3.Connection, name: str, kind: str, owner: str, value: str,
            fence: int) -> int:
    """Append a log entry; its seq."""
    seq = conn.execute(
        "INSERT INTO elections (name, seq) VALUES (?, 1)"
        " ON CONFLICT (name) DO UPDATE SET seq = seq + 1 RETURNING seq", (name,)).fetchone()[0]
    conn.execute("INSERT INTO election_log (name, seq, kind, owner, value, fence)"
                 " VALUES (?, ?, ?, ?, ?, ?)", (name, seq, kind, owner, value, fence))
    conn.execute("DELETE FROM election_log WHERE name = ? AND seq <= ?", (name, seq - LOG_KEEP))
    return int(seq)


def _state(conn: sqlite3.Connection, now: int, name: str) -> ElectionState:
    lock = conn.execute("SELECT fence, lease_id, owner, expires_ms FROM locks WHERE name = ?",
                        (name,)).fetchone()
    row = conn.execute("SELECT lease_id, value, handover, handover_lease, seq FROM elections"
                       " WHERE name = ?", (name,)).fetchone()
    fence = lock[0] if lock is not None else 0
    lease = lock[1] if lock is not None and lock[1] is not None and lock[3] > now else None
    leader = HolderView(lock[2], lock[3] - now, EXCLUSIVE) if lease is not None else None
    if row is None:
        return ElectionState(name, leader, fence, "", 0, None)
    value = row[1] if lease is not None and row[0] == lease else ""
    # A handover stays pending for the next leader when the one asked lapsed without resigning.
    handover = row[2] if lease is None or row[3] == lease else None
    return ElectionState(name, leader, fence, value, row[4], handover)


def _campaign(conn: sqlite3.Connection, now: int, acquire: Callable[..., Grant | Holder],
              name: str, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
              value: str) -> Grant | Holder:
    if client_id:  # a retry returns only a leadership: the lease the election's value is of
        row = conn.execute(
            "SELECT l.lease_id, e.lease_id FROM locks l LEFT JOIN elections e ON e.name = l.name"
            " WHERE l.name = ? AND l.client_id = ? AND l.lease_id IS NOT NULL"
            " AND l.expires_ms > ?", (name, client_id, now)).fetchone()
        if row is not None and row[0] != row[1]:
            raise not_a_leader(name)  # (a shared lease of it: the acquire raises other_mode)
    got = acquire(conn, now, name, lease_id, ttl_ms, owner, client_id)
    if isinstance(got, Grant) and got.lease_id == lease_id:  # a new leader (not a retry)
        _append(conn, name, "leader", owner, value, got.fence)
        conn.execute("UPDATE elections SET lease_id = ?, value = ?, handover = NULL,"
                     " handover_lease = NULL WHERE name = ?", (lease_id, value, name))
    return got


def _renew(conn: sqlite3.Connection, now: int, name: str, lease_id: str,
           ttl_ms: int | None) -> tuple[Grant, str | None]:
    row = conn.execute(
        "UPDATE locks SET expires_ms = ? + coalesce(?, ttl_ms), ttl_ms = coalesce(?, ttl_ms)"
        " WHERE name = ? AND lease_id = ? AND expires_ms > ? RETURNING fence, owner, ttl_ms",
        (now, ttl_ms, ttl_ms, name, lease_id, now)).fetchone()
    if row is None:
        raise LeaseLost(_LOST, lock=name)
    asked = conn.execute("SELECT handover FROM elections WHERE name = ? AND handover_lease = ?",
                         (name, lease_id)).fetchone()
    return Grant(name, lease_id, row[0], row[2], row[1]), asked[0] if asked else None


def _resign(conn: sqlite3.Connection, now: int, name: str, lease_id: str) -> None:
    _, owner, fence, _ = _leader(conn, now, name, lease_id)
    conn.execute("UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0,"
                 " writer_open = 0 WHERE name = ?", (name,))  # a clean release
    _append(conn, name, "resign", owner, "", fence)
    conn.execute("UPDATE elections SET lease_id = NULL, value = '', handover = NULL,"
                 " handover_lease = NULL WHERE name = ?", (name,))


def _proclaim(conn: sqlite3.Connection, now: int, name: str, lease_id: str,
              value: str) -> ElectionState:
    _, owner, fence, _ = _leader(conn, now, name, lease_id)
    _append(conn, name, "proclaim", owner, value, fence)
    conn.execute("UPDATE elections SET lease_id = ?, value = ? WHERE name = ?",
                 (lease_id, value, name))
    return _state(conn, now, name)


def _handover(conn: sqlite3.Connection, now: int, name: str, target: str) -> ElectionState:
    lease_id = _leader(conn, now, name)[0]
    conn.execute(
        "INSERT INTO elections (name, handover, handover_lease) VALUES (?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET handover = excluded.handover,"
        " handover_lease = excluded.handover_lease", (name, target, lease_id))
    return _state(conn, now, name)


def _log(conn: sqlite3.Connection, now: int, name: str, after: int,
         limit: int) -> list[ElectionEvent]:
    return [ElectionEvent(*row) for row in conn.execute(
        "SELECT seq, kind, owner, value, fence FROM election_log WHERE name = ? AND seq > ?"
        " ORDER BY seq LIMIT ?", (name, after, limit))]


LAZY_OPS = frozenset({_state, _log})
"""Reads: their batches need no fsync of their own (docs/stores/sqlite.md, "Durable grants")."""


class ElectionMethods:
    """The ``Store`` protocol's election methods, mixed into ``SqliteStore`` (which supplies
    ``_call``, ``_notify`` and ``_acquire_op``: its exclusive-acquire operation, so a campaign
    is the very same grant as ``acquire``)."""

    _call: Callable[..., Awaitable[Any]]
    _notify: Callable[[str], None]
    _acquire_op: Callable[..., Grant | Holder]

    async def elect_campaign(self, name: str, *, lease_id: str, ttl_ms: int, owner: str,
                             client_id: str | None, value: str) -> Grant | Holder:
        """See ``ElectionStore.elect_campaign``; notifies ``name`` when a new leader was granted."""
        got = await self._call(_campaign, self._acquire_op, name, lease_id, ttl_ms, owner,
                               client_id, value)
        if isinstance(got, Grant) and got.lease_id == lease_id:
            self._notify(name)
        return got

    async def elect_renew(self, name: str, lease_id: str,
                          ttl_ms: int | None) -> tuple[Grant, str | None]:
        """See ``ElectionStore.elect_renew``: the handover target asked of THIS lease, if any."""
        return await self._call(_renew, name, lease_id, ttl_ms)

    async def elect_resign(self, name: str, lease_id: str) -> None:
        """See ``ElectionStore.elect_resign``. Raises ``LeaseLost``."""
        await self._call(_resign, name, lease_id)
        self._notify(name)

    async def elect_proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """See ``ElectionStore.elect_proclaim``. Raises ``LeaseLost``."""
        state = await self._call(_proclaim, name, lease_id, value)
        self._notify(name)
        return state

    async def elect_handover(self, name: str, target: str) -> ElectionState:
        """See ``ElectionStore.elect_handover``. Raises ``LeaseLost`` when nobody leads."""
        state = await self._call(_handover, name, target)
        self._notify(name)
        return state

    async def elect_get(self, name: str) -> ElectionState:
        """See ``ElectionStore.elect_get``."""
        return await self._call(_state, name)

    async def elect_log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        """See ``ElectionStore.elect_log`` (the newest ``LOG_KEEP`` entries are kept)."""
        return await self._call(_log, name, after, limit)
