"""Reflected tables: what the proxy knows about each table, read from the database at start.

Everything comes from reflection (SQLAlchemy's inspector, plus ``format_type`` from PostgreSQL's
catalog for the casts of bound parameters): SQL is built only from these reflected identifiers,
every value travels as a bound parameter. How request values map onto these columns is
``values``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

__all__ = [
    "Kind",
    "Column",
    "Table",
    "Catalog",
    "reflect",
    "derived_tables",
]


class Kind(enum.Enum):
    INTEGER = "integer"
    NUMERIC = "numeric"
    FLOAT = "float"
    TEXT = "text"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    DATE = "date"
    TIME = "time"
    UUID = "uuid"
    JSON = "json"
    BYTES = "bytes"
    ENUM = "enum"
    ARRAY = "array"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class Column:
    """One reflected column. ``cast``: PostgreSQL type name for bound parameters ("" on SQLite)."""

    name: str
    kind: Kind
    nullable: bool = True
    cast: str = ""
    length: int | None = None
    int_bits: int | None = None
    labels: tuple[str, ...] = ()
    item: Column | None = None
    jsonb: bool = False
    generated: bool = False
    # Why equal values of this column may differ in text (a non-binary collation, citext,
    # char(n) padding): "" when equality is exact. Such a column cannot be bound per row.
    inexact: str = ""
    # PostgreSQL rounds on store: numeric(p, s) to ``scale`` decimals, timestamp(p)/time(p) to
    # ``scale`` fractional-second digits (None: no rounding). Canonical key text follows it.
    scale: int | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """A table of the allow-list: columns in table order, primary key in key order.

    ``fence_column`` (from the policy) receives the fence of the write that last touched a row.
    """

    name: str
    columns: dict[str, Column]
    primary_key: tuple[str, ...]
    fence_column: str | None = None
    column_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "column_names", tuple(self.columns))

    def with_fence_column(self, name: str | None) -> Table:
        return replace(self, fence_column=name)


Catalog = dict[str, Table]

_INT_BITS = {"smallint": 16, "integer": 32, "bigint": 64}


def _kind_of(sqltype: sa.types.TypeEngine, declared: str) -> tuple[Kind, dict[str, Any]]:
    """Classify a reflected SQLAlchemy type; ``declared`` is SQLite's declared type text."""
    extra: dict[str, Any] = {}
    if "UUID" in declared.upper() or isinstance(sqltype, sa.Uuid):
        return Kind.UUID, extra
    if isinstance(sqltype, sa.Enum):
        extra["labels"] = tuple(sqltype.enums)
        return Kind.ENUM, extra
    if isinstance(sqltype, sa.ARRAY):
        item_kind, item_extra = _kind_of(sqltype.item_type, "")
        extra["item"] = Column(name="", kind=item_kind, **item_extra)
        return Kind.ARRAY, extra
    if isinstance(sqltype, sa.Boolean):
        return Kind.BOOLEAN, extra
    if isinstance(sqltype, sa.Integer):
        extra["int_bits"] = 64  # SQLite's INTEGER; PostgreSQL's width comes from its catalog
        return Kind.INTEGER, extra
    if isinstance(sqltype, sa.Float):
        return Kind.FLOAT, extra
    if isinstance(sqltype, sa.Numeric):
        return Kind.NUMERIC, extra
    if isinstance(sqltype, sa.JSON):
        extra["jsonb"] = isinstance(sqltype, pg.JSONB)
        return Kind.JSON, extra
    if isinstance(sqltype, sa.DateTime):
        return (Kind.TIMESTAMPTZ if sqltype.timezone else Kind.TIMESTAMP), extra
    if isinstance(sqltype, sa.Date):
        return Kind.DATE, extra
    if isinstance(sqltype, sa.Time):
        return Kind.TIME, extra
    if isinstance(sqltype, sa.LargeBinary):
        return Kind.BYTES, extra
    if isinstance(sqltype, sa.String):
        if getattr(sqltype, "length", None):
            extra["length"] = int(sqltype.length)
        return Kind.TEXT, extra
    return Kind.ANY, extra


_DERIVED = """
SELECT c.relname,
       CASE WHEN c.relispartition THEN (SELECT r.relname FROM pg_class r
                                        WHERE r.oid = pg_partition_root(c.oid)) END,
       (SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
        WHERE i.inhrelid = c.oid ORDER BY i.inhseqno LIMIT 1)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
  AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)"""


def derived_tables(engine: sa.Engine) -> dict[str, str]:
    """PostgreSQL: the tables of the default schema whose rows are also rows of another table,
    ``{name: why}`` (``why`` says which table to write them through): partitions (their root)
    and inheritance children (their parent). A write through the parent reaches a child's rows
    under the parent's lock, so serving the child under a lock of its own would be two locks for
    one row; the database's fence triggers refuse such writes too. Empty on SQLite."""
    if engine.dialect.name != "postgresql":
        return {}
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(_DERIVED).all()
    return {name: (f"a partition of {root!r}: write its rows through {root!r}, whose lock "
                   "template governs every partition" if root is not None else
                   f"an inheritance child of {parent!r}: write its rows through {parent!r} "
                   f"(writes to {parent!r} reach them, under {parent!r}'s lock)")
            for name, root, parent in rows}


def reflect(engine: sa.Engine, allow: Sequence[str] | None, exclude: Iterable[str]) -> Catalog:
    """Reflect the tables of the default schema (``allow``: only these; ``exclude``: never these;
    without ``allow``, partitions and inheritance children are left out: ``derived_tables``).

    Raises ``ValueError`` if an allow-listed table does not exist (a typo should stop the start,
    not silently answer 404 forever).
    """
    excluded = set(exclude)
    if allow is None:
        excluded.update(derived_tables(engine))
    inspector = sa.inspect(engine)
    existing = [name for name in inspector.get_table_names() if name not in excluded]
    if allow is not None:
        missing = [name for name in allow if name not in existing]
        if missing:
            raise ValueError(f"tables not found in the database's default schema: {missing}")
        names = list(dict.fromkeys(allow))
    else:
        names = existing
    is_pg = engine.dialect.name == "postgresql"
    catalog: Catalog = {}
    with engine.connect() as conn:
        for name in names:
            casts: dict[str, str] = {}
            declared: dict[str, str] = {}
            inexact: dict[str, str] = {}
            if is_pg:
                rows = conn.exec_driver_sql(
                    "SELECT a.attname, format_type(a.atttypid, NULL), co.collname,"
                    " co.collisdeterministic FROM pg_attribute a"
                    " JOIN pg_class c ON c.oid = a.attrelid"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " LEFT JOIN pg_collation co ON co.oid = a.attcollation"
                    " WHERE n.nspname = current_schema() AND c.relname = %(name)s"
                    " AND a.attnum > 0 AND NOT a.attisdropped",
                    {"name": name},
                )
                for column, cast, collation, deterministic in rows:
                    casts[column] = cast
                    inexact[column] = _pg_inexact(cast, collation, deterministic)
            else:
                rows = conn.exec_driver_sql("SELECT name, type FROM pragma_table_info(?)", (name,))
                declared = {row[0]: row[1] or "" for row in rows}
                inexact = _sqlite_collations(conn, name)
            columns: dict[str, Column] = {}
            pk = tuple(inspector.get_pk_constraint(name).get("constrained_columns") or ())
            for info in inspector.get_columns(name):
                kind, extra = _kind_of(info["type"], declared.get(info["name"], ""))
                if is_pg and kind is Kind.INTEGER:
                    extra["int_bits"] = _INT_BITS.get(casts.get(info["name"], ""), 64)
                if is_pg and kind in (Kind.NUMERIC, Kind.TIMESTAMP, Kind.TIMESTAMPTZ, Kind.TIME):
                    digits = getattr(info["type"], "scale" if kind is Kind.NUMERIC else "precision", None)
                    if isinstance(digits, int) and (kind is Kind.NUMERIC or digits < 6):
                        extra["scale"] = digits
                if not is_pg and kind is Kind.TIMESTAMP:
                    kind = Kind.TIMESTAMPTZ  # SQLite has no zone type: store UTC with its offset
                identity = info.get("identity") or {}
                generated = bool(info.get("computed")) or bool(identity.get("always"))
                columns[info["name"]] = Column(
                    name=info["name"],
                    kind=kind,
                    # a key value is never NULL: it has no lock name. PostgreSQL enforces
                    # it; SQLite does not for a non-INTEGER key (a legacy quirk), so here
                    nullable=bool(info.get("nullable", True)) and info["name"] not in pk,
                    cast=casts.get(info["name"], ""),
                    generated=generated,
                    inexact=inexact.get(info["name"], ""),
                    **extra,
                )
            catalog[name] = Table(name=name, columns=columns, primary_key=pk)
    return catalog


def _pg_inexact(cast: str, collation: str | None, deterministic: bool | None) -> str:
    if cast == "citext":
        return "case-insensitively (citext)"
    if cast == "character":
        return "ignoring trailing spaces (char(n))"
    if deterministic is False:
        return f"under the nondeterministic collation {collation!r}"
    return ""


_COLLATE = re.compile(r"\bCOLLATE\s+[\"'`\[]?(\w+)", re.IGNORECASE)


def _sqlite_collations(conn: sa.Connection, table: str) -> dict[str, str]:
    """Columns of ``table`` compared under a collation other than BINARY (NOCASE, RTRIM, ...):
    the collation of the primary key's index, and any ``COLLATE`` in a column's definition."""
    found: dict[str, str] = {}
    for index in conn.exec_driver_sql("SELECT name, origin FROM pragma_index_list(?)", (table,)):
        if index[1] != "pk":
            continue
        for row in conn.exec_driver_sql(
                "SELECT name, coll FROM pragma_index_xinfo(?) WHERE key = 1", (index[0],)):
            if row[0] and row[1] and row[1].upper() != "BINARY":
                found[row[0]] = f"under the collation {row[1].upper()}"
    sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                               (table,)).scalar() or ""
    body = sql[sql.find("(") + 1:]
    for definition in body.split(","):
        words = definition.strip().split(None, 1)
        match = _COLLATE.search(definition)
        if words and match and match.group(1).upper() != "BINARY":
            column = words[0].strip("\"'`[]")
            found.setdefault(column, f"under the collation {match.group(1).upper()}")
    return found
