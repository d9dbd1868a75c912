"""The hot statements sent with libpq directly (``psycopg.pq``), below psycopg's cursors.

An exclusive acquire and release (alone or batched: ``sql.ACQUIRE``, ``sql.RELEASE``,
``sql.ACQUIRE_BATCH``, ``sql.RELEASE_BATCH``) are nearly all of lockd's statements. Through a
psycopg cursor each costs 40-60 µs of lockd's CPU (cursor and row factory, query conversion,
parameter dumpers, array dumping in Python, the prepared-statement cache, the connection's
lock, a timer per wait); here the same statement costs ~12 µs: its parameters are written as
PostgreSQL text values (arrays as ``{…}`` literals) by ``text``, it is sent as a named
prepared statement (``Statement.name``, prepared on each connection at its first use, or
unnamed when the store's ``prepare_threshold`` is ``None``, e.g. behind a transaction pooler),
psycopg's own C generator (``psycopg.generators.execute``) sends it and collects its results,
and the rows come back as text for the caller to read.

Only autocommit statements on a pooled connection the caller holds alone are sent here (no
psycopg lock is taken). An error result raises the exception psycopg would
(``psycopg.errors.error_from_result``); a broken socket raises ``psycopg.OperationalError``;
a wait cancelled with the statement in flight closes the connection (the pool drops it), since
its answer would otherwise be read by the next statement. A named statement the server no
longer knows (psycopg sends ``DEALLOCATE ALL`` after a rollback on the same connection) is
prepared again and sent once more: the server refused it before running it. A name the
server already holds when this module thinks it does not (``DuplicatePreparedStatement``) is
the same statement (each name is one constant query, and only this module uses these names):
it is taken as prepared.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as e
from psycopg import generators, pq

__all__ = ["Statement", "execute", "text"]

_PARAM = re.compile(r"%\((\w+)\)s")
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_ACTIVE = pq.TransactionStatus.ACTIVE
_IDLE = pq.TransactionStatus.IDLE
_OK = pq.ConnStatus.OK
_NUL = "PostgreSQL text fields cannot contain NUL (0x00) bytes"


class Statement:
    """One constant statement of ``sql`` (psycopg's ``%(key)s`` placeholders) as libpq takes it:
    ``$n`` placeholders in the order the keys first appear (``keys``), sent prepared under
    ``name`` (ASCII, unique per statement) or unnamed."""

    __slots__ = ("keys", "name", "query")

    def __init__(self, name: str, query: str):
        keys: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match[1] not in keys:
                keys.append(match[1])
            return f"${keys.index(match[1]) + 1}"

        body = _PARAM.sub(number, query)
        if "%" in body:
            raise ValueError(f"{name}: only %(key)s placeholders are supported")
        self.name = name.encode("ascii")
        self.query = body.encode("utf-8")
        self.keys = tuple(keys)


class _Conn:
    """What ``execute`` keeps per connection: its Python codec and the names prepared on it."""

    __slots__ = ("encoding", "prepared")

    def __init__(self, conn: psycopg.AsyncConnection):
        self.encoding = conn.info.encoding
        self.prepared: set[bytes] = set()


_state: weakref.WeakKeyDictionary[psycopg.AsyncConnection, _Conn] = weakref.WeakKeyDictionary()


def _quoted(item: Any) -> str:
    if item is None:
        return "NULL"
    if isinstance(item, str):
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(int(item))


def text(value: Any, encoding: str) -> bytes | None:
    """``value`` as a PostgreSQL text-format parameter: ``None`` (SQL NULL), ``str``, ``int``
    or a list of them (a one-dimensional array literal, ``None`` items NULL), encoded with the
    connection's Python codec ``encoding``. Raises ``psycopg.DataError`` for a NUL character
    (as psycopg's own dumpers do) and ``UnicodeEncodeError`` for text the codec cannot take."""
    if value is None:
        return None
    if isinstance(value, str):
        out = value
    elif isinstance(value, list):
        out = "{" + ",".join([_quoted(item) for item in value]) + "}"
    else:
        out = str(int(value))
    if "\x00" in out:
        raise psycopg.DataError(_NUL)
    return out.encode(encoding)


async def _drive(gen: Any, fd: int) -> Any:
    """Run a psycopg generator (``psycopg.generators.execute``) to its end, waiting on ``fd``
    with the event loop whenever it would block; its return value."""
    loop = asyncio.get_running_loop()
    try:
        state = next(gen)
        while True:
            fut = loop.create_future()
            reading, writing = state & 1, state & 2
            if reading:
                loop.add_reader(fd, _wake, fut, 1)
            if writing:
                loop.add_writer(fd, _wake, fut, 2)
            try:
                ready = await fut
            finally:
                if reading:
                    loop.remove_reader(fd)
                if writing:
                    loop.remove_writer(fd)
            state = gen.send(ready)
    except StopIteration as done:
        return done.value
    except OSError as exc:
        raise psycopg.OperationalError("connection socket closed") from exc


def _wake(fut: asyncio.Future[int], ready: int) -> None:
    if not fut.done():
        fut.set_result(ready)


async def _results(pgconn: pq.abc.PGconn, encoding: str) -> pq.abc.PGresult:
    results = await _drive(generators.execute(pgconn), pgconn.socket)
    if not results:
        raise psycopg.OperationalError("no result from the server")
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise e.error_from_result(result, encoding=encoding)
    return results[-1]


async def execute(conn: psycopg.AsyncConnection, statement: Statement,
                  params: Sequence[Any], *, prepare: bool = True) -> list[list[str | None]]:
    """Run ``statement`` on ``conn`` (autocommit, held by the caller alone) with ``params`` in
    ``statement.keys`` order (values as ``text`` takes them); its rows, each value as the text
    PostgreSQL sent (decoded: ``"t"`` for true, ``"12"`` for 12) or ``None``. ``prepare``: send
    it as a named prepared statement (prepared on this connection at its first use), else
    unnamed (parsed every time; so is a statement inside a transaction, whose failure to find a
    deallocated name would abort it). Errors: see the module docstring."""
    state = _state.get(conn)
    if state is None:
        state = _state[conn] = _Conn(conn)
    enc = state.encoding
    values = [text(v, enc) for v in params]
    pgconn = conn.pgconn
    try:
        if not prepare or pgconn.transaction_status != _IDLE:
            pgconn.send_query_params(statement.query, values)
            result = await _results(pgconn, enc)
        else:
            for attempt in (1, 2):
                if statement.name not in state.prepared:
                    pgconn.send_prepare(statement.name, statement.query)
                    try:
                        await _results(pgconn, enc)
                    except e.DuplicatePreparedStatement:
                        pass  # the session has it: only this module names its statements so
                    state.prepared.add(statement.name)
                pgconn.send_query_prepared(statement.name, values)
                try:
                    result = await _results(pgconn, enc)
                    break
                except e.InvalidSqlStatementName:  # deallocated by psycopg: prepare again
                    state.prepared.clear()
                    if attempt == 2:
                        raise
    except BaseException:
        if pgconn.status == _OK and pgconn.transaction_status == _ACTIVE:
            pgconn.finish()  # a statement in flight: its answer must not meet the next one
        raise
    if result.status != _TUPLES_OK:
        return []
    get = result.get_value
    cols = range(result.nfields)
    rows = []
    for row in range(result.ntuples):
        values = [get(row, col) for col in cols]
        rows.append([None if v is None else v.decode(enc) for v in values])
    return rows
