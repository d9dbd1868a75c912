"""One canonical form, decided by the database: for generated client spellings of every supported
key type, the lock name Python computes (``values.coerce`` + ``canonical.key_part``, what the
proxy and ``GET /v1/tables/{t}/lock`` use) is the lock name the row trigger computes from the
value PostgreSQL stored (after its casts, rounding and time zone rules).

Each example is written the way the proxy writes it (the coerced value, bound with the column's
cast) in a transaction that claims the Python name and is rolled back: the trigger refuses the
row unless its own name is that one. An unprotected twin table gives the database's name when
the two differ (for the failure message) or are too long to be lock names (both refuse).
"""

from __future__ import annotations

import string
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import create_database, drop_database, sqlalchemy_url
from resource_proxy.canonical import key_part
from resource_proxy.dbfence import install
from resource_proxy.errors import InvalidRequest
from resource_proxy.rows.tables import reflect
from resource_proxy.rows.values import coerce
from resource_proxy.store.sql import POSTGRES
from tests.proxy.dbfence.conftest import policy

# table -> (key type, spellings a client may send)
_OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
_MOMENTS = st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31))
_TIMES = st.times()


def _int_spellings(bits: int) -> st.SearchStrategy:
    n = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return st.one_of(n, n.map(str), n.map(lambda v: f"+{v}" if v >= 0 else str(v)),
                     n.map(lambda v: f" {v} "), n.map(lambda v: Decimal(f"{v}.0")))


def _decimal_spellings(max_abs: int, places: int) -> st.SearchStrategy:
    d = st.decimals(min_value=-max_abs + 1, max_value=max_abs - 1, allow_nan=False,
                    allow_infinity=False, places=places)
    return st.one_of(d, d.map(str), d.map(lambda v: f"{v:E}"), d.map(lambda v: f"{v}000"))


def _float_spellings() -> st.SearchStrategy:
    f = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30)
    tiny = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e-30, max_value=1e-30)
    return st.one_of(f.map(lambda v: Decimal(repr(v))), f.map(repr), f.map(lambda v: f"{v:.20e}"),
                     st.integers(-10**6, 10**6), f.map(lambda v: Decimal(f"{v:.3f}")),
                     tiny.map(repr), st.integers(-2**60, 2**60).map(lambda n: Decimal(n * 8)))


def _moment_spellings() -> st.SearchStrategy:
    aware = st.tuples(_MOMENTS, _OFFSETS).map(lambda p: p[0].replace(tzinfo=p[1]))
    return st.one_of(_MOMENTS.map(datetime.isoformat), aware.map(datetime.isoformat),
                     _MOMENTS.map(lambda m: m.isoformat() + "Z"),
                     _MOMENTS.map(lambda m: m.isoformat(sep=" ", timespec="milliseconds")))


def _time_spellings() -> st.SearchStrategy:
    return st.one_of(_TIMES.map(time.isoformat),
                     st.tuples(_TIMES, _OFFSETS).map(lambda p: p[0].replace(tzinfo=p[1]).isoformat()),
                     _TIMES.map(lambda t: t.isoformat(timespec="seconds")))


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=20)
_LABELS = ["a", "a b", "x/y", ".hidden", "é", "12:00", "-", "A.B"]

KINDS = {
    "k_smallint": ("smallint", _int_spellings(16)),
    "k_int": ("integer", _int_spellings(32)),
    "k_bigint": ("bigint", _int_spellings(64)),
    "k_numeric": ("numeric", _decimal_spellings(10**12, 6)),
    "k_numeric_s": ("numeric(12,2)", _decimal_spellings(10**9, 5)),
    "k_real": ("real", _float_spellings()),
    "k_double": ("double precision", _float_spellings()),
    "k_uuid": ("uuid", st.uuids().flatmap(lambda u: st.sampled_from(
        [str(u), str(u).upper(), u.hex, "{" + str(u) + "}", "urn:uuid:" + str(u)]))),
    "k_bool": ("boolean", st.sampled_from([True, False, "true", "FALSE", "True"])),
    "k_ts": ("timestamp", _moment_spellings()),
    "k_ts3": ("timestamp(3)", _moment_spellings()),
    "k_tstz": ("timestamptz", _moment_spellings()),
    "k_tstz0": ("timestamptz(0)", _moment_spellings()),
    "k_date": ("date", st.dates(min_value=date(1, 1, 1)).flatmap(lambda d: st.sampled_from(
        [d.isoformat(), d.strftime("%Y%m%d") if d.year >= 1000 else d.isoformat()]))),
    "k_time": ("time", _time_spellings()),
    "k_time0": ("time(0)", _time_spellings()),
    "k_text": ("text", _TEXT),
    "k_varchar": ("varchar(5)", st.text(string.printable.replace("\x00", ""), max_size=7)),
    "k_enum": ("mood", st.sampled_from(_LABELS)),
    "k_bytea": ("bytea", st.binary(max_size=16).map(
        lambda b: __import__("base64").b64encode(b).decode())),
}


@pytest.fixture(scope="module")
def diffdb(pg_admin_dsn: str):
    dsn = create_database(pg_admin_dsn)
    engine = sa.create_engine(sqlalchemy_url(dsn), poolclass=sa.NullPool)
    labels = ", ".join("'" + label + "'" for label in _LABELS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TYPE mood AS ENUM ({labels})")
        for table, (sqltype, _) in KINDS.items():
            conn.execute(f"CREATE TABLE {table} (k {sqltype} PRIMARY KEY)")
            conn.execute(f"CREATE TABLE twin_{table} (k {sqltype} PRIMARY KEY)")
    install(engine, policy({t: "k/{k}" for t in KINDS}), tables=list(KINDS))
    catalog = reflect(engine, list(KINDS), ())
    conn = psycopg.connect(dsn)
    yield conn, catalog
    conn.close()
    engine.dispose()
    drop_database(dsn, pg_admin_dsn)


@pytest.mark.parametrize("table", list(KINDS))
def test_python_and_trigger_agree_on_every_spelling(diffdb, table):
    conn, catalog = diffdb
    column = catalog[table].columns["k"]
    cast = column.cast

    @settings(max_examples=300, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(KINDS[table][1])
    def agree(spelling):
        try:
            value = coerce(column, spelling)
            python = "k/" + key_part(column, value)
        except InvalidRequest:
            return  # the proxy refuses this spelling (422): nothing to agree on
        bound = POSTGRES.adapt(column, value)
        try:
            stored = conn.execute(f"INSERT INTO twin_{table} (k) VALUES (%s::{cast}) "
                                  f"RETURNING fencing.lock_of_{table}(k)", (bound,)).fetchone()[0]
            if len(python) > 255 or len(stored) > 255:
                assert len(python) > 255 and len(stored) > 255, (spelling, python, stored)
                return
            assert stored == python, f"{spelling!r}: Python {python!r}, database {stored!r}"
            conn.execute("SELECT fencing.try_claim(%s, 0)", (python,))
            conn.execute(f"INSERT INTO {table} (k) VALUES (%s::{cast})", (bound,))
        except psycopg.errors.NumericValueOutOfRange:
            return  # e.g. numeric(12,2) rounding past its precision: the database refuses
        finally:
            conn.rollback()

    agree()


def test_known_disagreements_are_closed(diffdb):
    """Spellings that named another lock than the stored row's before the database decided."""
    conn, catalog = diffdb
    cases = [("k_time", "13:00:00+02:00", "k/13:3A00:3A00"),
             ("k_time0", "23:59:59.6", "k/24:3A00:3A00"),
             ("k_ts", "0999-01-02T03:04:05", "k/09990102T030405Z"),
             ("k_tstz", "2024-05-01T14:00:00+02:00", "k/20240501T120000Z"),
             ("k_numeric_s", "1.005", "k/1.01"),
             ("k_real", "0.1", "k/0.10000000149011612"),
             ("k_real", "4.337489834462413E+16", "k/43374900492107780"),
             ("k_double", "-0.0", "k/0"), ("k_double", "1e22", "k/10000000000000000000000"),
             ("k_text", ".a b/é", "k/:2Ea:20b:2F:C3:A9")]
    for table, spelling, expected in cases:
        column = catalog[table].columns["k"]
        assert "k/" + key_part(column, coerce(column, spelling)) == expected
        bound = POSTGRES.adapt(column, coerce(column, spelling))
        stored = conn.execute(f"INSERT INTO twin_{table} (k) VALUES (%s::{column.cast}) "
                              f"RETURNING fencing.lock_of_{table}(k)", (bound,)).fetchone()[0]
        conn.rollback()
        assert stored == expected, (table, spelling)


def test_spellings_of_one_instant_share_one_lock(diffdb):
    conn, catalog = diffdb
    column = catalog["k_tstz"].columns["k"]
    names = {key_part(column, coerce(column, s)) for s in
             ["2024-05-01T12:00:00Z", "2024-05-01T14:00:00+02:00", "2024-05-01 07:00:00-05:00"]}
    assert names == {"20240501T120000Z"}
    assert datetime(2024, 5, 1, 12, tzinfo=UTC)  # the instant named above
    assert uuid.UUID(int=0)  # (imports used by the strategies above)
