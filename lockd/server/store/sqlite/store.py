"""``SqliteStore``: lockd's ``Store`` on one SQLite file (one lockd process, held by a file
lock), expiry by lockd's injectable clock. Every operation is queued to one thread that runs
what has queued up in one transaction and one fsync (group commit; the operations of one
event-loop turn are queued as one item, one wake-up of the thread); the primitives' operations
are in ``locks``, ``semaphores`` and ``elections``. The design: docs/stores/sqlite.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import lockd.server.store.sqlite.elections as elect
import lockd.server.store.sqlite.locks as locks
import lockd.server.store.sqlite.semaphores as sem
from lockd.server.errors import StoreUnavailable
from lockd.server.store.values import ReleaseListener

__all__ = ["SqliteStore"]

log = logging.getLogger(__name__)

_MAX_BATCH = 256


def _create_schema(conn: sqlite3.Connection) -> None:
    """Create every table and index the store uses, idempotently (no transaction needed); a
    file of an older version gets the columns it lacks."""
    for statement in (*locks.SCHEMA, *sem.SCHEMA, *elect.SCHEMA):
        conn.execute(statement)
    locks.upgrade(conn)


_Op = Callable[..., Any]
_Item = tuple[_Op, tuple[Any, ...], "asyncio.Future[Any]"]


def _ping(conn: sqlite3.Connection, now: int) -> None:
    conn.execute("SELECT 1").fetchone()


# --- the store ----------------------------------------------------------------------------------


class SqliteStore(locks.LockMethods, sem.SemaphoreMethods, elect.ElectionMethods):
    """``Store`` on one SQLite file (or ``":memory:"``); see the module docstring.

    ``clock``: wall seconds, judges expiry (default ``time.time``). ``executor``: ``"thread"``
    (default: one dedicated thread, group commit) or ``"inline"`` (statements run on the event
    loop, which then blocks for each fsync; kept for measurements).
    """

    ordered = True
    """Operations apply in the order they are called (one queue, one thread; or inline): an
    acquire called after a release was called, even before the release completed, sees it.
    The service uses this to queue the head waiter's acquire right behind a release, often
    into the same group-commit transaction (one fsync per handoff instead of two)."""

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time,
                 executor: Literal["thread", "inline"] = "thread"):
        self.path = path
        self._clock = clock
        self._executor = executor
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[list[_Item] | None] = queue.SimpleQueue()
        self._pending: list[_Item] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[ReleaseListener] = []
        self._open = False

    # lifecycle

    async def open(self) -> None:
        """Take the file lock, open the database, create the schema, start the store thread.

        Raises ``StoreUnavailable`` if another process holds the file or SQLite cannot open it.
        """
        if self._open:
            return
        self._loop = asyncio.get_running_loop()
        memory = self.path == ":memory:"
        if not memory:
            self._take_file_lock()
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA busy_timeout = 5000")
                if not memory:
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise sqlite3.OperationalError(f"cannot switch to WAL (journal_mode={mode})")
                conn.execute("PRAGMA synchronous = FULL")
                _SYNC_MODE[id(conn)] = "FULL"
                _create_schema(conn)
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as exc:
            self._drop_file_lock()
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        self._conn = conn
        if self._executor == "thread":
            self._queue = queue.SimpleQueue()
            self._pending = []
            self._thread = threading.Thread(target=self._run, name="lockd-sqlite", daemon=True)
            self._thread.start()
        self._open = True

    async def close(self) -> None:
        """Finish queued operations, close the database and drop the file lock; idempotent."""
        if not self._open:
            return
        self._open = False
        if self._thread is not None:
            self._hand_over()  # operations called this turn run before the thread stops
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._conn is not None:
            _SYNC_MODE.pop(id(self._conn), None)
            self._conn.close()
            self._conn = None
        self._drop_file_lock()

    def _take_file_lock(self) -> None:
        lock_path = self.path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open lock file {lock_path!r}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreUnavailable(
                f"SQLite store {self.path!r} is already in use by another lockd (pid {holder}, "
                f"lock file {lock_path!r}); a SQLite store serves one lockd process: stop the "
                "other one, or share PostgreSQL or etcd between replicas"
            ) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _drop_file_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # running operations

    async def _call(self, op: _Op, *args: Any) -> Any:
        if not self._open or self._conn is None:
            raise StoreUnavailable("the SQLite store is not open")
        if self._executor == "inline":
            return _run_batch(self._conn, self._clock, [(op, args, None)])[0].result()
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[Any] = loop.create_future()
        pending = self._pending
        if not pending:
            loop.call_soon(self._hand_over)
        pending.append((op, args, fut))
        return await fut

    def _hand_over(self) -> None:
        """Queue the operations called during this turn of the event loop, in call order, as
        one item: the store thread is woken once per turn, not once per operation."""
        pending, self._pending = self._pending, []
        if pending:
            self._queue.put(pending)

    def _run(self) -> None:
        """The store thread: run whatever is queued in one transaction, hand results back."""
        assert self._conn is not None and self._loop is not None
        conn, loop, q = self._conn, self._loop, self._queue
        while True:
            items = q.get()
            if items is None:
                return
            batch = list(items)
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.extend(nxt)
            outcomes = _run_batch(conn, self._clock, batch)
            try:
                loop.call_soon_threadsafe(_deliver, batch, outcomes)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return
            if stop:
                return

    # the core of the Store protocol

    def _notify(self, lock: str) -> None:
        for listener in self._listeners:
            try:
                listener(lock)
            except Exception:  # a listener's bug must not fail a committed release
                log.exception("release listener failed")

    async def clock_offset(self) -> float:
        """0.0: expiry is judged by lockd's own clock."""
        return 0.0

    def subscribe(self, listener: ReleaseListener) -> None:
        self._listeners.append(listener)

    async def ping(self) -> None:
        await self._call(_ping)


class _Outcome:
    """One operation's result or error, delivered to its future on the event loop."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


# Operations whose commit need not be fsynced before the caller hears of it
# (docs/stores/sqlite.md, "Durable grants"): undoing one by a power loss only delays a grant.
_LAZY_OPS = frozenset({_ping, *locks.LAZY_OPS, *sem.LAZY_OPS, *elect.LAZY_OPS})
_SYNC_MODE: dict[int, str] = {}  # id(connection) -> the synchronous mode last set on it


def _set_sync(conn: sqlite3.Connection, mode: str) -> None:
    """``PRAGMA synchronous = mode`` (``FULL``/``NORMAL``) unless it is already set."""
    if _SYNC_MODE.get(id(conn)) != mode:
        conn.execute(f"PRAGMA synchronous = {mode}")
        _SYNC_MODE[id(conn)] = mode


def _run_batch(conn: sqlite3.Connection, clock: Callable[[], float],
               batch: list[Any]) -> list[_Outcome]:
    """Run ``batch`` in one transaction (one fsync, none if it only releases and reads). A
    SQLite error fails the whole batch."""
    outcomes: list[_Outcome] = []
    try:
        _set_sync(conn, "NORMAL" if all(op in _LAZY_OPS for op, _, _ in batch) else "FULL")
        conn.execute("BEGIN IMMEDIATE")
        for op, args, _ in batch:
            try:
                outcomes.append(_Outcome(op(conn, int(clock() * 1000), *args)))
            except sqlite3.Error:
                raise
            except Exception as exc:  # LeaseLost, or a bug confined to this one operation
                outcomes.append(_Outcome(error=exc))
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        log.error("SQLite store failed, %d operation(s) not applied: %s", len(batch), exc)
        return [
            _Outcome(error=StoreUnavailable(f"SQLite store failed: {exc}")) for _ in batch
        ]
    return outcomes


def _deliver(batch: list[_Item], outcomes: list[_Outcome]) -> None:
    for (_, _, fut), outcome in zip(batch, outcomes, strict=True):
        if fut.done():  # the caller was cancelled; the service copes (see LockService)
            continue
        if outcome.error is not None:
            fut.set_exception(outcome.error)
        else:
            fut.set_result(outcome.value)
