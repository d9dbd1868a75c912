"""The history checker: the final database and the workers' own logs in, violations out.

Inputs:

- ``history``: the protected ``history`` table in id order. Each committed increment inserted one
  row ``(op, worker, fence, read_value, wrote_value)`` in the same transaction as its counter
  write, so the table is the truth of *what committed*.
- ``counter``: the final counter value (it started at ``initial``).
- ``events``: every worker's JSON lines (``workload`` writes them): ``attempt``, ``acquired``
  (fence), ``read``, ``write`` (sent), then one outcome: ``ack``, ``stale`` (a 409 with
  ``presented``/``highest``), ``unknown`` (timeout, 503, connection error: it may or may not have
  committed), ``rejected`` (any other definite refusal). A worker killed mid-operation leaves
  no outcome: if its ``write`` was logged, the outcome is unknown.

Why history id order is commit order (for one lock, which is all the workload uses): the proxy's
fence upsert (PostgreSQL) takes the lock's fence row lock *before* the history insert draws its
id from the sequence, and holds it until COMMIT. Two writers of the lock are therefore serialized:
the second cannot draw an id before the first committed or rolled back, so among committed rows
a larger id committed later (rolled-back ids only leave gaps). SQLite allows one writer at a time
(``BEGIN IMMEDIATE``) and AUTOINCREMENT ids only grow, so the same holds. The ``nofence`` control
writes ``UPDATE counter`` first, whose row lock plays the same role.

Violations (``Violation.kind``):

=====================  ===============================================================
``fence_decrease``     a committed fence is lower than the one committed before it
``lost_update``        final counter != initial + number of committed increments
``interleaving``       a committed write read a value other than the previous write's
``bad_write``          a committed row did not write read + 1
``acked_missing``      an acknowledged write is not in the history (invariant 5)
``ack_mismatch``       an acknowledged write is in the history with other values
``rejected_committed`` a write answered 409 (or another definite refusal) committed anyway
``phantom``            a history row no worker sent (no such op, or no ``write`` logged)
``bogus_stale``        a 409 whose ``presented`` is not below ``highest``, is not the
                       lease's fence, or whose ``highest`` no worker had been granted by then
``fence_reused``       two operations were granted the same fence (invariant 1)
``fence_order``        an operation that started asking after another's grant had
                       completed got a lower fence (invariant 1, in real time)
=====================  ===============================================================

What a 409 can be checked against: ``highest`` is not always a *committed* fence, since a claim
(fenced read) raises it without writing, so "highest <= the max fence committed so far" does not
hold by design. What must hold is that some worker was granted ``highest`` before the 409 was
answered: workers log ``acquired`` before they send the claim, and stamp each event with the
machine's real uptime (``/proc/uptime``, which libfaketime does not fake; 10 ms resolution).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "HistoryRow",
    "Violation",
    "OpRecord",
    "CheckResult",
    "VIOLATION_KINDS",
    "UP_SLACK_S",
    "load_events",
    "collect_ops",
    "check",
]

VIOLATION_KINDS = (
    "fence_decrease",
    "lost_update",
    "interleaving",
    "bad_write",
    "acked_missing",
    "ack_mismatch",
    "rejected_committed",
    "phantom",
    "bogus_stale",
    "fence_reused",
    "fence_order",
)

UP_SLACK_S = 0.02
"""Tolerance of the uptime comparison: two readings of ``/proc/uptime`` 10 ms apart may tie."""

_OUTCOMES = ("ack", "stale", "unknown", "rejected", "not_acquired")


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One committed increment, as the ``history`` table holds it."""

    id: int
    op: str
    worker: str
    fence: int
    read: int
    wrote: int


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str
    op: str | None = None


@dataclass(slots=True)
class OpRecord:
    """What one worker's log says about one operation (one loop iteration)."""

    op: str
    worker: str = ""
    fence: int | None = None
    """The fence lockd granted for this operation (``acquired``)."""
    granted_up: float | None = None
    attempt_up: float | None = None
    read: int | None = None
    write: dict[str, int] | None = None
    """``{fence, read, wrote}`` of the write, once it was sent."""
    outcome: str = "none"
    """``ack``/``stale``/``unknown``/``rejected``/``not_acquired``, or ``none`` (interrupted)."""
    phase: str | None = None
    """Where the outcome happened: ``acquire``, ``read`` or ``write``."""
    stale: dict[str, Any] | None = None
    status: int | None = None

    @property
    def write_outcome_unknown(self) -> bool:
        """A write was sent and nobody knows whether it committed."""
        if self.write is None:
            return False
        return self.outcome == "none" or (self.outcome == "unknown" and self.phase == "write")


@dataclass(slots=True)
class CheckResult:
    violations: list[Violation] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        """Violations by kind."""
        return dict(Counter(v.kind for v in self.violations))

    def as_dict(self, limit: int = 200) -> dict[str, Any]:
        """JSON-ready: counts, stats and at most ``limit`` violations in full."""
        return {"violation_count": len(self.violations), "violations_by_kind": self.counts(),
                "stats": dict(self.stats),
                "violations": [asdict(v) for v in self.violations[:limit]]}


def load_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every event of every worker log. A torn last line (a worker killed mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    events.append(event)
    return events


def collect_ops(events: Iterable[Mapping[str, Any]]) -> dict[str, OpRecord]:
    """Fold the events of each operation (by ``op`` id) into an ``OpRecord``."""
    ops: dict[str, OpRecord] = {}
    for e in events:
        op_id = e.get("op")
        kind = e.get("ev")
        if not isinstance(op_id, str) or not isinstance(kind, str):
            continue
        rec = ops.get(op_id)
        if rec is None:
            rec = ops[op_id] = OpRecord(op=op_id, worker=str(e.get("w", "")))
        if kind == "attempt":
            rec.attempt_up = e.get("up")
        elif kind == "acquired":
            rec.fence = int(e["fence"])
            rec.granted_up = e.get("up")
        elif kind == "read":
            rec.read = int(e["value"])
        elif kind == "write":
            rec.write = {"fence": int(e["fence"]), "read": int(e["read"]), "wrote": int(e["wrote"])}
        elif kind in _OUTCOMES:
            rec.outcome = kind
            rec.phase = e.get("phase") or ("write" if kind == "ack" else None)
            rec.status = e.get("status")
            if kind == "stale":
                rec.stale = {"presented": e.get("presented"), "highest": e.get("highest"),
                             "up": e.get("up")}
    return ops


def _stats(ops: Mapping[str, OpRecord], committed: set[str]) -> dict[str, int]:
    unknown = [r for r in ops.values() if r.write_outcome_unknown]
    return {
        "attempted": len(ops),
        "acquired": sum(r.fence is not None for r in ops.values()),
        "acknowledged": sum(r.outcome == "ack" for r in ops.values()),
        "stale": sum(r.outcome == "stale" for r in ops.values()),
        "stale_at_read": sum(r.outcome == "stale" and r.phase == "read" for r in ops.values()),
        "stale_at_write": sum(r.outcome == "stale" and r.phase == "write" for r in ops.values()),
        "unknown": len(unknown),
        "unknown_committed": sum(r.op in committed for r in unknown),
        # a 503 promises "nothing was written"; a committed one is reported (not a violation:
        # a connection lost during COMMIT leaves the proxy itself unable to know)
        "unavailable_but_committed": sum(r.op in committed and r.status == 503 for r in unknown),
        "not_acquired": sum(r.outcome == "not_acquired" for r in ops.values()),
        "failed_before_write": sum(r.write is None and r.outcome in ("unknown", "rejected")
                                   for r in ops.values()),
        "rejected": sum(r.outcome == "rejected" and r.phase == "write" for r in ops.values()),
        "interrupted": sum(r.outcome == "none" for r in ops.values()),
    }


def _check_grant_order(grants: list[OpRecord], add) -> None:
    """A grant that completed before another operation even asked must carry a lower fence."""
    done = sorted((r.granted_up, r.fence, r.op) for r in grants
                  if isinstance(r.granted_up, int | float))
    asks = sorted((r.attempt_up, r.fence, r.op) for r in grants
                  if isinstance(r.attempt_up, int | float))
    best: tuple[int, str] | None = None
    j = 0
    for asked, fence, op_id in asks:
        while j < len(done) and done[j][0] + UP_SLACK_S < asked:
            if best is None or done[j][1] > best[0]:
                best = (done[j][1], done[j][2])
            j += 1
        if best is not None and fence <= best[0]:
            add(Violation("fence_order", f"granted fence {fence} after asking at uptime "
                                         f"{asked:.2f}, when {best[1]} already held fence "
                                         f"{best[0]}", op_id))


def check(history: Sequence[HistoryRow], counter: int, events: Iterable[Mapping[str, Any]], *,
          initial: int = 0) -> CheckResult:
    """Check the run; see the module docstring for what each violation means."""
    rows = sorted(history, key=lambda r: r.id)
    ops = collect_ops(events)
    out = CheckResult()
    add = out.violations.append

    # 1. Commit order: fences never decrease; each write read its predecessor's value.
    prev: HistoryRow | None = None
    for row in rows:
        if prev is not None and row.fence < prev.fence:
            add(Violation("fence_decrease", f"row {row.id} committed fence {row.fence} after "
                                            f"row {prev.id} with fence {prev.fence}", row.op))
        expected = initial if prev is None else prev.wrote
        if row.read != expected:
            add(Violation("interleaving", f"row {row.id} (fence {row.fence}) read {row.read} but "
                                          f"the previous committed write left {expected}", row.op))
        if row.wrote != row.read + 1:
            add(Violation("bad_write", f"row {row.id} read {row.read} and wrote {row.wrote}",
                          row.op))
        prev = row

    # 2. No lost update: the counter counts every committed increment.
    if counter != initial + len(rows):
        add(Violation("lost_update", f"counter is {counter} but {len(rows)} increments committed "
                                     f"(from {initial}): {initial + len(rows) - counter} lost"))

    # 3. Acknowledged writes are there, rejected ones are not, and nothing else is.
    by_op = {row.op: row for row in rows}
    for rec in ops.values():
        row = by_op.get(rec.op)
        if rec.outcome == "ack":
            if row is None:
                add(Violation("acked_missing", f"acknowledged write (fence {rec.fence}) is not "
                                               "in the history", rec.op))
            elif rec.write and (row.fence, row.read, row.wrote) != (
                    rec.write["fence"], rec.write["read"], rec.write["wrote"]):
                add(Violation("ack_mismatch", f"acknowledged {rec.write}, history has fence "
                                              f"{row.fence} read {row.read} wrote {row.wrote}",
                              rec.op))
        elif row is not None and rec.phase == "write" and rec.outcome in ("stale", "rejected"):
            add(Violation("rejected_committed", f"write answered {rec.outcome} "
                                                f"(status {rec.status}) is in the history as row "
                                                f"{row.id}", rec.op))
    for row in rows:
        rec = ops.get(row.op)
        if rec is None or rec.write is None:
            add(Violation("phantom", f"history row {row.id} (fence {row.fence}) matches no write "
                                     "a worker sent", row.op))
        elif rec.fence is not None and rec.fence != row.fence:
            add(Violation("ack_mismatch", f"row {row.id} has fence {row.fence}, the operation "
                                          f"was granted {rec.fence}", row.op))

    # 4. Fences are granted once; every 409 names a fence someone really holds.
    granted: dict[int, OpRecord] = {}
    for rec in ops.values():
        if rec.fence is None:
            continue
        other = granted.get(rec.fence)
        if other is not None:
            add(Violation("fence_reused", f"fence {rec.fence} granted to {other.op} and {rec.op}",
                          rec.op))
        else:
            granted[rec.fence] = rec
    _check_grant_order(list(granted.values()), add)
    for rec in ops.values():
        if rec.outcome != "stale" or rec.stale is None:
            continue
        presented, highest = rec.stale.get("presented"), rec.stale.get("highest")
        problem = None
        if not isinstance(presented, int) or not isinstance(highest, int):
            problem = f"409 without integer presented/highest: {rec.stale}"
        elif presented >= highest:
            problem = f"409 with presented {presented} >= highest {highest}"
        elif rec.fence is not None and presented != rec.fence:
            problem = f"409 presented {presented}, but the lease's fence was {rec.fence}"
        elif highest not in granted:
            problem = f"409 names highest {highest}, a fence no worker was granted"
        else:
            g_up, s_up = granted[highest].granted_up, rec.stale.get("up")
            if isinstance(g_up, int | float) and isinstance(s_up, int | float) \
                    and g_up > s_up + UP_SLACK_S:
                problem = (f"409 at uptime {s_up:.2f} names highest {highest}, granted only "
                           f"at {g_up:.2f}")
        if problem:
            add(Violation("bogus_stale", problem, rec.op))

    out.stats = _stats(ops, set(by_op))
    out.stats["history_rows"] = len(rows)
    out.stats["counter"] = counter
    return out
