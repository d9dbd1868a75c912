"""SQL text for both databases, built only from reflected identifiers; values are parameters.

``Dialect`` knows quoting, placeholders and the fence upsert of one database; ``SqlBuilder``
turns a ``WriteOp`` (or a read) into SQL text and its parameters, caching the text per
(table, op, columns) so the hot path does no string work beyond a dict lookup.

Two shapes of write:

- *gated* (PostgreSQL, single-row writes): ONE statement, run in autocommit, that is the fence
  check and the write together::

      WITH fence AS (SELECT fencing.try_claim(:lock, :fence) AS highest),
           w AS (<write> WHERE … AND EXISTS (SELECT 1 FROM fence WHERE highest = :fence)
                 RETURNING 1, <columns>)
      SELECT (SELECT highest FROM fence), w.* FROM (SELECT 1) AS one LEFT JOIN w ON true

  The EXISTS is an init-plan evaluated before the target table is touched, so the fence row is
  always locked first (no lock-order deadlocks with batches), and the claim ``try_claim``
  records is in place when a row trigger of ``resource-proxy db install`` checks the row. One
  round trip, one transaction.
- *plain*: the write alone, after a separate fence claim inside an explicit transaction
  (batches; SQLite).

The fence claim on PostgreSQL is ``fencing.try_claim`` (``dbfence.sql``: the conditional upsert
of ``fencing.fences``, which also records the claim for the transaction's row triggers), for a
fence taken for reading ``fencing.try_claim_read`` (the same raise, a claim that lets no row be
written); on SQLite the upsert itself, for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg.types.json import Json, Jsonb

from lockd.common.fencerule import Fence
from resource_proxy.codec import dumps
from resource_proxy.dbfence.sql import PROXY_TRY_CLAIM, PROXY_TRY_CLAIM_MANY, PROXY_TRY_CLAIM_READ
from resource_proxy.errors import InvalidRequest
from resource_proxy.fencing import PG_FENCES, SQLITE_TABLE
from resource_proxy.rows.tables import Column, Kind, Table
from resource_proxy.rows.writes import WriteOp

__all__ = ["Dialect", "POSTGRES", "SQLITE", "SqlBuilder"]

_CACHE_MAX = 4096


class Dialect:
    """Quoting, placeholders and value adaptation of one database."""

    def __init__(self, name: str):
        self.name = name
        self.is_pg = name == "postgresql"
        if self.is_pg:
            fences = PG_FENCES
            # one row, "highest": the claim, or the highest above the presented fence
            self.fence_upsert = PROXY_TRY_CLAIM
            self.fence_read_claim = PROXY_TRY_CLAIM_READ
        else:
            fences = self.q(SQLITE_TABLE)
            greatest = "max"
            self.fence_upsert = (
                f'INSERT INTO {fences} AS f ("lock", highest) VALUES ({self.p("lock")}, '
                f'{self.p("fence", "bigint")}) ON CONFLICT ("lock") DO UPDATE SET '
                f"highest = {greatest}(f.highest, excluded.highest) RETURNING highest"
            )
            self.fence_read_claim = self.fence_upsert  # no claims to record: the raise alone
        self.fence_select = f'SELECT highest FROM {fences} WHERE "lock" = {self.p("lock")}'

    def q(self, identifier: str) -> str:
        """A quoted identifier (reflected names only)."""
        quoted = '"' + identifier.replace('"', '""') + '"'
        return quoted.replace("%", "%%") if self.is_pg else quoted

    def p(self, name: str, cast: str = "") -> str:
        """The placeholder of parameter ``name`` (PostgreSQL: with an explicit cast)."""
        if self.is_pg:
            return f"%({name})s::{cast}" if cast else f"%({name})s"
        return f":{name}"

    def adapt(self, column: Column, value: Any) -> Any:
        """A coerced value as this database's driver takes it."""
        if value is None:
            return None
        if self.is_pg:
            if column.kind is Kind.JSON:
                return (Jsonb if column.jsonb else Json)(value, dumps=dumps)
            return value
        if column.kind is Kind.JSON or column.kind is Kind.ARRAY:
            return dumps(value)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, Decimal):
            # SQLite's NUMERIC affinity keeps a non-integer as a REAL: beyond its range that
            # would be a silent Infinity, so refuse it (PostgreSQL refuses it by itself)
            if math.isinf(float(value)):
                raise InvalidRequest(f"column {column.name!r}: expected a number within the range "
                                     "SQLite can store (about 1.8e308)", column=column.name)
            if column.kind is Kind.NUMERIC and not _sqlite_keeps(value):
                raise InvalidRequest(
                    f"column {column.name!r}: {value} cannot be stored exactly by SQLite (a "
                    f"NUMERIC column keeps a 64-bit integer or a double, about 15 significant "
                    f"digits); send fewer digits, or use PostgreSQL or a TEXT column",
                    column=column.name)
            return str(value)
        if isinstance(value, datetime | date | time):
            return value.isoformat()
        if isinstance(value, UUID):
            return str(value)
        return value


def _sqlite_keeps(value: Decimal) -> bool:
    """Whether SQLite's NUMERIC affinity stores ``value`` without changing it: an integer within
    64 bits is stored as INTEGER, anything else as a double, which keeps it only if the double's
    shortest text is the same number (``0.1`` yes, ``12345678901234567.89`` no). Trailing zeros
    are not kept either way (``5.00`` reads back as ``5``): same number, so accepted."""
    if value == value.to_integral_value() and -(2**63) <= value < 2**63:
        return True
    return Decimal(repr(float(value))) == value


POSTGRES = Dialect("postgresql")
SQLITE = Dialect("sqlite")


class SqlBuilder:
    """Cached SQL text + parameters for the writes and reads of one dialect."""

    def __init__(self, dialect: Dialect):
        self.d = dialect
        self._cache: dict[tuple[Any, ...], str] = {}

    def _cached(self, key: tuple[Any, ...], build) -> str:
        sql = self._cache.get(key)
        if sql is None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            sql = self._cache[key] = build()
        return sql

    # -- pieces --------------------------------------------------------------------------

    def _param(self, table: Table, column: str, name: str) -> str:
        return self.d.p(name, table.columns[column].cast)

    def _where_key(self, table: Table) -> str:
        return " AND ".join(
            f"{self.d.q(c)} = {self._param(table, c, f'k{i}')}" for i, c in enumerate(table.primary_key)
        )

    def _returning(self, table: Table) -> str:
        return ", ".join(self.d.q(c) for c in table.column_names)

    def _write_sql(self, op: WriteOp, gated: bool) -> str:
        d, table = self.d, op.table
        cols = list(op.values)
        names = ", ".join(d.q(c) for c in cols)
        params = ", ".join(self._param(table, c, f"v{i}") for i, c in enumerate(cols))
        gate = f"EXISTS (SELECT 1 FROM fence WHERE highest = {d.p('fence', 'bigint')})"
        returning = ("1, " if gated else "") + self._returning(table)
        target = d.q(table.name)
        if op.kind in ("insert", "upsert"):
            source = f"SELECT {params} WHERE {gate}" if gated else f"VALUES ({params})"
            sql = f"INSERT INTO {target} ({names}) {source}"
            if op.kind == "upsert":
                pk = table.primary_key
                replace = [c for c in table.column_names if c not in pk and not table.columns[c].generated]
                sets = ", ".join(f"{d.q(c)} = excluded.{d.q(c)}" for c in (replace or pk[:1]))
                sql += f" ON CONFLICT ({', '.join(d.q(c) for c in pk)}) DO UPDATE SET {sets}"
        elif op.kind == "update":
            sets = ", ".join(f"{d.q(c)} = {self._param(table, c, f'v{i}')}" for i, c in enumerate(cols))
            sql = f"UPDATE {target} SET {sets} WHERE {self._where_key(table)}"
            if gated:
                sql += f" AND {gate}"
        else:
            sql = f"DELETE FROM {target} WHERE {self._where_key(table)}"
            if gated:
                sql += f" AND {gate}"
        sql += f" RETURNING {returning}"
        if gated:
            sql = (
                f"WITH fence AS ({d.fence_upsert}), w AS ({sql}) "
                "SELECT (SELECT highest FROM fence), w.* FROM (SELECT 1) AS one LEFT JOIN w ON true"
            )
        return sql

    # -- public --------------------------------------------------------------------------

    def fence_claim(self, fence: Fence) -> tuple[str, dict[str, Any]]:
        """SQL + params claiming ``fence`` for its purpose (one row, ``highest``)."""
        sql = self.d.fence_upsert if fence.writes else self.d.fence_read_claim
        return sql, {"lock": fence.lock, "fence": fence.fence}

    def fence_upsert_many(self) -> str:
        """PostgreSQL: the fence claim of several locks in ONE statement (``%(locks)s`` text[],
        ``%(fences)s`` bigint[], ``%(purposes)s`` text[] of ``write``/``read``), returning
        ``(lock, highest)`` per lock: ``fencing.try_claim_many``, which inserts or locks the
        fence rows in ``COLLATE "C"`` (code-point) order of the lock name, the order
        ``fencerule.in_lock_order`` gives, so concurrent multi-lock batches never deadlock."""
        assert self.d.is_pg
        return PROXY_TRY_CLAIM_MANY

    def write(self, op: WriteOp, fence: Fence | None) -> tuple[str, dict[str, Any]]:
        """SQL + params of ``op``; gated (fence check inside) when ``fence`` is given."""
        gated = fence is not None
        key = ("w", op.table.name, op.kind, tuple(op.values), gated)
        sql = self._cached(key, lambda: self._write_sql(op, gated))
        params = {f"v{i}": self.d.adapt(op.table.columns[c], v) for i, (c, v) in enumerate(op.values.items())}
        if op.kind in ("update", "delete"):
            assert op.key is not None
            params.update(self.key_params(op.table, op.key))
        if fence is not None:
            params["lock"], params["fence"] = fence.lock, fence.fence
        return sql, params

    def key_params(self, table: Table, key: tuple[Any, ...]) -> dict[str, Any]:
        return {
            f"k{i}": self.d.adapt(table.columns[c], v)
            for i, (c, v) in enumerate(zip(table.primary_key, key, strict=True))
        }

    def select_row(self, table: Table) -> str:
        return self._cached(
            ("r", table.name),
            lambda: f"SELECT {self._returning(table)} FROM {self.d.q(table.name)} WHERE {self._where_key(table)}",
        )

    def select_rows(self, table: Table, filters: Mapping[str, Any], limit: int) -> tuple[str, dict[str, Any]]:
        """SQL + params listing rows whose columns equal ``filters``, in key order."""
        cols = tuple(filters)

        def build() -> str:
            sql = f"SELECT {self._returning(table)} FROM {self.d.q(table.name)}"
            if cols:
                sql += " WHERE " + " AND ".join(
                    f"{self.d.q(c)} = {self._param(table, c, f'f{i}')}" for i, c in enumerate(cols)
                )
            if table.primary_key:
                sql += " ORDER BY " + ", ".join(self.d.q(c) for c in table.primary_key)
            return sql + f" LIMIT {self.d.p('limit', 'bigint')}"

        sql = self._cached(("l", table.name, cols), build)
        params = {f"f{i}": self.d.adapt(table.columns[c], v) for i, (c, v) in enumerate(filters.items())}
        params["limit"] = limit
        return sql, params

