"""The checker of the ``sql`` workload: the transfer checker, plus the lock rule for every row.

Account updates (``kind = 'account'``) are transfers and go through ``check_transfers``
unchanged: money conserved, each account's committed writes chained (a write read what the
previous one left), no fence below one committed or honoured before, per account lock. Orders
and lines (``chaos.sqldb``'s kinds) and the near operations' rows (``chaos.near``) then answer
to the rule the database's triggers enforce, row by row in commit order (``chaos.rowlocks``:
``unclaimed_commit``, ``phantom``, ``rejected_committed``, ``fence_decrease``,
``stale_commit``); an account update by an operation that claimed nothing (the ``noclaim``
control) is an ``unclaimed_commit`` too.

The stats add ``sql_rows`` (order/line/near rows committed), ``sql_refused`` (writes the triggers
refused: ``rejected`` with ``code = lock_not_claimed``) and ``committed_writes`` (operations
with at least one committed row, of any kind).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chaos.checker import CheckResult, HistoryRow
from chaos.rowlocks import check_row_locks
from chaos.transfers import check_transfers

__all__ = ["SQL_ROW_KINDS", "check_sql"]

SQL_ROW_KINDS = ("order_ins", "order_del", "line_ins", "line_upd", "line_out", "line_del",
                 "near")


def check_sql(history: Sequence[HistoryRow], balances: Mapping[int, int],
              events: Iterable[Mapping[str, Any]], *, initial: int,
              ttl: float | None = None) -> CheckResult:
    """Check a ``sql`` run (see the module docstring); arguments as ``check_transfers``."""
    events = list(events)
    out = check_transfers([r for r in history if r.kind in ("account", "fence")], balances,
                          events, initial=initial, ttl=ttl)
    sql_rows = check_row_locks(history, events, SQL_ROW_KINDS, out.violations.append)
    committed = {r.op for r in history if r.kind == "account" or r.kind in SQL_ROW_KINDS}
    out.stats["sql_rows"] = sql_rows
    out.stats["sql_refused"] = sum(1 for e in events if e.get("ev") == "rejected"
                                   and e.get("code") == "lock_not_claimed")
    out.stats["committed_writes"] = len(committed)
    return out
