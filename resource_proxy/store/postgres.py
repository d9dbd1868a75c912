"""The PostgreSQL store: raw psycopg 3 async pool on every request path (SQLAlchemy only at start).

- A single-row write is ONE autocommit statement: the fence upsert and the write in a CTE
  (``sql.SqlBuilder``, gated form). One round trip; PostgreSQL commits it atomically, and the
  fence row stays locked until that commit, which serializes the writers of one lock.
- A batch is an explicit transaction: the fence upsert, then each op, then COMMIT.
- A fenced read pipelines the fence upsert and the SELECT in one round trip; the SELECT is a
  separate statement so it takes its snapshot after the fence row was locked and raised, and sees
  every write that committed before (READ COMMITTED gives each statement a fresh snapshot).

Sessions run with ``TimeZone = UTC`` (timestamps come back with ``+00:00``) and load json/jsonb
with exact Decimals. Errors are translated at this boundary (``translate``); a connection that
broke is discarded by the pool and replaced in the background, so the proxy recovers by itself
when the database returns.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from resource_proxy.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    ProxyError,
    StoreUnavailable,
)
from resource_proxy.fencing import Fence, check
from resource_proxy.ops import WriteOp
from resource_proxy.store.base import Row
from resource_proxy.store.sql import POSTGRES, SqlBuilder
from resource_proxy.tables import Catalog, Table, decode_row, loads

__all__ = ["PostgresStore", "libpq_dsn", "translate"]

log = logging.getLogger("resource_proxy.store")

_CONFLICT = {"23505", "23503", "23P01"}  # unique, foreign key, exclusion
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
        return StoreUnavailable("no database connection became available in time")
    if not isinstance(exc, psycopg.Error):
        return StoreUnavailable("database error")
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
    return StoreUnavailable("the database did not complete the request; nothing was committed")


class PostgresStore:
    """``Store`` on PostgreSQL. ``pool_size`` connections; ``timeout_s`` to get one (then 503)."""

    def __init__(self, url: str, catalog: Catalog, *, pool_size: int = 10, timeout_s: float = 3.0):
        self.catalog = catalog
        self.sql = SqlBuilder(POSTGRES)
        self._timeout = timeout_s
        self._pool = AsyncConnectionPool(
            libpq_dsn(url),
            min_size=pool_size,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout_s))},
            configure=self._configure,
            timeout=timeout_s,
            reconnect_timeout=24 * 3600,
            name="resource-proxy",
            open=False,
        )

    @staticmethod
    async def _configure(conn: psycopg.AsyncConnection) -> None:
        set_json_loads(loads, conn)
        await conn.execute("SET TimeZone TO 'UTC'")

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, OSError) as exc:
            raise translate(exc) from None

    async def ping(self) -> None:
        async with self._connection() as conn:
            await conn.execute("SELECT 1")

    async def write(self, fence: Fence | None, op: WriteOp) -> Row | None:
        sql, params = self.sql.write(op, fence)
        async with self._connection() as conn:
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

    async def batch(self, fence: Fence | None, ops: Sequence[WriteOp]) -> list[Row | None]:
        results: list[Row | None] = []
        d = self.sql.d
        async with self._connection() as conn, conn.transaction():
            if fence is not None:
                cur = await conn.execute(d.fence_upsert, {"lock": fence.lock, "fence": fence.fence})
                (highest,) = await cur.fetchone()  # type: ignore[misc]
                try:
                    check(fence, highest)
                except ProxyError as exc:
                    raise exc.with_extra(op_index=0) from None
            for index, op in enumerate(ops):
                sql, params = self.sql.write(op, None)
                try:
                    cur = await conn.execute(sql, params)
                    row = await cur.fetchone()
                except psycopg.Error as exc:
                    if exc.sqlstate is None or exc.sqlstate.startswith(("08", "57")):
                        raise
                    raise translate(exc).with_extra(op_index=index) from None
                if row is None:
                    raise NotFound(
                        f"op {index}: no row with that key in table {op.table.name!r}", op_index=index
                    )
                results.append(None if op.kind == "delete" else decode_row(op.table, row))
        return results

    async def _read(self, fence: Fence | None, sql: str, params: Mapping[str, Any]) -> list[tuple]:
        async with self._connection() as conn:
            if fence is None:
                cur = await conn.execute(sql, params)
                return await cur.fetchall()
            async with conn.pipeline():
                fenced = await conn.execute(
                    self.sql.d.fence_upsert, {"lock": fence.lock, "fence": fence.fence}
                )
                cur = await conn.execute(sql, params)
            (highest,) = await fenced.fetchone()  # type: ignore[misc]
            rows = await cur.fetchall()
        check(fence, highest)
        return rows

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
            cur = await conn.execute(self.sql.d.fence_upsert, {"lock": fence.lock, "fence": fence.fence})
            (highest,) = await cur.fetchone()  # type: ignore[misc]
        check(fence, highest)
        return highest

    async def highest(self, lock: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(self.sql.d.fence_select, {"lock": lock})
            row = await cur.fetchone()
        return int(row[0]) if row else 0
