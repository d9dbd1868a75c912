"""The checkers of the ``rw`` workload (shared locks) and the ``sem`` workload (semaphores).

``check_rw``: the writers' operations (exclusive leases of the counter's lock) go through the
``counter`` checker unchanged (``chaos.checker.check``: fences, stale commits, chained
increments, lease exclusivity among writers). The readers' operations (``acquired {mode:
shared}``; their fence is the lock's write epoch) add:

======================  ==============================================================
``shared_write``        a write under a shared token committed (a history row of a
                        reader's operation), was acknowledged, or was answered anything
                        but 403 ``shared_token`` (a 409 means it reached the fence check)
``lease_overlap``       a shared grant while an exclusive lease was provably live (the
                        last exclusive grant at or below the reader's epoch), or an exclusive
                        grant while a shared lease of an older epoch was provably live
``stale_read``          a reader's fenced read was allowed although, before it was sent, a
                        write with a higher fence than its epoch had been acknowledged or a
                        fenced read of a writer honoured; or it returned a counter older than
                        a write acknowledged before it was sent
``phantom_read``        a read returned a counter value no committed write left
``fence_order``         a shared grant asked for after an exclusive grant had completed
                        carries an older epoch
``lapsed_write``        a writer's write with fence f was sent after a reader's fenced
                        read under epoch e >= f had been answered, and committed: the
                        writer's lease had ended before the reader's grant (exclusive
                        grants raise the fence, and the modes exclude each other), so a
                        reader that holds the lock shared saw its data change under it
======================  ==============================================================

``lapsed_write`` is the rule for a writer that froze past its lease while readers took the
lock: a shared grant after an exclusive lease that ended without a clean release starts a new
epoch, and a reader's fenced read raises the highest to it, so the lapsed writer's fence is
below every later reader's epoch and its write is refused. After a clean release the epoch
stays, but the writer released after its last write, so nothing of it is sent after a read.

Lease windows are judged as in ``chaos.checker`` (``_check_leases``): a lease is provably live
until its attempt's or its last renewal's send time + TTL, cut at its release's send time, and
a grant happened at the latest when its ``acquired`` line was logged (``LEASE_SLACK_S``).

``check_sem``: permits (``acquired {mode: permit, slot, limit}``):

======================  ==============================================================
``sem_overflow``        a permit granted while ``limit`` permits granted before it (lower
                        fences) were provably live: limit + 1 holders
``fence_reused``        two permits with one fence (fences strictly increase per semaphore)
``fence_order``         a permit asked for after another's grant completed has a lower fence
``lease_overlap``       one slot granted while its previous holder was provably live
``acked_missing``       an acknowledged slot mark is not in the history
======================  ==============================================================

and each slot mark row answers to the lock rule of its slot's lock (``chaos.rowlocks``:
``phantom``, ``rejected_committed``, ``unclaimed_commit``, ``fence_decrease``,
``stale_commit``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chaos.checker import (
    LEASE_SLACK_S,
    UP_SLACK_S,
    CheckResult,
    HistoryRow,
    OpRecord,
    Violation,
    _check_grant_order,
    _check_leases,
    _deleters,
    _stats,
    check,
    collect_ops,
)
from chaos.rowlocks import check_row_locks

__all__ = ["check_rw", "check_sem", "lease_end", "modes"]


def modes(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per operation: its ``acquired`` event (``mode``, ``slot``, ``limit``, ...)."""
    return {e["op"]: dict(e) for e in events
            if e.get("ev") == "acquired" and isinstance(e.get("op"), str)}


def lease_end(rec: OpRecord, ttl: float) -> float | None:
    """Until when ``rec``'s lease was provably live (None: nothing to go by)."""
    starts = [rec.attempt_up] if isinstance(rec.attempt_up, int | float) else []
    end = max(starts + rec.renewals, default=None)
    if end is None:
        return None
    end += ttl
    if isinstance(rec.release_up, int | float):
        end = min(end, rec.release_up)
    return end


def _prefix_max(items: list[tuple[float, int, str]]) -> tuple[list[float], list[tuple[float, int, str]]]:
    """``items`` sorted by time, and for each position the item with the highest value so far."""
    items.sort()
    best: list[tuple[float, int, str]] = []
    for item in items:
        best.append(item if not best or item[1] > best[-1][1] else best[-1])
    return [i[0] for i in items], best


def _shared_writes(readers: set[str], events: Sequence[Mapping[str, Any]],
                   history: Sequence[HistoryRow], add) -> int:
    """``shared_write``; returns the refused attempts (403 ``shared_token``)."""
    committed = {r.op for r in history if r.kind in ("counter", "mark_ins", "mark_del")}
    for op in sorted(readers & committed):
        add(Violation("shared_write", f"{op} held the lock shared and its write committed", op))
    refused = 0
    writing: set[str] = set()
    for e in events:
        op = e.get("op")
        if op not in readers:
            continue
        if e.get("ev") == "write":
            writing.add(op)
        elif op in writing and e.get("ev") in ("ack", "stale", "rejected"):
            if e.get("ev") == "rejected" and e.get("status") == 403 \
                    and e.get("code") == "shared_token":
                refused += 1
            else:
                add(Violation("shared_write", f"a write under {op}'s shared token was answered "
                                              f"{e.get('ev')} ({e.get('status')} "
                                              f"{e.get('code')}), not 403 shared_token", op))
    return refused


def _overlaps(ops: Mapping[str, OpRecord], readers: set[str], ttl: float, add) -> None:
    """``lease_overlap`` between modes (the module docstring)."""
    exclusive = {r.fence: r for r in ops.values()
                 if r.op not in readers and r.fence is not None}
    fences = sorted(exclusive)
    shared = sorted((r for r in ops.values() if r.op in readers and r.fence is not None),
                    key=lambda r: r.fence or 0)
    for r in shared:
        # the last exclusive grant before the reader's: its fence is the epoch, or one below
        # when the shared grant started a new epoch after that lease ended uncleanly
        i = bisect.bisect_right(fences, r.fence or 0)
        holder = exclusive[fences[i - 1]] if i else None
        end = lease_end(holder, ttl) if holder is not None else None
        if end is not None and isinstance(r.granted_up, int | float) \
                and r.granted_up + LEASE_SLACK_S < end:
            add(Violation("lease_overlap", f"shared grant of epoch {r.fence} by uptime "
                                           f"{r.granted_up:.2f}, while {holder.op} held it "
                                           f"exclusive (fence {holder.fence}) until at least "
                                           f"{end:.2f}", r.op))
    ends = [(r.fence or 0, lease_end(r, ttl), r.op) for r in shared]
    for w in sorted(exclusive.values(), key=lambda r: r.fence or 0):
        if not isinstance(w.granted_up, int | float):
            continue
        live = [(end, op) for epoch, end, op in ends if epoch < (w.fence or 0) and end is not None]
        if not live:
            continue
        end, op = max(live)
        if w.granted_up + LEASE_SLACK_S < end:
            add(Violation("lease_overlap", f"exclusive grant of fence {w.fence} by uptime "
                                           f"{w.granted_up:.2f}, while {op} held it shared "
                                           f"until at least {end:.2f}", w.op))


def _reads(ops: Mapping[str, OpRecord], readers: set[str], events: Sequence[Mapping[str, Any]],
           history: Sequence[HistoryRow], add) -> dict[str, int]:
    """``stale_read``, ``phantom_read``, ``fence_order`` of the readers; returns counts."""
    fences: list[tuple[float, int, str]] = []
    values: list[tuple[float, int, str]] = []
    for r in ops.values():
        if r.op in readers:
            continue
        if r.fenced_read and isinstance(r.read_up, int | float) and r.fence is not None:
            fences.append((r.read_up, r.fence, r.op))
        if r.write is not None and isinstance(r.acked_up, int | float):
            fences.append((r.acked_up, int(r.write["fence"]), r.op))
            if "wrote" in r.write:
                values.append((r.acked_up, int(r.write["wrote"]), r.op))
    f_ups, f_best = _prefix_max(fences)
    v_ups, v_best = _prefix_max(values)
    committed = {0} | {r.wrote for r in history if r.kind == "counter"}
    allowed = 0
    for e in events:
        if e.get("ev") != "observe" or e.get("op") not in readers:
            continue
        allowed += 1
        op, epoch, value, sent = e["op"], int(e["fence"]), int(e["value"]), float(e["sent"])
        i = bisect.bisect_left(f_ups, sent - UP_SLACK_S)
        if i and f_best[i - 1][1] > epoch:
            up, fence, by = f_best[i - 1]
            add(Violation("stale_read", f"{op}'s read with epoch {epoch} sent at {sent:.2f} was "
                                        f"allowed, though {by} had fence {fence} honoured at "
                                        f"{up:.2f}", op))
        j = bisect.bisect_left(v_ups, sent - UP_SLACK_S)
        if j and v_best[j - 1][1] > value:
            up, wrote, by = v_best[j - 1]
            add(Violation("stale_read", f"{op} read counter {value} (sent at {sent:.2f}), though "
                                        f"{by}'s write of {wrote} was acknowledged at {up:.2f}",
                          op))
        if value not in committed:
            add(Violation("phantom_read", f"{op} read counter {value}, which no committed write "
                                          "left", op))
    grants = sorted((r.granted_up, r.fence or 0, r.op) for r in ops.values()
                    if r.op not in readers and isinstance(r.granted_up, int | float))
    g_ups, g_best = _prefix_max(grants)
    for op in readers:
        r = ops[op]
        if r.fence is None or not isinstance(r.attempt_up, int | float):
            continue
        i = bisect.bisect_left(g_ups, r.attempt_up - UP_SLACK_S)
        if i and g_best[i - 1][1] > r.fence:
            up, fence, by = g_best[i - 1]
            add(Violation("fence_order", f"{op} asked at {r.attempt_up:.2f} and was granted "
                                         f"epoch {r.fence}, though {by} had been granted fence "
                                         f"{fence} at {up:.2f}", op))
    stale = sum(1 for op in readers if ops[op].outcome == "stale" and ops[op].phase == "read")
    return {"reads_allowed": allowed, "reads_stale": stale}


def _lapsed_writes(ops: Mapping[str, OpRecord], readers: set[str],
                   events: Sequence[Mapping[str, Any]], history: Sequence[HistoryRow],
                   add) -> None:
    """``lapsed_write`` (module docstring), blaming the writer once."""
    reads = [(float(e["up"]), int(e["fence"]), str(e["op"])) for e in events
             if e.get("ev") == "observe" and e.get("op") in readers
             and isinstance(e.get("up"), int | float)]
    ups, best = _prefix_max(reads)
    writers = {op: r for op, r in ops.items() if op not in readers}
    deleters = _deleters(writers)
    committed = {r.op for r in history if r.kind in ("counter", "mark_ins")}
    committed |= {deleters[r.op].op for r in history
                  if r.kind == "mark_del" and r.op in deleters}
    for op in sorted(committed):
        rec = writers.get(op)
        if rec is None or rec.write is None or not isinstance(rec.write.get("up"), int | float):
            continue
        sent, fence = float(rec.write["up"]), int(rec.write["fence"])
        i = bisect.bisect_left(ups, sent - UP_SLACK_S)
        if i and best[i - 1][1] >= fence:
            up, epoch, by = best[i - 1]
            add(Violation("lapsed_write", f"{op}'s write with fence {fence} sent at {sent:.2f} "
                                          f"committed, though {by}'s fenced read under epoch "
                                          f"{epoch} was answered at {up:.2f}", op))


def check_rw(history: Sequence[HistoryRow], counter: int, events: Iterable[Mapping[str, Any]],
             *, ttl: float | None = None) -> CheckResult:
    """Check an ``rw`` run (module docstring); arguments as ``chaos.checker.check``."""
    events = list(events)
    readers = {op for op, e in modes(events).items() if e.get("mode") == "shared"}
    ops = collect_ops(events)
    epochs: dict[int, float] = {}
    for op in readers:
        r = ops[op]
        if r.fence is not None and isinstance(r.granted_up, int | float):
            epochs[r.fence] = min(epochs.get(r.fence, r.granted_up), r.granted_up)
    out = check(history, counter, [e for e in events if e.get("op") not in readers], ttl=ttl,
                epochs=epochs)
    add = out.violations.append
    refused = _shared_writes(readers, events, history, add)
    if ttl is not None:
        _overlaps(ops, readers, ttl, add)
    out.stats.update(_reads(ops, readers, events, history, add))
    _lapsed_writes(ops, readers, events, history, add)
    out.stats["readers"] = len(readers)
    out.stats["shared_writes_refused"] = refused
    return out


def check_sem(history: Sequence[HistoryRow], events: Iterable[Mapping[str, Any]], *,
              ttl: float | None = None, lock_prefix: str = "sem/chaos/") -> CheckResult:
    """Check a ``sem`` run (module docstring); ``lock_prefix``: the slot locks' prefix."""
    events = list(events)
    acquired = {op: e for op, e in modes(events).items() if e.get("mode") == "permit"}
    ops = collect_ops(events)
    out = CheckResult()
    add = out.violations.append
    permits = [ops[op] for op in acquired if ops[op].fence is not None]
    seen: dict[int, OpRecord] = {}
    for rec in permits:
        other = seen.get(rec.fence or 0)
        if other is not None:
            add(Violation("fence_reused", f"permit fence {rec.fence} granted to {other.op} and "
                                          f"{rec.op}", rec.op))
        else:
            seen[rec.fence or 0] = rec
    _check_grant_order(list(seen.values()), add)
    if ttl is not None:
        ordered = sorted(seen.values(), key=lambda r: r.fence or 0)
        ends = [(r, lease_end(r, ttl)) for r in ordered]
        for n, rec in enumerate(ordered):
            limit = int(acquired[rec.op].get("limit") or 0)
            if not limit or not isinstance(rec.granted_up, int | float):
                continue
            live = [q.op for q, end in ends[:n]
                    if end is not None and rec.granted_up + LEASE_SLACK_S < end]
            if len(live) >= limit:
                add(Violation("sem_overflow", f"permit {rec.fence} granted by uptime "
                                              f"{rec.granted_up:.2f} while {len(live)} permits "
                                              f"(limit {limit}) were live: {live}", rec.op))
        slots: dict[int, list[OpRecord]] = defaultdict(list)
        for rec in ordered:
            slots[int(acquired[rec.op].get("slot", -1))].append(rec)
        for recs in slots.values():
            _check_leases(recs, ttl, add)
    marks = check_row_locks(history, events, ("smark",), add, lock_prefix=lock_prefix)
    committed = {r.op for r in history if r.kind == "smark"}
    for rec in ops.values():
        if rec.outcome == "ack" and rec.write is not None and rec.op not in committed:
            add(Violation("acked_missing", f"acknowledged slot mark of {rec.op} is not in the "
                                           "history", rec.op))
    out.stats = _stats(ops, committed)
    out.stats.update(history_rows=marks, counter=len(permits), permits=len(permits))
    return out
