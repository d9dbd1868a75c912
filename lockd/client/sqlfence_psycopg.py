"""``fenced_transaction``'s transaction on a psycopg 3 connection in one round trip less.

The general path (``lockd.client.sqlfence``) enters psycopg's ``conn.transaction()``, which
sends ``BEGIN`` alone, then sends each ``SELECT fencing.claim(...)`` as a statement of its own:
two round trips before the caller's first statement. Here ``BEGIN`` and every claim travel as
**one simple-query message** (``BEGIN; SELECT fencing.claim('lock'::text, 5::bigint); ...``,
each lock name quoted by libpq for this connection, ``PQescapeLiteral``, never formatted in
unquoted), then the block runs, then ``COMMIT``: a claim + UPDATE + COMMIT is three round trips,
not four. PostgreSQL runs the statements of that message in order and stops at the first error,
so a stale claim (``LF001``) raises before any statement of the caller is sent, and the
transaction it opened is rolled back: nothing is written.

psycopg's own view of the connection stays true: the message is sent through a psycopg cursor
(the connection's own ``cursor()``, as the general path's claims; ``prepare=False``: a
multi-statement string cannot be prepared), so psycopg sees ``transaction_status`` INTRANS
during the block as it would after its own ``BEGIN``; a ``conn.transaction()`` inside the block
is a savepoint, as before; the transaction ends with ``conn.commit()``/``conn.rollback()``
(which also drop psycopg's prepared statements after a rollback, as ``transaction()`` does). A
connection opened with ``autocommit=False`` is switched to ``autocommit=True`` for the block
(psycopg would otherwise send its own ``BEGIN`` first, a round trip of its own) and switched
back when the transaction has ended, on every exit; inside the block ``conn.autocommit``
therefore reads ``True``. A ``psycopg.Rollback()`` raised in the block rolls back and is
swallowed, as psycopg's outermost ``transaction()`` does. The one other difference from the
general path is on misuse: ``conn.commit()``/``conn.rollback()`` called inside the block are not
refused by psycopg (no ``transaction()`` context is open) and end the fenced transaction early,
which is then reported on exit as ``TransactionStateError`` (``code="transaction_ended"``).

Used (``applies``) for a psycopg ``Connection``/``AsyncConnection`` that is not in pipeline mode
and has no ``isolation_level``, ``read_only`` or ``deferrable`` set (whose ``BEGIN`` psycopg
spells itself); any other connection, and SQLAlchemy's, takes the general path.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import psycopg

from lockd.client.claimsql import claim_function
from lockd.client.errors import TransactionStateError
from lockd.common.fencerule import Fence

__all__ = ["applies", "begin_and_claim", "transaction", "async_transaction"]

log = logging.getLogger(__name__)

_IDLE, _INERROR = 0, 3  # libpq PQTRANS_IDLE, PQTRANS_INERROR


def applies(conn: Any) -> bool:
    """Whether ``conn`` (a psycopg connection with no transaction open) can take this path: not
    in pipeline mode, and no ``isolation_level``/``read_only``/``deferrable`` of its own."""
    return (conn.pgconn.pipeline_status == 0 and conn.isolation_level is None
            and conn.read_only is None and conn.deferrable is None)


def begin_and_claim(conn: Any, fences: Sequence[Fence]) -> bytes:
    """The one message: ``BEGIN`` and a claim of each of ``fences`` (in the order given; each
    for its purpose, ``claimsql.claim_function``). Each lock name is quoted by libpq for
    ``conn`` (``PQescapeLiteral``, through ``psycopg.pq.Escaping``: the connection's encoding
    and ``standard_conforming_strings``), each fence written from an ``int``; nothing is
    formatted in unquoted. Raises ``UnicodeEncodeError`` for a lock name the connection's
    encoding cannot hold (before any SQL)."""
    escape, encoding = psycopg.pq.Escaping(conn.pgconn).escape_literal, conn.info.encoding
    parts = [b"BEGIN"]
    for f in fences:
        parts.append(b"SELECT fencing.%s(%s::text, %d::bigint)" % (
            claim_function(f).encode(), escape(f.lock.encode(encoding)), int(f.fence)))
    return b"; ".join(parts)


def _ended_early() -> TransactionStateError:
    return TransactionStateError(
        "the fenced transaction was ended inside the block (conn.commit() or conn.rollback()): "
        "statements after it ran outside the claims; let fenced_transaction commit",
        code="transaction_ended")


def _aborted() -> TransactionStateError:
    return TransactionStateError(
        "the fenced transaction was aborted by an error caught inside the block; rolled "
        "back, nothing committed", code="transaction_aborted")


def _swallowed(exc: BaseException) -> bool:
    """A ``psycopg.Rollback()`` aimed at no inner transaction: rolled back and not re-raised,
    as psycopg's outermost ``transaction()`` does."""
    return isinstance(exc, psycopg.Rollback) and exc.transaction is None


@contextlib.contextmanager
def transaction(conn: Any, fences: Sequence[Fence],
                on_claimed: Callable[[], None]) -> Iterator[None]:
    """``BEGIN`` + the claims of ``fences`` in one message, the block, ``COMMIT``; roll back
    and re-raise on any exception (``BaseException`` too). ``on_claimed()`` is called once the
    claims are made. Raises the driver's errors (the caller maps them) and
    ``TransactionStateError`` (``transaction_aborted``: an error was caught in the block;
    ``transaction_ended``: the block committed or rolled back itself)."""
    message = begin_and_claim(conn, fences)
    switched = not conn.autocommit
    if switched:
        conn.autocommit = True
    try:
        try:
            with conn.cursor() as cur:
                cur.format = psycopg.pq.Format.TEXT  # binary would need one statement
                cur.execute(message, prepare=False)
            on_claimed()
            yield
            _check_open(conn)
        except BaseException as exc:
            try:
                conn.rollback()
            except Exception as exc2:  # a broken connection: keep the block's error
                log.warning("error ignored in rollback of the fenced transaction: %s", exc2)
            if _swallowed(exc):
                return
            raise
        conn.commit()
    finally:
        if switched:
            _restore(conn)


def _check_open(conn: Any) -> None:
    """At the block's end: ``transaction_ended`` if the block committed or rolled back
    itself, ``transaction_aborted`` if an error it caught left the transaction failed."""
    status = int(conn.info.transaction_status)
    if status == _IDLE:
        raise _ended_early()
    if status == _INERROR:
        raise _aborted()


def _restore(conn: Any) -> None:
    try:
        conn.autocommit = False
    except psycopg.Error as exc:  # closed or broken: nothing left to restore on
        log.warning("autocommit not restored on the fenced transaction's connection: %s", exc)


@contextlib.asynccontextmanager
async def async_transaction(conn: Any, fences: Sequence[Fence],
                            on_claimed: Callable[[], None]) -> AsyncIterator[None]:
    """The asyncio twin of ``transaction`` (a psycopg ``AsyncConnection``)."""
    message = begin_and_claim(conn, fences)
    switched = not conn.autocommit
    if switched:
        await conn.set_autocommit(True)
    try:
        try:
            async with conn.cursor() as cur:
                cur.format = psycopg.pq.Format.TEXT  # binary would need one statement
                await cur.execute(message, prepare=False)
            on_claimed()
            yield
            _check_open(conn)
        except BaseException as exc:
            try:
                await conn.rollback()
            except Exception as exc2:  # a broken connection: keep the block's error
                log.warning("error ignored in rollback of the fenced transaction: %s", exc2)
            if _swallowed(exc):
                return
            raise
        await conn.commit()
    finally:
        if switched:
            await _arestore(conn)


async def _arestore(conn: Any) -> None:
    try:
        await conn.set_autocommit(False)
    except psycopg.Error as exc:  # closed or broken: nothing left to restore on
        log.warning("autocommit not restored on the fenced transaction's connection: %s", exc)
