"""``PostgresStore``: lockd's ``Store`` on PostgreSQL; replicas that share one database are
correct together.

Invariants: every expiry is judged by the database's ``now()`` (lockd's clock is never sent);
a grant raises the lock row's fence in the same autocommit statement that installs the lease,
and lock rows are never deleted, so fences strictly increase per lock; a grant is acknowledged
only after its commit is durable. The statements are in ``sql``, the release notifications in
``listen``; the design, pool sizing and retries: docs/stores/postgres.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import lockd.server.store.postgres.sql as sql
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.base import Grant, Holder, LockState, MultiGrant, ReleaseListener
from lockd.server.store.postgres.listen import Listener, first_line
from lockd.server.store.postgres.url import libpq_url, param

__all__ = ["PostgresStore"]

log = logging.getLogger("lockd.server.store.postgres")

_ACQUIRE_ATTEMPTS = 4
_LEASE_SWEEP_EVERY = 64  # multi-lock grants between two deletes of expired lease rows

T = TypeVar("T")


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


class PostgresStore:
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
        cur = await conn.execute(sql.SCHEMA_EXISTS)
        row = await cur.fetchone()
        if row and row[0]:
            return  # nothing to do (and no CREATE privilege needed)
        async with conn.transaction():
            await conn.execute(sql.SCHEMA_LOCK, [sql.SCHEMA_LOCK_KEY])
            await conn.execute(sql.DDL)

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
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None
    ) -> Grant | Holder:
        """See ``Store.acquire``. One statement; a second only when a refusal needs explaining."""
        params = {"lock": lock, "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant | Holder:
            holder: Holder | None = None
            for _ in range(_ACQUIRE_ATTEMPTS):
                cur = await conn.execute(sql.ACQUIRE, params)
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return Grant(lock=lock, lease_id=row[1], fence=row[2], ttl_ms=row[4],
                                 owner=row[3])
                if row is not None and row[4] > 0:
                    return Holder(lock=lock, owner=row[3], ttl_ms=row[4], fence=row[2])
                # The statement's snapshot did not show the lease that refused us (it was
                # inserted or replaced concurrently): look again with a fresh snapshot.
                cur = await conn.execute(sql.HOLDER, params)
                live = await cur.fetchone()
                if live is not None:
                    return Holder(lock=lock, owner=live[1], ttl_ms=max(1, live[2]), fence=live[0])
                if row is not None:  # freed in between: try again
                    holder = Holder(lock=lock, owner=row[3], ttl_ms=1, fence=row[2])
            return holder or Holder(lock=lock, owner="", ttl_ms=1, fence=0)

        return await self._run(op, retry=True)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """See ``Store.renew``. Raises ``LeaseLost`` unless the lease is live by the server."""
        params = {"lock": lock, "lease_id": lease_id,
                  "ttl_ms": None if ttl_ms is None else int(ttl_ms)}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant:
            cur = await conn.execute(sql.RENEW, params)
            row = await cur.fetchone()
            if row is None:
                raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)
            return Grant(lock=lock, lease_id=lease_id, fence=row[0], ttl_ms=row[2], owner=row[1])

        return await self._run(op, retry=True)

    async def release(self, lock: str, lease_id: str) -> None:
        """See ``Store.release``: frees the lock and NOTIFYs in one statement; keeps the fence."""
        params = {"lock": lock, "lease_id": lease_id}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            cur = await conn.execute(sql.RELEASE, params)
            if await cur.fetchone() is not None:
                return
            if retried:  # the first attempt's outcome was unknown: did it commit?
                cur = await conn.execute(sql.RELEASED_BY, params)
                if await cur.fetchone() is not None:
                    return
            raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)

        await self._run(op, retry=True)

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many``: one transaction that upserts every lock row (in name
        order) and the lease row, or rolls back. A deadlock (with a hand-written transaction
        locking rows in another order) is retried."""
        params = {"names": list(locks), "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant | list[Holder]:
            for _ in range(_ACQUIRE_ATTEMPTS):
                try:
                    async with conn.transaction():
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
                    fences = {r[0]: r[1] for r in rows}
                    return MultiGrant(lease_id, {n: fences[n] for n in locks}, rows[0][2],
                                      owner or "")
                cur = await conn.execute(sql.HOLDERS, params)
                live = await cur.fetchall()
                if not live:
                    continue  # freed in between: try again
                if client_id and len(live) == len(locks) and len({r[4] for r in live}) == 1:
                    cur = await conn.execute(sql.LEASE_CLIENT, [live[0][4]])
                    lease = await cur.fetchone()
                    if lease is not None and lease[0] == client_id and lease[1] == list(locks):
                        try:
                            return await self._renew_many(conn, live[0][4], ttl_ms)
                        except LeaseLost:
                            continue
                if len(live) == len(locks) and all(r[4] == lease_id for r in live):
                    # A retry after a lost answer: our first attempt committed the grant.
                    return MultiGrant(lease_id, {r[0]: r[1] for r in live},
                                      min(r[3] for r in live), owner or "")
                return [Holder(lock=r[0], owner=r[2], ttl_ms=max(1, r[3]), fence=r[1])
                        for r in live]
            raise StoreUnavailable("PostgreSQL store: the locks kept changing hands; try again")

        return await self._run(op, retry=True)

    @staticmethod
    async def _renew_many(conn: psycopg.AsyncConnection, lease_id: str,
                          ttl_ms: int | None) -> MultiGrant:
        async with conn.transaction():
            cur = await conn.execute(sql.LEASE_FOR_UPDATE, [lease_id])
            lease = await cur.fetchone()
            if lease is None:
                raise LeaseLost("the multi-lock lease is not live")
            names, owner, own_ttl = lease
            ttl = int(own_ttl if ttl_ms is None else ttl_ms)
            params = {"names": names, "lease_id": lease_id, "ttl_ms": ttl}
            cur = await conn.execute(sql.RENEW_SET, params)
            fences = dict(await cur.fetchall())
            if len(fences) != len(names):
                raise LeaseLost("the multi-lock lease is not live")  # rolls back
            await conn.execute(sql.RENEW_LEASE_ROW, params)
        return MultiGrant(lease_id, {n: fences[n] for n in names}, ttl, owner)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """See ``Store.renew_many``: one transaction (lease row, then lock rows in name order)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant:
            return await self._renew_many(conn, lease_id, ttl_ms)

        return await self._run(op, retry=True)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """See ``Store.release_many``: one statement that deletes the lease row and frees its
        live lock rows (a NOTIFY for each, sent by the commit)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> tuple[tuple[str, ...], bool]:
            cur = await conn.execute(sql.RELEASE_MANY, {"lease_id": lease_id})
            row = await cur.fetchone()
            total, names = row if row is not None else (None, None)
            if total is None:
                return (), retried  # a retry: our first attempt's commit deleted the lease row
            freed = tuple(sorted(names or ()))
            return freed, len(freed) == total

        freed, whole = await self._run(op, retry=True)
        if not whole:
            raise LeaseLost("the multi-lock lease is not live")
        return freed

    async def get(self, lock: str) -> LockState:
        """See ``Store.get``."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> LockState:
            cur = await conn.execute(sql.GET, {"lock": lock})
            row = await cur.fetchone()
            if row is None:
                return LockState(lock=lock, held=False, fence=0, owner=None, ttl_ms=0)
            return _state(row)

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
        page = sql.list_sql(upper=upper is not None, after=after is not None)

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[LockState]:
            cur = await conn.execute(page, params)
            return [_state(row) for row in await cur.fetchall()]

        return await self._run(op, retry=True)

    async def force_release(self, lock: str) -> Holder | None:
        """See ``Store.force_release``: one statement that frees the lock and NOTIFYs."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Holder | None:
            cur = await conn.execute(sql.FORCE_RELEASE, {"lock": lock})
            row = await cur.fetchone()
            return None if row is None else Holder(lock=lock, owner=row[1], ttl_ms=row[2],
                                                   fence=row[0])

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


def _state(row: tuple) -> LockState:
    name, fence, owner, ttl_ms = row
    return LockState(lock=name, held=owner is not None, fence=fence, owner=owner, ttl_ms=ttl_ms)



def _kind(exc: psycopg.Error) -> str:
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}, SQLSTATE {state}" if state else type(exc).__name__

