"""Canonical key text: the one spelling of a key value that goes into a row's lock name.

A row is written under exactly one lock name (``policy``), built from its key values. Every
spelling a client may send for one value (``1``, ``1.0``, ``+1``, ``1e0``; an upper-case uuid;
two offsets of one instant) is first parsed into the column's value (``values.coerce``), then
turned into text here, by SQL kind::

    kind            canonical text                      examples
    integer         plain decimal                       7, -12
    numeric, float  shortest plain decimal, no exponent 1 (1.0, 1.00, +1, 1e0), 0.5, 100, 0 (-0)
                    of the value the database stores: PostgreSQL numeric(p, s) rounded to s
                    decimals, real as a 4-byte float; SQLite's double (NUMERIC affinity
                    keeps ~15 digits)
    uuid            lower-case, hyphenated              6f9619ff-8b86-d011-b42d-00cf4fc964ff
    boolean         true / false
    timestamp(tz)   ISO 8601 basic format in UTC        20240501T120000Z, 20240501T120000.5Z
                    (PostgreSQL timestamp(p): rounded to p digits first, as it stores it)
    date            ISO 8601                            2024-05-01
    time            ISO 8601                            12:00:00
    text, enum      exactly as stored                   Alice, a b
    bytes           lower-case hex                      00ff

then *escaped* (``encode``) so that it is a valid piece of a lock name (``A-Za-z0-9._:/-``) and
no two values share a name: every UTF-8 byte outside ``A-Za-z0-9._-`` - including ``/`` (the
separator of a template's parts) and ``:`` (the escape character itself) - becomes ``:`` and two
upper-case hex digits (percent-encoding, with ``:`` in place of ``%``, which lock names may not
contain); a leading ``.`` is escaped too, so no part is ``.`` or ``..`` (URL dot segments).
``a b`` -> ``a:20b``, ``x/y`` -> ``x:2Fy``, ``é`` -> ``:C3:A9``, ``12:00`` -> ``12:3A00``. The
escaping is injective (``decode`` inverts it) and the canonical text is a function of the value
and injective per kind, so key values and names correspond one to one.

A kind whose equality is not its text (json, arrays, unknown types) cannot be bound per row:
``unbindable`` says why, and such a key is refused at start when a template uses it.
"""

from __future__ import annotations

import binascii
import contextlib
import re
import struct
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from resource_proxy.rows.tables import Column, Kind

__all__ = ["ESCAPE", "canonical", "encode", "decode", "key_part", "unbindable"]

ESCAPE = ":"
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_ESCAPED = re.compile(r":([0-9A-F]{2})")
_BINDABLE = frozenset({Kind.INTEGER, Kind.NUMERIC, Kind.FLOAT, Kind.TEXT, Kind.BOOLEAN,
                       Kind.TIMESTAMP, Kind.TIMESTAMPTZ, Kind.DATE, Kind.TIME, Kind.UUID,
                       Kind.ENUM, Kind.BYTES})
MAX_DIGITS = 300  # a decimal longer than this cannot be part of a 255-character lock name


def unbindable(column: Column) -> str | None:
    """Why ``column`` cannot be part of a lock name, or None if it can."""
    if column.inexact:
        return f"column {column.name!r} compares {column.inexact}, so one row has many spellings"
    if column.kind not in _BINDABLE:
        what = column.cast or column.kind.value
        return f"column {column.name!r} ({what}) has no canonical text"
    return None


def _decimal_text(number: Decimal) -> str:
    if number == 0:
        return "0"
    number = number.normalize()
    if abs(number.adjusted()) > MAX_DIGITS or len(number.as_tuple().digits) > MAX_DIGITS:
        return "9" * (MAX_DIGITS + 1)  # too long for any lock name; refused by the caller
    return format(number, "f")


_EPOCH_2000 = datetime(2000, 1, 1)


def _round_fraction(value: datetime | time, digits: int) -> datetime | time | None:
    """``value`` rounded to ``digits`` fractional-second digits the way PostgreSQL stores
    timestamp(p)/time(p): half away from zero, counted from 2000-01-01 for timestamps (None:
    a time that rounds to 24:00:00)."""
    step = 10 ** (6 - digits)
    if isinstance(value, time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 + value.microsecond
        micros = (micros + step // 2) // step * step
        if micros >= 86_400 * 10**6:
            return None  # rounds to 24:00:00, which PostgreSQL keeps and Python cannot hold
        seconds, micro = divmod(micros, 10**6)
        return time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro, value.tzinfo)
    zone = value.tzinfo
    naive = value.astimezone(UTC).replace(tzinfo=None) if zone else value
    micros = (naive - _EPOCH_2000) // timedelta(microseconds=1)
    sign = -1 if micros < 0 else 1
    micros = sign * ((abs(micros) + step // 2) // step * step)
    rounded = _EPOCH_2000 + timedelta(microseconds=micros)
    return rounded.replace(tzinfo=UTC) if zone else rounded


def _utc_basic(moment: datetime) -> str:
    moment = moment.astimezone(UTC) if moment.tzinfo else moment
    text = f"{moment.year:04d}" + moment.strftime("%m%dT%H%M%S")  # %Y: 3 digits for 999 on glibc
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


def canonical(column: Column, value: Any, *, sqlite: bool = False) -> str:
    """The canonical text of ``value``, already coerced for ``column`` (see the module table).

    ``sqlite``: the database is SQLite, where NUMERIC/REAL keys are stored as doubles.
    """
    kind = column.kind
    if isinstance(value, bool) or kind is Kind.BOOLEAN:
        return "true" if value else "false"
    if kind is Kind.INTEGER:
        return str(int(value))
    if kind in (Kind.NUMERIC, Kind.FLOAT):
        number = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
        if kind is Kind.NUMERIC and column.scale is not None and not sqlite:
            with contextlib.suppress(InvalidOperation):  # too many digits: the database refuses
                number = number.quantize(Decimal(1).scaleb(-column.scale), ROUND_HALF_UP)
        if sqlite or kind is Kind.FLOAT:
            try:
                double = float(number)
                if column.cast == "real":  # PostgreSQL float4
                    double = struct.unpack("f", struct.pack("f", double))[0]
                number = Decimal(repr(double))
            except OverflowError:
                pass
            if not number.is_finite():
                number = Decimal("9" * (MAX_DIGITS + 1))
        return _decimal_text(number)
    if column.scale is not None and isinstance(value, datetime | time) and not sqlite:
        value = _round_fraction(value, column.scale)
        if value is None:
            return "24:00:00"
    if kind is Kind.UUID:
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
    if kind in (Kind.TIMESTAMP, Kind.TIMESTAMPTZ) and isinstance(value, datetime):
        return _utc_basic(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if kind is Kind.BYTES:
        return binascii.hexlify(bytes(value)).decode("ascii")
    return str(value)


def encode(text: str) -> str:
    """``text`` escaped into the lock-name alphabet (see the module doc); injective."""
    out: list[str] = []
    for index, byte in enumerate(text.encode("utf-8")):
        if byte in _SAFE and not (index == 0 and byte == 0x2E):
            out.append(chr(byte))
        else:
            out.append(f"{ESCAPE}{byte:02X}")
    return "".join(out)


def decode(part: str) -> str:
    """The text ``encode`` made ``part`` from (``ValueError`` if ``part`` is not such an output)."""
    raw = _ESCAPED.sub(lambda m: chr(0x100 + int(m.group(1), 16)), part)
    if ESCAPE in raw or "/" in raw:
        raise ValueError(f"{part!r} is not an escaped key part")
    data = bytes(ord(c) - 0x100 if ord(c) >= 0x100 else ord(c) for c in raw)
    text = data.decode("utf-8")
    if encode(text) != part:
        raise ValueError(f"{part!r} is not the canonical escape of {text!r}")
    return text


def key_part(column: Column, value: Any, *, sqlite: bool = False) -> str:
    """The escaped canonical text of one key value: what a ``{column}`` placeholder becomes."""
    return encode(canonical(column, value, sqlite=sqlite))
