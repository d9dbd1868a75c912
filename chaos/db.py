"""The protected tables of a chaos run, on PostgreSQL (psycopg) or SQLite (sqlite3).

::

    counter (id integer PRIMARY KEY, value bigint NOT NULL)     -- one row, id 1, starts at 0
    history (id bigserial PRIMARY KEY, op text UNIQUE, worker text,
             fence bigint, read_value bigint, wrote_value bigint)

The proxy serves both tables (it reflects them at start, so ``create_schema`` runs first). The
``nofence`` control mode bypasses the proxy with ``Direct``: it reads and writes these tables
itself, in one transaction per increment, ``UPDATE counter`` first (its row lock, or SQLite's
single writer, keeps history id order equal to commit order; see ``checker``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg

from chaos.checker import HistoryRow

__all__ = ["COUNTER_TABLE", "HISTORY_TABLE", "ResourceDB", "Direct"]

COUNTER_TABLE = "counter"
HISTORY_TABLE = "history"

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS counter (id integer PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE IF NOT EXISTS history (
    id bigserial PRIMARY KEY, op text NOT NULL UNIQUE, worker text NOT NULL,
    fence bigint NOT NULL, read_value bigint NOT NULL, wrote_value bigint NOT NULL);
INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
"""
_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL UNIQUE, worker TEXT NOT NULL,
    fence INTEGER NOT NULL, read_value INTEGER NOT NULL, wrote_value INTEGER NOT NULL);
INSERT OR IGNORE INTO counter (id, value) VALUES (1, 0);
"""
_HISTORY = "SELECT id, op, worker, fence, read_value, wrote_value FROM history ORDER BY id"


class ResourceDB:
    """The protected database at ``url``: ``postgresql://…`` (libpq form) or ``sqlite:////abs``."""

    def __init__(self, url: str):
        self.url = url
        self.is_sqlite = url.startswith("sqlite:")
        self.path = url.split("sqlite:///", 1)[1] if self.is_sqlite else None

    def _connect(self) -> Any:
        if self.is_sqlite:
            conn = sqlite3.connect(self.path, timeout=10, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            return conn
        return psycopg.connect(self.url, autocommit=True, connect_timeout=5)

    def create_schema(self) -> None:
        conn = self._connect()
        try:
            if self.is_sqlite:
                conn.executescript(_SQLITE_SCHEMA)
            else:
                conn.execute(_PG_SCHEMA)
        finally:
            conn.close()

    def final_state(self) -> tuple[int, list[HistoryRow]]:
        """The counter's value and the history in id order."""
        conn = self._connect()
        try:
            (value,) = conn.execute("SELECT value FROM counter WHERE id = 1").fetchone()
            rows = [HistoryRow(int(i), str(op), str(w), int(f), int(r), int(v))
                    for i, op, w, f, r, v in conn.execute(_HISTORY).fetchall()]
        finally:
            conn.close()
        return int(value), rows


class Direct:
    """Unfenced access for the ``nofence`` control: one connection, reconnecting after errors."""

    def __init__(self, url: str):
        self.db = ResourceDB(url)
        self._conn: Any = None

    def _c(self) -> Any:
        if self._conn is None:
            self._conn = self.db._connect()
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                self._conn.close()
            self._conn = None

    def read(self) -> int:
        try:
            (value,) = self._c().execute("SELECT value FROM counter WHERE id = 1").fetchone()
            return int(value)
        except (psycopg.Error, sqlite3.Error, OSError):
            self._drop()
            raise

    def write(self, op: str, worker: str, fence: int, read: int, wrote: int) -> None:
        """``UPDATE counter`` + ``INSERT history`` in one transaction."""
        conn = self._c()
        try:
            if self.db.is_sqlite:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute("UPDATE counter SET value = ? WHERE id = 1", (wrote,))
                    conn.execute("INSERT INTO history (op, worker, fence, read_value, wrote_value)"
                                 " VALUES (?, ?, ?, ?, ?)", (op, worker, fence, read, wrote))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            else:
                with conn.transaction():
                    conn.execute("UPDATE counter SET value = %s WHERE id = 1", (wrote,))
                    conn.execute("INSERT INTO history (op, worker, fence, read_value, wrote_value)"
                                 " VALUES (%s, %s, %s, %s, %s)", (op, worker, fence, read, wrote))
        except (psycopg.Error, sqlite3.Error, OSError):
            self._drop()
            raise

    def close(self) -> None:
        self._drop()
