"""Shared leases of the SQLite store: the ``shared`` table (one row per lock and lease, in grant
order) beside the exclusive lease in the lock's ``locks`` row, and a lock's state with all its
holders. A shared grant carries the lock's fence, raised once first after an unclean end (the
new epoch). Run on the store thread like every operation. docs/stores/sqlite.md, "Modes".
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from lockd.server.errors import LeaseLost
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    Grant,
    Holder,
    HolderView,
    LockState,
    other_mode,
    other_modes,
)

__all__ = ["SCHEMA", "force_shared", "grant_shared", "held_by", "holders_of", "lock_state",
           "modes_of", "multi_retry", "release_shared", "renew_shared", "shared_blockers", "shared_check"]

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS shared (
    id         INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    lease_id   TEXT NOT NULL,
    owner      TEXT NOT NULL DEFAULT '',
    client_id  TEXT,
    fence      INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    UNIQUE (name, lease_id)
)
""",
    "CREATE INDEX IF NOT EXISTS shared_by_lease ON shared (lease_id)",
    "CREATE INDEX IF NOT EXISTS leases_by_client ON leases (client_id)",
)
"""The shared-lease table (and the index ``multi_retry`` looks a client_id up by). ``id`` (rowid) orders a lock's holders by grant; no AUTOINCREMENT
is needed: a new rowid is above every row present, so live holders keep their grant order."""

_LOST = "the lease is not live (expired, released or unknown)"


def _marks(n: int) -> str:
    return ",".join("?" * n)


def shared_check(conn: sqlite3.Connection, now: int, lock: str, mode: str, ttl_ms: int,
                 client_id: str | None) -> Grant | Holder | None:
    """Before granting ``lock`` (no live exclusive lease holds it): a live shared lease of the
    same non-empty ``client_id`` is returned with its expiry pushed to ``ttl_ms`` from now (a
    retried SHARED acquire; an exclusive one raises ``ClientIdConflict``, nothing changed); an
    EXCLUSIVE request is refused with the shared holder whose lease ends last; ``None``: go
    ahead and grant."""
    rows = conn.execute(
        "SELECT lease_id, owner, client_id, fence, expires_ms FROM shared WHERE name = ?"
        " ORDER BY id", (lock,)).fetchall()
    if not rows:
        return None
    live = [r for r in rows if r[4] > now]
    if len(live) != len(rows):
        conn.execute("DELETE FROM shared WHERE name = ? AND expires_ms <= ?", (lock, now))
    if client_id:
        for lease_id, owner, live_client, fence, _ in live:
            if live_client == client_id:
                if mode != SHARED:
                    raise other_mode(lock, SHARED, mode)
                conn.execute("UPDATE shared SET expires_ms = ?, ttl_ms = ? WHERE name = ?"
                             " AND lease_id = ?", (now + ttl_ms, ttl_ms, lock, lease_id))
                return Grant(lock, lease_id, fence, ttl_ms, owner, SHARED)
    if mode != SHARED and live:
        _, owner, _, fence, expires = max(live, key=lambda r: r[4])
        return Holder(lock, owner, expires - now, fence, SHARED)
    return None


def grant_shared(conn: sqlite3.Connection, now: int, lock: str, lease_id: str, ttl_ms: int,
                 owner: str, client_id: str | None) -> Grant:
    """Install a shared lease of ``lock`` (no live exclusive lease holds it) carrying the lock's
    fence: raised by one first if the last exclusive lease ended without a clean release (a
    new epoch: the lapsed writer's fence is below it), else the current one."""
    fence = conn.execute(
        "INSERT INTO locks (name, fence, writer_open) VALUES (?, 0, 0) ON CONFLICT (name) DO"
        " UPDATE SET fence = fence + 1, writer_open = 0 WHERE writer_open"
        " AND NOT (lease_id IS NOT NULL AND expires_ms > ?) RETURNING fence",
        (lock, now)).fetchone()
    if fence is None:  # no new epoch: the current fence
        fence = conn.execute("SELECT fence FROM locks WHERE name = ?", (lock,)).fetchone()
    fence = fence[0]
    conn.execute("DELETE FROM shared WHERE name = ? AND expires_ms <= ?", (lock, now))
    conn.execute(
        "INSERT INTO shared (name, lease_id, owner, client_id, fence, expires_ms, ttl_ms)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (lock, lease_id, owner, client_id, fence, now + ttl_ms, ttl_ms))
    return Grant(lock, lease_id, fence, ttl_ms, owner, SHARED)


def renew_shared(conn: sqlite3.Connection, now: int, lock: str, lease_id: str,
                 ttl_ms: int | None) -> Grant:
    """``renew`` of a shared lease (``None``: its own TTL). Raises ``LeaseLost``."""
    row = conn.execute(
        "UPDATE shared SET expires_ms = ? + coalesce(?, ttl_ms), ttl_ms = coalesce(?, ttl_ms)"
        " WHERE name = ? AND lease_id = ? AND expires_ms > ? RETURNING fence, owner, ttl_ms",
        (now, ttl_ms, ttl_ms, lock, lease_id, now)).fetchone()
    if row is None:
        raise LeaseLost(_LOST, lock=lock)
    return Grant(lock, lease_id, row[0], row[2], row[1], SHARED)


def release_shared(conn: sqlite3.Connection, now: int, lock: str, lease_id: str) -> None:
    """End a live shared lease. Raises ``LeaseLost`` (an expired one cannot be released)."""
    cur = conn.execute("DELETE FROM shared WHERE name = ? AND lease_id = ? AND expires_ms > ?",
                       (lock, lease_id, now))
    if cur.rowcount != 1:
        raise LeaseLost(_LOST, lock=lock)


def force_shared(conn: sqlite3.Connection, now: int, lock: str) -> Holder | None:
    """End every live shared lease of ``lock``; the one that would have ended last, or
    ``None`` if there was none."""
    ended = conn.execute("DELETE FROM shared WHERE name = ? RETURNING owner, fence, expires_ms",
                         (lock,)).fetchall()
    live = [r for r in ended if r[2] > now]
    if not live:
        return None
    owner, fence, expires = max(live, key=lambda r: r[2])
    return Holder(lock, owner, expires - now, fence, SHARED)


def holders_of(conn: sqlite3.Connection, now: int,
               names: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    """The live shared holders ``(owner, expires_ms)`` of each of ``names``, in grant order
    (names without any are left out)."""
    found: dict[str, list[tuple[str, int]]] = {}
    if not names:
        return found
    for name, owner, expires in conn.execute(
            f"SELECT name, owner, expires_ms FROM shared WHERE name IN ({_marks(len(names))})"
            " AND expires_ms > ? ORDER BY id", (*names, now)):
        found.setdefault(name, []).append((owner, expires))
    return found


def shared_blockers(conn: sqlite3.Connection, now: int,
                    names: Sequence[str]) -> dict[str, Holder]:
    """For each of ``names`` with live shared holders: the one whose lease ends last."""
    blockers: dict[str, Holder] = {}
    if not names:
        return blockers
    for name, owner, fence, expires in conn.execute(
            f"SELECT name, owner, fence, expires_ms FROM shared WHERE name IN"
            f" ({_marks(len(names))}) AND expires_ms > ? ORDER BY expires_ms", (*names, now)):
        blockers[name] = Holder(name, owner, expires - now, fence, SHARED)  # last one wins
    return blockers


def held_by(conn: sqlite3.Connection, now: int, names: Sequence[str],
            lease_id: str) -> dict[str, tuple[int, str]]:
    """Which of ``names`` the lease ``lease_id`` holds live: name -> (fence, mode)."""
    held = {n: (f, EXCLUSIVE) for n, f in conn.execute(
        f"SELECT name, fence FROM locks WHERE name IN ({_marks(len(names))})"
        " AND lease_id = ? AND expires_ms > ?", (*names, lease_id, now))}
    held.update((n, (f, SHARED)) for n, f in conn.execute(
        f"SELECT name, fence FROM shared WHERE name IN ({_marks(len(names))})"
        " AND lease_id = ? AND expires_ms > ?", (*names, lease_id, now)))
    return held


def multi_retry(conn: sqlite3.Connection, now: int, locks: Sequence[str], client_id: str,
                wanted: Mapping[str, str]) -> str | None:
    """The live multi-lock lease of ``client_id`` holding exactly ``locks`` (every one of them
    still live) in the ``wanted`` modes (name -> mode), or ``None``. Raises
    ``ClientIdConflict`` if that lease holds them in other modes."""
    for lease_id, names in conn.execute(
            "SELECT lease_id, locks FROM leases WHERE client_id = ? AND expires_ms > ?",
            (client_id, now)).fetchall():
        if json.loads(names) != list(locks):
            continue
        held = held_by(conn, now, locks, lease_id)
        if len(held) == len(locks):
            if any(held[n][1] != wanted[n] for n in locks):
                raise other_modes(locks)
            return str(lease_id)
    return None


def modes_of(held: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """A multi-lock lease's ``modes``: ``None`` when every lock is exclusive (name -> mode)."""
    modes = dict(held)
    return modes if any(m == SHARED for m in modes.values()) else None


def lock_state(now: int, name: str, fence: int, lease_id: str | None, owner: str, expires: int,
               shared: Sequence[tuple[str, int]] = ()) -> LockState:
    """A lock's state from its ``locks`` row and its live shared holders (grant order)."""
    if lease_id is not None and expires > now:
        return LockState(name, True, fence, owner, expires - now, EXCLUSIVE,
                         (HolderView(owner, expires - now, EXCLUSIVE),))
    if shared:
        last_owner, last_expires = max(shared, key=lambda h: h[1])
        return LockState(name, True, fence, last_owner, last_expires - now, SHARED,
                         tuple(HolderView(o, e - now, SHARED) for o, e in shared))
    return LockState(name, False, fence, None, 0)
