"""The PostgreSQL store's one ``LISTEN`` connection: every release reaches the listeners.

A release NOTIFYs ``sql.CHANNEL`` with the lock name in its own commit; this connection calls
every subscribed listener, on the event loop, with that name. It checks itself with a heartbeat
and reconnects with backoff (0.05 s up to 2 s). PostgreSQL drops the notifications sent while
it was away, so after a reconnect it reads the locks released since the last heartbeat (minus a
5 s margin) and calls the listeners for each. A waiter never depends on a notification alone:
it also retries at the holder's expiry. See docs/stores/postgres.md ("Notifications").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

import lockd.server.store.postgres.sql as sql
import lockd.server.store.postgres.sql_modes as sql_modes
from lockd.server.store.listeners import ReleaseListeners, stop_task
from lockd.server.store.values import ReleaseListener

__all__ = ["Listener", "first_line"]

log = logging.getLogger("lockd.server.store.postgres")

_CATCH_UP_MARGIN = dt.timedelta(seconds=5)
_RECONNECT_MIN, _RECONNECT_MAX = 0.05, 2.0


class Listener:
    """Runs ``LISTEN`` on its own connection to ``conninfo`` (libpq ``conn_kwargs``).

    ``heartbeat``: seconds between liveness checks (``SELECT now()``); ``connect_timeout``:
    seconds allowed for a (re)connection, on top of one heartbeat.
    """

    def __init__(self, conninfo: str, conn_kwargs: dict[str, Any], *, heartbeat: float,
                 connect_timeout: float):
        self._conninfo = conninfo
        self._conn_kwargs = conn_kwargs
        self._heartbeat = heartbeat
        self._connect_timeout = connect_timeout
        self._listeners = ReleaseListeners(log)
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    def subscribe(self, listener: ReleaseListener) -> None:
        self._listeners.add(listener)

    async def start(self) -> None:
        """Start the loop and wait until it listens. Raises ``TimeoutError`` after
        ``connect_timeout`` seconds (the loop keeps trying until ``stop``)."""
        if self._task is None:
            self._listening = asyncio.Event()
            self._task = asyncio.create_task(self._forever(), name="lockd-listen")
        async with asyncio.timeout(self._connect_timeout):
            await self._listening.wait()

    async def stop(self) -> None:
        """Cancel the loop and close its connection; idempotent."""
        task, self._task = self._task, None
        await stop_task(task)

    async def _forever(self) -> None:
        """Keep one ``LISTEN`` connection alive forever (see the module docstring)."""
        delay = _RECONNECT_MIN
        last_seen: dt.datetime | None = None
        while True:
            conn: psycopg.AsyncConnection | None = None
            try:
                async with asyncio.timeout(self._connect_timeout + self._heartbeat):
                    conn = await psycopg.AsyncConnection.connect(
                        self._conninfo, autocommit=True, row_factory=tuple_row,
                        **self._conn_kwargs)
                    # Notifications psycopg reads with a statement's answer (the heartbeat's);
                    # between statements, ``_watch`` reads them.
                    conn.add_notify_handler(self._notified)
                    await conn.execute(sql.LISTEN)
                    now = await _server_now(conn)
                    missed: list[str] = []
                    if last_seen is not None:
                        cur = await conn.execute(
                            sql_modes.CATCH_UP, {"since": last_seen - _CATCH_UP_MARGIN})
                        missed = [r[0] for r in await cur.fetchall()]
                if last_seen is not None:
                    log.info("LISTEN connection re-established; waking waiters of %d lock(s)"
                             " released meanwhile", len(missed))
                last_seen = now
                self._listening.set()
                delay = _RECONNECT_MIN
                for name in missed:
                    self._listeners.notify(name)
                while True:
                    await self._watch(conn)
                    async with asyncio.timeout(self._heartbeat):
                        last_seen = await _server_now(conn)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if self._listening.is_set():
                    log.warning("LISTEN connection lost (%s); reconnecting", first_line(exc))
                else:
                    log.debug("LISTEN connection attempt failed: %s", first_line(exc))
                self._listening.clear()
            except Exception:
                log.exception("LISTEN loop failed; reconnecting")
                self._listening.clear()
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(1.0):
                            await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX)

    def _notified(self, notify: psycopg.Notify) -> None:
        self._listeners.notify(notify.payload)

    async def _watch(self, conn: psycopg.AsyncConnection) -> None:
        """Call the listeners with every notification ``conn`` receives for ``heartbeat``
        seconds; raises ``psycopg.OperationalError`` when the connection breaks.

        The socket is watched once for the whole period and each arrival is read with libpq
        directly (``consume_input``, then ``notifies``): psycopg's ``notifies()`` takes the
        connection's lock, registers and drops the socket with the event loop and starts a
        timer for every arrival, one arrival per release (or batch of releases)."""
        loop = asyncio.get_running_loop()
        pgconn = conn.pgconn
        fd = pgconn.socket
        encoding = conn.info.encoding
        done: asyncio.Future[None] = loop.create_future()
        notify = self._listeners.notify

        def readable() -> None:
            if done.done():
                return
            try:
                pgconn.consume_input()
                if pgconn.status != pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the LISTEN connection is broken")
            except psycopg.Error as exc:
                done.set_exception(exc)
                return
            while (pgn := pgconn.notifies()) is not None:
                notify(pgn.extra.decode(encoding))

        def heartbeat() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, readable)
        timer = loop.call_later(self._heartbeat, heartbeat)
        try:
            readable()  # anything libpq read already (with the last statement's answer)
            await done
        finally:
            timer.cancel()
            loop.remove_reader(fd)


async def _server_now(conn: psycopg.AsyncConnection) -> dt.datetime:
    cur = await conn.execute(sql.NOW)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


def first_line(exc: BaseException) -> str:
    """``"ExcType: first line of its message"`` for a log line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
