"""Elections on PostgreSQL: the ``elect_*`` methods of ``PostgresStore`` (a mixin).

The leader is the exclusive holder of lock ``name``: a campaign is the exclusive acquire plus,
when it grants a new lease, the value, the cleared handover and a ``leader`` log entry, in one
transaction. Every write NOTIFYs the name with its commit. Statements: ``sql_elect``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg

import lockd.server.store.postgres.sql as sql
import lockd.server.store.postgres.sql_elect as q
from lockd.server.errors import LeaseLost
from lockd.server.store.values import (
    EXCLUSIVE,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    HolderView,
    not_a_leader,
    other_mode,
)

__all__ = ["ElectionOps"]

_TRIM_EVERY = 64


class ElectionOps:
    """The ``Store`` election methods on ``self._run`` and ``self._acquire_exclusive``."""

    _run: Callable[..., Awaitable[Any]]
    _acquire_exclusive: Callable[[psycopg.AsyncConnection, Mapping[str, Any]],
                                 Awaitable[Grant | Holder]]

    async def elect_campaign(
        self, name: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        value: str
    ) -> Grant | Holder:
        """See ``ElectionStore.elect_campaign``: one transaction (the grant, then the election row and
        its log entry); a retry that finds its own lease appends nothing. A client_id retry
        that found a lease no campaign granted (the election row holds another lease) raises
        ``ClientIdConflict`` and rolls back (a shared one: ``_acquire_exclusive`` raises)."""
        p = {"lock": name, "name": name, "lease_id": lease_id, "ttl_ms": int(ttl_ms),
             "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant | Holder:
            async with conn.transaction():
                got = await self._acquire_exclusive(conn, p)
                if not isinstance(got, Grant):
                    return got
                if got.mode != EXCLUSIVE:
                    raise other_mode(name, got.mode, EXCLUSIVE)  # rolls back
                cur = await conn.execute(q.ELECT_LEASE, p)
                row = await cur.fetchone()
                if row is not None and row[0] == got.lease_id:
                    return got  # a retry: this client's (or our lost answer's) leadership
                if got.lease_id != lease_id:
                    raise not_a_leader(name)  # this client's lock lease: rolls back
                await _append(conn, name, "leader", got.owner, value, got.fence, got.lease_id,
                              clear=True)  # a new term
                return got

        return await self._run(op, retry=True)

    async def elect_renew(self, name: str, lease_id: str,
                          ttl_ms: int | None) -> tuple[Grant, str | None]:
        """See ``ElectionStore.elect_renew``: one statement. Raises ``LeaseLost``."""
        p = {"lock": name, "lease_id": lease_id,
             "ttl_ms": None if ttl_ms is None else int(ttl_ms)}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> tuple[Grant, str | None]:
            cur = await conn.execute(q.ELECT_RENEW, p)
            row = await cur.fetchone()
            if row is None:
                raise LeaseLost(f"lease on {name!r} is not live", lock=name)
            fence, owner, ttl, handover = row
            return Grant(name, lease_id, fence, ttl, owner), handover

        return await self._run(op, retry=True)

    async def elect_resign(self, name: str, lease_id: str) -> None:
        """See ``ElectionStore.elect_resign``: one transaction (release, ``resign`` entry, value and
        handover cleared). Raises ``LeaseLost``."""
        p = {"name": name, "lock": name, "lease_id": lease_id}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            async with conn.transaction():
                cur = await conn.execute(q.ELECT_RELEASE, p)
                row = await cur.fetchone()
                if row is not None:
                    await _append(conn, name, "resign", row[1], "", row[0], None, clear=True)
                    return
            if retried:  # did the first attempt's commit end it?
                cur = await conn.execute(sql.RELEASED_BY, p)
                if await cur.fetchone() is not None:
                    return
            raise LeaseLost(f"lease on {name!r} is not live", lock=name)

        await self._run(op, retry=True)

    async def elect_proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """See ``ElectionStore.elect_proclaim``: one transaction. Raises ``LeaseLost``."""
        p = {"name": name, "lease_id": lease_id}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> ElectionState:
            async with conn.transaction():
                cur = await conn.execute(q.ELECT_LEADER, p)
                row = await cur.fetchone()
                if row is None:
                    raise LeaseLost(f"lease on {name!r} is not the live leader", lock=name)
                fence, owner, ttl, _ = row
                seq, handover = await _append(conn, name, "proclaim", owner, value, fence,
                                              lease_id, clear=False)
            return ElectionState(name, HolderView(owner, ttl, EXCLUSIVE), fence, value, seq,
                                 handover)

        return await self._run(op, retry=True)

    async def elect_handover(self, name: str, target: str) -> ElectionState:
        """See ``ElectionStore.elect_handover``: recorded for the live leader's lease (a later leader
        does not see it). Raises ``LeaseLost`` when nobody leads."""
        p = {"name": name, "lease_id": None, "target": target}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> ElectionState:
            async with conn.transaction():
                cur = await conn.execute(q.ELECT_LEADER, p)
                row = await cur.fetchone()
                if row is None:
                    raise LeaseLost(f"nobody leads {name!r}", lock=name)
                await conn.execute(q.ELECT_HANDOVER, {**p, "lease_id": row[3]})
                return await _get(conn, name)

        return await self._run(op, retry=True)

    async def elect_get(self, name: str) -> ElectionState:
        """See ``ElectionStore.elect_get``."""
        if "\x00" in name:
            return ElectionState(name, None, 0, "", 0, None)

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> ElectionState:
            return await _get(conn, name)

        return await self._run(op, retry=True)

    async def elect_log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        """See ``ElectionStore.elect_log``: the last 1,024 entries (at least) of each election."""
        if limit <= 0 or "\x00" in name:
            return []
        p = {"name": name, "after": int(after), "limit": int(limit)}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[ElectionEvent]:
            cur = await conn.execute(q.ELECT_LOG, p)
            return [ElectionEvent(*row) for row in await cur.fetchall()]

        return await self._run(op, retry=True)


async def _append(conn: psycopg.AsyncConnection, name: str, kind: str, owner: str, value: str,
                  fence: int, lease_id: str | None, *, clear: bool) -> tuple[int, str | None]:
    """Append one log entry (inside the caller's transaction) and NOTIFY ``name``; the new seq
    and the handover still pending for ``lease_id``."""
    cur = await conn.execute(q.ELECT_WRITE, {
        "name": name, "kind": kind, "owner": owner, "value": value, "fence": fence,
        "lease_id": lease_id, "clear": clear})
    row = await cur.fetchone()
    assert row is not None
    seq, handover = row[0], row[1]
    if seq % _TRIM_EVERY == 0 and seq > q.KEEP:
        await conn.execute(q.ELECT_TRIM, {"name": name, "upto": seq - q.KEEP})
    return seq, handover


async def _get(conn: psycopg.AsyncConnection, name: str) -> ElectionState:
    cur = await conn.execute(q.ELECT_GET, {"name": name})
    row = await cur.fetchone()
    assert row is not None
    fence, owner, ttl, value, seq, handover = row
    leader = None if owner is None else HolderView(owner, ttl, EXCLUSIVE)
    return ElectionState(name, leader, fence, value, seq, handover)
