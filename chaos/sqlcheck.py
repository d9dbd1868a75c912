"""The checker of the ``sql`` workload: the transfer checker, plus the lock rule for every row.

Account updates (``kind = 'account'``) are transfers and go through ``check_transfers``
unchanged: money conserved, each account's committed writes chained (a write read what the
previous one left), no fence below one committed or honoured before, per account lock. Orders
and lines (``chaos.sqldb``'s kinds) then answer to the rule the database's triggers enforce,
checked row by row in commit order (``seq``), per lock (``accounts/<worker>``):

=====================  ==============================================================
``unclaimed_commit``   a committed row of a lock its operation did not claim: the lock is
                       not in the lease (a cascade or a key-changing UPDATE into another
                       account), or the operation claimed nothing (``noclaim`` mode)
``phantom``            a committed order/line row no worker's ``write`` explains
``rejected_committed`` an operation answered ``stale``/``rejected`` at its write has rows
``fence_decrease``     a row committed with its lease's fence below the last committed fence
                       of the same lock (any kind, accounts included)
``stale_commit``       a row committed with its lease's fence below the highest
                       ``fencing.fences`` had committed for that lock before it
=====================  ==============================================================

The stats add ``sql_rows`` (order/line rows committed), ``sql_refused`` (writes the triggers
refused: ``rejected`` with ``code = lock_not_claimed``) and ``committed_writes`` (operations
with at least one committed row, of any kind).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chaos.checker import CheckResult, HistoryRow, Violation, collect_ops
from chaos.transfers import _transfer_fields, account_lock, check_transfers

__all__ = ["SQL_ROW_KINDS", "check_sql"]

SQL_ROW_KINDS = ("order_ins", "order_del", "line_ins", "line_upd", "line_out", "line_del")


def _claimed(events: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
    """Per op: whether its ``write`` says it ran inside ``fenced_transaction``."""
    return {e["op"]: bool(e.get("claimed", True)) for e in events
            if e.get("ev") == "write" and isinstance(e.get("op"), str)}


def check_sql(history: Sequence[HistoryRow], balances: Mapping[int, int],
              events: Iterable[Mapping[str, Any]], *, initial: int,
              ttl: float | None = None) -> CheckResult:
    """Check a ``sql`` run (see the module docstring); arguments as ``check_transfers``."""
    events = list(events)
    out = check_transfers([r for r in history if r.kind in ("account", "fence")], balances,
                          events, initial=initial, ttl=ttl)
    add = out.violations.append
    ops = collect_ops(events)
    fields = _transfer_fields(events)
    claimed = _claimed(events)
    ordered = sorted(history, key=lambda r: (r.seq if r.seq is not None else r.id, r.id))
    high: dict[str, int] = defaultdict(int)
    last: dict[str, tuple[int, HistoryRow]] = {}
    blamed: set[tuple[str, str]] = set()
    sql_rows = 0
    for row in ordered:
        if row.kind == "fence":
            high[row.op] = max(high[row.op], row.fence)
            continue
        if row.kind != "account" and row.kind not in SQL_ROW_KINDS:
            continue
        lock = account_lock(row.worker)
        rec = ops.get(row.op)
        fences = fields.get(row.op, {}).get("fences", {})
        if row.kind == "account":
            if lock in fences:
                last[lock] = max(last.get(lock, (0, row)), (fences[lock], row),
                                 key=lambda x: x[0])
            if not claimed.get(row.op, True) and (row.op, lock) not in blamed:
                blamed.add((row.op, lock))
                add(Violation("unclaimed_commit", f"account {row.worker} updated by {row.op}, "
                                                  "which claimed nothing", row.op))
            continue
        sql_rows += 1
        if rec is None or rec.write is None:
            add(Violation("phantom", f"{row.kind} row {row.id} of {lock} matches no write a "
                                     "worker sent", row.op))
            continue
        if rec.phase == "write" and rec.outcome in ("stale", "rejected"):
            if (row.op, "answered") not in blamed:
                blamed.add((row.op, "answered"))
                add(Violation("rejected_committed", f"{row.op} answered {rec.outcome} has "
                                                    f"{row.kind} row {row.id}", row.op))
        if (row.op, lock) in blamed:
            continue
        if not claimed.get(row.op, True) or lock not in fences:
            blamed.add((row.op, lock))
            why = ("claimed nothing" if not claimed.get(row.op, True)
                   else f"holds only {sorted(fences)}")
            add(Violation("unclaimed_commit", f"{row.kind} row {row.id} of {lock} committed "
                                              f"(seq {row.seq}) by {row.op}, which {why}",
                          row.op))
            continue
        fence = fences[lock]
        prev = last.get(lock)
        if prev is not None and fence < prev[0]:
            blamed.add((row.op, lock))
            add(Violation("fence_decrease", f"{row.kind} row {row.id} of {lock} committed "
                                            f"fence {fence} after row {prev[1].id} with fence "
                                            f"{prev[0]}", row.op))
        elif fence < high[lock]:
            blamed.add((row.op, lock))
            add(Violation("stale_commit", f"{row.kind} row {row.id} of {lock} with fence "
                                          f"{fence} committed (seq {row.seq}) after the database "
                                          f"had recorded highest {high[lock]}", row.op))
        if prev is None or fence > prev[0]:
            last[lock] = (fence, row)
    committed = {r.op for r in history if r.kind == "account" or r.kind in SQL_ROW_KINDS}
    out.stats["sql_rows"] = sql_rows
    out.stats["sql_refused"] = sum(1 for e in events if e.get("ev") == "rejected"
                                   and e.get("code") == "lock_not_claimed")
    out.stats["committed_writes"] = len(committed)
    return out
