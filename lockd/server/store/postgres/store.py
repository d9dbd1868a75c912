"""``PostgresStore``: lockd's ``Store`` on PostgreSQL, the pool, the schema and the one place
errors are translated (``_run``); the primitives are its mixins (``locks``, ``semaphores``,
``elections``). Expiry is judged by the database's ``now()``, never lockd's clock; replicas
sharing one database are correct together. The design: docs/stores/postgres.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import lockd.server.store.postgres.sql as sql
import lockd.server.store.postgres.sql_elect as sql_elect
import lockd.server.store.postgres.sql_modes as sql_modes
import lockd.server.store.postgres.sql_sem as sql_sem
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.postgres.elections import ElectionOps
from lockd.server.store.postgres.listen import Listener, first_line
from lockd.server.store.postgres.locks import LockOps
from lockd.server.store.postgres.semaphores import SemaphoreOps
from lockd.server.store.postgres.url import libpq_url, param
from lockd.server.store.values import ReleaseListener

__all__ = ["SCHEMA", "PostgresStore"]

log = logging.getLogger("lockd.server.store.postgres")

T = TypeVar("T")

# Every statement that creates (or upgrades in place) lockd's schema, in order.
SCHEMA = (sql.DDL, sql_modes.DDL, sql_sem.DDL, sql_elect.DDL)


class _ConnectionLost(Exception):
    """Internal: the statement failed because its connection broke; the outcome is unknown."""

    def __init__(self, cause: psycopg.Error):
        super().__init__(str(cause))
        self.cause = cause


class PostgresStore(LockOps, SemaphoreOps, ElectionOps):
    """The ``Store`` protocol on PostgreSQL (see docs/stores/postgres.md for the design).

    ``url``: ``postgresql[+psycopg]://user:pass@host:port/db?…``. Keyword arguments (``None``:
    take the URL's query parameter, else the default): ``pool_min`` 1, ``pool_max`` 32,
    ``pool_timeout`` 5.0 s, ``op_timeout`` 10.0 s, ``prepare_threshold`` 5, ``heartbeat`` 5.0 s
    (LISTEN connection liveness check), ``batch`` 1 (send the exclusive single-lock acquires
    and releases of one event-loop turn in one statement each, ``locks.batch``; 0: one
    statement per request; without the URL parameter, the environment's ``LOCKD_PG_BATCH``).
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
        batch: bool | None = None,
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
        if batch is None:
            env = os.environ.get("LOCKD_PG_BATCH", "1").strip().lower()
            default = int(env not in ("0", "false", "off", "no"))
            batch = bool(param(own, "batch", default, int))
        self._batch = batch
        # libpq connection parameters lockd sets unless the URL does.
        self._conn_kwargs: dict[str, Any] = {}
        present = {k for k, _ in parse_qsl(urlsplit(conninfo).query)}
        if "connect_timeout" not in present:
            self._conn_kwargs["connect_timeout"] = max(1, round(self._pool_timeout))
        if "application_name" not in present:
            self._conn_kwargs["application_name"] = "lockd"
        self._pool: AsyncConnectionPool | None = None
        self._idle: list[psycopg.AsyncConnection] = []  # see ``_take``
        self._given = 0
        self._asking = 0  # statements waiting on the pool's getconn
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
            if self._batch:
                self._start_batching()
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
            await self._hand_back(pool)
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
                        await self._hand_back(pool)
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

    async def _once(self, pool: AsyncConnectionPool, op, retried: bool):
        """``op`` on a connection taken and given back (``_take``/``_give``). What
        ``pool.connection()`` does, without its context managers: on autocommit connections its
        ``commit()`` on success does nothing but take the connection's lock (a few µs per
        statement); a transaction an error left open is rolled back here, as it would."""
        conn = self._take(pool)
        if conn is None:
            self._asking += 1
            try:
                conn = await pool.getconn()
            finally:
                self._asking -= 1
        try:
            return await op(conn, retried)
        except psycopg.OperationalError as exc:
            if conn.closed:
                raise _ConnectionLost(exc) from exc
            await _rollback(conn)
            raise
        except BaseException:
            await _rollback(conn)
            raise
        finally:
            if not self._give(pool, conn):
                await pool.putconn(conn)

    # Between statements an idle, healthy connection waits in ``_idle`` (last in, first out)
    # rather than in the pool: the pool's ``getconn``/``putconn`` (its lock, its checks, its
    # statistics) cost ~5 % of lockd's CPU per lock cycle. Every ``_RECYCLE``-th give-back still
    # goes through the pool, so its rules (``max_lifetime``, a broken connection dropped) keep
    # applying; a lost connection or ``close`` hands every kept one back first (``_hand_back``).
    _RECYCLE = 256

    def _take(self, pool: AsyncConnectionPool) -> psycopg.AsyncConnection | None:
        """A kept connection of ``pool`` (the store's current one), or None: ask the pool."""
        return self._idle.pop() if self._idle and pool is self._pool else None

    def _give(self, pool: AsyncConnectionPool, conn: psycopg.AsyncConnection) -> bool:
        """Keep ``conn`` for the next statement if it is idle and healthy, ``pool`` is still the
        store's and no statement waits on the pool for a connection (kept, it would not reach
        that one); False: the caller gives it to the pool."""
        self._given += 1
        if (pool is not self._pool or self._asking or self._given % self._RECYCLE == 0
                or conn.closed
                or conn.pgconn.status != ConnStatus.OK
                or conn.pgconn.transaction_status != TransactionStatus.IDLE):
            return False
        self._idle.append(conn)
        return True

    async def _hand_back(self, pool: AsyncConnectionPool) -> None:
        """Give every kept connection back to ``pool`` (which drops the broken ones)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await pool.putconn(conn)

    # -- the core of the Store protocol --------------------------------------------------

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
        """See ``StoreCore.subscribe``: called on the event loop from the one LISTEN connection."""
        self._listener.subscribe(listener)

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless PostgreSQL answers ``SELECT 1``."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            await conn.execute(sql.PING)

        await self._run(op, retry=True)



async def _rollback(conn: psycopg.AsyncConnection) -> None:
    """Roll back a transaction an error left open on ``conn`` (a failure to do so is logged,
    not raised over the error that is on its way)."""
    if conn.closed or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        await conn.rollback()
    except Exception as exc:  # noqa: BLE001 - the first error is the one to report
        log.warning("rollback after an error failed: %s", first_line(exc))


def _kind(exc: psycopg.Error) -> str:
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}, SQLSTATE {state}" if state else type(exc).__name__

