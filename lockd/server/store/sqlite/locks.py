"""Locks of the SQLite store: single leases (the exclusive one in its ``locks`` row; shared
ones: ``modes``) and multi-lock leases (a ``leases`` row naming the set), as operations run on
the store thread inside a batch's transaction (``now``: lockd-clock milliseconds). They read
before they write, so one that raises has changed nothing. docs/stores/sqlite.md.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import lockd.server.store.sqlite.modes as modes
from lockd.server.errors import LeaseLost
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    other_mode,
)

__all__ = ["LAZY_OPS", "SCHEMA", "LockMethods", "upgrade"]

_TABLES = (
    """
CREATE TABLE IF NOT EXISTS locks (
    name        TEXT PRIMARY KEY,
    fence       INTEGER NOT NULL,
    lease_id    TEXT,
    owner       TEXT NOT NULL DEFAULT '',
    client_id   TEXT,
    expires_ms  INTEGER NOT NULL DEFAULT 0,
    ttl_ms      INTEGER NOT NULL DEFAULT 0,
    writer_open INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID
""",
    # Multi-lock leases: the set of locks each one holds (its lock rows carry its lease_id).
    """
CREATE TABLE IF NOT EXISTS leases (
    lease_id   TEXT PRIMARY KEY,
    locks      TEXT NOT NULL,
    owner      TEXT NOT NULL DEFAULT '',
    client_id  TEXT,
    expires_ms INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL
) WITHOUT ROWID
""",
)
SCHEMA = (*_TABLES, *modes.SCHEMA)
"""The lock and multi-lock lease tables, then the shared holders' (``modes``). ``writer_open``:
1 while the exclusive lease of ``fence`` has not ended by a clean release (live, expired or
force-released), 0 once released cleanly or once a shared grant started a new epoch
(``modes.grant_shared``)."""

_WRITER_OPEN = "ALTER TABLE locks ADD COLUMN writer_open INTEGER NOT NULL DEFAULT 1"


def upgrade(conn: sqlite3.Connection) -> None:
    """A file of an older version gets ``writer_open`` with 1 (a shared grant may then raise
    once more than needed: never less)."""
    if "writer_open" not in {row[1] for row in conn.execute("PRAGMA table_info(locks)")}:
        conn.execute(_WRITER_OPEN)


def _acquire(conn: sqlite3.Connection, now: int, lock: str, lease_id: str, ttl_ms: int,
             owner: str, client_id: str | None, mode: str = EXCLUSIVE) -> Grant | Holder:
    # row[5]: whether any shared lease row exists (a shared grant creates the lock row first)
    row = conn.execute(
        "SELECT fence, lease_id, owner, client_id, expires_ms,"
        " EXISTS (SELECT 1 FROM shared WHERE shared.name = locks.name) FROM locks WHERE name = ?",
        (lock,)
    ).fetchone()
    if row is not None and row[1] is not None and row[4] > now:
        fence, live_id, live_owner, live_client, expires = row[:5]
        if client_id and live_client == client_id:
            if mode != EXCLUSIVE:  # a retry answers only the mode the store recorded
                raise other_mode(lock, EXCLUSIVE, mode)
            conn.execute("UPDATE locks SET expires_ms = ?, ttl_ms = ? WHERE name = ?",
                         (now + ttl_ms, ttl_ms, lock))
            return Grant(lock, live_id, fence, ttl_ms, live_owner)
        return Holder(lock, live_owner, expires - now, fence)
    if row is not None and row[5]:
        shared = modes.shared_check(conn, now, lock, mode, ttl_ms, client_id)
        if shared is not None:  # a client_id retry of a shared lease, or shared holders block
            return shared
    if mode == SHARED:  # the first one after an unclean end raises the fence (a new epoch)
        return modes.grant_shared(conn, now, lock, lease_id, ttl_ms, owner, client_id)
    fence = (row[0] if row is not None else 0) + 1
    conn.execute(
        "INSERT INTO locks (name, fence, lease_id, owner, client_id, expires_ms, ttl_ms,"
        " writer_open) VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (name) DO UPDATE SET"
        " fence = excluded.fence, lease_id = excluded.lease_id, owner = excluded.owner,"
        " client_id = excluded.client_id, expires_ms = excluded.expires_ms,"
        " ttl_ms = excluded.ttl_ms, writer_open = 1",
        (lock, fence, lease_id, owner, client_id, now + ttl_ms, ttl_ms),
    )
    return Grant(lock, lease_id, fence, ttl_ms, owner)


def _renew(conn: sqlite3.Connection, now: int, lock: str, lease_id: str,
           ttl_ms: int | None) -> Grant:
    # ttl_ms None: the lease's own TTL (the last one granted or renewed with).
    row = conn.execute(
        "UPDATE locks SET expires_ms = ? + coalesce(?, ttl_ms), ttl_ms = coalesce(?, ttl_ms)"
        " WHERE name = ? AND lease_id = ? AND expires_ms > ? RETURNING fence, owner, ttl_ms",
        (now, ttl_ms, ttl_ms, lock, lease_id, now),
    ).fetchone()
    if row is None:
        return modes.renew_shared(conn, now, lock, lease_id, ttl_ms)  # or LeaseLost
    return Grant(lock, lease_id, row[0], row[2], row[1])


def _release(conn: sqlite3.Connection, now: int, lock: str, lease_id: str) -> None:
    cur = conn.execute(  # a clean release: the writer is done (writer_open = 0)
        "UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0,"
        " writer_open = 0 WHERE name = ? AND lease_id = ? AND expires_ms > ?",
        (lock, lease_id, now),
    )
    if cur.rowcount != 1:
        modes.release_shared(conn, now, lock, lease_id)  # or LeaseLost


def _force_release(conn: sqlite3.Connection, now: int, lock: str) -> Holder | None:
    row = conn.execute(
        "SELECT fence, owner, expires_ms FROM locks"
        " WHERE name = ? AND lease_id IS NOT NULL AND expires_ms > ?", (lock, now)
    ).fetchone()
    if row is None:
        return modes.force_shared(conn, now, lock)  # every shared holder, if any
    conn.execute(  # no clean release: writer_open stays 1, the next shared grant raises
        "UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0"
        " WHERE name = ?", (lock,)
    )
    return Holder(lock, row[1], row[2] - now, row[0])


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _acquire_many(conn: sqlite3.Connection, now: int, locks: tuple[str, ...], lease_id: str,
                  ttl_ms: int, owner: str, client_id: str | None,
                  wanted: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
    # Reads first, writes only once every lock is known to be free: nothing to undo.
    mode_of = {n: SHARED if wanted and wanted.get(n) == SHARED else EXCLUSIVE for n in locks}
    rows = {r[0]: r[1:] for r in conn.execute(
        f"SELECT name, fence, lease_id, owner, expires_ms FROM locks WHERE name IN"
        f" ({_marks(len(locks))})", locks)}
    live = sorted((n, r) for n, r in rows.items() if r[1] is not None and r[3] > now)
    if client_id and (held_id := modes.multi_retry(conn, now, locks, client_id,
                                                   mode_of)) is not None:
        return _renew_many(conn, now, held_id, ttl_ms)
    blocked = {n: Holder(n, r[2], r[3] - now, r[0]) for n, r in live}
    blocked.update(modes.shared_blockers(
        conn, now, [n for n in locks if mode_of[n] == EXCLUSIVE and n not in blocked]))
    if blocked:
        return [blocked[n] for n in sorted(blocked)]
    conn.execute("DELETE FROM leases WHERE expires_ms <= ?", (now,))
    fences: dict[str, int] = {}
    for name in locks:
        if mode_of[name] == SHARED:  # the single-lock rule, per lock (a new epoch or not)
            fences[name] = modes.grant_shared(conn, now, name, lease_id, ttl_ms, owner,
                                              None).fence
            continue
        fence = (rows[name][0] if name in rows else 0) + 1
        conn.execute(
            "INSERT INTO locks (name, fence, lease_id, owner, client_id, expires_ms, ttl_ms,"
            " writer_open) VALUES (?, ?, ?, ?, NULL, ?, ?, 1) ON CONFLICT (name) DO UPDATE SET"
            " fence = excluded.fence, lease_id = excluded.lease_id, owner = excluded.owner,"
            " client_id = NULL, expires_ms = excluded.expires_ms, ttl_ms = excluded.ttl_ms,"
            " writer_open = 1",
            (name, fence, lease_id, owner, now + ttl_ms, ttl_ms),
        )
        fences[name] = fence
    conn.execute(
        "INSERT INTO leases (lease_id, locks, owner, client_id, expires_ms, ttl_ms)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (lease_id, json.dumps(list(locks)), owner, client_id, now + ttl_ms, ttl_ms),
    )
    return MultiGrant(lease_id, fences, ttl_ms, owner, modes.modes_of(mode_of.items()))


def _lease_row(conn: sqlite3.Connection, lease_id: str) -> tuple[list[str], str, int]:
    row = conn.execute("SELECT locks, owner, ttl_ms FROM leases WHERE lease_id = ?",
                       (lease_id,)).fetchone()
    if row is None:
        raise LeaseLost("the lease is not live (expired, released or unknown)")
    return json.loads(row[0]), row[1], row[2]


def _renew_many(conn: sqlite3.Connection, now: int, lease_id: str,
                ttl_ms: int | None) -> MultiGrant:
    names, owner, own_ttl = _lease_row(conn, lease_id)
    ttl = own_ttl if ttl_ms is None else ttl_ms
    held = modes.held_by(conn, now, names, lease_id)  # name -> (fence, mode)
    if len(held) != len(names):  # checked before writing: nothing to undo
        raise LeaseLost("the lease is not live (expired, released or unknown)")
    conn.execute(f"UPDATE locks SET expires_ms = ?, ttl_ms = ? WHERE name IN"
                 f" ({_marks(len(names))}) AND lease_id = ?", (now + ttl, ttl, *names, lease_id))
    if any(mode == SHARED for _, mode in held.values()):
        conn.execute("UPDATE shared SET expires_ms = ?, ttl_ms = ? WHERE lease_id = ?",
                     (now + ttl, ttl, lease_id))
    conn.execute("UPDATE leases SET expires_ms = ?, ttl_ms = ? WHERE lease_id = ?",
                 (now + ttl, ttl, lease_id))
    return MultiGrant(lease_id, {n: held[n][0] for n in names}, ttl, owner,
                      modes.modes_of((n, held[n][1]) for n in names))


def _release_many(conn: sqlite3.Connection, now: int,
                  lease_id: str) -> tuple[tuple[str, ...], bool]:
    """(names freed, whether the whole set was live)."""
    row = conn.execute("SELECT locks FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
    if row is None:
        return (), False
    names = json.loads(row[0])
    freed = conn.execute(  # a clean release of each lock still held (writer_open = 0)
        "UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0,"
        f" writer_open = 0 WHERE name IN ({_marks(len(names))}) AND lease_id = ?"
        " AND expires_ms > ? RETURNING name", (*names, lease_id, now)).fetchall()
    freed += [r[:1] for r in conn.execute(  # its shared part (a multi lease id is never reused)
        "DELETE FROM shared WHERE lease_id = ? RETURNING name, expires_ms",
        (lease_id,)).fetchall() if r[1] > now]
    conn.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
    return tuple(sorted(r[0] for r in freed)), len(freed) == len(names)


def _get(conn: sqlite3.Connection, now: int, lock: str) -> LockState:
    row = conn.execute(
        "SELECT fence, lease_id, owner, expires_ms FROM locks WHERE name = ?", (lock,)
    ).fetchone()
    if row is None:
        return LockState(lock, False, 0, None, 0)
    return modes.lock_state(now, lock, *row, modes.holders_of(conn, now, [lock]).get(lock, ()))


def _list(conn: sqlite3.Connection, now: int, prefix: str, limit: int,
          after: str | None) -> list[LockState]:
    where, params = [], []
    if prefix:
        # Every name starting with prefix sorts in [prefix, prefix with its last char + 1).
        where.append("name >= ? AND name < ?")
        params += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
    if after is not None:
        where.append("name > ?")
        params.append(after)
    sql = "SELECT name, fence, lease_id, owner, expires_ms FROM locks"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = conn.execute(sql + " ORDER BY name LIMIT ?", (*params, limit)).fetchall()
    shared = modes.holders_of(conn, now, [row[0] for row in rows])
    return [modes.lock_state(now, *row, shared.get(row[0], ())) for row in rows]


LAZY_OPS = frozenset({_release, _release_many, _force_release, _get, _list})
"""Operations whose commit need not be fsynced before the caller hears of it
(docs/stores/sqlite.md, "Durable grants"): undoing one by a power loss only delays a grant."""


class LockMethods:
    """The ``LockStore`` methods of ``SqliteStore`` (which supplies ``_call``: run one
    operation in the store's next group-commit transaction, and ``_notify``)."""

    _call: Callable[..., Awaitable[Any]]
    _notify: Callable[[str], None]

    _acquire_op = staticmethod(_acquire)
    """The exclusive grant, for a campaign to be the very same grant (``elections``)."""

    async def acquire(self, lock: str, *, lease_id: str, ttl_ms: int, owner: str,
                      client_id: str | None, mode: str = EXCLUSIVE) -> Grant | Holder:
        return await self._call(_acquire, lock, lease_id, ttl_ms, owner, client_id, mode)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        return await self._call(_renew, lock, lease_id, ttl_ms)

    async def release(self, lock: str, lease_id: str) -> None:
        await self._call(_release, lock, lease_id)
        self._notify(lock)

    async def force_release(self, lock: str) -> Holder | None:
        ended = await self._call(_force_release, lock)
        if ended is not None:
            self._notify(lock)
        return ended

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None,
                           modes: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
        """One operation of one group-commit transaction."""
        return await self._call(_acquire_many, locks, lease_id, ttl_ms, owner, client_id, modes)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        return await self._call(_renew_many, lease_id, ttl_ms)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        freed, whole = await self._call(_release_many, lease_id)
        for lock in freed:
            self._notify(lock)
        if not whole:
            raise LeaseLost("the lease is not live (expired, released or unknown)")
        return freed

    async def get(self, lock: str) -> LockState:
        return await self._call(_get, lock)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        return await self._call(_list, prefix, limit, after)
