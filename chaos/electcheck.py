"""The checker of the ``election`` workload: one leader per term, terms never interleave.

Inputs: the ``history`` rows of ``kind = 'term'`` (one per committed entry of the ``terms``
log, by trigger, in commit order ``seq``: ``op`` = the entry id, ``fence`` = the term it was
written under), the ``fence`` rows of the election's lock, and the workers' logs (``acquired
{mode: leader}``: a candidate became leader with that fence; ``write {entry, term}`` then
``ack``/``stale``/``rejected``/``unknown`` naming the ``entry``).

======================  ==============================================================
``term_order``          an entry of term n committed after an entry of term n + 1 (in
                        commit order): two leaders' writes interleaved
``two_leaders``         entries of one term written by two operations (a new term reused
                        the fence)
``stale_commit``        an entry committed with a term below the highest the fence table
                        had committed for the election's lock before it, or sent after a
                        higher term had been honoured (an entry acknowledged or a leader's
                        fenced read answered)
``ack_mismatch``        a committed entry's term is not its leader's fence
``acked_missing``       an acknowledged entry is not in the history
``rejected_committed``  an entry answered 409 (or another refusal) committed anyway
``phantom``             a committed entry no leader sent
``fence_reused``        two campaigns won with one fence
``fence_order``         a campaign that began after another's win completed got a lower fence
``lease_overlap``       a leader elected while the previous leader's lease was provably
                        live (``chaos.checker._check_leases``): two leaders at once
======================  ==============================================================
"""

from __future__ import annotations

import bisect
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
from chaos.rwcheck import modes

__all__ = ["check_election"]


def _entries(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per entry id: ``op``, ``term``, ``sent`` (uptime), ``outcome``, ``acked``, ``status``."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        entry = e.get("entry")
        if not isinstance(entry, str):
            continue
        if e.get("ev") == "write":
            out[entry] = {"op": e.get("op"), "term": int(e["term"]), "sent": e.get("up"),
                          "outcome": "none"}
        elif entry in out and e.get("ev") in ("ack", "stale", "rejected", "unknown"):
            out[entry].update(outcome=e["ev"], status=e.get("status"),
                              acked=e.get("up") if e["ev"] == "ack" else None)
    return out


def _honoured(ops: Mapping[str, OpRecord], entries: Mapping[str, Mapping[str, Any]]
              ) -> tuple[list[float], list[tuple[float, int, str]]]:
    """Terms honoured by the proxy over time (acknowledged entries, leaders' fenced reads):
    their times, and the highest term honoured up to each."""
    items = [(float(e["acked"]), int(e["term"]), str(e["op"])) for e in entries.values()
             if isinstance(e.get("acked"), int | float)]
    items += [(float(r.read_up), int(r.fence), r.op) for r in ops.values()
              if r.fenced_read and isinstance(r.read_up, int | float) and r.fence is not None]
    items.sort()
    best: list[tuple[float, int, str]] = []
    for item in items:
        best.append(item if not best or item[1] > best[-1][1] else best[-1])
    return [i[0] for i in items], best


def check_election(history: Sequence[HistoryRow], events: Iterable[Mapping[str, Any]], *,
                   lock: str, ttl: float | None = None) -> CheckResult:
    """Check an ``election`` run (module docstring). ``lock``: the election's name (the lock of
    its leaders' tokens, as the fence table names it); ``ttl``: the lease TTL in seconds (None:
    no lease-exclusivity check)."""
    events = list(events)
    ops = collect_ops(events)
    leaders = {op for op, e in modes(events).items() if e.get("mode") == "leader"}
    entries = _entries(events)
    out = CheckResult()
    add = out.violations.append
    ordered = sorted(history, key=lambda r: (r.seq if r.seq is not None else r.id, r.id))
    ups, best = _honoured(ops, entries)

    top: HistoryRow | None = None
    high = 0
    writers: dict[int, set[str]] = defaultdict(set)
    blamed: set[str] = set()
    rows = 0
    for row in ordered:
        if row.kind == "fence" and row.op == lock:
            high = max(high, row.fence)
            continue
        if row.kind != "term":
            continue
        rows += 1
        entry = entries.get(row.op)
        if entry is None or entry["op"] not in leaders:
            add(Violation("phantom", f"term entry {row.op} (term {row.fence}) that no leader "
                                     "sent", row.op))
            continue
        op = str(entry["op"])
        writers[row.fence].add(op)
        if entry["term"] != row.fence or ops[op].fence != row.fence:
            add(Violation("ack_mismatch", f"entry {row.op} committed term {row.fence}, its "
                                          f"leader {op} had fence {ops[op].fence}", op))
        if top is not None and row.fence < top.fence:
            add(Violation("term_order", f"entry {row.op} of term {row.fence} committed (seq "
                                        f"{row.seq}) after entry {top.op} of term {top.fence}",
                          op))
        if top is None or row.fence > top.fence:
            top = row
        if entry["outcome"] in ("stale", "rejected"):
            add(Violation("rejected_committed", f"entry {row.op} answered {entry['outcome']} "
                                                f"({entry.get('status')}) committed", op))
        if op in blamed:
            continue
        if row.fence < high:
            blamed.add(op)
            add(Violation("stale_commit", f"entry {row.op} of term {row.fence} committed (seq "
                                          f"{row.seq}) after the fence table had recorded "
                                          f"highest {high} for {lock}", op))
            continue
        if isinstance(entry.get("sent"), int | float):
            i = bisect.bisect_left(ups, float(entry["sent"]) - UP_SLACK_S)
            if i and best[i - 1][1] > row.fence:
                up, term, by = best[i - 1]
                blamed.add(op)
                add(Violation("stale_commit", f"entry {row.op} of term {row.fence} sent at "
                                              f"{entry['sent']:.2f} committed, though {by} had "
                                              f"term {term} honoured at {up:.2f}", op))
    for term, ops_of_term in sorted(writers.items()):
        if len(ops_of_term) > 1:
            add(Violation("two_leaders", f"term {term} has entries of {sorted(ops_of_term)}",
                          sorted(ops_of_term)[-1]))

    committed = {r.op for r in history if r.kind == "term"}
    for entry_id, entry in entries.items():
        if entry["outcome"] == "ack" and entry_id not in committed:
            add(Violation("acked_missing", f"acknowledged entry {entry_id} is not in the history",
                          str(entry["op"])))

    seen: dict[int, OpRecord] = {}
    for op in sorted(leaders):
        rec = ops[op]
        other = seen.get(rec.fence or 0)
        if other is not None:
            add(Violation("fence_reused", f"fence {rec.fence} won by {other.op} and {rec.op}",
                          rec.op))
        else:
            seen[rec.fence or 0] = rec
    _check_grant_order(list(seen.values()), add)
    if ttl is not None:
        _check_leases(list(seen.values()), ttl, add)

    out.stats = _stats(ops, {str(entries[r.op]["op"]) for r in history
                             if r.kind == "term" and r.op in entries})
    out.stats.update(history_rows=rows, counter=len(committed), leaders=len(leaders),
                     terms_written=len(writers),
                     entries_acked=sum(e["outcome"] == "ack" for e in entries.values()),
                     entries_stale=sum(e["outcome"] == "stale" for e in entries.values()))
    return out
