"""A psycopg async connection whose socket stays registered with the event loop for its life.

psycopg's ``AsyncConnection.wait`` registers the socket as a reader (``loop.add_reader``) before
every wait for the server and removes it after; under uvloop that is a poll handle created and
closed each time: ``ioctl`` (non-blocking), an ``epoll_ctl`` ADD + DEL to probe the descriptor,
the ADD that arms it and the DEL that drops it, about half of the proxy's system calls per
fenced write. ``WatchedConnection`` registers once and keeps the registration.

Why a duplicate descriptor: libpq closes its socket by itself when it finds the connection
broken (an EOF from a terminated backend, a failed send). A descriptor closed while the event
loop still watches it leaves a stale watcher, and the next socket that gets the same number (a
client's connection, a new database connection) would be mis-served (libuv may even abort).
So the loop watches ``os.dup`` of the socket: that number stays ours until ``_Watch.release``
removes the reader and only then closes it, whatever libpq does with its own descriptor.

Level-triggered readiness while no one waits (a NOTICE, or the EOF of a connection the server
closed while idle in the pool) would wake the loop on every turn: the first such wake drops the
registration and the next wait registers again. The watch is released (reader removed, dup
closed) when the connection is closed, when a wait finds it broken, and when the connection
object is collected.

A wait with a ``timeout`` (psycopg's cancellation paths) takes psycopg's own path. A wait
without one waits as long as the server takes, as psycopg's does, and re-arms its registration
whenever its ``interval`` (0.1 s) passes unanswered (``_Watch.run`` says why). The watch belongs
to the loop of the connection's first wait: a pooled connection is only used on its pool's loop
(on another, awaiting the watch's future raises ``RuntimeError``; not checked per wait, as
``asyncio.get_running_loop`` costs a ``getpid`` system call on Python 3.11).
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from typing import Any

import psycopg
from psycopg import errors as e
from psycopg import pq
from psycopg.waiting import READY_R as _READY_R
from psycopg.waiting import READY_W as _READY_W
from psycopg.waiting import WAIT_R as _WAIT_R
from psycopg.waiting import WAIT_W as _WAIT_W

__all__ = ["WatchedConnection"]

log = logging.getLogger("resource_proxy.store")

_ACTIVE = pq.TransactionStatus.ACTIVE
_BAD = pq.ConnStatus.BAD
# plain ints: IntFlag arithmetic costs microseconds on the hot path
READY_R, READY_W, WAIT_R, WAIT_W = int(_READY_R), int(_READY_W), int(_WAIT_R), int(_WAIT_W)
_INTERRUPTED = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)


class _Watch:
    """``os.dup`` of one connection's socket, watched for reading by one event loop."""

    __slots__ = ("loop", "fd", "registered", "fut", "want", "ready")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: int) -> None:
        self.loop = loop
        self.fd = os.dup(sock)
        self.registered = False
        self.fut: asyncio.Future[None] | None = None
        self.want = 0  # the Wait flags of the wait in progress (0: none)
        self.ready = 0  # the Ready flags seen during it

    def _wake(self, flag: int) -> None:
        self.ready |= flag
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _readable(self) -> None:
        if self.want & WAIT_R:
            self._wake(READY_R)
        else:  # unprompted bytes or EOF while nobody reads: stop watching until the next wait
            self.unregister()

    def _writable(self) -> None:
        self._wake(READY_W)

    def unregister(self) -> None:
        if self.registered:
            self.registered = False
            try:
                self.loop.remove_reader(self.fd)
            except RuntimeError:  # the loop is closed: nothing is watched any more
                pass

    def release(self) -> None:
        """Stop watching, then close the duplicate (in that order: see the module)."""
        if self.fd >= 0:
            self.unregister()
            os.close(self.fd)
            self.fd = -1

    def _expired(self) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)  # ``ready`` stays 0: the generator asks again

    async def run(self, gen: Any, interval: float) -> Any:
        """Drive psycopg generator ``gen`` to its return value, waiting on this watch.

        Every wait also arms a timer of ``interval`` seconds (psycopg's own wait does the
        same; a timer costs no system call). When it expires before the socket was reported,
        the registration is made anew: uvloop closes a poll handle on a socket error (POLLERR,
        e.g. a reset connection) without calling its reader, and a closed handle would
        otherwise never report again."""
        try:
            s = next(gen)
        except StopIteration as stop:
            return stop.value
        loop = self.loop
        fd = self.fd
        try:
            while True:
                if not s & (WAIT_R | WAIT_W):
                    raise e.InternalError(f"bad poll status: {s}")
                if s & WAIT_R and not self.registered:
                    loop.add_reader(fd, self._readable)
                    self.registered = True
                writer = s & WAIT_W
                if writer:
                    loop.add_writer(fd, self._writable)
                self.ready = 0
                self.want = s
                self.fut = loop.create_future()
                timer = loop.call_later(interval, self._expired)
                try:
                    await self.fut
                finally:
                    timer.cancel()
                    self.fut = None
                    self.want = 0
                    if writer:
                        loop.remove_writer(fd)
                if not self.ready:  # the timer: re-register (see above)
                    self.unregister()
                s = gen.send(self.ready)
        except StopIteration as stop:
            return stop.value
        except OSError as exc:
            raise e.OperationalError("connection socket closed") from exc


class WatchedConnection(psycopg.AsyncConnection):
    """``AsyncConnection`` whose waits use a socket registered once (see the module)."""

    _watch: _Watch | None = None
    # the names of the statements prepared with SQL ``PREPARE`` on this session
    # (``PostgresStore.claimed_statement``)
    statements: frozenset[str] = frozenset()

    def _deallocate(self, name: bytes | None) -> Any:
        """psycopg's ``DEALLOCATE`` (``ALL`` after a rollback, when it prepared statements of
        its own): the SQL-prepared statements go too."""
        if name is None:
            self.statements = frozenset()
        return super()._deallocate(name)

    async def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        watch = self._watch
        if watch is None or watch.fd < 0:
            if timeout is not None or self.pgconn.status == _BAD:
                return await super().wait(gen, interval, timeout)
            watch = self._watch = _Watch(asyncio.get_running_loop(), self.pgconn.socket)
            weakref.finalize(self, watch.release)
        elif timeout is not None:
            return await super().wait(gen, interval, timeout)
        try:
            return await watch.run(gen, interval)
        except _INTERRUPTED:
            if self.pgconn.status != _BAD and self.pgconn.transaction_status == _ACTIVE:
                await self._cancel_interrupted(gen)
            raise
        finally:
            if self.pgconn.status == _BAD:  # libpq closed its socket: let ours go too
                watch.release()

    async def _cancel_interrupted(self, gen: Any) -> None:
        """As psycopg does on an interrupted wait: cancel the query in the server and consume
        its end within 5 s, or close the connection (its state is then unknown)."""
        try:
            await self._try_cancel(timeout=5.0)
            await super().wait(gen, 0.1, 5.0)
        except e.QueryCanceled:
            pass
        except e._WaitTimeout:
            log.warning("query not terminated after cancellation: closing connection")
            self.pgconn.finish()
        except BaseException as exc:
            log.warning("query cancellation interrupted (%s): closing connection",
                        type(exc).__name__)
            self.pgconn.finish()
            if not isinstance(exc, Exception):
                raise

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._watch is not None:
                self._watch.release()
