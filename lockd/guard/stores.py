"""Fence stores: where a guarded service keeps the highest fence it honoured per lock, claimed
in the same atomic step as the service's own write (the fence-store rule of
docs/fencing-protocol.md: check and raise the highest, then write, then commit, all or none).

Every store's claim passes iff the presented fence is ≥ the highest (equal: the same holder's
next write) and then makes it the highest; otherwise ``StaleToken`` (409) and nothing of the
block is kept.

- ``MemoryFences``: a dict under a lock, for ONE process only (its highest values die with the
  process, and another process keeps its own): tests, a single worker's in-memory state.
- ``SqliteFences``: a fences table in the service's own SQLite database, claimed inside the
  service's transaction, opened ``BEGIN IMMEDIATE`` (one writer at a time).
- ``PostgresFences``: the ``fencing`` schema (``resource-proxy db install``): ``fencing.claim``
  in the service's transaction, by ``lockd.client.sqlfence.claimed_transaction``, the code of
  ``fenced_transaction``; a newer holder's claim waits on the fence row until commit.
- Redis: ``lockd.guard.redis.RedisFences`` (a function library; check, raise and write in one
  call).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

from lockd.client.errors import StaleTokenError
from lockd.client.sqlfence import claimed_transaction
from lockd.common.fencerule import Fence
from lockd.guard.errors import StaleToken

__all__ = ["MemoryFences", "SqliteFences", "PostgresFences"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class MemoryFences:
    """The highest fence per lock in this process's memory: single process only, lost on exit.
    ``transaction(fence)`` holds one lock for the check, the block and the raise."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}
        self._lock = threading.RLock()

    def highest(self, lock: str) -> int:
        """The highest fence honoured for ``lock`` (0: none)."""
        with self._lock:
            return self._highest.get(lock, 0)

    @contextlib.contextmanager
    def transaction(self, fence: Fence) -> Iterator[None]:
        """Check ``fence``, run the block, then raise the highest to it; ``StaleToken`` before
        the block if stale. A block that raises leaves the highest as it was."""
        with self._lock:
            highest = self._highest.get(fence.lock, 0)
            if fence.fence < highest:
                raise StaleToken(fence.lock, fence.fence, highest)
            yield
            self._highest[fence.lock] = max(highest, fence.fence)


class SqliteFences:
    """A fences table (``table``, default ``lockd_fences``: ``lock TEXT PRIMARY KEY, highest
    INTEGER``) in the service's own SQLite database; ``sqlite3`` connections."""

    def __init__(self, table: str = "lockd_fences"):
        if not _IDENT.match(table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        self.table = table

    def install(self, conn: sqlite3.Connection) -> None:
        """Create the fences table if it is missing (idempotent; commits)."""
        conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                     "(lock TEXT PRIMARY KEY, highest INTEGER NOT NULL)")
        conn.commit()

    def highest(self, conn: sqlite3.Connection, lock: str) -> int:
        row = conn.execute(f"SELECT highest FROM {self.table} WHERE lock = ?", (lock,)).fetchone()
        return int(row[0]) if row else 0

    def claim(self, conn: sqlite3.Connection, fence: Fence) -> None:
        """Claim ``fence`` inside the caller's open write transaction (``BEGIN IMMEDIATE``):
        raise the highest to it, or ``StaleToken``. Raises ``RuntimeError`` if no transaction
        is open (the claim would commit alone)."""
        if not conn.in_transaction:
            raise RuntimeError("SqliteFences.claim needs the write's transaction open "
                               "(BEGIN IMMEDIATE); use transaction()")
        row = conn.execute(
            f"INSERT INTO {self.table} (lock, highest) VALUES (?, ?) ON CONFLICT (lock) DO "
            "UPDATE SET highest = max(highest, excluded.highest) RETURNING highest",
            (fence.lock, fence.fence)).fetchone()
        if int(row[0]) != fence.fence:
            raise StaleToken(fence.lock, fence.fence, int(row[0]))

    @contextlib.contextmanager
    def transaction(self, conn: sqlite3.Connection, fence: Fence) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``, claim ``fence``, run the block, COMMIT; ROLLBACK and re-raise on
        any error (``StaleToken`` included). ``conn`` must have no transaction open."""
        if conn.in_transaction:
            raise RuntimeError("SqliteFences.transaction needs a connection with no "
                               "transaction open: the claim must be in the one that commits")
        conn.execute("BEGIN IMMEDIATE")
        try:
            self.claim(conn, fence)
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


class PostgresFences:
    """The ``fencing`` schema of the service's PostgreSQL database (install it with
    ``resource-proxy db install``; the service's role needs EXECUTE on the claim functions).
    A psycopg 3 connection or a SQLAlchemy connection/session, as ``fenced_transaction``."""

    @contextlib.contextmanager
    def transaction(self, conn: Any, fence: Fence) -> Iterator[Any]:
        """Open a transaction on ``conn`` (none may be open), ``fencing.claim`` the fence, run
        the block, commit; ``StaleToken`` (nothing committed) when a higher fence was claimed.
        Other errors are ``fenced_transaction``'s (``lockd.client.errors``)."""
        try:
            with claimed_transaction(conn, [fence]):
                yield conn
        except StaleTokenError as exc:
            raise StaleToken(exc.lock or fence.lock, exc.presented or fence.fence,
                             exc.highest or 0) from exc
