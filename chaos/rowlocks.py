"""The lock rule, row by row: each committed row of an account lock was written by an operation
that held that lock (and claimed it), at a fence no lower than the lock's history before it.

Shared by the ``transfer`` checker (its blind multi-lock batches' ``amark`` rows) and the ``sql``
checker (orders and lines, ``chaos.sqldb``), and the near rows of every workload
(``chaos.near``). Every row of ``kinds`` names its account in ``worker`` (lock
``accounts/<worker>``; a ``near`` row names its whole lock there) and its operation in ``op``; the fence judged is the
operation's lease fence for that lock (from its ``acquired`` event), not a column the writer
filled in. Account updates (``kind = 'account'``) are judged by the transfer checker, and only
feed the per-lock fence order here. In commit order (``seq``):

=====================  ==============================================================
``unclaimed_commit``   a committed row of a lock its operation did not hold (a cascade or a
                       key-changing UPDATE into another account), or an operation that
                       claimed nothing (its ``write`` says ``claimed: false``) committed a row
``phantom``            a committed row no worker's ``write`` explains
``rejected_committed`` an operation answered ``stale``/``rejected`` at its write has rows
``fence_decrease``     a row committed with a fence below the last committed fence of the
                       same lock (account updates included)
``stale_commit``       a row committed with a fence below the highest the fence table had
                       committed for that lock before it (``fence`` rows)
=====================  ==============================================================
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chaos.checker import HistoryRow, Violation, collect_ops

__all__ = ["check_row_locks"]


def _leases(events: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[str, int]],
                                                          dict[str, bool]]:
    """Per op: its lease's fences (lock -> fence), and whether its write claimed."""
    fences: dict[str, dict[str, int]] = {}
    claimed: dict[str, bool] = {}
    for e in events:
        op = e.get("op")
        if not isinstance(op, str):
            continue
        if e.get("ev") == "acquired" and isinstance(e.get("fences"), dict):
            fences[op] = {str(k): int(v) for k, v in e["fences"].items()}
        elif e.get("ev") == "write":
            claimed[op] = bool(e.get("claimed", True))
    return fences, claimed


def check_row_locks(history: Sequence[HistoryRow], events: Sequence[Mapping[str, Any]],
                    kinds: tuple[str, ...], add: Callable[[Violation], None],
                    lock_prefix: str = "accounts/") -> int:
    """Judge every history row of ``kinds`` (see the module docstring); returns their count.
    ``lock_prefix``: a row's lock is the prefix + its ``worker`` (``sem/chaos/`` + a slot for
    the ``sem`` workload's ``smark`` rows)."""
    ops = collect_ops(events)
    leases, claimed = _leases(events)
    ordered = sorted(history, key=lambda r: (r.seq if r.seq is not None else r.id, r.id))
    high: dict[str, int] = defaultdict(int)
    last: dict[str, tuple[int, int]] = {}  # lock -> (fence, row id)
    blamed: set[tuple[str, str]] = set()
    count = 0
    for row in ordered:
        if row.kind == "fence":
            high[row.op] = max(high[row.op], row.fence)
            continue
        if row.kind != "account" and row.kind not in kinds:
            continue
        lock = row.worker if row.kind == "near" else f"{lock_prefix}{row.worker}"
        fences = leases.get(row.op, {})
        if row.kind == "account":
            if lock in fences and fences[lock] > last.get(lock, (0, 0))[0]:
                last[lock] = (fences[lock], row.id)
            if not claimed.get(row.op, True) and (row.op, lock) not in blamed:
                blamed.add((row.op, lock))
                add(Violation("unclaimed_commit", f"account {row.worker} updated by {row.op}, "
                                                  "which claimed nothing", row.op))
            continue
        count += 1
        rec = ops.get(row.op)
        if rec is None or rec.write is None:
            add(Violation("phantom", f"{row.kind} row {row.id} of {lock} matches no write a "
                                     "worker sent", row.op))
            continue
        if rec.phase == "write" and rec.outcome in ("stale", "rejected") \
                and (row.op, "answered") not in blamed:
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
                                            f"fence {fence} after row {prev[1]} with fence "
                                            f"{prev[0]}", row.op))
        elif fence < high[lock]:
            blamed.add((row.op, lock))
            add(Violation("stale_commit", f"{row.kind} row {row.id} of {lock} with fence "
                                          f"{fence} committed (seq {row.seq}) after the fence "
                                          f"table had recorded highest {high[lock]}", row.op))
        if prev is None or fence > prev[0]:
            last[lock] = (fence, row.id)
    return count
