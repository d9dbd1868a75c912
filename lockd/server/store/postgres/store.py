"""``PostgresStore``: lockd's ``Store`` on PostgreSQL; replicas that share one database are
correct together.

Invariants: every expiry is judged by the database's ``now()`` (lockd's clock is never sent);
a grant raises the lock row's fence in the same autocommit statement that installs the lease,
and lock rows are never deleted, so fences strictly increase per lock; a grant is acknowledged
only after its commit is durable. Shared leases, semaphores and elections write several rows
in one transaction that locks its rows first (``modes``, ``semaphores``, ``elections``). The
statements are in ``sql``/``sql_modes``/``sql_sem``/``sql_elect``, the release notifications in
``listen``; the design, pool sizing and retries: docs/stores/postgres.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import lockd.server.store.postgres.modes as modes_
import lockd.server.store.postgres.sql as sql
import lockd.server.store.postgres.sql_elect as sql_elect
import lockd.server.store.postgres.sql_modes as sql_modes
import lockd.server.store.postgres.sql_sem as sql_sem
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.postgres.elections import ElectionOps
from lockd.server.store.postgres.listen import Listener, first_line
from lockd.server.store.postgres.semaphores import SemaphoreOps
from lockd.server.store.postgres.url import libpq_url, param
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    SHARED_PREFIX,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
)

__all__ = ["SCHEMA", "PostgresStore"]

log = logging.getLogger("lockd.server.store.postgres")

_ACQUIRE_ATTEMPTS = 4
_LEASE_SWEEP_EVERY = 64  # multi-lock grants between two deletes of expired lease rows

T = TypeVar("T")

# Every statement that creates (or upgrades in place) lockd's schema, in order.
SCHEMA = (sql.DDL, sql_modes.DDL, sql_sem.DDL, sql_elect.DDL)


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


class _ConnectionLost(Exception):
    """Internal: the statement failed because its connection broke; the outcome is unknown."""

    def __init__(self, cause: psycopg.Error):
        super().__init__(str(cause))
        self.cause = cause


class PostgresStore(SemaphoreOps, ElectionOps):
    """The ``Store`` protocol on PostgreSQL (see docs/stores/postgres.md for the design).

    ``url``: ``postgresql[+psycopg]://user:pass@host:port/db?…``. Keyword arguments (``None``:
    take the URL's query parameter, else the default): ``pool_min`` 1, ``pool_max`` 32,
    ``pool_timeout`` 5.0 s, ``op_timeout`` 10.0 s, ``prepare_threshold`` 5, ``heartbeat`` 5.0 s
    (LISTEN connection liveness check).
    """

    def __init__(
        self,
        url: str,
        *,
        pool_min: int | None = None,
        pool_max: int | None = None,
        pool_timeout: float | None = None,
        op_timeout: float | None = None,
        prepare_threshold: int | None = None,
        heartbeat: float = 5.0,
    ):
        conninfo, own = libpq_url(url)
        try:  # libpq's own check of the URL, now rather than at each connection attempt
            conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            raise ValueError("PostgreSQL store URL: " + " ".join(str(exc).split())) from None
        self._conninfo = conninfo
        self._pool_min = pool_min if pool_min is not None else param(own, "pool_min", 1, int)
        self._pool_max = pool_max if pool_max is not None else param(own, "pool_max", 32, int)
        self._pool_max = max(self._pool_max, self._pool_min, 1)
        self._pool_timeout = (
            pool_timeout if pool_timeout is not None
            else param(own, "pool_timeout", 5.0, float)
        )
        self._op_timeout = (
            op_timeout if op_timeout is not None
            else param(own, "op_timeout", self._pool_timeout + 5.0, float)
        )
        if prepare_threshold is None:
            raw = own.get("prepare_threshold", "5")
            self._prepare_threshold = (None if raw.lower() == "none"
                                       else param(own, "prepare_threshold", 5, int))
        else:
            self._prepare_threshold = prepare_threshold
        self._heartbeat = heartbeat
        # libpq connection parameters lockd sets unless the URL does.
        self._conn_kwargs: dict[str, Any] = {}
        present = {k for k, _ in parse_qsl(urlsplit(conninfo).query)}
        if "connect_timeout" not in present:
            self._conn_kwargs["connect_timeout"] = max(1, round(self._pool_timeout))
        if "application_name" not in present:
            self._conn_kwargs["application_name"] = "lockd"
        self._grants = 0
        self._pool: AsyncConnectionPool | None = None
        self._listener = Listener(conninfo, self._conn_kwargs, heartbeat=heartbeat,
                                  connect_timeout=self._pool_timeout)

    async def _connect_error(self) -> str:
        """``": <why>"`` from one direct connection attempt (the pool only logs its errors), so
        the final line says ``database "x" does not exist`` rather than only a timeout."""
        try:
            async with asyncio.timeout(self._pool_timeout):
                conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._conn_kwargs)
            await conn.close()
        except psycopg.Error as exc:
            return ": " + " ".join(str(exc).split())
        except (TimeoutError, OSError) as exc:
            return f": {type(exc).__name__} {exc}".rstrip()
        return ""

    def __repr__(self) -> str:
        parts = urlsplit(self._conninfo)
        host = parts.netloc.rsplit("@", 1)[-1]
        return f"PostgresStore(postgresql://{host}{parts.path})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the pool, create the schema, start the LISTEN connection.

        Raises ``StoreUnavailable`` if PostgreSQL does not answer within ``pool_timeout``.
        """
        if self._pool is not None:
            return
        pool = AsyncConnectionPool(
            self._conninfo,
            kwargs={**self._conn_kwargs, "autocommit": True,
                    "prepare_threshold": self._prepare_threshold},
            min_size=self._pool_min,
            max_size=self._pool_max,
            timeout=self._pool_timeout,
            # Give up background reconnection quickly: later requests grow the pool again at
            # once, instead of waiting out an exponential backoff after the database is back.
            reconnect_timeout=self._pool_timeout,
            configure=self._configure,
            name="lockd",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self._pool_timeout)
            self._pool = pool
            await self._run(self._create_schema, retry=True)
            try:
                await self._listener.start()
            except TimeoutError:
                raise StoreUnavailable(
                    f"PostgreSQL store: LISTEN connection not ready within {self._pool_timeout} s"
                ) from None
        except PoolTimeout as exc:
            await self.close()
            await pool.close()
            raise StoreUnavailable(
                f"PostgreSQL store: could not connect within {self._pool_timeout} s"
                f"{await self._connect_error()}"
            ) from exc
        except BaseException:
            await self.close()
            await pool.close()
            raise

    async def close(self) -> None:
        """Stop the LISTEN connection and close the pool; idempotent."""
        await self._listener.stop()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close(timeout=5.0)

    @staticmethod
    async def _configure(conn: psycopg.AsyncConnection) -> None:
        await conn.execute(sql.CONFIGURE)  # synchronous_commit never off: durable grants

    @staticmethod
    async def _create_schema(conn: psycopg.AsyncConnection, retried: bool) -> None:
        cur = await conn.execute(sql_modes.SCHEMA_CURRENT)
        row = await cur.fetchone()
        if row and row[0]:
            return  # nothing to do (and no CREATE privilege needed)
        async with conn.transaction():  # a database of the previous version upgrades in place
            await conn.execute(sql.SCHEMA_LOCK, [sql.SCHEMA_LOCK_KEY])
            for ddl in SCHEMA:
                await conn.execute(ddl)

    # -- the one place errors are translated ------------------------------------------------

    async def _run(
        self,
        op: Callable[[psycopg.AsyncConnection, bool], Awaitable[T]],
        *,
        retry: bool,
    ) -> T:
        """Run ``op(conn, retried)`` on a pooled connection, within ``op_timeout``.

        If the connection broke and ``retry`` is set, the pool is checked (broken idle
        connections dropped) and ``op`` runs once more with ``retried=True``.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("PostgreSQL store is not open")
        try:
            async with asyncio.timeout(self._op_timeout):
                retried = False
                while True:
                    try:
                        return await self._once(pool, op, retried)
                    except _ConnectionLost as lost:
                        if not retry or retried:
                            raise lost.cause from None
                        log.warning("PostgreSQL connection lost (%s); retrying once",
                                    first_line(lost.cause))
                        await pool.check()
                        retried = True
        except (LeaseLost, StoreUnavailable):
            raise
        except PoolTimeout as exc:
            raise StoreUnavailable(
                f"PostgreSQL store: no database connection within {self._pool_timeout} s"
            ) from exc
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"PostgreSQL store: no answer within {self._op_timeout} s"
            ) from exc
        except psycopg.OperationalError as exc:
            log.warning("PostgreSQL store unavailable: %s", first_line(exc))
            raise StoreUnavailable(
                f"PostgreSQL store: database unavailable ({_kind(exc)})"
            ) from exc
        except psycopg.Error as exc:
            log.error("PostgreSQL store error: %s", first_line(exc))
            raise StoreUnavailable(f"PostgreSQL store: database error ({_kind(exc)})") from exc

    @staticmethod
    async def _once(pool: AsyncConnectionPool, op, retried: bool):
        async with pool.connection() as conn:
            try:
                return await op(conn, retried)
            except psycopg.OperationalError as exc:
                if conn.closed:
                    raise _ConnectionLost(exc) from exc
                raise

    # -- Store protocol ------------------------------------------------------------------------

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        mode: str = EXCLUSIVE
    ) -> Grant | Holder:
        """See ``Store.acquire``. Exclusive: one statement, a second only when a refusal needs
        explaining. Shared: one transaction on the locked lock row (``modes.acquire_shared``)."""
        params = {"lock": lock, "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant | Holder:
            if mode != SHARED:
                return await self._acquire_exclusive(conn, params)
            got = await modes_.acquire_shared(conn, params)
            self._grants += 1
            if self._grants % _LEASE_SWEEP_EVERY == 0:  # ended shared rows, long past
                await conn.execute(sql_modes.SWEEP_SHARED)
            return got

        return await self._run(op, retry=True)

    @staticmethod
    async def _acquire_exclusive(conn: psycopg.AsyncConnection,
                                 params: Mapping[str, Any]) -> Grant | Holder:
        lock = params["lock"]
        holder: Holder | None = None
        for _ in range(_ACQUIRE_ATTEMPTS):
            cur = await conn.execute(sql.ACQUIRE, params)
            row = await cur.fetchone()
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
        """See ``Store.renew``. Raises ``LeaseLost`` unless the lease is live by the server. A
        lease id with ``SHARED_PREFIX`` is tried as shared first (one statement when it is)."""
        params = {"lock": lock, "lease_id": lease_id,
                  "ttl_ms": None if ttl_ms is None else int(ttl_ms)}

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

    async def release(self, lock: str, lease_id: str) -> None:
        """See ``Store.release``: frees the lock and NOTIFYs in one statement; keeps the fence. A
        lease id with ``SHARED_PREFIX`` is tried as shared first (one round trip when it is)."""
        params = {"lock": lock, "lease_id": lease_id}

        shared_first = lease_id.startswith(SHARED_PREFIX)

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            if shared_first and await modes_.release_shared(conn, lock, lease_id, retried):
                return
            cur = await conn.execute(sql.RELEASE, params)
            if await cur.fetchone() is not None:
                return
            if not shared_first and await modes_.release_shared(conn, lock, lease_id, retried):
                return
            if retried:  # the first attempt's outcome was unknown: did it commit?
                cur = await conn.execute(sql.RELEASED_BY, params)
                if await cur.fetchone() is not None:
                    return
            raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)

        await self._run(op, retry=True)

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None,
                           modes: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many``. All exclusive: one transaction that upserts every lock row
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
                            rows = await self._grant_mixed(conn, params, mode_of)
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
                           mode_of: Mapping[str, str]) -> list[tuple]:
        """Inside a transaction: lock every row (name order), then grant all, or raise
        ``_Refused``."""
        await conn.execute(sql_modes.LOCK_MANY, params)
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
        """See ``Store.renew_many``: one transaction (lease row, then lock rows in name order)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant:
            return await self._renew_many(conn, lease_id, ttl_ms)

        return await self._run(op, retry=True)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """See ``Store.release_many``: one statement that deletes the lease row and frees its
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
        """See ``Store.get``."""

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
        """See ``Store.list``: a name range scan, so ``%`` and ``_`` in ``prefix`` are literal."""
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
        """See ``Store.force_release``: one transaction that ends every live lease of the
        lock (its exclusive one, or all its shared holders) and NOTIFYs."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Holder | None:
            return await modes_.force_release(conn, lock)

        return await self._run(op, retry=True)

    async def clock_offset(self) -> float:
        """PostgreSQL's ``clock_timestamp()`` minus lockd's ``time.time()`` at the midpoint of
        the round trip, in seconds (error at most half the round trip)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> float:
            sent = time.time()
            cur = await conn.execute(sql.CLOCK)
            row = await cur.fetchone()
            answered = time.time()
            assert row is not None
            return float(row[0]) - (sent + answered) / 2

        return await self._run(op, retry=False)

    def subscribe(self, listener: ReleaseListener) -> None:
        """See ``Store.subscribe``: called on the event loop from the one LISTEN connection."""
        self._listener.subscribe(listener)

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless PostgreSQL answers ``SELECT 1``."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            await conn.execute(sql.PING)

        await self._run(op, retry=True)



def _kind(exc: psycopg.Error) -> str:
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}, SQLSTATE {state}" if state else type(exc).__name__

