"""The checker of the ``transfer`` workload: money is conserved, each transfer lands once.

Inputs: the ``history`` rows of ``kind = 'account'`` (one per update of an account row, written
by the database's trigger in the transaction of the write, stamped with the commit order
``seq``; ``worker`` is the account id, ``op`` the transfer id, ``read``/``wrote`` the balance
the transfer read and wrote), the proxy's ``fence`` rows (``op`` = the lock name), the final
balances, and the workers' logs (``workload``: ``acquired {fences}``, ``read``, ``write {src,
dst, amount, reads}``, then ``ack``/``stale``/``unknown``/``rejected`` or nothing if killed).

Violations (beside the lease checks of ``chaos.checker``, run per account lock:
``fence_reused``, ``fence_order``, ``lease_overlap``):

======================  ==============================================================
``not_conserved``       the final balances do not sum to accounts x the initial balance
``lost_update``         an account's final balance is not the last committed write's
``interleaving``        a committed write of an account read a balance other than the
                        previous committed write of that account left (a lost transfer)
``doubled_transfer``    one transfer id updated the same account twice
``partial_transfer``    a committed transfer updated only one of its two accounts (or an
                        account it did not name)
``bad_write``           a committed update is not the transfer's amount off the balance read
``fence_decrease``      per account lock, a committed fence is below the one committed before
``stale_commit``        per account lock, a write committed with a fence below one the proxy
                        had honoured (claimed, read or written) before the write was sent, or
                        below a highest the database had committed before the write committed
``acked_missing``       an acknowledged transfer is not (wholly) in the history
``rejected_committed``  a transfer answered 409 (or another refusal) committed anyway
``phantom``             a committed update no worker sent
``ack_mismatch``        a committed update carries a fence other than its lease's for that lock
======================  ==============================================================

Blind multi-lock batches (no claim, no read first) insert one ``amark`` row per account of
their lease; ``chaos.rowlocks`` holds them, and the near operations' rows (``chaos.near``:
``accounts/10`` beside ``accounts/1``, ``accounts/1/x``), to the lock rule (``unclaimed_commit``, ``phantom``,
``rejected_committed``, ``fence_decrease``, ``stale_commit`` per account lock, in commit order
with the account updates).

A transfer whose outcome was unknown (timeout, 503, killed) may have committed or not, but at
most once and whole: ``doubled_transfer`` and ``partial_transfer`` hold it to that.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chaos.checker import (
    UP_SLACK_S,
    CheckResult,
    HistoryRow,
    OpRecord,
    Violation,
    _check_grant_order,
    _check_leases,
    _stats,
    collect_ops,
)
from chaos.rowlocks import check_row_locks

__all__ = ["TRANSFER_VIOLATION_KINDS", "check_transfers", "account_lock"]

TRANSFER_VIOLATION_KINDS = (
    "not_conserved", "lost_update", "interleaving", "doubled_transfer", "partial_transfer",
    "bad_write", "fence_decrease", "stale_commit", "acked_missing", "rejected_committed",
    "phantom", "ack_mismatch", "fence_reused", "fence_order", "lease_overlap",
)


def account_lock(account: int | str) -> str:
    """The lock of an account row (the proxy's policy ``accounts/{key}``)."""
    return f"accounts/{account}"


def _transfer_fields(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per op: ``fences`` (lock -> fence) from ``acquired``, ``src``/``dst``/``amount`` from
    ``write``."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for e in events:
        op_id = e.get("op")
        if not isinstance(op_id, str):
            continue
        if e.get("ev") == "acquired" and isinstance(e.get("fences"), dict):
            out[op_id]["fences"] = {str(k): int(v) for k, v in e["fences"].items()}
        elif e.get("ev") == "write" and "src" in e:
            out[op_id].update(src=int(e["src"]), dst=int(e["dst"]), amount=int(e["amount"]))
    return out


def _per_lock(ops: Mapping[str, OpRecord],
              fields: Mapping[str, Mapping[str, Any]]) -> dict[str, list[OpRecord]]:
    """For each lock, the operations granted it, each as an ``OpRecord`` whose ``fence`` is
    its fence for that lock (so the single-lock checks apply per lock)."""
    out: dict[str, list[OpRecord]] = defaultdict(list)
    for rec in ops.values():
        for lock, fence in fields.get(rec.op, {}).get("fences", {}).items():
            out[lock].append(dataclasses.replace(rec, fence=fence, renewals=list(rec.renewals)))
    return out


def _check_stale(ordered: Sequence[HistoryRow], ops: Mapping[str, OpRecord],
                 fields: Mapping[str, Mapping[str, Any]], add) -> None:
    """``stale_commit`` per account lock, by the logs and by the database's commit order."""
    honoured: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for rec in ops.values():
        fences = fields.get(rec.op, {}).get("fences", {})
        for up in (rec.read_up if rec.fenced_read else None,
                   rec.acked_up if rec.write is not None else None):
            if isinstance(up, int | float):
                for lock, fence in fences.items():
                    honoured[lock].append((up, fence, rec.op))
    best_before: dict[str, tuple[list[float], list[tuple[float, int, str]]]] = {}
    for lock, items in honoured.items():
        items.sort()
        prefix: list[tuple[float, int, str]] = []
        for h in items:
            prefix.append(h if not prefix or h[1] > prefix[-1][1] else prefix[-1])
        best_before[lock] = ([h[0] for h in items], prefix)
    blamed: set[tuple[str, str]] = set()
    high: dict[str, int] = defaultdict(int)
    for row in ordered:
        if row.kind == "fence":
            high[row.op] = max(high[row.op], row.fence)
            continue
        if row.kind != "account":
            continue
        lock = account_lock(row.worker)
        rec = ops.get(row.op)
        if (row.op, lock) in blamed:
            continue
        if row.fence < high[lock]:
            blamed.add((row.op, lock))
            add(Violation("stale_commit", f"account {row.worker}: write with fence {row.fence} "
                                          f"committed (seq {row.seq}) after the database had "
                                          f"recorded highest {high[lock]} for {lock}", row.op))
            continue
        if rec is None or rec.write is None or not isinstance(rec.write.get("up"), int | float) \
                or lock not in best_before:
            continue
        ups, prefix = best_before[lock]
        i = bisect.bisect_left(ups, rec.write["up"] - UP_SLACK_S)
        if i and prefix[i - 1][1] > row.fence:
            best = prefix[i - 1]
            blamed.add((row.op, lock))
            add(Violation("stale_commit", f"account {row.worker}: write with fence {row.fence} "
                                          f"sent at uptime {rec.write['up']:.2f} committed, "
                                          f"though {best[2]} had fence {best[1]} of {lock} "
                                          f"honoured at {best[0]:.2f}", row.op))


def check_transfers(history: Sequence[HistoryRow], balances: Mapping[int, int],
                    events: Iterable[Mapping[str, Any]], *, initial: int,
                    ttl: float | None = None) -> CheckResult:
    """Check a ``transfer`` run (see the module docstring). ``balances``: every account's final
    balance (each started at ``initial``); ``ttl``: the lease TTL in seconds (None: no
    lease-exclusivity check)."""
    events = list(events)
    ordered = sorted(history, key=lambda r: (r.seq if r.seq is not None else r.id, r.id))
    rows = [r for r in ordered if r.kind == "account"]
    ops = collect_ops(events)
    fields = _transfer_fields(events)
    out = CheckResult()
    add = out.violations.append

    # 1. Money: the sum is conserved; each account's rows chain, fences never go down.
    total = sum(balances.values())
    if total != initial * len(balances):
        add(Violation("not_conserved", f"balances sum to {total}, not {initial * len(balances)} "
                                       f"({len(balances)} accounts x {initial})"))
    last: dict[str, HistoryRow] = {}
    for row in rows:
        prev = last.get(row.worker)
        expected = initial if prev is None else prev.wrote
        if row.read != expected:
            add(Violation("interleaving", f"account {row.worker}: row {row.id} (fence {row.fence})"
                                          f" read {row.read} but the previous committed write "
                                          f"left {expected}", row.op))
        if prev is not None and row.fence < prev.fence:
            add(Violation("fence_decrease", f"account {row.worker}: row {row.id} committed fence "
                                            f"{row.fence} after row {prev.id} with fence "
                                            f"{prev.fence}", row.op))
        last[row.worker] = row
    for account, balance in sorted(balances.items()):
        prev = last.get(str(account))
        expected = initial if prev is None else prev.wrote
        if balance != expected:
            add(Violation("lost_update", f"account {account} holds {balance}, but its last "
                                         f"committed write left {expected}"))

    # 2. Each committed transfer: sent by a worker, applied once, whole, by its amount.
    by_op: dict[str, list[HistoryRow]] = defaultdict(list)
    for row in rows:
        by_op[row.op].append(row)
    applied: set[str] = set()
    for op_id, op_rows in by_op.items():
        rec, info = ops.get(op_id), fields.get(op_id, {})
        if rec is None or rec.write is None or "src" not in info:
            add(Violation("phantom", f"{len(op_rows)} account update(s) of transfer {op_id!r} "
                                     "that no worker sent", op_id))
            continue
        accounts = [int(r.worker) for r in op_rows]
        if len(set(accounts)) != len(accounts):
            add(Violation("doubled_transfer", f"transfer {op_id} updated accounts {accounts}",
                          op_id))
        if sorted(set(accounts)) != sorted({info["src"], info["dst"]}):
            add(Violation("partial_transfer", f"transfer {op_id} of {info['amount']} from "
                                              f"{info['src']} to {info['dst']} updated only "
                                              f"{sorted(set(accounts))}", op_id))
        else:
            applied.add(op_id)
        for r in op_rows:
            want = -info["amount"] if int(r.worker) == info["src"] else info["amount"]
            if r.wrote - r.read != want:
                add(Violation("bad_write", f"transfer {op_id}: account {r.worker} read {r.read} "
                                           f"and wrote {r.wrote}, not {want:+d}", op_id))
            fence = info.get("fences", {}).get(account_lock(r.worker))
            if fence is not None and fence != r.fence:
                add(Violation("ack_mismatch", f"transfer {op_id}: account {r.worker} has fence "
                                              f"{r.fence}, the lease's was {fence}", op_id))

    # 3. Acknowledged transfers are there whole, refused ones are not there at all.
    for rec in ops.values():
        if rec.write is None:
            continue
        if rec.outcome == "ack" and "src" in fields.get(rec.op, {}) and rec.op not in applied:
            add(Violation("acked_missing", f"acknowledged transfer {rec.op} is not wholly in the "
                                           "history", rec.op))
        elif rec.op in by_op and rec.phase == "write" and rec.outcome in ("stale", "rejected"):
            add(Violation("rejected_committed", f"transfer answered {rec.outcome} (status "
                                                f"{rec.status}) committed", rec.op))

    # 4. Per account lock: the fence held across commits, and leases were exclusive.
    _check_stale(ordered, ops, fields, add)
    for _lock, grants in sorted(_per_lock(ops, fields).items()):
        seen: dict[int, OpRecord] = {}
        for rec in grants:
            other = seen.get(rec.fence or 0)
            if other is not None:
                add(Violation("fence_reused", f"fence {rec.fence} of {_lock} granted to "
                                              f"{other.op} and {rec.op}", rec.op))
            else:
                seen[rec.fence or 0] = rec
        _check_grant_order(list(seen.values()), add)
        if ttl is not None:
            _check_leases(list(seen.values()), ttl, add)

    # 5. The blind multi-lock batches' marks: each under a lock its batch held, fences in order.
    marks = check_row_locks(history, events, ("amark", "near"), add)

    out.stats = _stats(ops, set(by_op))
    out.stats["transfers_committed"] = len(applied)
    out.stats["account_marks"] = marks
    out.stats["history_rows"] = len(rows)
    out.stats["counter"] = total
    return out
