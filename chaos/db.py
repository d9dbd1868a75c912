"""The protected tables of a chaos run, on PostgreSQL (psycopg) or SQLite (sqlite3).

::

    counter (id integer PRIMARY KEY, value bigint NOT NULL,          -- one row, id 1, starts at 0
             op text, worker text, fence bigint, read_value bigint)  -- who wrote it last
    marks   (id text PRIMARY KEY, worker text, fence bigint)         -- blind writes (no claim)
    accounts (id integer PRIMARY KEY, balance bigint NOT NULL,       -- ACCOUNTS rows (ids whose
              op text, fence bigint, read_balance bigint)            -- locks nest: account_ids),
                                                                     -- each at INITIAL_BALANCE
    account_marks (account integer, id text, fence bigint)          -- blind multi-lock batches
    terms   (id text PRIMARY KEY, term bigint, worker text, n int)  -- the election's term log
    slot_marks (slot integer, id text, fence bigint)                -- semaphore permits' writes
    near, near_x (n integer, id text, fence bigint)                 -- neighbour locks' rows
    history (id, kind, op, worker, fence, read_value, wrote_value, commit_seq)   -- not served

The proxy serves ``counter`` and ``marks`` (it reflects them at start, so ``create_schema`` runs
first); ``history`` is written by the database itself, by triggers, never through the proxy:

- ``kind = 'counter'``: every update of the counter row that names a new ``op`` (a batch, a
  PATCH or a PUT) logs the op, its fence, the value it read and the value it wrote.
- ``kind = 'mark_ins'`` / ``'mark_del'``: every insert / delete of a mark (``op`` = the mark's id).
- ``kind = 'account'``: EVERY update of an account row (the ``transfer`` workload): the transfer
  id (``op``), the account (``worker`` = its id), the fence of its lock, the balance the
  transfer read and the one it wrote. Every update, so a transfer applied twice shows twice.
- ``kind = 'amark'``: every insert of an account mark (the ``transfer`` workload's blind
  multi-lock batches: one mark per account of the lease, ``op`` = the transfer id, ``worker`` =
  the account, ``fence`` = its lock's fence).
- ``kind = 'term'``: every insert or update of a ``terms`` row (the ``election`` workload's term
  log: ``op`` = the entry id, ``worker`` = the leader, ``fence`` = its term, ``read_value`` = the
  entry's number within the term).
- ``kind = 'smark'``: every insert of a ``slot_marks`` row (the ``sem`` workload: ``op`` = the
  operation, ``worker`` = the permit's slot, ``fence`` = the permit's fence).
- ``kind = 'near'``: every insert of a ``near``/``near_x`` row (``chaos.near``: ``op`` = the
  operation, ``worker`` = the row's lock in full, from the run's templates, ``fence`` = its
  lease's fence).
- ``kind = 'fence'``: every change of the fence table (``watch_fences``, installed once it
  exists; ``fencing.fences`` on PostgreSQL, shared by the proxy and ``fencing.claim``): the
  highest fence honoured, as the database committed it.

Commit order without trusting the locks under test: on PostgreSQL a deferred constraint trigger
stamps each history row with ``nextval('chaos_commit_seq')`` at COMMIT (after every statement
of the transaction, with its row locks still held, so two transactions that touch a common row
are stamped in the order they commit; a transaction that rolls back stamps nothing). SQLite has
one writer at a time, so its AUTOINCREMENT id is the commit order (``commit_seq = id``).

The ``nofence`` control mode bypasses the proxy with ``Direct``: one transaction per increment.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg

from chaos.checker import HistoryRow
from chaos.near import NEAR_SPACES

__all__ = ["COUNTER_TABLE", "MARKS_TABLE", "ACCOUNTS_TABLE", "ACCOUNT_MARKS_TABLE", "HISTORY_TABLE", "ACCOUNTS",
           "TERMS_TABLE", "SLOT_MARKS_TABLE", "account_ids",
           "INITIAL_BALANCE", "ResourceDB", "Direct"]

COUNTER_TABLE = "counter"
MARKS_TABLE = "marks"
ACCOUNTS_TABLE = "accounts"
ACCOUNT_MARKS_TABLE = "account_marks"
HISTORY_TABLE = "history"
TERMS_TABLE = "terms"
SLOT_MARKS_TABLE = "slot_marks"
ACCOUNTS = 8
"""Account rows of the ``transfer`` and ``sql`` workloads (ids: ``account_ids``)."""
_NESTED_IDS = (1, 10, 2, 100, 11, 3, 20, 12)
"""Account ids whose locks contain one another (``accounts/1``, ``accounts/10``,
``accounts/100``, ``accounts/11``, ...): a check that matches lock names loosely confuses them."""


def account_ids(n: int = ACCOUNTS) -> list[int]:
    """The ids of ``n`` account rows: ``_NESTED_IDS`` first, then 200, 201, ..."""
    return list(_NESTED_IDS[:n]) + [200 + i for i in range(max(0, n - len(_NESTED_IDS)))]
INITIAL_BALANCE = 1000

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS counter (id integer PRIMARY KEY, value bigint NOT NULL, op text,
    worker text, fence bigint, read_value bigint);
CREATE TABLE IF NOT EXISTS marks (id text PRIMARY KEY, worker text NOT NULL, fence bigint NOT NULL);
CREATE SEQUENCE IF NOT EXISTS chaos_commit_seq;
CREATE TABLE IF NOT EXISTS history (
    id bigserial PRIMARY KEY, kind text NOT NULL, op text, worker text, fence bigint,
    read_value bigint, wrote_value bigint, commit_seq bigint);
CREATE UNIQUE INDEX IF NOT EXISTS history_counter_op ON history (op) WHERE kind = 'counter';
INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS accounts (id integer PRIMARY KEY, balance bigint NOT NULL, op text,
    fence bigint, read_balance bigint);
INSERT INTO accounts (id, balance) VALUES {account_rows} ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS account_marks (account integer NOT NULL, id text NOT NULL,
    fence bigint, PRIMARY KEY (account, id));
CREATE OR REPLACE FUNCTION chaos_log_account_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (kind, op, worker, fence) VALUES ('amark', NEW.id, NEW.account::text, NEW.fence);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_account_mark ON account_marks;
CREATE TRIGGER chaos_log_account_mark AFTER INSERT ON account_marks FOR EACH ROW
    EXECUTE FUNCTION chaos_log_account_mark();

CREATE OR REPLACE FUNCTION chaos_log_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (kind, op, worker, fence, read_value, wrote_value)
    VALUES ('account', NEW.op, NEW.id::text, NEW.fence, NEW.read_balance, NEW.balance);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_account ON accounts;
CREATE TRIGGER chaos_log_account AFTER UPDATE ON accounts FOR EACH ROW
    EXECUTE FUNCTION chaos_log_account();

CREATE TABLE IF NOT EXISTS terms (id text PRIMARY KEY, term bigint NOT NULL, worker text NOT NULL,
    n integer NOT NULL);
CREATE OR REPLACE FUNCTION chaos_log_term() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (kind, op, worker, fence, read_value) VALUES ('term', NEW.id, NEW.worker, NEW.term, NEW.n);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_term ON terms;
CREATE TRIGGER chaos_log_term AFTER INSERT OR UPDATE ON terms FOR EACH ROW
    EXECUTE FUNCTION chaos_log_term();
CREATE TABLE IF NOT EXISTS slot_marks (slot integer NOT NULL, id text NOT NULL, fence bigint,
    PRIMARY KEY (slot, id));
CREATE OR REPLACE FUNCTION chaos_log_slot_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (kind, op, worker, fence) VALUES ('smark', NEW.id, NEW.slot::text, NEW.fence);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_slot_mark ON slot_marks;
CREATE TRIGGER chaos_log_slot_mark AFTER INSERT ON slot_marks FOR EACH ROW
    EXECUTE FUNCTION chaos_log_slot_mark();

CREATE OR REPLACE FUNCTION chaos_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE history SET commit_seq = nextval('chaos_commit_seq') WHERE id = NEW.id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_stamp ON history;
CREATE CONSTRAINT TRIGGER chaos_stamp AFTER INSERT ON history
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_stamp();

CREATE OR REPLACE FUNCTION chaos_log_counter() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (kind, op, worker, fence, read_value, wrote_value)
    VALUES ('counter', NEW.op, NEW.worker, NEW.fence, NEW.read_value, NEW.value);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_counter ON counter;
CREATE TRIGGER chaos_log_counter AFTER UPDATE ON counter FOR EACH ROW
    WHEN (NEW.op IS DISTINCT FROM OLD.op) EXECUTE FUNCTION chaos_log_counter();

CREATE OR REPLACE FUNCTION chaos_log_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO history (kind, op, worker, fence) VALUES ('mark_ins', NEW.id, NEW.worker, NEW.fence);
    ELSE
        INSERT INTO history (kind, op, worker, fence) VALUES ('mark_del', OLD.id, OLD.worker, OLD.fence);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_mark ON marks;
CREATE TRIGGER chaos_log_mark AFTER INSERT OR DELETE ON marks FOR EACH ROW
    EXECUTE FUNCTION chaos_log_mark();
"""
_PG_FENCES = """
CREATE OR REPLACE FUNCTION chaos_log_fence() RETURNS trigger LANGUAGE plpgsql
    SET search_path = public AS $$  -- fencing.try_claim runs with its own search_path
BEGIN
    INSERT INTO history (kind, op, fence) VALUES ('fence', NEW.lock, NEW.highest);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_fence ON fencing.fences;
CREATE TRIGGER chaos_log_fence AFTER INSERT OR UPDATE ON fencing.fences FOR EACH ROW
    EXECUTE FUNCTION chaos_log_fence();
"""

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL, op TEXT,
    worker TEXT, fence INTEGER, read_value INTEGER);
CREATE TABLE IF NOT EXISTS marks (id TEXT PRIMARY KEY, worker TEXT NOT NULL, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, op TEXT, worker TEXT,
    fence INTEGER, read_value INTEGER, wrote_value INTEGER, commit_seq INTEGER);
CREATE UNIQUE INDEX IF NOT EXISTS history_counter_op ON history (op) WHERE kind = 'counter';
INSERT OR IGNORE INTO counter (id, value) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, op TEXT,
    fence INTEGER, read_balance INTEGER);
INSERT OR IGNORE INTO accounts (id, balance) VALUES {account_rows};
CREATE TABLE IF NOT EXISTS account_marks (account INTEGER NOT NULL, id TEXT NOT NULL,
    fence INTEGER, PRIMARY KEY (account, id));
CREATE TRIGGER IF NOT EXISTS chaos_log_account_mark AFTER INSERT ON account_marks FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence)
          VALUES ('amark', NEW.id, CAST(NEW.account AS TEXT), NEW.fence); END;
CREATE TRIGGER IF NOT EXISTS chaos_log_account AFTER UPDATE ON accounts FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence, read_value, wrote_value)
          VALUES ('account', NEW.op, CAST(NEW.id AS TEXT), NEW.fence, NEW.read_balance,
                  NEW.balance); END;
CREATE TRIGGER IF NOT EXISTS chaos_log_counter AFTER UPDATE ON counter FOR EACH ROW
    WHEN NEW.op IS NOT OLD.op
    BEGIN INSERT INTO history (kind, op, worker, fence, read_value, wrote_value)
          VALUES ('counter', NEW.op, NEW.worker, NEW.fence, NEW.read_value, NEW.value); END;
CREATE TABLE IF NOT EXISTS terms (id TEXT PRIMARY KEY, term INTEGER NOT NULL, worker TEXT NOT NULL,
    n INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS chaos_log_term_ins AFTER INSERT ON terms FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence, read_value)
          VALUES ('term', NEW.id, NEW.worker, NEW.term, NEW.n); END;
CREATE TRIGGER IF NOT EXISTS chaos_log_term_upd AFTER UPDATE ON terms FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence, read_value)
          VALUES ('term', NEW.id, NEW.worker, NEW.term, NEW.n); END;
CREATE TABLE IF NOT EXISTS slot_marks (slot INTEGER NOT NULL, id TEXT NOT NULL, fence INTEGER,
    PRIMARY KEY (slot, id));
CREATE TRIGGER IF NOT EXISTS chaos_log_slot_mark AFTER INSERT ON slot_marks FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence)
          VALUES ('smark', NEW.id, CAST(NEW.slot AS TEXT), NEW.fence); END;
CREATE TRIGGER IF NOT EXISTS chaos_log_mark_ins AFTER INSERT ON marks FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence) VALUES ('mark_ins', NEW.id, NEW.worker, NEW.fence); END;
CREATE TRIGGER IF NOT EXISTS chaos_log_mark_del AFTER DELETE ON marks FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence) VALUES ('mark_del', OLD.id, OLD.worker, OLD.fence); END;
"""
_SQLITE_FENCES = """
CREATE TRIGGER IF NOT EXISTS chaos_log_fence_ins AFTER INSERT ON resource_proxy_fences FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, fence) VALUES ('fence', NEW.lock, NEW.highest); END;
CREATE TRIGGER IF NOT EXISTS chaos_log_fence_upd AFTER UPDATE ON resource_proxy_fences FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, fence) VALUES ('fence', NEW.lock, NEW.highest); END;
"""
def _near_ddl(templates: tuple[str, str], sqlite: bool) -> str:
    """``near`` and ``near_x``, each logging its inserts as history ``kind = 'near'`` with the
    row's lock (its template with ``{n}`` replaced) in ``worker``."""
    out = []
    for table, template in zip(("near", "near_x"), templates, strict=True):
        pre, post = (part.replace("'", "''") for part in template.split("{n}"))
        lock = (f"'{pre}' || CAST(NEW.n AS TEXT) || '{post}'")
        if sqlite:
            out.append(f"""
CREATE TABLE IF NOT EXISTS {table} (n INTEGER NOT NULL, id TEXT NOT NULL, fence INTEGER,
    PRIMARY KEY (n, id));
CREATE TRIGGER IF NOT EXISTS chaos_log_{table} AFTER INSERT ON {table} FOR EACH ROW
    BEGIN INSERT INTO history (kind, op, worker, fence) VALUES ('near', NEW.id, {lock}, NEW.fence); END;
""")
        else:
            out.append(f"""
CREATE TABLE IF NOT EXISTS {table} (n integer NOT NULL, id text NOT NULL, fence bigint,
    PRIMARY KEY (n, id));
CREATE OR REPLACE FUNCTION chaos_log_{table}() RETURNS trigger LANGUAGE plpgsql
    SET search_path = public AS $$
BEGIN
    INSERT INTO history (kind, op, worker, fence) VALUES ('near', NEW.id, {lock}, NEW.fence);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_{table} ON {table};
CREATE TRIGGER chaos_log_{table} AFTER INSERT ON {table} FOR EACH ROW
    EXECUTE FUNCTION chaos_log_{table}();
""")
    return "".join(out)


_HISTORY = ("SELECT id, kind, op, worker, fence, read_value, wrote_value, commit_seq FROM history"
            " ORDER BY id")


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

    def _script(self, pg: str, lite: str) -> None:
        conn = self._connect()
        try:
            if self.is_sqlite:
                conn.executescript(lite)
            else:
                conn.execute(pg)
        finally:
            conn.close()

    def create_schema(self, accounts: int = ACCOUNTS,
                      near: tuple[str, str] = NEAR_SPACES["counter"]) -> None:
        """The tables, triggers and first rows (``accounts`` account rows; ``near``: the lock
        templates of ``near`` and ``near_x``, ``{n}`` their ``n``, which their history rows
        name in full)."""
        rows = ", ".join(f"({i}, {INITIAL_BALANCE})" for i in account_ids(int(accounts)))
        self._script(_PG_SCHEMA.replace("{account_rows}", rows) + _near_ddl(near, False),
                     _SQLITE_SCHEMA.replace("{account_rows}", rows) + _near_ddl(near, True))

    def watch_fences(self) -> None:
        """Log every change of the proxy's fence table into ``history`` (``kind = 'fence'``).
        Call once the proxy has created its table (after it started)."""
        self._script(_PG_FENCES, _SQLITE_FENCES)

    def final_state(self) -> tuple[int, list[HistoryRow]]:
        """The counter's value and every history row (all kinds), in commit order."""
        conn = self._connect()
        try:
            (value,) = conn.execute("SELECT value FROM counter WHERE id = 1").fetchone()
            rows = [HistoryRow(int(i), str(op or ""), str(w or ""), int(f or 0), int(r or 0),
                               int(v or 0), kind=str(k),
                               seq=int(s) if s is not None else (int(i) if self.is_sqlite else None))
                    for i, k, op, w, f, r, v, s in conn.execute(_HISTORY).fetchall()]
        finally:
            conn.close()
        return int(value), rows

    def balances(self) -> dict[int, int]:
        """Every account's balance now (``transfer`` workload)."""
        conn = self._connect()
        try:
            return {int(i): int(b) for i, b in
                    conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()}
        finally:
            conn.close()


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
        """``UPDATE counter`` (its trigger logs the history row), one statement."""
        conn = self._c()
        ph = "?" if self.db.is_sqlite else "%s"
        try:
            conn.execute(f"UPDATE counter SET value = {ph}, op = {ph}, worker = {ph}, fence = {ph},"
                         f" read_value = {ph} WHERE id = 1", (wrote, op, worker, fence, read))
        except (psycopg.Error, sqlite3.Error, OSError):
            self._drop()
            raise

    def read_balance(self, account: int) -> int:
        try:
            ph = "?" if self.db.is_sqlite else "%s"
            (value,) = self._c().execute(f"SELECT balance FROM accounts WHERE id = {ph}",
                                         (account,)).fetchone()
            return int(value)
        except (psycopg.Error, sqlite3.Error, OSError):
            self._drop()
            raise

    def transfer(self, op: str, rows: list[tuple[int, int, int, int]]) -> None:
        """Update each ``(account, balance, fence, read_balance)`` in ONE transaction."""
        conn = self._c()
        ph = "?" if self.db.is_sqlite else "%s"
        sql = (f"UPDATE accounts SET balance = {ph}, op = {ph}, fence = {ph}, read_balance = {ph}"
               f" WHERE id = {ph}")
        try:
            if self.db.is_sqlite:
                conn.execute("BEGIN IMMEDIATE")
                for account, balance, fence, read in rows:
                    conn.execute(sql, (balance, op, fence, read, account))
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    for account, balance, fence, read in rows:
                        conn.execute(sql, (balance, op, fence, read, account))
        except (psycopg.Error, sqlite3.Error, OSError):
            self._drop()
            raise

    def close(self) -> None:
        self._drop()
