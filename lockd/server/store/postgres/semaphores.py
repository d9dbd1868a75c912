"""Semaphores on PostgreSQL: the ``sem_*`` methods of ``PostgresStore`` (a mixin).

A grant is one transaction on the locked semaphore row (limit, fence counter): first the common
case in one round trip (the lowest free slot, ``sql_sem.SEM_GRANT_FREE``); else read the live
permits, answer a retry of this client, refuse a mismatched limit or a full semaphore, else take
the lowest free slot with the next fence. Renew and release are one statement each. The rules
that keep at most ``limit`` permits live are in ``sql_sem``' docstring.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

import lockd.server.store.postgres.sql_sem as q
from lockd.server.errors import LeaseLost, LimitMismatch, StoreUnavailable
from lockd.server.store.values import Permit, SemFull, SemGrant, SemState

__all__ = ["SemaphoreOps"]


class _Taken(Exception):
    """Internal: the chosen slot's row turned out live; roll back and look again."""


class SemaphoreOps:
    """``SemaphoreStore.sem_acquire`` / ``sem_renew`` / ``sem_release`` / ``sem_get`` on ``self._run``."""

    _run: Callable[..., Awaitable[Any]]

    async def sem_acquire(
        self, name: str, *, limit: int, lease_id: str, ttl_ms: int, owner: str,
        client_id: str | None
    ) -> SemGrant | SemFull:
        """See ``SemaphoreStore.sem_acquire``. Raises ``LimitMismatch`` while live permits hold another
        limit."""
        p = {"name": name, "limit": int(limit), "lease_id": lease_id, "ttl_ms": int(ttl_ms),
             "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> SemGrant | SemFull:
            got = await _grant_free(conn, p)
            if got is not None:
                return got
            for _ in range(4):
                try:
                    return await _grant(conn, p)
                except _Taken:
                    continue
            raise StoreUnavailable("PostgreSQL store: semaphore slots kept changing hands")

        return await self._run(op, retry=True)

    async def sem_renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        """See ``SemaphoreStore.sem_renew``. Raises ``LeaseLost``."""
        p = {"name": name, "lease_id": lease_id, "ttl_ms": None if ttl_ms is None else int(ttl_ms)}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> SemGrant:
            cur = await conn.execute(q.SEM_RENEW, p)
            row = await cur.fetchone()
            if row is None:
                raise LeaseLost(f"permit of semaphore {name!r} is not live", semaphore=name)
            fence, slot, lim, owner, ttl = row
            return SemGrant(name, lease_id, fence, slot, lim, ttl, owner)

        return await self._run(op, retry=True)

    async def sem_release(self, name: str, lease_id: str) -> None:
        """See ``SemaphoreStore.sem_release``: one statement that ends the permit and NOTIFYs
        ``sem_key(name)``. Raises ``LeaseLost``."""
        p = {"name": name, "lease_id": lease_id}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            cur = await conn.execute(q.SEM_RELEASE, p)
            if await cur.fetchone() is not None:
                return
            if retried:  # did the first attempt's commit end it?
                cur = await conn.execute(q.SEM_RELEASED_BY, p)
                if await cur.fetchone() is not None:
                    return
            raise LeaseLost(f"permit of semaphore {name!r} is not live", semaphore=name)

        await self._run(op, retry=True)

    async def sem_get(self, name: str) -> SemState:
        """See ``SemaphoreStore.sem_get``."""
        p = {"name": name}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> SemState:
            cur = await conn.execute(q.SEM_GET, p)
            row = await cur.fetchone()
            if row is None:
                return SemState(name, 0, 0, ())
            cur = await conn.execute(q.SEM_PERMITS, p)
            permits = tuple(Permit(o, s, t, f) for o, s, t, f in await cur.fetchall())
            return SemState(name, row[0], row[1], permits)

        if "\x00" in name:
            return SemState(name, 0, 0, ())
        return await self._run(op, retry=True)


async def _grant_free(conn: psycopg.AsyncConnection, p: dict[str, Any]) -> SemGrant | None:
    """The common grant in one round trip (BEGIN, lock the semaphore row, take the lowest free
    slot, COMMIT): the row stays locked only while the server runs them and flushes the commit,
    never across a round trip to lockd. ``None``: not that case (a retry of this lease or
    client, another limit, full); ``_grant`` decides."""
    async with conn.pipeline():
        async with conn.transaction():
            await conn.execute(q.SEM_LOCK, p)
            cur = await conn.execute(q.SEM_GRANT_FREE, p)
        got = await cur.fetchone()
    if got is None:
        return None
    slot, fence, ttl = got
    return SemGrant(p["name"], p["lease_id"], fence, slot, p["limit"], ttl, p["owner"])


async def _grant(conn: psycopg.AsyncConnection, p: dict[str, Any]) -> SemGrant | SemFull:
    """One transaction, pipelined: BEGIN, lock the semaphore row, read the live permits (one
    round trip); then the grant and COMMIT (one more)."""
    name, limit = p["name"], p["limit"]
    async with conn.pipeline():
        async with conn.transaction():
            c_lock = await conn.execute(q.SEM_LOCK, p)
            c_live = await conn.execute(q.SEM_LIVE, p)
            row = await c_lock.fetchone()
            assert row is not None
            lim, _ = row
            live = await c_live.fetchall()
            for slot, lid, owner, cid, _, _ in live:
                if lid == p["lease_id"] or (p["client_id"] and cid == p["client_id"]):
                    cur = await conn.execute(q.SEM_RENEW_ONE, {**p, "slot": slot})
                    got = await cur.fetchone()
                    assert got is not None
                    return SemGrant(name, lid, got[0], slot, lim, got[1], owner)
            if live and lim != limit:
                raise LimitMismatch(
                    f"semaphore {name!r} is held under limit {lim}, not {limit}", limit=lim)
            if len(live) >= limit:
                return SemFull(name, lim, max(1, min(r[5] for r in live)),
                               tuple(r[2] for r in live))
            if lim != limit:
                await conn.execute(q.SEM_KILL, p)
            taken = {r[0] for r in live}
            slot = next(s for s in range(limit) if s not in taken)
            cur = await conn.execute(q.SEM_GRANT, {**p, "slot": slot})
        got = await cur.fetchone()  # after the COMMIT was queued: one round trip for both
    if got is None:  # cannot happen while the row is locked; a raised fence is harmless
        raise _Taken
    return SemGrant(name, p["lease_id"], got[0], slot, limit, got[1], p["owner"])
