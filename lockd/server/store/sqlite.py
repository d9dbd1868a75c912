"""The embedded SQLite store: one lockd process, one database file, expiry by lockd's clock.

Design:

- **One row per lock, never deleted.** ``fence`` in the row is the last fence issued for that
  lock; a grant writes ``fence + 1`` in the same statement that installs the lease, so fences
  strictly increase per lock across release, expiry and restarts (invariant 1), and
  ``GET /v1/locks/{name}`` can show the last fence of a free lock. ``writer_open`` says whether
  the exclusive lease of that fence has NOT ended by a clean release (a shared grant after such
  an end starts a new epoch: ``sqlite_modes``). (A store-wide counter would
  let idle rows be deleted; rows are ~100 bytes, so keeping them is the simpler guarantee.)
- **Durable grants.** WAL journal with ``synchronous=FULL``: every commit that grants or renews
  is fsynced before the caller hears of it, so a fence once handed out, and an expiry once
  promised, survive a crash (``kill -9``, power loss). A batch of nothing but releases and reads
  commits with ``synchronous=NORMAL`` (no fsync of its own): the release is committed and seen
  by every later operation, survives ``kill -9`` (the WAL is in the OS's cache), and is made
  durable by the next fsynced commit (the WAL is one file written in order, so that fsync
  covers every frame before it). A power loss before then can undo a release; the lease then
  runs to its expiry, which delays the lock's next grant but never repeats a fence (and, its
  ``writer_open = 0`` undone too, ends uncleanly: the next reader starts a new epoch, one raise
  more than needed, never one less). Measured: this halves the fsyncs of a single client's
  acquire + release cycle.
- **Modes, semaphores, elections** keep the same rules in tables of their own (rows holding a
  fence or a log seq never deleted; grants fsynced; expiry by lockd's clock): shared leases in
  ``shared`` (``sqlite_modes``), permits per semaphore in ``semaphores``/``permits``
  (``sqlite_sem``), an election's value, handover and log next to its lock row
  (``sqlite_elect``).
- **One node.** An exclusive ``fcntl.flock`` on ``<db>.lock`` is held while the store is open, so
  a second lockd on the same file fails at start with a clear message instead of both granting
  the same lock from their own memory of waiters and clocks.
- **Expiry by lockd's clock** (``clock``: wall seconds, injectable for tests). Leases are stored
  as absolute wall-clock milliseconds so they survive a lockd restart; a wall clock that jumps
  shortens or stretches leases but never weakens fencing.
- **One connection, one thread, group commit.** Every operation is queued to a single dedicated
  thread that runs whatever has queued up in one transaction and one fsync, then resolves the
  callers' futures on the event loop. The event loop never blocks on the disk; under load many
  grants share one fsync. (Measured against running the statements inline on the event loop:
  see ``executor``.)

Errors: ``LeaseLost`` from renew/release of a lease that is not live; ``StoreUnavailable`` for
any SQLite failure (nothing of that batch was committed) or a store that is not open.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import lockd.server.store.sqlite_elect as elect
import lockd.server.store.sqlite_modes as modes
import lockd.server.store.sqlite_sem as sem
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
    other_mode,
)

__all__ = ["SqliteStore"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS locks (
    name        TEXT PRIMARY KEY,
    fence       INTEGER NOT NULL,
    lease_id    TEXT,
    owner       TEXT NOT NULL DEFAULT '',
    client_id   TEXT,
    expires_ms  INTEGER NOT NULL DEFAULT 0,
    ttl_ms      INTEGER NOT NULL DEFAULT 0,
    writer_open INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID
"""
# ``writer_open``: 1 while the exclusive lease of ``fence`` has not ended by a clean release (it
# is live, expired or was force-released), 0 once released cleanly or once a shared grant
# started a new epoch (``sqlite_modes.grant_shared``). An older file gets the column with 1 (a
# shared grant may then raise once more than needed: never less).
_WRITER_OPEN = "ALTER TABLE locks ADD COLUMN writer_open INTEGER NOT NULL DEFAULT 1"
# Multi-lock leases: the set of locks each one holds (its lock rows carry its lease_id).
_SCHEMA_LEASES = """
CREATE TABLE IF NOT EXISTS leases (
    lease_id   TEXT PRIMARY KEY,
    locks      TEXT NOT NULL,
    owner      TEXT NOT NULL DEFAULT '',
    client_id  TEXT,
    expires_ms INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL
) WITHOUT ROWID
"""
_MAX_BATCH = 256


def _create_schema(conn: sqlite3.Connection) -> None:
    """Create every table and index the store uses, idempotently (no transaction needed); a
    file of an older version gets the columns it lacks."""
    for statement in (_SCHEMA, _SCHEMA_LEASES, *modes.SCHEMA, *sem.SCHEMA,
                      *elect.SCHEMA):
        conn.execute(statement)
    if "writer_open" not in {row[1] for row in conn.execute("PRAGMA table_info(locks)")}:
        conn.execute(_WRITER_OPEN)

_Op = Callable[..., Any]
_Item = tuple[_Op, tuple[Any, ...], "asyncio.Future[Any]"]


# --- operations: run on the store thread inside a transaction; ``now`` is lockd-clock ms -------


def _acquire(conn: sqlite3.Connection, now: int, lock: str, lease_id: str, ttl_ms: int,
             owner: str, client_id: str | None, mode: str = EXCLUSIVE) -> Grant | Holder:
    # row[5]: whether any shared lease row exists (a shared grant creates the lock row first)
    row = conn.execute(
        "SELECT fence, lease_id, owner, client_id, expires_ms,"
        " EXISTS (SELECT 1 FROM shared WHERE shared.name = locks.name) FROM locks WHERE name = ?",
        (lock,)
    ).fetchone()
    if row is not None and row[1] is not None and row[4] > now:
        fence, live_id, live_owner, live_client, expires = row[:5]
        if client_id and live_client == client_id:
            if mode != EXCLUSIVE:  # a retry answers only the mode the store recorded
                raise other_mode(lock, EXCLUSIVE, mode)
            conn.execute("UPDATE locks SET expires_ms = ?, ttl_ms = ? WHERE name = ?",
                         (now + ttl_ms, ttl_ms, lock))
            return Grant(lock, live_id, fence, ttl_ms, live_owner)
        return Holder(lock, live_owner, expires - now, fence)
    if row is not None and row[5]:
        shared = modes.shared_check(conn, now, lock, mode, ttl_ms, client_id)
        if shared is not None:  # a client_id retry of a shared lease, or shared holders block
            return shared
    if mode == SHARED:  # the first one after an unclean end raises the fence (a new epoch)
        return modes.grant_shared(conn, now, lock, lease_id, ttl_ms, owner, client_id)
    fence = (row[0] if row is not None else 0) + 1
    conn.execute(
        "INSERT INTO locks (name, fence, lease_id, owner, client_id, expires_ms, ttl_ms,"
        " writer_open) VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (name) DO UPDATE SET"
        " fence = excluded.fence, lease_id = excluded.lease_id, owner = excluded.owner,"
        " client_id = excluded.client_id, expires_ms = excluded.expires_ms,"
        " ttl_ms = excluded.ttl_ms, writer_open = 1",
        (lock, fence, lease_id, owner, client_id, now + ttl_ms, ttl_ms),
    )
    return Grant(lock, lease_id, fence, ttl_ms, owner)


def _renew(conn: sqlite3.Connection, now: int, lock: str, lease_id: str,
           ttl_ms: int | None) -> Grant:
    # ttl_ms None: the lease's own TTL (the last one granted or renewed with).
    row = conn.execute(
        "UPDATE locks SET expires_ms = ? + coalesce(?, ttl_ms), ttl_ms = coalesce(?, ttl_ms)"
        " WHERE name = ? AND lease_id = ? AND expires_ms > ? RETURNING fence, owner, ttl_ms",
        (now, ttl_ms, ttl_ms, lock, lease_id, now),
    ).fetchone()
    if row is None:
        return modes.renew_shared(conn, now, lock, lease_id, ttl_ms)  # or LeaseLost
    return Grant(lock, lease_id, row[0], row[2], row[1])


def _release(conn: sqlite3.Connection, now: int, lock: str, lease_id: str) -> None:
    cur = conn.execute(  # a clean release: the writer is done (writer_open = 0)
        "UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0,"
        " writer_open = 0 WHERE name = ? AND lease_id = ? AND expires_ms > ?",
        (lock, lease_id, now),
    )
    if cur.rowcount != 1:
        modes.release_shared(conn, now, lock, lease_id)  # or LeaseLost


def _force_release(conn: sqlite3.Connection, now: int, lock: str) -> Holder | None:
    row = conn.execute(
        "SELECT fence, owner, expires_ms FROM locks"
        " WHERE name = ? AND lease_id IS NOT NULL AND expires_ms > ?", (lock, now)
    ).fetchone()
    if row is None:
        return modes.force_shared(conn, now, lock)  # every shared holder, if any
    conn.execute(  # no clean release: writer_open stays 1, the next shared grant raises
        "UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0"
        " WHERE name = ?", (lock,)
    )
    return Holder(lock, row[1], row[2] - now, row[0])


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _acquire_many(conn: sqlite3.Connection, now: int, locks: tuple[str, ...], lease_id: str,
                  ttl_ms: int, owner: str, client_id: str | None,
                  wanted: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
    # Reads first, writes only once every lock is known to be free: nothing to undo.
    mode_of = {n: SHARED if wanted and wanted.get(n) == SHARED else EXCLUSIVE for n in locks}
    rows = {r[0]: r[1:] for r in conn.execute(
        f"SELECT name, fence, lease_id, owner, expires_ms FROM locks WHERE name IN"
        f" ({_marks(len(locks))})", locks)}
    live = sorted((n, r) for n, r in rows.items() if r[1] is not None and r[3] > now)
    if client_id and (held_id := modes.multi_retry(conn, now, locks, client_id,
                                                   mode_of)) is not None:
        return _renew_many(conn, now, held_id, ttl_ms)
    blocked = {n: Holder(n, r[2], r[3] - now, r[0]) for n, r in live}
    blocked.update(modes.shared_blockers(
        conn, now, [n for n in locks if mode_of[n] == EXCLUSIVE and n not in blocked]))
    if blocked:
        return [blocked[n] for n in sorted(blocked)]
    conn.execute("DELETE FROM leases WHERE expires_ms <= ?", (now,))
    fences: dict[str, int] = {}
    for name in locks:
        if mode_of[name] == SHARED:  # the single-lock rule, per lock (a new epoch or not)
            fences[name] = modes.grant_shared(conn, now, name, lease_id, ttl_ms, owner,
                                              None).fence
            continue
        fence = (rows[name][0] if name in rows else 0) + 1
        conn.execute(
            "INSERT INTO locks (name, fence, lease_id, owner, client_id, expires_ms, ttl_ms,"
            " writer_open) VALUES (?, ?, ?, ?, NULL, ?, ?, 1) ON CONFLICT (name) DO UPDATE SET"
            " fence = excluded.fence, lease_id = excluded.lease_id, owner = excluded.owner,"
            " client_id = NULL, expires_ms = excluded.expires_ms, ttl_ms = excluded.ttl_ms,"
            " writer_open = 1",
            (name, fence, lease_id, owner, now + ttl_ms, ttl_ms),
        )
        fences[name] = fence
    conn.execute(
        "INSERT INTO leases (lease_id, locks, owner, client_id, expires_ms, ttl_ms)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (lease_id, json.dumps(list(locks)), owner, client_id, now + ttl_ms, ttl_ms),
    )
    return MultiGrant(lease_id, fences, ttl_ms, owner, modes.modes_of(mode_of.items()))


def _lease_row(conn: sqlite3.Connection, lease_id: str) -> tuple[list[str], str, int]:
    row = conn.execute("SELECT locks, owner, ttl_ms FROM leases WHERE lease_id = ?",
                       (lease_id,)).fetchone()
    if row is None:
        raise LeaseLost("the lease is not live (expired, released or unknown)")
    return json.loads(row[0]), row[1], row[2]


def _renew_many(conn: sqlite3.Connection, now: int, lease_id: str,
                ttl_ms: int | None) -> MultiGrant:
    names, owner, own_ttl = _lease_row(conn, lease_id)
    ttl = own_ttl if ttl_ms is None else ttl_ms
    held = modes.held_by(conn, now, names, lease_id)  # name -> (fence, mode)
    if len(held) != len(names):  # checked before writing: nothing to undo
        raise LeaseLost("the lease is not live (expired, released or unknown)")
    conn.execute(f"UPDATE locks SET expires_ms = ?, ttl_ms = ? WHERE name IN"
                 f" ({_marks(len(names))}) AND lease_id = ?", (now + ttl, ttl, *names, lease_id))
    if any(mode == SHARED for _, mode in held.values()):
        conn.execute("UPDATE shared SET expires_ms = ?, ttl_ms = ? WHERE lease_id = ?",
                     (now + ttl, ttl, lease_id))
    conn.execute("UPDATE leases SET expires_ms = ?, ttl_ms = ? WHERE lease_id = ?",
                 (now + ttl, ttl, lease_id))
    return MultiGrant(lease_id, {n: held[n][0] for n in names}, ttl, owner,
                      modes.modes_of((n, held[n][1]) for n in names))


def _release_many(conn: sqlite3.Connection, now: int,
                  lease_id: str) -> tuple[tuple[str, ...], bool]:
    """(names freed, whether the whole set was live)."""
    row = conn.execute("SELECT locks FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
    if row is None:
        return (), False
    names = json.loads(row[0])
    freed = conn.execute(  # a clean release of each lock still held (writer_open = 0)
        "UPDATE locks SET lease_id = NULL, client_id = NULL, owner = '', expires_ms = 0,"
        f" writer_open = 0 WHERE name IN ({_marks(len(names))}) AND lease_id = ?"
        " AND expires_ms > ? RETURNING name", (*names, lease_id, now)).fetchall()
    freed += [r[:1] for r in conn.execute(  # its shared part (a multi lease id is never reused)
        "DELETE FROM shared WHERE lease_id = ? RETURNING name, expires_ms",
        (lease_id,)).fetchall() if r[1] > now]
    conn.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
    return tuple(sorted(r[0] for r in freed)), len(freed) == len(names)


def _get(conn: sqlite3.Connection, now: int, lock: str) -> LockState:
    row = conn.execute(
        "SELECT fence, lease_id, owner, expires_ms FROM locks WHERE name = ?", (lock,)
    ).fetchone()
    if row is None:
        return LockState(lock, False, 0, None, 0)
    return modes.lock_state(now, lock, *row, modes.holders_of(conn, now, [lock]).get(lock, ()))


def _list(conn: sqlite3.Connection, now: int, prefix: str, limit: int,
          after: str | None) -> list[LockState]:
    where, params = [], []
    if prefix:
        # Every name starting with prefix sorts in [prefix, prefix with its last char + 1).
        where.append("name >= ? AND name < ?")
        params += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
    if after is not None:
        where.append("name > ?")
        params.append(after)
    sql = "SELECT name, fence, lease_id, owner, expires_ms FROM locks"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = conn.execute(sql + " ORDER BY name LIMIT ?", (*params, limit)).fetchall()
    shared = modes.holders_of(conn, now, [row[0] for row in rows])
    return [modes.lock_state(now, *row, shared.get(row[0], ())) for row in rows]


def _ping(conn: sqlite3.Connection, now: int) -> None:
    conn.execute("SELECT 1").fetchone()


# --- the store ----------------------------------------------------------------------------------


class SqliteStore(sem.SemaphoreMethods, elect.ElectionMethods):
    """``Store`` on one SQLite file (or ``":memory:"``); see the module docstring. Shared
    leases: ``sqlite_modes``; semaphores: ``sqlite_sem``; elections: ``sqlite_elect``.

    ``clock``: wall seconds, judges expiry (default ``time.time``). ``executor``: ``"thread"``
    (default: one dedicated thread, group commit) or ``"inline"`` (statements run on the event
    loop, which then blocks for each fsync; kept for measurements).
    """

    ordered = True
    """Operations apply in the order they are called (one queue, one thread; or inline): an
    acquire called after a release was called, even before the release completed, sees it.
    The service uses this to queue the head waiter's acquire right behind a release, often
    into the same group-commit transaction (one fsync per handoff instead of two)."""

    _acquire_op = staticmethod(_acquire)  # a campaign's grant (``sqlite_elect``)

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time,
                 executor: Literal["thread", "inline"] = "thread"):
        self.path = path
        self._clock = clock
        self._executor = executor
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
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
            self._thread = threading.Thread(target=self._run, name="lockd-sqlite", daemon=True)
            self._thread.start()
        self._open = True

    async def close(self) -> None:
        """Finish queued operations, close the database and drop the file lock; idempotent."""
        if not self._open:
            return
        self._open = False
        if self._thread is not None:
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
        assert self._loop is not None
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._queue.put((op, args, fut))
        return await fut

    def _run(self) -> None:
        """The store thread: run whatever is queued in one transaction, hand results back."""
        assert self._conn is not None and self._loop is not None
        conn, loop, q = self._conn, self._loop, self._queue
        while True:
            item = q.get()
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            outcomes = _run_batch(conn, self._clock, batch)
            try:
                loop.call_soon_threadsafe(_deliver, batch, outcomes)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return
            if stop:
                return

    # the Store protocol

    async def acquire(self, lock: str, *, lease_id: str, ttl_ms: int, owner: str,
                      client_id: str | None, mode: str = EXCLUSIVE) -> Grant | Holder:
        return await self._call(_acquire, lock, lease_id, ttl_ms, owner, client_id, mode)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        return await self._call(_renew, lock, lease_id, ttl_ms)

    async def release(self, lock: str, lease_id: str) -> None:
        await self._call(_release, lock, lease_id)
        for listener in self._listeners:
            try:
                listener(lock)
            except Exception:  # a listener's bug must not fail a committed release
                log.exception("release listener failed")

    async def force_release(self, lock: str) -> Holder | None:
        """See ``Store.force_release``."""
        ended = await self._call(_force_release, lock)
        if ended is not None:
            self._notify(lock)
        return ended

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None,
                           modes: Mapping[str, str] | None = None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many``: one operation of one group-commit transaction."""
        return await self._call(_acquire_many, locks, lease_id, ttl_ms, owner, client_id, modes)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        return await self._call(_renew_many, lease_id, ttl_ms)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        freed, whole = await self._call(_release_many, lease_id)
        for lock in freed:
            self._notify(lock)
        if not whole:
            raise LeaseLost("the lease is not live (expired, released or unknown)")
        return freed

    def _notify(self, lock: str) -> None:
        for listener in self._listeners:
            try:
                listener(lock)
            except Exception:  # a listener's bug must not fail a committed release
                log.exception("release listener failed")

    async def clock_offset(self) -> float:
        """0.0: expiry is judged by lockd's own clock."""
        return 0.0

    async def get(self, lock: str) -> LockState:
        return await self._call(_get, lock)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        return await self._call(_list, prefix, limit, after)

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


# Operations whose commit need not be fsynced before the caller hears of it (see the module
# docstring, "Durable grants"): undoing one by a power loss only delays a lock's next grant.
_LAZY_OPS = frozenset({_release, _release_many, _force_release, _get, _list, _ping,
                       *sem.LAZY_OPS, *elect.LAZY_OPS})
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
