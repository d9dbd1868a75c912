"""Lock modes on PostgreSQL: the shared-holder steps ``PostgresStore`` runs on a pooled
connection, and the state of a lock with its holders.

Each function takes a connection (autocommit) and opens its own transaction when it writes more
than one row; the rules are in ``sql_modes``' docstring. Nothing here translates errors: the
store's ``_run`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

import lockd.server.store.postgres.sql as sql
import lockd.server.store.postgres.sql_modes as q
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

__all__ = ["acquire_shared", "blockers", "blocking_holder", "client_leases", "fix_shared_until",
           "force_release", "release_shared", "renew_shared", "state"]


async def acquire_shared(conn: psycopg.AsyncConnection, p: Mapping[str, Any]) -> Grant | Holder:
    """Without a client_id, first one statement (``SHARED_FAST``). Else, or when it found an
    exclusive lease live, one transaction: lock the lock row; refused by a live exclusive lease
    (``ClientIdConflict`` if it is this client's: a retry gets only its own mode, and the
    transaction rolls back); else join the shared holders (or renew this client's shared
    lease) carrying the lock's fence (a new epoch after an unclean end: ``sql_modes``)."""
    lock = p["lock"]
    if not p["client_id"]:  # one statement, unless an exclusive lease is live
        cur = await conn.execute(q.SHARED_FAST, p)
        fast = await cur.fetchone()
        if fast is not None:
            return Grant(lock, p["lease_id"], fast[0], fast[2], fast[1], SHARED)
    async with conn.transaction():
        cur = await conn.execute(q.LOCK_ONE, p)
        row = await cur.fetchone()
        assert row is not None
        fence, live, _, owner, holder_client, ttl = row
        if live:
            if p["client_id"] and holder_client == p["client_id"]:
                raise other_mode(lock, EXCLUSIVE, SHARED)  # rolls back: nothing changed
            return Holder(lock, owner, max(1, ttl), fence, EXCLUSIVE)
        cur = await conn.execute(q.SHARED_GRANT, p)
        got = await cur.fetchone()
        assert got is not None
        return Grant(lock, got[1], got[0], got[3], got[2], SHARED)


async def renew_shared(conn: psycopg.AsyncConnection, lock: str, lease_id: str,
                       ttl_ms: int | None) -> Grant | None:
    """Renew a live shared lease (``None``: not one) in one statement that locks the lock row
    first: a lease an exclusive grant has already outlived is not renewed, whatever this
    statement's ``now()``."""
    params = {"lock": lock, "lease_id": lease_id, "ttl_ms": ttl_ms}
    cur = await conn.execute(q.SHARED_RENEW, params)
    got = await cur.fetchone()
    if got is None:
        return None
    return Grant(lock, lease_id, got[0], got[2], got[1], SHARED)


async def release_shared(conn: psycopg.AsyncConnection, lock: str, lease_id: str,
                         retried: bool) -> bool:
    """End a live shared lease, lower ``shared_until`` to the other holders' and NOTIFY. True if
    ended (or, on a retry, if the first attempt's commit ended it). The commit does not wait for
    its WAL flush, like the exclusive release (docs/stores/postgres.md "Release commits")."""
    params = {"names": [lock], "lock": lock, "lease_id": lease_id}
    async with conn.pipeline():  # one round trip: BEGIN, lock the row, release, COMMIT
        async with conn.transaction():
            await conn.execute(sql.ASYNC_COMMIT)
            await conn.execute(q.LOCK_ROWS, params)
            cur = await conn.execute(q.SHARED_RELEASE, params)
        if await cur.fetchone() is not None:
            return True
    if retried:
        cur = await conn.execute(q.SHARED_RELEASED_BY, params)
        return await cur.fetchone() is not None
    return False


async def force_release(conn: psycopg.AsyncConnection, lock: str) -> Holder | None:
    """End every live lease of ``lock`` (exclusive, or all shared holders); the one that ended
    last, or ``None``. One transaction; NOTIFYs with its commit."""
    params = {"names": [lock], "lock": lock}
    async with conn.transaction():
        cur = await conn.execute(q.LOCK_ROWS, params)
        row = await cur.fetchone()
        if row is None:
            return None
        fence = row[3]
        cur = await conn.execute(sql.FORCE_RELEASE, params)
        excl = await cur.fetchone()
        cur = await conn.execute(q.RELEASE_SHARED_ALL, params)
        shared = await cur.fetchall()
    if excl is not None:
        return Holder(lock=lock, owner=excl[1], ttl_ms=excl[2], fence=excl[0])
    if shared:
        return Holder(lock=lock, owner=shared[0][0], ttl_ms=shared[0][1], fence=fence,
                      mode=SHARED)
    return None


async def blocking_holder(conn: psycopg.AsyncConnection, p: Mapping[str, Any]) -> Holder | None:
    """After an exclusive acquire was refused: with a fresh snapshot, the blocking holder
    (exclusive, or the shared holder whose lease ends last); ``None`` if the lock is free now
    (try again). Raises ``ClientIdConflict`` if this client holds it shared: an exclusive
    retry never gets a shared lease."""
    lock = p["lock"]
    cur = await conn.execute(q.HOLDERS_ANY, {"names": [lock]})
    rows = await cur.fetchall()
    if not rows:
        return None
    client_id = p.get("client_id")
    if client_id and any(mode == SHARED and cid == client_id
                         for _, mode, _, _, _, _, cid in rows):
        raise other_mode(lock, SHARED, EXCLUSIVE)
    _, mode, fence, owner, ttl, _, _ = rows[0]
    return Holder(lock=lock, owner=owner, ttl_ms=max(1, ttl), fence=fence, mode=mode)


async def blockers(conn: psycopg.AsyncConnection, locks: Sequence[str],
                   mode_of: Callable[[str], str], lease_id: str) -> list[Holder]:
    """The ``Holder`` of every lock of ``locks`` that refuses a lease of ``lease_id`` in its
    requested mode, in name order (an exclusive lease refuses any; shared holders, the one
    whose lease ends last, refuse an exclusive request). Empty: nothing refuses now."""
    cur = await conn.execute(q.HOLDERS_ANY, {"names": list(locks)})
    found: dict[str, Holder] = {}
    for name, mode, fence, owner, ttl, lid, _ in await cur.fetchall():
        if lid == lease_id or name in found:
            continue
        if mode == EXCLUSIVE or mode_of(name) == EXCLUSIVE:
            found[name] = Holder(lock=name, owner=owner, ttl_ms=max(1, ttl), fence=fence,
                                 mode=mode)
    return [found[n] for n in locks if n in found]


async def client_leases(conn: psycopg.AsyncConnection, p: Mapping[str, Any]) -> list[str]:
    """The multi-lock leases of ``p``'s client_id holding exactly ``p``'s ``names`` in the
    modes asked for (``p["shared"]``), to renew as a retry. Raises ``ClientIdConflict`` if one
    holds every lock of them live in other modes."""
    cur = await conn.execute(q.LEASE_BY_CLIENT, p)
    found = []
    for lease_id, held_shared in await cur.fetchall():
        if set(held_shared) == set(p["shared"]):
            found.append(lease_id)
            continue
        live = await conn.execute(q.LEASE_LIVE, {"lease_id": lease_id})
        row = await live.fetchone()
        if row and row[0]:
            raise other_modes(p["names"])
    return found


async def fix_shared_until(conn: psycopg.AsyncConnection, locks: Sequence[str]) -> None:
    """Lower the locks' ``shared_until`` to their live shared holders' (one transaction, rows
    locked first): called when an exclusive request was refused but found nobody live."""
    params = {"names": list(locks)}
    async with conn.transaction():
        await conn.execute(q.LOCK_ROWS, params)
        await conn.execute(q.SHARED_UNTIL_FIX, params)


def state(row: tuple) -> LockState:
    """A ``sql_modes.STATE`` row as a ``LockState`` (owner/ttl of shared holders: the one whose
    lease ends last; ``holders`` in grant order)."""
    name, fence, owner, ttl_ms, owners, ttls = row
    if owner is not None:
        return LockState(lock=name, held=True, fence=fence, owner=owner, ttl_ms=ttl_ms,
                         mode=EXCLUSIVE, holders=(HolderView(owner, ttl_ms, EXCLUSIVE),))
    if owners:
        holders = tuple(HolderView(o, t, SHARED) for o, t in zip(owners, ttls, strict=True))
        last = max(range(len(holders)), key=lambda i: (holders[i].ttl_ms, i))
        return LockState(lock=name, held=True, fence=fence, owner=holders[last].owner,
                         ttl_ms=holders[last].ttl_ms, mode=SHARED, holders=holders)
    return LockState(lock=name, held=False, fence=fence, owner=None, ttl_ms=0)
