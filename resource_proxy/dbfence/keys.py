"""Which key columns the database can turn into lock-name text, and the SQL expression for each.

Each supported kind maps to one ``fencing.key_*`` function (``sql.KEY_FUNCTIONS``) that produces,
from the value PostgreSQL STORED, exactly what ``canonical.key_part`` produces in Python (the
differential test in tests/proxy/dbfence proves it on generated spellings). Types where PostgreSQL
stores something other than the client spelled and Python cannot follow are refused
(``refusal``): the proxy calls it at start and ``install`` before touching the database.
"""

from __future__ import annotations

import resource_proxy.dbfence.sql as sql
from resource_proxy.canonical import unbindable
from resource_proxy.rows.tables import Column, Kind

__all__ = ["refusal", "key_expression"]

# PostgreSQL type (format_type without modifiers) -> why a key of that type is refused.
_REFUSED = {
    "time with time zone": "a value without an offset takes the session's TimeZone (and its "
                           "DST rule on the current date), so one spelling can store two rows",
    '"char"': "PostgreSQL keeps only the first byte, so 'ab' and 'a' are one stored row",
    "name": "PostgreSQL truncates it to 63 bytes, so two longer spellings are one stored row",
    "character": "char(n) pads with spaces and compares ignoring them",
}

_SIMPLE = {
    Kind.INTEGER: ("key_int", "bigint", False),
    Kind.NUMERIC: ("key_numeric", "numeric", False),
    Kind.FLOAT: ("key_float8", "double precision", False),
    Kind.UUID: ("key_uuid", "uuid", False),
    Kind.BOOLEAN: ("key_bool", "boolean", False),
    Kind.TIMESTAMP: ("key_timestamp", "timestamp without time zone", False),
    Kind.TIMESTAMPTZ: ("key_timestamptz", "timestamp with time zone", False),
    Kind.DATE: ("key_date", "date", False),
    Kind.TIME: ("key_time", "time without time zone", True),
    Kind.BYTES: ("key_bytea", "bytea", False),
}


def refusal(column: Column) -> str | None:
    """One line naming ``column`` and its type if it cannot be part of a lock name on
    PostgreSQL (the database and the proxy could disagree on which lock governs a row); None if
    it can. ``column`` comes from ``tables.reflect`` on PostgreSQL (``cast`` is its type)."""
    cast = column.cast or column.kind.value
    reason = _REFUSED.get(column.cast)
    if reason is not None:
        return (f"key column {column.name!r} ({cast}) cannot be bound to a lock: {reason}; "
                "use a literal lock for its table, or another key type")
    reason = unbindable(column)
    if reason is not None:
        return f"key column {column.name!r} ({cast}) cannot be bound to a lock: {reason}"
    if column.kind not in _SIMPLE and column.kind not in (Kind.TEXT, Kind.ENUM):
        return f"key column {column.name!r} ({cast}) has no canonical text in the database"
    return None


def key_expression(column: Column, ref: str, *, inline: bool = False) -> str:
    """The SQL text of ``canonical.key_part(column, <ref>)`` (escaped), ``ref`` an expression
    of the column's type: calls of the ``fencing.key_*`` functions, or with ``inline`` what
    they compute (``sql.inline_key``: the row triggers' form). ``ValueError`` if
    ``refusal(column)`` is not None."""
    reason = refusal(column)
    if reason is not None:
        raise ValueError(reason)
    if column.kind in (Kind.TEXT, Kind.ENUM):
        text = f"({ref})::text"
        return sql.inline_escape(text) if inline else f"fencing.escape({text})"
    function, arg, escaped = _SIMPLE[column.kind]
    value = f"({ref})::{arg}"
    call = sql.inline_key(function, value) if inline else f"fencing.{function}({value})"
    if not escaped:
        return call
    return sql.inline_escape(call) if inline else f"fencing.escape({call})"
