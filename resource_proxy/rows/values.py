"""JSON <-> column values, and row keys, for the tables ``tables`` reflected.

Value mapping (request JSON -> column; response column -> JSON)::

    kind        accepts                                     returns
    integer     integer, integral number, "42"             integer   (range of its width checked)
    numeric     number or string, parsed as Decimal         string    (exact: "12.50")
    float       number or numeric string                    number
    text        string (no NUL; varchar(n) length checked)  string
    boolean     true/false, "true"/"false"                  boolean
    timestamp   ISO 8601 string (timestamptz, and SQLite's  ISO 8601 string
                DATETIME/TIMESTAMP: naive means UTC)
    date, time  ISO 8601 string                             ISO 8601 string
    uuid        string                                      string
    json        any JSON value (numbers kept exact)         the JSON value
    bytes       base64 string                               base64 string
    enum        one of the enum's labels                    string
    array       list of the element kind                    list
    any         string / number / boolean (other types: the database parses and may refuse)

A value of the wrong kind raises ``InvalidRequest`` naming the column. Hostile text is refused
the same way, before any driver sees it: a string that is not valid Unicode (a lone surrogate
such as ``"\\ud800"``, legal in JSON text but not encodable as UTF-8), digits that are not ASCII
(``"²"``, ``"٣"``: ``int``/``Decimal`` would take some of them, as aliases of ASCII numbers), and a
timestamp whose zone offset moves it outside years 1-9999 once converted to UTC. Request bodies are parsed
with ``parse_float=Decimal`` (``loads``) so no precision is lost before a numeric column sees it;
``dumps`` writes Decimals back as exact JSON numbers. On SQLite, NUMERIC affinity keeps about 15
significant digits (SQLite's own limit); PostgreSQL ``numeric`` keeps them all.

Keys: in URLs the primary key values in primary key order joined by ``,`` each percent-encoded
(``parse_url_key``); in batch ops a scalar, a list in key order, or ``{column: value}``
(``parse_json_key``). A key value is never NULL (422 naming the column), in a key or in a row:
NULL has no lock name. ``tables.reflect`` marks every key column NOT NULL, also on SQLite, which
lets a non-INTEGER key hold NULL; ``null`` for an INTEGER PRIMARY KEY or a serial does not ask
for an assigned key either (leave the column out for that).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import unquote

from resource_proxy.codec import loads
from resource_proxy.errors import InvalidRequest
from resource_proxy.rows.tables import Column, Kind, Table

__all__ = [
    "coerce",
    "is_unicode",
    "parse_url_key",
    "parse_json_key",
    "key_text",
    "decode_row",
    "MAX_JSON_DEPTH",
]


# ---------------------------------------------------------------------------------------------
# JSON value -> column value

_INT_RE = re.compile(r"[+-]?[0-9]{1,40}")
MAX_JSON_DEPTH = 64


def _bad(column: Column, expected: str) -> InvalidRequest:
    return InvalidRequest(f"column {column.name!r}: expected {expected}", column=column.name)


def is_unicode(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (no lone surrogates: ``"\\ud800"`` is valid JSON
    text, but no database driver can send it)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_value(column: Column, value: str) -> str:
    if not is_unicode(value):
        raise _bad(column, "valid Unicode text (a lone surrogate is not)")
    if "\x00" in value:
        raise _bad(column, "a string without NUL characters")
    return value


def _to_decimal(column: Column, value: Any) -> Decimal:
    if isinstance(value, bool):
        raise _bad(column, "a number")
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, int | float):
        number = Decimal(value)
    elif isinstance(value, str) and len(value) <= 1000 and value.isascii():
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise _bad(column, "a number") from None
    else:
        raise _bad(column, "a number")
    if not number.is_finite():
        raise _bad(column, "a finite number")
    return number


def _to_int(column: Column, value: Any) -> int:
    if isinstance(value, bool):
        raise _bad(column, "an integer")
    if isinstance(value, int):
        number = value
    elif isinstance(value, Decimal):
        # adjusted(): the exponent of the leading digit; bounds int() (1e999999999 would hang)
        if not value.is_finite() or value.adjusted() > 40 or value != value.to_integral_value():
            raise _bad(column, "an integer")
        number = int(value)
    elif isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise _bad(column, "an integer")
    bits = column.int_bits or 64
    if not -(1 << (bits - 1)) <= number < (1 << (bits - 1)):
        raise _bad(column, f"an integer that fits in {bits} bits")
    return number


def _to_datetime(column: Column, value: Any) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise _bad(column, "an ISO 8601 timestamp string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _bad(column, "an ISO 8601 timestamp string") from None
    try:  # the offset may move 0001-01-01 or 9999-12-31 out of datetime's range
        if column.kind is Kind.TIMESTAMP:
            return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:
        raise _bad(column, "a timestamp within the years 1 to 9999 in UTC") from None


def coerce(column: Column, value: Any, *, from_text: bool = False) -> Any:
    """The Python value for ``column`` from a JSON value (or URL/query text if ``from_text``).

    Raises ``InvalidRequest`` (with ``column``) for a value of the wrong kind or a NOT NULL
    column given null.
    """
    if value is None:
        if not column.nullable:
            raise InvalidRequest(f"column {column.name!r} may not be null", column=column.name)
        return None
    kind = column.kind
    if from_text and kind in (Kind.JSON, Kind.ARRAY):
        raise InvalidRequest(
            f"column {column.name!r} ({kind.value}) cannot be given in a URL", column=column.name
        )
    if kind is Kind.INTEGER:
        return _to_int(column, value)
    if kind is Kind.NUMERIC:
        return _to_decimal(column, value)
    if kind is Kind.FLOAT:
        number = float(_to_decimal(column, value))
        if math.isinf(number):
            raise _bad(column, "a number within the range of a float")
        return number
    if kind is Kind.TEXT:
        if not isinstance(value, str):
            raise _bad(column, "a string")
        _text_value(column, value)
        if column.length is not None and len(value) > column.length:
            raise _bad(column, f"a string of at most {column.length} characters")
        return value
    if kind is Kind.BOOLEAN:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _bad(column, "true or false")
    if kind in (Kind.TIMESTAMP, Kind.TIMESTAMPTZ):
        return _to_datetime(column, value)
    if kind is Kind.DATE:
        try:
            return date.fromisoformat(value) if isinstance(value, str) else _fail()
        except ValueError:
            raise _bad(column, "an ISO 8601 date string") from None
    if kind is Kind.TIME:
        try:
            moment = time.fromisoformat(value) if isinstance(value, str) else _fail()
        except ValueError:
            raise _bad(column, "an ISO 8601 time string") from None
        # PostgreSQL's time drops an offset (13:00:00+02:00 is stored as 13:00:00): so here
        return moment.replace(tzinfo=None) if column.cast == "time without time zone" else moment
    if kind is Kind.UUID:
        try:
            ok = isinstance(value, str) and len(value) <= 64 and value.isascii()
            return uuid.UUID(value) if ok else _fail()
        except ValueError:
            raise _bad(column, "a UUID string") from None
    if kind is Kind.JSON:
        if _depth(value) > MAX_JSON_DEPTH:
            raise _bad(column, f"JSON nested at most {MAX_JSON_DEPTH} levels deep")
        if not _json_is_unicode(value):
            raise _bad(column, "JSON whose strings and keys are valid Unicode (a lone surrogate is not)")
        return value
    if kind is Kind.BYTES:
        try:
            return base64.b64decode(value, validate=True) if isinstance(value, str) else _fail()
        except (ValueError, binascii.Error):
            raise _bad(column, "a base64 string") from None
    if kind is Kind.ENUM:
        if isinstance(value, str) and value in column.labels:
            return value
        raise _bad(column, f"one of {list(column.labels)}")
    if kind is Kind.ARRAY:
        if not isinstance(value, list):
            raise _bad(column, "a list")
        assert column.item is not None
        item = replace(column.item, name=column.name)
        return [coerce(item, v) for v in value]
    if isinstance(value, str | int | Decimal | bool):
        return _text_value(column, value) if isinstance(value, str) else value
    raise _bad(column, "a string, number or boolean")


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_JSON_DEPTH:
                stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _json_is_unicode(value: Any) -> bool:
    """Whether every string and key of a JSON value is valid Unicode (``is_unicode``)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not is_unicode(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _fail() -> Any:
    raise ValueError("wrong JSON type")


# ---------------------------------------------------------------------------------------------
# keys

def _need_key(table: Table) -> None:
    if not table.primary_key:
        raise InvalidRequest(f"table {table.name!r} has no primary key; rows cannot be addressed")


def parse_url_key(table: Table, raw: str) -> tuple[Any, ...]:
    """The key from its URL form (``raw`` still percent-encoded): values joined by ``,``."""
    _need_key(table)
    try:  # strict: bytes that are not UTF-8 are not a key (``errors="replace"`` would alias them)
        parts = [unquote(part, errors="strict") for part in raw.split(",")]
    except UnicodeDecodeError:
        raise InvalidRequest(f"the key of table {table.name!r} is not UTF-8 once decoded") from None
    if len(parts) != len(table.primary_key):
        raise InvalidRequest(
            f"key of table {table.name!r} has {len(table.primary_key)} value(s) "
            f"({', '.join(table.primary_key)}) joined by ','; got {len(parts)}"
        )
    return tuple(
        _key_value(table.columns[name], part, from_text=True)
        for name, part in zip(table.primary_key, parts, strict=True)
    )


def parse_json_key(table: Table, value: Any) -> tuple[Any, ...]:
    """The key of a batch op: a scalar (one-column key), a list in key order, or an object."""
    _need_key(table)
    pk = table.primary_key
    if isinstance(value, Mapping):
        if set(value) != set(pk):
            raise InvalidRequest(f"key of table {table.name!r} must name exactly {list(pk)}")
        values = [value[name] for name in pk]
    elif isinstance(value, list):
        values = value
    else:
        values = [value]
    if len(values) != len(pk):
        raise InvalidRequest(f"key of table {table.name!r} has {len(pk)} value(s) ({', '.join(pk)})")
    return tuple(_key_value(table.columns[n], v) for n, v in zip(pk, values, strict=True))


def _key_value(column: Column, value: Any, *, from_text: bool = False) -> Any:
    """``coerce`` for a key column: a key value is never NULL (it would have no lock name), even
    where the database allows it (SQLite, a non-INTEGER key): 422 naming the column."""
    if value is None:
        raise InvalidRequest(f"column {column.name!r} is part of the key: a key value may not be "
                             "null", column=column.name)
    return coerce(column, value, from_text=from_text)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)


def key_text(table: Table, key: Sequence[Any]) -> dict[str, str]:
    """Canonical text of each key value by column (what a policy's ``{column}`` is matched to)."""
    return {name: _text(v) for name, v in zip(table.primary_key, key, strict=True)}


# ---------------------------------------------------------------------------------------------
# column value (as a driver returns it) -> JSON value

def _decode(column: Column, value: Any) -> Any:
    if value is None:
        return None
    kind = column.kind
    if kind is Kind.NUMERIC:
        if isinstance(value, float):
            value = Decimal(repr(value))
        return str(value)
    if kind is Kind.BOOLEAN:
        return bool(value)
    if kind is Kind.FLOAT:
        return float(value) if isinstance(value, int | float | Decimal) else value
    if kind in (Kind.TIMESTAMP, Kind.TIMESTAMPTZ, Kind.DATE, Kind.TIME):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    if kind is Kind.JSON:
        if isinstance(value, str | bytes) and not column.cast:  # SQLite stores the text
            try:
                return loads(value)
            except ValueError:
                return value
        return value
    if kind is Kind.BYTES:
        return base64.b64encode(bytes(value)).decode("ascii")
    if kind is Kind.ARRAY and isinstance(value, list) and column.item is not None:
        return [_decode(column.item, v) for v in value]
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def decode_row(table: Table, values: Sequence[Any]) -> dict[str, Any]:
    """A row tuple in ``table.column_names`` order -> a JSON-ready dict."""
    return {
        name: _decode(table.columns[name], value)
        for name, value in zip(table.column_names, values, strict=True)
    }
