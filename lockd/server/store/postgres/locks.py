"""Locks on PostgreSQL: the ``LockStore`` methods of ``PostgresStore`` (a mixin).

An exclusive grant is one autocommit statement that raises the lock row's fence as it installs
the lease (``sql.ACQUIRE``; the grants of one event-loop turn in one statement, and so their
releases and renewals: ``batch``; the exclusive acquire and release statements are sent with
libpq directly: ``wire``); shared holders and mixed-mode sets lock the lock rows first, in name
order, in one transaction (``modes``, ``sql_modes``). docs/stores/postgres.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg

import lockd.server.store.postgres.batch as batch_
import lockd.server.store.postgres.modes as modes_
import lockd.server.store.postgres.sql as sql
import lockd.server.store.postgres.sql_modes as sql_modes
import lockd.server.store.postgres.wire as wire
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    SHARED_PREFIX,
    Grant,
    Holder,
    LockState,
    MultiGrant,
)

__all__ = ["LockOps"]

_ACQUIRE_ATTEMPTS = 4
_LEASE_SWEEP_EVERY = 64  # grants between two deletes of expired lease rows and shared rows

# The hot statements, sent below psycopg's cursors (``wire``).
_ACQUIRE = wire.Statement("lockd_acquire", sql.ACQUIRE)
_ACQUIRE_BATCH = wire.Statement("lockd_acquire_batch", sql.ACQUIRE_BATCH)
_RELEASE = wire.Statement("lockd_release", sql.RELEASE)
_RELEASE_BATCH = wire.Statement("lockd_release_batch", sql.RELEASE_BATCH)


def _prefix_upper(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (code point order)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code == 0xD800:  # surrogates cannot be sent as UTF-8
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:i] + chr(code)
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Refused(Exception):
    """Internal: a lock of a multi-lock grant is held; roll the transaction back."""


class LockOps:
    """``LockStore`` on ``self._run`` (run one operation on a pooled connection, errors
    translated: ``PostgresStore._run``)."""

    _run: Callable[..., Awaitable[Any]]
    _prepare_threshold: int | None = 5  # None: no named prepared statements (``wire``)
    _grants = 0
    _acquires: batch_.Batcher[Grant | Holder] | None = None  # None: each request alone
    _releases: batch_.Batcher[None] | None = None
    _renewals: batch_.Batcher[Grant] | None = None

    def _start_batching(self) -> None:
        """Send the exclusive acquires and releases of one event-loop turn together."""
        busy = [0]  # one count for both: a lone client's acquire or release goes at once
        self._acquires = batch_.Batcher(self._send_acquires, self._acquire_alone, busy)
        self._releases = batch_.Batcher(self._send_releases, self._release_alone, busy)
        self._renewals = batch_.Batcher(self._send_renewals, self._renew_alone, busy)

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        mode: str = EXCLUSIVE
    ) -> Grant | Holder:
        """See ``LockStore.acquire``. Exclusive: one statement (shared with the other exclusive
        acquires of this event-loop turn: ``batch``), a second only when a refusal needs
        explaining. Shared: one transaction on the locked lock row (``modes.acquire_shared``)."""
        params = {"lock": lock, "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None}
        if mode != SHARED:
            if self._acquires is not None:
                return await self._acquires.submit(lock, params)
            return await self._acquire_alone(params)

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant | Holder:
            got = await modes_.acquire_shared(conn, params)
            self._grants += 1
            if self._grants % _LEASE_SWEEP_EVERY == 0:  # ended shared rows, long past
                await conn.execute(sql_modes.SWEEP_SHARED)
            return got

        return await self._run(op, retry=True)

    async def _acquire_alone(self, params: Mapping[str, Any]) -> Grant | Holder:
        prepare = self._prepare_threshold is not None

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant | Holder:
            return await self._acquire_exclusive(conn, params, prepare)

        return await self._run(op, retry=True)

    async def _send_acquires(self, entries: list[batch_.Entry]) -> None:
        """``Batcher``'s send: one ``sql.ACQUIRE_BATCH`` for requests on distinct locks. A
        refusal the statement cannot explain runs alone (as ACQUIRE's does); a failed
        statement runs every request alone."""
        assert self._acquires is not None
        stats = self._acquires.stats
        reqs = [req for _, req, _ in entries]
        params = {"locks": [r["lock"] for r in reqs], "lease_ids": [r["lease_id"] for r in reqs],
                  "owners": [r["owner"] for r in reqs],
                  "client_ids": [r["client_id"] for r in reqs],
                  "ttls": [r["ttl_ms"] for r in reqs]}
        values = [params[key] for key in _ACQUIRE_BATCH.keys]
        prepare = self._prepare_threshold is not None

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[list]:
            return await wire.execute(conn, _ACQUIRE_BATCH, values, prepare=prepare)

        try:
            rows = {row[1]: row for row in await self._run(op, retry=True)}
        except (StoreUnavailable, LeaseLost):
            stats["failed"] += len(entries)
            for _, _, fut in entries:
                batch_.answer(fut, batch_.ALONE)
            return
        for lock, _, fut in entries:
            row = rows.get(lock)
            if row is not None and row[0] == "t":
                batch_.answer(fut, Grant(lock=lock, lease_id=row[2], fence=int(row[3]),
                                         ttl_ms=int(row[5]), owner=row[4]))
            elif row is not None and int(row[5]) > 0:
                batch_.answer(fut, Holder(lock=lock, owner=row[4], ttl_ms=int(row[5]),
                                          fence=int(row[3])))
            else:
                stats["alone"] += 1
                batch_.answer(fut, batch_.ALONE)

    @staticmethod
    async def _acquire_exclusive(conn: psycopg.AsyncConnection, params: Mapping[str, Any],
                                 prepare: bool = True) -> Grant | Holder:
        lock = params["lock"]
        holder: Holder | None = None
        values = [params[key] for key in _ACQUIRE.keys]
        for _ in range(_ACQUIRE_ATTEMPTS):
            row: list[Any] | None = None
            for got in await wire.execute(conn, _ACQUIRE, values, prepare=prepare):
                row = [got[0] == "t", got[1], int(got[2]), got[3], int(got[4])]
            if row is not None and row[0]:
                return Grant(lock=lock, lease_id=row[1], fence=row[2], ttl_ms=row[4],
                             owner=row[3])
            if row is not None and row[4] > 0:
                return Holder(lock=lock, owner=row[3], ttl_ms=row[4], fence=row[2])
            # Refused by shared holders, or the statement's snapshot did not show the lease
            # that refused us (inserted or replaced concurrently): look with a fresh snapshot.
            found = await modes_.blocking_holder(conn, params)
            if found is not None:
                return found
            if row is not None:  # freed in between, or shared_until was too high: again
                holder = Holder(lock=lock, owner=row[3], ttl_ms=1, fence=row[2])
                await modes_.fix_shared_until(conn, [lock])
        return holder or Holder(lock=lock, owner="", ttl_ms=1, fence=0)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """See ``LockStore.renew``. Raises ``LeaseLost`` unless the lease is live by the server. A
        lease id with ``SHARED_PREFIX`` is tried as shared first (one statement when it is); an
        exclusive one shares a statement with the other renewals of this event-loop turn
        (``batch``: a client's ``renew-each`` sends many at once)."""
        params = {"lock": lock, "lease_id": lease_id,
                  "ttl_ms": None if ttl_ms is None else int(ttl_ms)}
        if self._renewals is not None and not lease_id.startswith(SHARED_PREFIX):
            return await self._renewals.submit(lock, params)
        return await self._renew_alone(params)

    async def _renew_alone(self, params: Mapping[str, Any]) -> Grant:
        lock, lease_id = params["lock"], params["lease_id"]
        shared_first = lease_id.startswith(SHARED_PREFIX)

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant:
            if shared_first:
                shared = await modes_.renew_shared(conn, lock, lease_id, params["ttl_ms"])
                if shared is not None:
                    return shared
            cur = await conn.execute(sql.RENEW, params)
            row = await cur.fetchone()
            if row is not None:
                return Grant(lock=lock, lease_id=lease_id, fence=row[0], ttl_ms=row[2],
                             owner=row[1])
            shared = None if shared_first else await modes_.renew_shared(
                conn, lock, lease_id, params["ttl_ms"])
            if shared is None:
                raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)
            return shared

        return await self._run(op, retry=True)

    async def _send_renewals(self, entries: list[batch_.Entry]) -> None:
        """``Batcher``'s send: one ``sql.RENEW_BATCH``. A lease it did not renew (lost, or a
        shared lease) is asked again alone, which says which; a failed statement runs every
        renewal alone."""
        assert self._renewals is not None
        stats = self._renewals.stats
        reqs = [req for _, req, _ in entries]
        params = {"locks": [r["lock"] for r in reqs], "lease_ids": [r["lease_id"] for r in reqs],
                  "ttls": [r["ttl_ms"] for r in reqs]}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[tuple]:
            cur = await conn.execute(sql.RENEW_BATCH, params)
            return await cur.fetchall()

        try:
            rows: dict[str, tuple] | None = {
                row[0]: row for row in await self._run(op, retry=True)}
        except (StoreUnavailable, LeaseLost):
            rows = None
        for lock, req, fut in entries:
            row = rows.get(lock) if rows is not None else None
            if row is not None:
                batch_.answer(fut, Grant(lock=lock, lease_id=req["lease_id"], fence=row[1],
                                         ttl_ms=row[3], owner=row[2]))
                continue
            stats["failed" if rows is None else "alone"] += 1
            batch_.answer(fut, batch_.ALONE)

    async def release(self, lock: str, lease_id: str) -> None:
        """See ``LockStore.release``: frees the lock and NOTIFYs in one statement (shared with the
        other exclusive releases of this event-loop turn: ``batch``); keeps the fence. A lease id
        with ``SHARED_PREFIX`` is tried as shared first (one round trip when it is)."""
        if self._releases is not None and not lease_id.startswith(SHARED_PREFIX):
            await self._releases.submit(lock, [lock, lease_id, False])
        else:
            await self._release_alone([lock, lease_id, False])

    async def _release_alone(self, request: list[Any]) -> None:
        """One release, ``request`` = [lock, lease id, whether an earlier attempt's outcome is
        unknown: then a lease already released by the database is this release's own]."""
        lock, lease_id, unknown = request
        params = {"lock": lock, "lease_id": lease_id}

        shared_first = lease_id.startswith(SHARED_PREFIX)

        values = [params[key] for key in _RELEASE.keys]
        prepare = self._prepare_threshold is not None

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            retried = retried or unknown
            if shared_first and await modes_.release_shared(conn, lock, lease_id, retried):
                return
            if await wire.execute(conn, _RELEASE, values, prepare=prepare):
                return
            if not shared_first and await modes_.release_shared(conn, lock, lease_id, retried):
                return
            if retried:  # the first attempt's outcome was unknown: did it commit?
                cur = await conn.execute(sql.RELEASED_BY, params)
                if await cur.fetchone() is not None:
                    return
            raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)

        await self._run(op, retry=True)

    async def _send_releases(self, entries: list[batch_.Entry]) -> None:
        """``Batcher``'s send: one ``sql.RELEASE_BATCH``. A release it did not free runs alone
        (a shared lease, a lease lost; after a lost connection, one the first attempt may have
        freed: checked as a retry); a failed statement runs every release alone."""
        assert self._releases is not None
        stats = self._releases.stats
        params = {"locks": [r[0] for _, r, _ in entries],
                  "lease_ids": [r[1] for _, r, _ in entries]}
        values = [params[key] for key in _RELEASE_BATCH.keys]
        prepare = self._prepare_threshold is not None
        unknown = False

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> set[str]:
            nonlocal unknown
            unknown = unknown or retried
            rows = await wire.execute(conn, _RELEASE_BATCH, values, prepare=prepare)
            return {row[0] for row in rows}

        try:
            freed: set[str] | None = await self._run(op, retry=True)
        except (StoreUnavailable, LeaseLost):
            freed = None
        for lock, req, fut in entries:
            if freed is not None and lock in freed:
                batch_.answer(fut, None)
                continue
            stats["failed" if freed is None else "alone"] += 1
            req[2] = unknown
            batch_.answer(fut, batch_.ALONE)

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None,
                           modes: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
        """See ``LockStore.acquire_many``. All exclusive: one transaction that upserts every lock row
        (in name order) and the lease row, or rolls back. With shared locks: one transaction
        that locks every row in name order, checks each against its mode and grants them all.
        A deadlock (with a hand-written transaction locking rows in another order) is retried.
        Refused, the holders are those that refuse a lock in its requested mode."""
        mode_of = {n: (modes or {}).get(n, EXCLUSIVE) for n in locks}
        shared = [n for n in locks if mode_of[n] == SHARED]
        params = {"names": list(locks), "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None,
                  "shared": shared, "excl": [n for n in locks if mode_of[n] != SHARED]}
        out_modes = dict(mode_of) if shared else None  # as renew_many answers

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant | list[Holder]:
            for _ in range(_ACQUIRE_ATTEMPTS):
                try:
                    async with conn.transaction():
                        if shared:
                            rows = await self._grant_mixed(conn, params, mode_of, client_id)
                        else:
                            cur = await conn.execute(sql.ACQUIRE_MANY, params)
                            rows = await cur.fetchall()
                        if len(rows) != len(locks):
                            raise _Refused  # roll back: nothing granted, no fence raised
                except _Refused:
                    pass
                except psycopg.errors.DeadlockDetected:
                    continue
                else:
                    self._grants += 1
                    if self._grants % _LEASE_SWEEP_EVERY == 0:  # lease rows of expired sets
                        await conn.execute(sql.SWEEP_LEASES)
                        await conn.execute(sql_modes.SWEEP_SHARED)
                    fences = {r[0]: r[1] for r in rows}
                    return MultiGrant(lease_id, {n: fences[n] for n in locks}, int(ttl_ms),
                                      owner or "", out_modes)
                # A retry (this client's, or ours after a lost answer): the live lease, in the
                # modes asked for (another modes' lease of this client: ClientIdConflict).
                again = await modes_.client_leases(conn, params) if client_id else []
                cur = await conn.execute(sql_modes.LEASE_BY_ID, params)
                if await cur.fetchone() is not None:
                    again.append(lease_id)
                for lid in again:
                    try:
                        return await self._renew_many(conn, lid, ttl_ms)
                    except LeaseLost:
                        pass
                refusing = await modes_.blockers(conn, locks, mode_of.__getitem__, lease_id)
                if refusing:
                    return refusing
                await modes_.fix_shared_until(conn, locks)
            raise StoreUnavailable("PostgreSQL store: the locks kept changing hands; try again")

        return await self._run(op, retry=True)

    @staticmethod
    async def _grant_mixed(conn: psycopg.AsyncConnection, params: Mapping[str, Any],
                           mode_of: Mapping[str, str], client_id: str | None) -> list[tuple]:
        """Inside a transaction: lock every row (name order), then grant all, or raise
        ``_Refused``. A set of only shared locks is never refused by its client's own live
        lease, so its retry is looked for here, under the row locks (``_Refused``: the caller
        renews it)."""
        await conn.execute(sql_modes.LOCK_MANY, params)
        if client_id and not params["excl"]:
            for lid in await modes_.client_leases(conn, params):
                live = await conn.execute(sql_modes.LEASE_LIVE, {"lease_id": lid})
                row = await live.fetchone()
                if row and row[0]:  # a set partly force-released is no retry to renew
                    raise _Refused
        cur = await conn.execute(sql_modes.MANY_STATE, params)
        for name, _, excl_live, shared_live in await cur.fetchall():
            if excl_live or (shared_live and mode_of[name] != SHARED):
                raise _Refused
        cur = await conn.execute(sql_modes.MANY_GRANT, params)
        return await cur.fetchall()

    @staticmethod
    async def _renew_many(conn: psycopg.AsyncConnection, lease_id: str,
                          ttl_ms: int | None) -> MultiGrant:
        async with conn.transaction():
            cur = await conn.execute(sql_modes.LEASE_MODES, [lease_id])
            lease = await cur.fetchone()
            if lease is None:
                raise LeaseLost("the multi-lock lease is not live")
            names, owner, own_ttl, shared = lease
            ttl = int(own_ttl if ttl_ms is None else ttl_ms)
            params = {"names": [n for n in names if n not in shared], "lease_id": lease_id,
                      "ttl_ms": ttl, "shared": shared}
            if shared:  # lock rows first; a shared lock an exclusive lease took is lost
                cur = await conn.execute(sql_modes.LOCK_ROWS, {"names": names})
                if any(r[1] and r[0] in shared for r in await cur.fetchall()):
                    raise LeaseLost("the multi-lock lease is not live")  # rolls back
            cur = await conn.execute(sql.RENEW_SET, params)
            fences = dict(await cur.fetchall())
            if shared:
                cur = await conn.execute(sql_modes.SHARED_RENEW_MANY, params)
                fences.update(dict(await cur.fetchall()))
            if len(fences) != len(names):
                raise LeaseLost("the multi-lock lease is not live")  # rolls back
            await conn.execute(sql.RENEW_LEASE_ROW, params)
        modes = {n: SHARED if n in shared else EXCLUSIVE for n in names} if shared else None
        return MultiGrant(lease_id, {n: fences[n] for n in names}, ttl, owner, modes)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """See ``LockStore.renew_many``: one transaction (lease row, then lock rows in name order)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant:
            return await self._renew_many(conn, lease_id, ttl_ms)

        return await self._run(op, retry=True)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """See ``LockStore.release_many``: one statement that deletes the lease row and frees its
        live lock rows (a NOTIFY for each, sent by the commit); a lease holding some locks
        shared, one transaction (lease row, lock rows in name order, both modes' rows)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> tuple[tuple[str, ...], bool]:
            cur = await conn.execute(sql.RELEASE_MANY, {"lease_id": lease_id})
            row = await cur.fetchone()
            total, names = row if row is not None else (None, None)
            if total is None:
                async with conn.transaction():
                    cur = await conn.execute(sql_modes.LEASE_DELETE, {"lease_id": lease_id})
                    lease = await cur.fetchone()
                    if lease is None:
                        return (), retried  # a retry: our first attempt's commit ended it
                    params = {"names": lease[0], "lease_id": lease_id}
                    await conn.execute(sql_modes.LOCK_ROWS, params)
                    cur = await conn.execute(sql_modes.RELEASE_MANY_ROWS, params)
                    total, names = len(lease[0]), [r[0] for r in await cur.fetchall()]
            freed = tuple(sorted(names or ()))
            return freed, len(freed) == total

        freed, whole = await self._run(op, retry=True)
        if not whole:
            raise LeaseLost("the multi-lock lease is not live")
        return freed

    async def get(self, lock: str) -> LockState:
        """See ``LockStore.get``."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> LockState:
            cur = await conn.execute(sql_modes.STATE, {"lock": lock})
            row = await cur.fetchone()
            if row is None:
                return LockState(lock=lock, held=False, fence=0, owner=None, ttl_ms=0)
            return modes_.state(row)

        if "\x00" in lock or not _utf8(lock):
            return LockState(lock=lock, held=False, fence=0, owner=None, ttl_ms=0)
        return await self._run(op, retry=True)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """See ``LockStore.list``: a name range scan, so ``%`` and ``_`` in ``prefix`` are literal."""
        if limit <= 0 or "\x00" in prefix or not _utf8(prefix):
            return []
        params: dict[str, Any] = {"prefix": prefix, "limit": int(limit)}
        upper = _prefix_upper(prefix)
        if upper is not None:
            params["upper"] = upper
        if after is not None:
            # No name contains NUL, so "names after a\0b" are exactly "names after a" but "a".
            after = after.split("\x00", 1)[0]
            if not _utf8(after):
                return []
            params["after"] = after
        page = sql_modes.list_sql(upper=upper is not None, after=after is not None)

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[LockState]:
            cur = await conn.execute(page, params)
            return [modes_.state(row) for row in await cur.fetchall()]

        return await self._run(op, retry=True)

    async def force_release(self, lock: str) -> Holder | None:
        """See ``LockStore.force_release``: one transaction that ends every live lease of the
        lock (its exclusive one, or all its shared holders) and NOTIFYs."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Holder | None:
            return await modes_.force_release(conn, lock)

        return await self._run(op, retry=True)
