"""The ``sql`` workload's operations: plain SQL (psycopg) inside ``fenced_transaction``, no proxy.

Each operation holds a two-account multi-lock lease (``accounts/a``, ``accounts/b``) and runs one
of these in ONE transaction, on a database whose fence triggers ``chaos.sqldb.protect``
installed. ``fenced_transaction(conn, lease)`` claims both fences first (``fenced`` mode); the
``noclaim`` control opens a plain transaction instead, and the triggers must refuse every write
of it (no committed row, each refusal an ``LF002``).

============  ====================================================================  ===========
``rmw``       read both balances, think, write both (a transfer, one UPDATE per row)  read first
``blind``     one set-based UPDATE moving the amount, no read (``WHERE id IN``)       blind
``order``     INSERT an order of ``a`` and two lines, owned by ``a`` and ``b``        blind
``touch``     ``UPDATE order_lines ... WHERE owner = a``: every line of one lock      blind
``rehome``    ``UPDATE order_lines SET owner = a WHERE account = a AND owner <> a``:  blind
              moves lines out of other locks (each must be claimed: often refused)
``cancel``    DELETE an order of ``a`` whose lines are all under the lease: the       read first
              cascade deletes lines of ``a`` and ``b``, both claimed
``drop``      DELETE a random order of ``a``: the cascade reaches lines of accounts   blind
              the lease lacks, and the triggers must refuse the whole delete
============  ====================================================================  ===========

A ``blind`` operation logs ``blind`` (the nemesis may freeze it there) and ``write`` BEFORE its
transaction claims: nothing read or claimed hides whether the claim refuses a stale fence. An
``rmw`` logs ``read`` after the claim and the read (inside the transaction, which then holds the
fence rows until COMMIT), ``write`` before its UPDATEs. Outcomes: ``ack`` (committed),
``stale`` (``StaleTokenError``: the claim met a newer fence), ``rejected`` with ``code =
lock_not_claimed`` (``LF002``: a row of a lock not claimed, the expected answer of ``drop``,
``rehome`` and every ``noclaim`` write), ``unknown`` (the connection broke: committed or not).
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from lockd.client.errors import LockClientError, SharedTokenError, StaleTokenError
from lockd.client.sqlfence import LockNotClaimedError, fenced_transaction

__all__ = ["SQL_OPS", "SqlOps"]

SQL_OPS = ("rmw", "rmw", "rmw", "blind", "blind", "order", "order", "order", "touch", "rehome",
           "rehome", "rehome", "cancel", "drop", "drop", "drop")
"""The draw of each operation (weights by repetition): the writes that reach rows of locks the
lease lacks (``rehome``, ``drop``, and the ``order`` rows they reach) often enough that a trigger
which lets one through is caught several times a run."""
_SET_OP = "SELECT set_config('chaos.op', %s, true)"


def _account(lock: str) -> int:
    return int(lock.rsplit("/", 1)[1])


class SqlOps:
    """One worker's ``sql`` operations on the protected database ``url`` (reconnecting after a
    broken connection). ``worker`` is the ``chaos.workload.Worker`` (its ``log``, ``rng``,
    ``a.mode``, think times, ``sleep``)."""

    def __init__(self, worker: Any, url: str, sleep: Any):
        self.w = worker
        self.url = url
        self.sleep = sleep
        self._conn: psycopg.Connection | None = None

    # -- connection ----------------------------------------------------------------------------

    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def transaction(self, op: str, lease: Any):
        """``fenced_transaction`` (``fenced``) or a plain one (``noclaim``), naming ``op``."""
        conn = self.conn()
        if self.w.a.mode == "noclaim":
            with conn.transaction():
                conn.execute(_SET_OP, (op,))
                yield conn
        else:  # a raw lease (``chaos.near``) has no client: its keys come from lockd's URL
            url = None if hasattr(lease, "_client") else self.w.a.lockd
            with fenced_transaction(conn, lease, lockd_url=url, refuse_lost=False):
                conn.execute(_SET_OP, (op,))
                yield conn

    # -- one operation -------------------------------------------------------------------------

    def run(self, op: str, lease: Any) -> None:
        fences = {name: int(f) for name, f in lease.fences.items()}
        a, b = sorted(_account(n) for n in fences)
        if self.w.rng.random() < 0.5:
            a, b = b, a
        kind = self.w.rng.choice(SQL_OPS)
        claimed = self.w.a.mode != "noclaim"
        self._guarded(op, lease, lambda: getattr(self, "_" + kind)(op, lease, fences, a, b,
                                                                  claimed))

    def near(self, op: str, lease: Any, table: str, row: dict[str, Any]) -> bool:
        """Insert ``row`` into near table ``table`` in one transaction of ``lease`` (a neighbour
        lock, ``chaos.near``); whether it committed (else its outcome is logged)."""
        self._phase = "write"

        def insert() -> None:
            with self.transaction(op, lease) as conn:
                conn.execute(f"INSERT INTO {table} (n, id, fence) VALUES (%s, %s, %s)",
                             (row["n"], row["id"], row["fence"]))

        return self._guarded(op, lease, insert)

    def _guarded(self, op: str, lease: Any, body: Any) -> bool:
        """Run ``body``; log its failure as the operation's outcome. Whether it succeeded."""
        try:
            body()
            return True
        except StaleTokenError as exc:
            self.w.log("stale", op=op, phase=self._phase, fence=lease.fence,
                       presented=exc.presented, highest=exc.highest, lock=exc.lock,
                       status=exc.status)
        except SharedTokenError as exc:  # a shared lease's read claim: its rows are refused
            self.w.log("rejected", op=op, phase=self._phase, fence=lease.fence, status=None,
                       code="shared_token", lock=getattr(exc, "lock", None),
                       error=exc.detail[:200])
        except LockNotClaimedError as exc:
            self.w.log("rejected", op=op, phase=self._phase, fence=lease.fence, status=None,
                       code="lock_not_claimed", lock=exc.lock, error=exc.detail[:200])
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == "LF002":  # noclaim: the trigger's refusal
                self.w.log("rejected", op=op, phase=self._phase, fence=lease.fence, status=None,
                           code="lock_not_claimed", error=str(exc).splitlines()[0][:200])
                return False
            if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                self.close()  # the connection broke: committed or not, nobody knows
                self.w.log("unknown", op=op, phase=self._phase, fence=lease.fence, status=None,
                           code=type(exc).__name__, error=str(exc)[:200])
            else:  # a statement failed: the transaction rolled back
                self.w.log("rejected", op=op, phase=self._phase, fence=lease.fence, status=None,
                           code=getattr(exc, "sqlstate", None) or type(exc).__name__,
                           error=str(exc)[:200])
        except (LockClientError, OSError) as exc:
            self.close()
            self.w.log("unknown", op=op, phase=self._phase, fence=lease.fence,
                       status=getattr(exc, "status", None), code=type(exc).__name__,
                       error=str(exc)[:200])
        return False

    _phase = "read"

    def _think(self) -> None:
        self.sleep(self.w.rng.uniform(self.w.a.think_min, self.w.a.think_max))

    def _blind_start(self, op: str, lease: Any, what: str, **fields: Any) -> None:
        """Log ``blind`` (a freeze point before any claim), think, log ``write``."""
        self._phase = "write"
        self.w.log("blind", op=op, fence=lease.fence, via=what,
                   fences=dict(lease.fences))
        self._think()
        self.w.log("write", op=op, fence=lease.fence, via=what, sql=what, **fields)

    def _ack(self, op: str, lease: Any, what: str, rows: int) -> None:
        """A blind write committed (``via = sql``, ``mark``: the nemesis's ``pause_grant``
        thaws a frozen holder of one of ``fences`` right after it)."""
        self.w.log("ack", op=op, fence=lease.fence, via="sql", sql=what, mark=op, rows=rows,
                   fences=dict(lease.fences))

    def _rmw(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
             claimed: bool) -> None:
        self._phase = "read"
        amount = self.w.rng.randint(1, 50)
        self.sleep(self.w.rng.uniform(0.02, 0.06))  # setting up after the grant
        with self.transaction(op, lease) as conn:
            rows = conn.execute("SELECT id, balance FROM accounts WHERE id = ANY(%s)",
                                ([a, b],)).fetchall()
            reads = {int(i): int(v) for i, v in rows}
            self.w.log("read", op=op, fence=lease.fence, value=reads[a], fenced=claimed,
                       via="sql", balances={str(k): v for k, v in reads.items()})
            self._think()
            new = {a: reads[a] - amount, b: reads[b] + amount}
            self._phase = "write"
            self.w.log("write", op=op, fence=lease.fence, read=reads[a], wrote=new[a], via="sql",
                       sql="rmw", src=a, dst=b, amount=amount, claimed=claimed,
                       reads={str(k): v for k, v in reads.items()})
            for account in (a, b):
                conn.execute("UPDATE accounts SET balance = %s, op = %s, fence = %s, "
                             "read_balance = %s WHERE id = %s",
                             (new[account], op, fences[f"accounts/{account}"], reads[account],
                              account))
        self.w.log("ack", op=op, fence=lease.fence, read=reads[a], wrote=new[a],
                   fences=dict(lease.fences))

    def _blind(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
               claimed: bool) -> None:
        amount = self.w.rng.randint(1, 50)
        self._blind_start(op, lease, "blind", src=a, dst=b, amount=amount, claimed=claimed)
        with self.transaction(op, lease) as conn:
            cur = conn.execute(
                "UPDATE accounts SET balance = balance + CASE WHEN id = %(a)s THEN -%(n)s "
                "ELSE %(n)s END, read_balance = balance, op = %(op)s, "
                "fence = CASE WHEN id = %(a)s THEN %(fa)s ELSE %(fb)s END "
                "WHERE id IN (%(a)s, %(b)s)",
                {"a": a, "b": b, "n": amount, "op": op, "fa": fences[f"accounts/{a}"],
                 "fb": fences[f"accounts/{b}"]})
            rows = cur.rowcount
        self._ack(op, lease, "blind", rows)

    def _order(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
               claimed: bool) -> None:
        self._blind_start(op, lease, "order", account=a, claimed=claimed)
        with self.transaction(op, lease) as conn:
            conn.execute("INSERT INTO orders (account, id, op) VALUES (%s, %s, %s)", (a, op, op))
            conn.execute("INSERT INTO order_lines (owner, account, order_id, line, op, fence) "
                         "VALUES (%s, %s, %s, 1, %s, %s), (%s, %s, %s, 2, %s, %s)",
                         (a, a, op, op, fences[f"accounts/{a}"],
                          b, a, op, op, fences[f"accounts/{b}"]))
        self._ack(op, lease, "order", 3)

    def _touch(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
               claimed: bool) -> None:
        self._blind_start(op, lease, "touch", account=a, claimed=claimed)
        with self.transaction(op, lease) as conn:
            rows = conn.execute("UPDATE order_lines SET op = %s, fence = %s WHERE owner = %s",
                                (op, fences[f"accounts/{a}"], a)).rowcount
        self._ack(op, lease, "touch", rows)

    def _rehome(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
                claimed: bool) -> None:
        self._blind_start(op, lease, "rehome", account=a, claimed=claimed)
        with self.transaction(op, lease) as conn:
            rows = conn.execute("UPDATE order_lines SET owner = account, op = %s, fence = %s "
                                "WHERE account = %s AND owner <> account",
                                (op, fences[f"accounts/{a}"], a)).rowcount
        self._ack(op, lease, "rehome", rows)

    def _cancel(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
                claimed: bool) -> None:
        self._phase = "read"
        self.sleep(self.w.rng.uniform(0.02, 0.06))
        with self.transaction(op, lease) as conn:
            found = conn.execute(
                "SELECT o.id FROM orders o WHERE o.account = %(a)s AND NOT EXISTS (SELECT 1 "
                "FROM order_lines l WHERE l.account = o.account AND l.order_id = o.id AND "
                "l.owner NOT IN (%(a)s, %(b)s)) ORDER BY random() LIMIT 1",
                {"a": a, "b": b}).fetchone()
            if found is None:
                self.w.log("read", op=op, fence=lease.fence, value=0, fenced=claimed,
                           via="cancel", found=None)
                return
            self.w.log("read", op=op, fence=lease.fence, value=0, fenced=claimed,
                       via="cancel", found=found[0])
            self._think()
            self._phase = "write"
            self.w.log("write", op=op, fence=lease.fence, via="cancel", sql="cancel",
                       order=found[0], claimed=claimed)
            rows = conn.execute("DELETE FROM orders WHERE account = %s AND id = %s",
                                (a, found[0])).rowcount
        self._ack(op, lease, "cancel", rows)

    def _drop(self, op: str, lease: Any, fences: dict[str, int], a: int, b: int,
              claimed: bool) -> None:
        self._blind_start(op, lease, "drop", account=a, claimed=claimed)
        with self.transaction(op, lease) as conn:
            rows = conn.execute(
                "DELETE FROM orders WHERE (account, id) IN (SELECT account, id FROM orders "
                "WHERE account = %s ORDER BY random() LIMIT 1)", (a,)).rowcount
        self._ack(op, lease, "drop", rows)
