"""The PostgreSQL store: raw psycopg 3 async pool on every request path (SQLAlchemy only at start).

- A single-row write is ONE autocommit statement: the fence claim and the write in a CTE
  (``sql.SqlBuilder``, gated form). One round trip; PostgreSQL commits it atomically, and the
  fence row stays locked until that commit, which serializes the writers of one lock.
- A batch is an explicit transaction: the fence claim of every lock it touches
  (``fencing.try_claim_many``, one statement, rows locked in lock-name order: two batches never
  wait for each other in a cycle), then each op, then COMMIT. A claim of several locks is the
  same statement alone; a claim of one lock ``fencing.try_claim``.
- A fenced read pipelines the fence claim and the SELECT in one round trip; the SELECT is a
  separate statement so it takes its snapshot after the fence row was locked and raised, and sees
  every write that committed before (READ COMMITTED gives each statement a fresh snapshot).
  Its claim is for reading (``fencing.try_claim_read``: the same raise, under a shared token to
  the read epoch, but a claim no row trigger accepts).

Every fence claim is ``fencing.try_claim`` (``dbfence``): the conditional upsert of
``fencing.fences`` that also records the claim for the transaction, so where ``resource-proxy db
install`` put row triggers on the served tables the proxy's writes pass them (each transaction
claims the locks of the rows it writes, before it writes them).

- Another resource's transaction (``fenced``: objects) sends BEGIN and its one fence claim as
  ONE simple query (no parameters: a lock name's alphabet needs no quoting), judges the fence
  (``check_all``), runs its body, then COMMIT. A write nothing can refuse once its fence
  passed (an inline object's PUT without preconditions) is ONE round trip
  (``claimed_statement``): ``fencing.claim`` and its prepared statement as one simple query,
  which PostgreSQL runs as one transaction (a stale fence aborts it whole).
- A write with an ``Idempotency-Key`` (``*_once``) is an explicit transaction: claim the key's
  record row, the fence upsert + write, then the record's answer and COMMIT (``idempotency``),
  in three round trips: BEGIN with the key's claim (and an object's fence claim), the write,
  the record with the COMMIT.

Sessions run with ``TimeZone = UTC`` (timestamps come back with ``+00:00``), ``lock_timeout``
(``lock_timeout_ms``: a lock's fence row held by a claim another transaction keeps open is
waited for that long, then 503 ``lock_timeout``, so it cannot take every pooled connection) and
load json/jsonb with exact Decimals. Errors are translated at this boundary (``translate``); a connection that
broke is discarded by the pool and replaced in the background, so the proxy recovers by itself
when the database returns.

Unavailable or unknown: a failure is 503 ``database_unavailable`` when nothing can have
committed (no connection was had; the transaction failed before its COMMIT was sent; the server
answered with an error) and 502 ``outcome_unknown`` when the connection broke while a write's
COMMIT (or its autocommit statement) was in flight. To keep the second case to its real window,
a pooled connection is checked before use for an unprompted byte or EOF from the server (one
``poll`` syscall, no round trip): a connection the server or the network closed while idle is
discarded instead of being written to.
"""

from __future__ import annotations

import asyncio
import logging
import re
import select
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from lockd.common.fencerule import READ, WRITE, Fence
from resource_proxy.codec import loads
from resource_proxy.dbfence.sql import LF_STALE
from resource_proxy.errors import (
    Conflict,
    InvalidRequest,
    LockTimeout,
    NotFound,
    OutcomeUnknown,
    ProxyError,
    StoreUnavailable,
)
from resource_proxy.fencing import PG_SCHEMA, check, check_all
from resource_proxy.idempotency import PG_TABLE as RECORDS
from resource_proxy.idempotency import PURGE_BATCH, PURGE_INTERVAL_S, Once, Reply, StaleReplay
from resource_proxy.rows.tables import Catalog, Table
from resource_proxy.rows.values import decode_row
from resource_proxy.rows.writes import WriteOp
from resource_proxy.store.base import Row
from resource_proxy.store.sql import POSTGRES, SqlBuilder
from resource_proxy.store.watched import WatchedConnection

__all__ = ["PostgresStore", "libpq_dsn", "translate"]

log = logging.getLogger("resource_proxy.store")

# unique, foreign key, exclusion; and a row of another lock refused by the database's fence
# trigger (``dbfence``: a cascade or a trigger of the user's reached a row this write did not
# claim): retrying cannot help, the message names the lock the write would need
_CONFLICT = {"23505", "23503", "23P01", "LF002", "LF003"}
_LOCK_TIMEOUT = "55P03"  # lock_not_available: lock_timeout ran out
# A value the column's type cannot take (a cast or operator that does not exist for it), or a
# generated column given a value: the client's input, not the database's health.
_REFUSED = {"42804", "42846", "42883", "42P18", "428C9"}


def libpq_dsn(url: str) -> str:
    """``postgresql+psycopg://…`` (SQLAlchemy form) -> ``postgresql://…`` (libpq form)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def translate(exc: Exception) -> ProxyError:
    """A psycopg/pool error -> the proxy's error (see the table in ``errors``)."""
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable("no database connection became available in time; nothing was "
                                "committed (safe to retry)")
    if not isinstance(exc, psycopg.Error):
        return StoreUnavailable("database error; nothing was committed (safe to retry)")
    state = exc.sqlstate or ""
    diag = exc.diag
    text = " ".join(part for part in (diag.message_primary, diag.message_detail) if part)
    extra: dict[str, Any] = {}
    if diag.constraint_name:
        extra["constraint"] = diag.constraint_name
    if diag.column_name:
        extra["column"] = diag.column_name
    if state in _CONFLICT:
        return Conflict(text or "constraint violated", **extra)
    if state.startswith(("22", "23")) or state in _REFUSED:
        return InvalidRequest(text or "the database refused a value", **extra)
    if state and not state.startswith(("08", "53", "57", "40", "58", "XX")):
        log.warning("unexpected database error %s: %s", state, text)
    return StoreUnavailable("the database did not complete the request; nothing was committed "
                            "(safe to retry)")


_UNKNOWN = ("the connection to the database broke while the write was being committed: it may "
            "or may not have committed. Retry with the same Idempotency-Key to get its outcome "
            "(without one, read the rows to find out)")
_RECORDS = f'"{PG_SCHEMA}"."{RECORDS}"'
_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
# A key's claim and its record with the COMMIT, as simple-query texts (``%`` formatting of
# literals quoted by ``_quoter``): a claim returns no row when the key is live.
_CLAIM_KEY_SQL = (
    f"INSERT INTO {_RECORDS} AS r (key, digest, created_ms) VALUES (%s, %s, {_NOW_MS}) "
    "ON CONFLICT (key) DO UPDATE SET digest = excluded.digest, status = NULL, body = NULL, "
    "fences = NULL, created_ms = excluded.created_ms WHERE r.created_ms < excluded.created_ms - %d "
    "RETURNING 1").encode()
_RECORD_SQL = (f"UPDATE {_RECORDS} SET status = %d, body = %s, fences = %s WHERE key = %s; "
               "COMMIT").encode()
_READ_KEY = f"SELECT digest, status, body, fences FROM {_RECORDS} WHERE key = %(key)s"
_PURGE = (f"DELETE FROM {_RECORDS} WHERE key IN (SELECT key FROM {_RECORDS} "
          f"WHERE created_ms < {_NOW_MS} - %(ttl)s LIMIT {PURGE_BATCH})")


def _idle_and_open(conn: psycopg.AsyncConnection) -> bool:
    """Whether a pooled (idle) connection is still usable: open, and nothing to read on its
    socket (an idle connection the server or the network closed reads as EOF; a server that is
    shutting down sends an error first)."""
    if conn.closed or conn.broken:
        return False
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    return not poller.poll(0)


_IDLE = pq.TransactionStatus.IDLE
_SAFE_LOCK = re.compile(r"[A-Za-z0-9._:/-]{1,255}")
_CLAIMS = {WRITE: "fencing.try_claim", READ: "fencing.try_claim_read"}


def _claim_text(fences: Sequence[Fence]) -> bytes | None:
    """The claim of the ONE fence as a statement to send with ``BEGIN`` in one simple query
    (no parameters: a lock name of the lock-name alphabet needs no quoting, a fence is an int);
    None for no fence, several, or a name outside that alphabet (then the claim goes alone)."""
    if len(fences) != 1:
        return None
    fence = fences[0]
    if _SAFE_LOCK.fullmatch(fence.lock) is None:
        return None
    return (f"SELECT {_CLAIMS[fence.purpose]}('{fence.lock}', {int(fence.fence)}::bigint)"
            " AS highest").encode()


def _quoter(conn: psycopg.AsyncConnection) -> Callable[[str], bytes]:
    """Text -> a SQL string literal quoted for ``conn`` (libpq's ``escape_literal``)."""
    escape = pq.Escaping(conn.pgconn).escape_literal
    encoding = conn.info.encoding
    return lambda text: escape(text.encode(encoding))


def _highest_of(exc: psycopg.Error) -> int:
    """The highest fence a ``fencing.claim`` refusal (LF001) names in its detail
    (``lock=... presented=... highest=N``)."""
    return int((exc.diag.message_detail or "").rpartition("highest=")[2])


async def _roll_back(conn: psycopg.AsyncConnection) -> None:
    """ROLLBACK of the transaction an error interrupted, unless the connection is gone (the
    pool discards a broken one) or no transaction is open."""
    if conn.closed or conn.broken or conn.pgconn.transaction_status == _IDLE:
        return
    try:
        await conn.rollback()
    except (psycopg.Error, OSError):
        pass  # broken meanwhile: the pool discards it


class _Flight:
    """Where a request is: ``committing`` once a COMMIT (or an autocommit write) may have been
    sent; a connection lost after that is ``outcome_unknown``, before it ``database_unavailable``."""

    __slots__ = ("committing",)

    def __init__(self) -> None:
        self.committing = False


class PostgresStore:
    """``Store`` on PostgreSQL. ``pool_size`` connections; ``timeout_s`` to get one (then 503);
    ``lock_timeout_ms``: the longest a statement waits for a lock (then 503 ``lock_timeout``)."""

    def __init__(self, url: str, catalog: Catalog, *, pool_size: int = 10, timeout_s: float = 3.0,
                 lock_timeout_ms: int = 1000):
        self.catalog = catalog
        self.sql = SqlBuilder(POSTGRES)
        self._timeout = timeout_s
        self._lock_timeout_ms = int(lock_timeout_ms)
        self._purged = float("-inf")
        self._purge_task: asyncio.Task | None = None
        self._pool = AsyncConnectionPool(
            libpq_dsn(url),
            min_size=pool_size,
            max_size=pool_size,
            connection_class=WatchedConnection,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout_s))},
            configure=self._configure,
            timeout=timeout_s,
            reconnect_timeout=24 * 3600,
            name="resource-proxy",
            open=False,
        )

    async def _configure(self, conn: psycopg.AsyncConnection) -> None:
        set_json_loads(loads, conn)
        await conn.execute(f"SET TimeZone TO 'UTC'; SET lock_timeout = {self._lock_timeout_ms}")

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        if self._purge_task is not None:
            await asyncio.gather(self._purge_task, return_exceptions=True)
        await self._pool.close()

    async def _acquire(self) -> psycopg.AsyncConnection:
        """A live pooled connection within ``timeout_s`` (``PoolTimeout`` otherwise); stale ones
        are closed, so the pool replaces them."""
        deadline = time.monotonic() + self._timeout
        while True:
            conn = await self._pool.getconn(timeout=max(0.001, deadline - time.monotonic()))
            if _idle_and_open(conn):
                return conn
            log.info("discarding a database connection closed while idle")
            await conn.close()
            await self._pool.putconn(conn)

    @asynccontextmanager
    async def _connection(self, flight: _Flight | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
        """A connection for one request; errors translated (``flight``: see ``_Flight``)."""
        try:
            conn = await self._acquire()
        except (psycopg.Error, OSError) as exc:
            raise translate(exc) from None
        try:
            yield conn
        except (psycopg.Error, OSError) as exc:
            if flight is not None and flight.committing and (conn.broken or conn.closed):
                raise OutcomeUnknown(_UNKNOWN) from None
            if getattr(exc, "sqlstate", None) == _LOCK_TIMEOUT:
                raise LockTimeout(
                    f"a lock this request needs (its lock's fence row, claimed by another "
                    f"transaction that is still open, or a row) was not released within "
                    f"{self._lock_timeout_ms} ms; nothing was committed (retry later)",
                    timeout_ms=self._lock_timeout_ms) from None
            raise translate(exc) from None
        finally:
            await self._pool.putconn(conn)

    async def ping(self) -> None:
        async with self._connection() as conn:
            await conn.execute("SELECT 1")

    async def _write_on(self, conn: psycopg.AsyncConnection, fence: Fence | None,
                        op: WriteOp) -> Row | None:
        sql, params = self.sql.write(op, fence)
        cur = await conn.execute(sql, params)
        result = await cur.fetchone()
        if fence is None:  # an unfenced table: the plain write
            if result is None:
                raise NotFound(f"no row with that key in table {op.table.name!r}")
            return None if op.kind == "delete" else decode_row(op.table, result)
        assert result is not None
        highest, present, *values = result
        check(fence, highest)
        if present is None:
            raise NotFound(f"no row with that key in table {op.table.name!r}")
        return None if op.kind == "delete" else decode_row(op.table, values)

    async def write(self, fence: Fence | None, op: WriteOp) -> Row | None:
        flight = _Flight()
        flight.committing = True  # one autocommit statement: sending it is committing it
        async with self._connection(flight) as conn:
            return await self._write_on(conn, fence, op)

    async def _raise_fences(self, conn: psycopg.AsyncConnection,
                            fences: Sequence[Fence]) -> list[int]:
        """The fence upsert of each of ``fences`` (in lock order) inside the caller's
        transaction; the highest of each after it (``check_all`` decides)."""
        if len(fences) == 1:
            cur = await conn.execute(*self.sql.fence_claim(fences[0]))
            (highest,) = await cur.fetchone()  # type: ignore[misc]
            return [highest]
        cur = await conn.execute(self.sql.fence_upsert_many(),
                                 {"locks": [f.lock for f in fences],
                                  "fences": [f.fence for f in fences],
                                  "purposes": [f.purpose.value for f in fences]})
        found = dict(await cur.fetchall())
        return [found[f.lock] for f in fences]

    async def _batch_on(self, conn: psycopg.AsyncConnection, fences: Sequence[Fence],
                        ops: Sequence[WriteOp]) -> list[Row | None]:
        """The batch's statements inside the caller's transaction (no fence check when every
        op is on an unfenced table: ``fences`` empty)."""
        results: list[Row | None] = []
        if fences:
            highest = await self._raise_fences(conn, fences)
            try:
                check_all(fences, highest)
            except ProxyError as exc:
                raise exc.with_extra(op_index=0) from None
        for index, op in enumerate(ops):
            sql, params = self.sql.write(op, None)
            try:
                cur = await conn.execute(sql, params)
                row = await cur.fetchone()
            except psycopg.Error as exc:
                if (exc.sqlstate is None or exc.sqlstate.startswith(("08", "57"))
                        or exc.sqlstate == _LOCK_TIMEOUT or conn.broken):
                    raise
                raise translate(exc).with_extra(op_index=index) from None
            if row is None:
                raise NotFound(
                    f"op {index}: no row with that key in table {op.table.name!r}", op_index=index
                )
            results.append(None if op.kind == "delete" else decode_row(op.table, row))
        return results

    async def batch(self, fences: Sequence[Fence], ops: Sequence[WriteOp]) -> list[Row | None]:
        flight = _Flight()
        async with self._connection(flight) as conn:
            async with conn.transaction():
                results = await self._batch_on(conn, fences, ops)
                flight.committing = True  # leaving the block sends COMMIT
            return results

    async def _once(self, once: Once, body, fences: Sequence[Fence] = ()) -> Reply:
        """``body(conn)`` in a transaction that also records its ``Reply`` under ``once.key``;
        the recorded reply instead if the key was used before (``idempotency``). ``fences``:
        claimed and checked after the key, before ``body`` (a body that claims its own: none).

        Three round trips whatever the body's own: ``BEGIN``, the key's claim and, where they
        go that way (``_claim_text``), the fence claim as one simple query; the body's
        statements; the record and ``COMMIT`` as one simple query (values as quoted literals)."""
        flight = _Flight()
        async with self._connection(flight) as conn:
            quote = _quoter(conn)
            claim = _claim_text(fences)
            head = [b"BEGIN", _CLAIM_KEY_SQL % (quote(once.key), quote(once.digest),
                                                int(once.ttl_ms))]
            if claim is not None:
                head.append(claim)
            try:
                cur = await conn.execute(b"; ".join(head), prepare=False)
                cur.nextset()
                claimed = await cur.fetchone()
                if claimed is None:  # recorded (and committed) by an earlier request
                    reply = await self._replay(conn, once)
                    await conn.rollback()
                    return reply
                if claim is not None:
                    cur.nextset()
                    (highest,) = await cur.fetchone()  # type: ignore[misc]
                    check_all(fences, [highest])
                elif fences:
                    check_all(fences, await self._raise_fences(conn, fences))
                reply = once.render(await body(conn))
                flight.committing = True
                await conn.execute(_RECORD_SQL % (
                    int(reply.status), quote(reply.body), quote(once.recorded_fences),
                    quote(once.key)), prepare=False)
            except BaseException:
                await _roll_back(conn)
                raise
        self._maybe_purge(once.ttl_ms)
        return reply

    async def _replay(self, conn: psycopg.AsyncConnection, once: Once) -> Reply:
        """The recorded answer of ``once.key`` (see ``Once.replay``), read in the open
        transaction."""
        found = await (await conn.execute(_READ_KEY, {"key": once.key})).fetchone()
        if found is None:  # expired and purged in between: rare, and safe to retry
            raise StoreUnavailable("the key's record expired meanwhile; nothing was committed "
                                   "(safe to retry)")
        try:
            return once.replay(*found)
        except StaleReplay as stale:  # a fence below the recorded one: 409
            raise stale.refusal(
                [await self._highest_on(conn, lock) for lock in stale.locks]) from None

    async def write_once(self, fence: Fence | None, op: WriteOp, once: Once) -> Reply:
        return await self._once(once, lambda conn: self._write_on(conn, fence, op))

    async def batch_once(self, fences: Sequence[Fence], ops: Sequence[WriteOp],
                         once: Once) -> Reply:
        try:
            return await self._once(once, lambda conn: self._batch_on(conn, fences, ops))
        except ProxyError as exc:  # a stale replay is refused before any op, as a stale batch
            if exc.code == "stale_token":
                exc.with_extra(op_index=0)
            raise

    def _maybe_purge(self, ttl_ms: int) -> None:
        """Start a purge of expired records in the background, at most once per
        ``PURGE_INTERVAL_S`` (or half the TTL if shorter) and one at a time (best effort)."""
        now = time.monotonic()
        interval = min(PURGE_INTERVAL_S, ttl_ms / 2000)
        if now - self._purged < interval or (self._purge_task and not self._purge_task.done()):
            return
        self._purged = now
        self._purge_task = asyncio.get_running_loop().create_task(self._purge(ttl_ms))

    async def _purge(self, ttl_ms: int) -> None:
        try:
            async with self._connection() as conn:
                await conn.execute(_PURGE, {"ttl": ttl_ms})
        except ProxyError as exc:
            log.info("idempotency record purge skipped: %s", exc.detail)

    async def _read(self, fence: Fence | None, sql: str, params: Mapping[str, Any]) -> list[tuple]:
        async with self._connection() as conn:
            if fence is None:
                cur = await conn.execute(sql, params)
                return await cur.fetchall()
            async with conn.pipeline():
                fenced = await conn.execute(*self._fence_check(fence))
                cur = await conn.execute(sql, params)
            found = await fenced.fetchone()
            rows = await cur.fetchall()
        self._judge(fence, found)
        return rows

    def _fence_check(self, fence: Fence) -> tuple[str, dict[str, Any]]:
        """The statement that claims ``fence`` for its purpose: the raising upsert of a write
        claim, or of a read claim (``fencing.try_claim_read``)."""
        return self.sql.fence_claim(fence)

    @staticmethod
    def _judge(fence: Fence, found: tuple | None) -> int:
        """``StaleToken`` unless ``fence`` passed; the highest."""
        highest = int(found[0]) if found else 0
        check(fence, highest)
        return highest

    async def read_row(self, table: Table, key: tuple[Any, ...], fence: Fence | None) -> Row:
        rows = await self._read(fence, self.sql.select_row(table), self.sql.key_params(table, key))
        if not rows:
            raise NotFound(f"no row with that key in table {table.name!r}")
        return decode_row(table, rows[0])

    async def list_rows(self, table: Table, filters: Mapping[str, Any], limit: int,
                        fence: Fence | None) -> list[Row]:
        sql, params = self.sql.select_rows(table, filters, limit)
        return [decode_row(table, row) for row in await self._read(fence, sql, params)]

    async def claim(self, fence: Fence) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(*self._fence_check(fence))
            found = await cur.fetchone()
        return self._judge(fence, found)

    async def claim_all(self, fences: Sequence[Fence]) -> list[int]:
        async with self._connection() as conn:
            async with conn.transaction():  # a stale fence rolls every raise back
                highest = await self._raise_fences(conn, fences)
                check_all(fences, highest)
        return highest

    # -- for another resource kind (objects): its statements in the fence's transaction ------

    async def fenced(self, fences: Sequence[Fence], body, once: Once | None = None) -> Any:
        """``await body(conn)`` in ONE transaction after the fence check of each of ``fences``
        (lock order; ``StaleToken`` and nothing committed if one is stale); with ``once``, the
        keyed form of ``write_once`` (a ``Reply``). Errors translated as for rows."""

        async def checked(conn: psycopg.AsyncConnection) -> Any:
            if fences:
                check_all(fences, await self._raise_fences(conn, fences))
            return await body(conn)

        if once is not None:
            return await self._once(once, body, fences)
        flight = _Flight()
        claim = _claim_text(fences)
        async with self._connection(flight) as conn:
            if claim is None:  # no fence, several, or a lock name that would need quoting
                async with conn.transaction():
                    result = await checked(conn)
                    flight.committing = True  # leaving the block sends COMMIT
                return result
            try:
                # BEGIN and the claim in ONE round trip (a simple query of two statements)
                cur = await conn.execute(b"BEGIN; " + claim, prepare=False)
                cur.nextset()
                (highest,) = await cur.fetchone()  # type: ignore[misc]
                check_all(fences, [highest])
                result = await body(conn)
                flight.committing = True
                await conn.commit()
            except BaseException:
                await _roll_back(conn)
                raise
            return result

    async def claimed_statement(self, fence: Fence, name: str, prepare: str,
                                arguments: Callable[[psycopg.AsyncConnection], str | None]
                                ) -> tuple | None:
        """ONE round trip for a write nothing can refuse once its fence passed (an inline
        object's PUT without preconditions): the write claim of ``fence`` and ``EXECUTE
        name(arguments(conn))`` as one simple query, which PostgreSQL runs as ONE transaction on
        the autocommit connection, each statement with its own snapshot (the statement's taken
        after the claim, as in ``fenced``). The claim is ``fencing.claim``, the database's
        form of the write rule: a stale fence raises there, the transaction aborts whole and
        ``check`` gives the ``StaleToken``. The statement is prepared once per session with SQL
        ``PREPARE`` (``prepare``: its text after the name, ``(types) AS statement``).
        ``arguments``: SQL literals quoted for ``conn``, or None when a value cannot be sent.
        The statement's first row; None, and nothing sent, if the claim cannot go this way (a
        read fence, a lock name that would need quoting, ``arguments`` None): use ``fenced``.
        A connection lost meanwhile is 502 ``outcome_unknown`` (the write may have committed)."""
        if fence.purpose is not WRITE or _SAFE_LOCK.fullmatch(fence.lock) is None:
            return None
        flight = _Flight()
        async with self._connection(flight) as conn:
            values = arguments(conn)
            if values is None:
                return None
            if name not in conn.statements:  # type: ignore[attr-defined]
                # once per session, a round trip of its own: it outlives a rollback, and the
                # set says exactly what this session has (``WatchedConnection._deallocate``)
                await conn.execute(f"PREPARE {name}{prepare}".encode(), prepare=False)
                conn.statements |= {name}  # type: ignore[attr-defined]
            flight.committing = True
            query = (f"SELECT fencing.claim('{fence.lock}', {int(fence.fence)}::bigint); "
                     f"EXECUTE {name}({values})")
            try:
                cur = await conn.execute(query.encode(), prepare=False)
            except psycopg.Error as exc:
                if exc.sqlstate == LF_STALE:
                    check(fence, _highest_of(exc))
                if exc.sqlstate == "26000":  # deallocated behind our back: prepared again next time
                    conn.statements = frozenset()  # type: ignore[attr-defined]
                raise
            cur.nextset()
            return await cur.fetchone()

    async def plain(self, body) -> Any:
        """``await body(conn)`` on a pooled autocommit connection (reads), errors translated."""
        async with self._connection() as conn:
            return await body(conn)

    async def _highest_on(self, conn: psycopg.AsyncConnection, lock: str) -> int:
        cur = await conn.execute(self.sql.d.fence_select, {"lock": lock})
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def highest(self, lock: str) -> int:
        async with self._connection() as conn:
            return await self._highest_on(conn, lock)
