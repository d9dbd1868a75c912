"""The SQLite store (the embedded default): one connection, one writer at a time.

Every fenced call is ``BEGIN IMMEDIATE`` (the database's write lock, so other processes on the
same file wait for it too) + fence upsert (one per lock a batch or claim touches, in lock-name
order) + the write(s) or read + ``COMMIT``; anything failing rolls the whole transaction back,
fence upserts included. The connection is used from worker
threads under a mutex, so the event loop never blocks on the disk. Journal: WAL with
``synchronous = FULL`` (an acknowledged write survives a power cut); foreign keys enforced.

A write with an ``Idempotency-Key`` (``*_once``) looks its record up first in the same
transaction (a replay ends there) and records its answer before COMMIT (``idempotency``). A
COMMIT that fails but leaves no transaction open (an I/O error while the WAL was written: the
frames may be recovered at the next open) is ``outcome_unknown``; one that leaves the
transaction open is rolled back: ``database_unavailable``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from lockd.common.fencerule import Fence
from resource_proxy.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    ProxyError,
    StoreUnavailable,
)
from resource_proxy.fencing import check_all
from resource_proxy.idempotency import (
    PURGE_BATCH,
    PURGE_INTERVAL_S,
    SQLITE_TABLE,
    Once,
    Reply,
    StaleReplay,
)
from resource_proxy.rows.tables import Catalog, Table
from resource_proxy.rows.values import decode_row
from resource_proxy.rows.writes import WriteOp
from resource_proxy.store.base import Row
from resource_proxy.store.sql import SQLITE, SqlBuilder

__all__ = ["SqliteStore", "translate"]

T = TypeVar("T")
_READ_KEY = (f"SELECT digest, status, body, fences, created_ms FROM {SQLITE_TABLE} "
             "WHERE key = :key")
_RECORD = (f"INSERT OR REPLACE INTO {SQLITE_TABLE} (key, digest, status, body, fences, "
           "created_ms) VALUES (:key, :digest, :status, :body, :fences, :now)")
_PURGE = (f"DELETE FROM {SQLITE_TABLE} WHERE key IN (SELECT key FROM {SQLITE_TABLE} "
          f"WHERE created_ms < :cutoff LIMIT {PURGE_BATCH})")


def translate(exc: Exception) -> ProxyError:
    """A sqlite3 error -> the proxy's error."""
    message = str(exc)
    if isinstance(exc, sqlite3.IntegrityError):
        if message.startswith(("UNIQUE", "FOREIGN KEY", "PRIMARY KEY")):
            return Conflict(message)
        if message.startswith("NOT NULL constraint failed: "):
            column = message.rsplit(".", 1)[-1]
            return InvalidRequest(message, column=column)
        return InvalidRequest(message)
    if isinstance(exc, OverflowError | sqlite3.DataError | sqlite3.InterfaceError):
        return InvalidRequest(f"the database refused a value: {message}")
    return StoreUnavailable(f"the database did not complete the request ({message}); nothing was "
                            "committed (safe to retry)")


def _one(fence: Fence | None) -> list[Fence]:
    return [] if fence is None else [fence]


def _now_ms() -> int:
    return int(time.time() * 1000)


class SqliteStore:
    """``Store`` on a SQLite file. ``timeout_s``: how long to wait for another writer (then 503)."""

    def __init__(self, path: str, catalog: Catalog, *, timeout_s: float = 3.0):
        self.catalog = catalog
        self.sql = SqlBuilder(SQLITE)
        self._path = path
        self._timeout = timeout_s
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._purged = float("-inf")

    async def open(self) -> None:
        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(self._path, timeout=self._timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            return conn

        self._conn = await asyncio.to_thread(connect)

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.to_thread(conn.close)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._mutex:
                if self._conn is None:
                    raise StoreUnavailable("the store is closed")
                try:
                    return fn(self._conn)
                except (sqlite3.Error, OverflowError) as exc:
                    raise translate(exc) from None

        return await asyncio.to_thread(call)

    def _check(self, conn: sqlite3.Connection, fences: Sequence[Fence]) -> None:
        """The fence upsert of each of ``fences`` (lock order; a read's as a write's: SQLite
        keeps no claims) in the open transaction, then ``check_all`` (``StaleToken`` listing
        the stale ones)."""
        highest = [conn.execute(*self.sql.fence_claim(f)).fetchone()[0] for f in fences]
        check_all(fences, highest)

    def _fenced(self, conn: sqlite3.Connection, fences: Sequence[Fence],
                body: Callable[[], T]) -> T:
        """``BEGIN IMMEDIATE``, fence checks (none for an unfenced table's writes: ``fences``
        empty), ``body()``, ``COMMIT``; ROLLBACK on any error."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._check(conn, fences)
            result = body()
            self._commit(conn)
            return result
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _commit(conn: sqlite3.Connection) -> None:
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                raise  # still open: the caller rolls it back, nothing committed
            raise OutcomeUnknown(f"the database failed while committing ({exc}): the write may or "
                                 "may not have committed; retry with the same Idempotency-Key") from None

    def _once(self, conn: sqlite3.Connection, fences: Sequence[Fence], once: Once,
              body: Callable[[], object]) -> Reply:
        """Like ``_fenced``, with the record of ``once.key`` looked up first and written last."""
        now = _now_ms()
        conn.execute("BEGIN IMMEDIATE")
        try:
            found = conn.execute(_READ_KEY, {"key": once.key}).fetchone()
            if found is not None and found[4] >= now - once.ttl_ms:
                try:
                    reply = once.replay(*found[:4])
                except StaleReplay as stale:  # a fence below the recorded one: 409
                    raise stale.refusal([self._highest_on(conn, lock)
                                         for lock in stale.locks]) from None
                conn.execute("ROLLBACK")
                return reply
            self._check(conn, fences)  # none: only unfenced tables are written
            reply = once.render(body())
            conn.execute(_RECORD, {"key": once.key, "digest": once.digest, "status": reply.status,
                                   "body": reply.body, "fences": once.recorded_fences,
                                   "now": now})
            self._commit(conn)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if now - self._purged >= min(PURGE_INTERVAL_S * 1000, once.ttl_ms / 2):  # best effort
            self._purged = now
            try:
                conn.execute(_PURGE, {"cutoff": now - once.ttl_ms})
            except sqlite3.Error:
                pass  # the write is committed; the purge runs again later
        return reply

    async def write_once(self, fence: Fence | None, op: WriteOp, once: Once) -> Reply:
        return await self._run(
            lambda conn: self._once(conn, _one(fence), once,
                                    lambda: self._apply(conn, [op], False)[0]))

    async def batch_once(self, fences: Sequence[Fence], ops: Sequence[WriteOp],
                         once: Once) -> Reply:
        def run(conn: sqlite3.Connection) -> Reply:
            try:
                return self._once(conn, fences, once, lambda: self._apply(conn, ops, True))
            except ProxyError as exc:
                if exc.code == "stale_token":
                    exc.with_extra(op_index=0)
                raise

        return await self._run(run)

    def _apply(self, conn: sqlite3.Connection, ops: Sequence[WriteOp], indexed: bool) -> list[Row | None]:
        results: list[Row | None] = []
        for index, op in enumerate(ops):
            where = {"op_index": index} if indexed else {}
            sql, params = self.sql.write(op, None)
            try:
                row = conn.execute(sql, params).fetchone()
            except (sqlite3.Error, OverflowError) as exc:
                raise translate(exc).with_extra(**where) from None
            if row is None:
                raise NotFound(f"no row with that key in table {op.table.name!r}", **where)
            results.append(None if op.kind == "delete" else decode_row(op.table, row))
        return results

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def write(self, fence: Fence | None, op: WriteOp) -> Row | None:
        return await self._run(
            lambda conn: self._fenced(conn, _one(fence), lambda: self._apply(conn, [op], False))[0])

    async def batch(self, fences: Sequence[Fence], ops: Sequence[WriteOp]) -> list[Row | None]:
        def run(conn: sqlite3.Connection) -> list[Row | None]:
            try:
                return self._fenced(conn, fences, lambda: self._apply(conn, ops, True))
            except ProxyError as exc:
                if exc.code == "stale_token":
                    exc.with_extra(op_index=0)
                raise

        return await self._run(run)

    async def _read(self, fence: Fence | None, sql: str, params: Mapping[str, Any]) -> list[tuple]:
        def run(conn: sqlite3.Connection) -> list[tuple]:
            if fence is None:
                return conn.execute(sql, params).fetchall()
            return self._fenced(conn, [fence], lambda: conn.execute(sql, params).fetchall())

        return await self._run(run)

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
        return await self._run(lambda conn: self._fenced(conn, [fence], lambda: fence.fence))

    async def claim_all(self, fences: Sequence[Fence]) -> list[int]:
        return await self._run(
            lambda conn: self._fenced(conn, fences, lambda: [f.fence for f in fences]))

    # -- for another resource kind (objects): its statements in the fence's transaction ------

    async def fenced(self, fences: Sequence[Fence], body: Callable[[sqlite3.Connection], T],
                     once: Once | None = None) -> Any:
        """``body(conn)`` in ONE ``BEGIN IMMEDIATE`` transaction after the fence check of each
        of ``fences`` (``StaleToken`` and nothing committed if one is stale); with ``once``, the
        keyed form of ``write_once`` (a ``Reply``). Errors translated as for rows."""
        if once is not None:
            return await self._run(lambda conn: self._once(conn, fences, once, lambda: body(conn)))
        return await self._run(lambda conn: self._fenced(conn, fences, lambda: body(conn)))

    async def plain(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body(conn)`` outside any transaction (reads), errors translated."""
        return await self._run(body)

    def _highest_on(self, conn: sqlite3.Connection, lock: str) -> int:
        row = conn.execute(self.sql.d.fence_select, {"lock": lock}).fetchone()
        return int(row[0]) if row else 0

    async def highest(self, lock: str) -> int:
        return await self._run(lambda conn: self._highest_on(conn, lock))
