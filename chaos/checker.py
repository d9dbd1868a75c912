"""The history checker: the final database and the workers' own logs in, violations out.

Inputs:

- ``history``: the protected ``history`` table, written by the database's own triggers in the
  transaction of each write (``chaos.db``), so it is the truth of *what committed*: ``counter``
  rows (one per committed increment: op, fence, value read, value written), ``mark_ins`` /
  ``mark_del`` rows (blind writes), and ``fence`` rows (each change of the proxy's fence table:
  the highest fence honoured). ``seq`` is the commit order the database stamped at COMMIT.
- ``counter``: the final counter value (it started at ``initial``).
- ``events``: every worker's JSON lines (``workload`` writes them): ``attempt``, ``acquired``
  (fence), ``read``, ``write`` (sent), then one outcome: ``ack``, ``stale`` (a 409 with
  ``presented``/``highest``), ``unknown`` (timeout, 503, connection error: it may or may not have
  committed), ``rejected`` (any other definite refusal). A worker killed mid-operation leaves
  no outcome: if its ``write`` was logged, the outcome is unknown.

Commit order is ``seq``, not the id: on PostgreSQL a deferred constraint trigger draws it at
COMMIT, so it does not rely on the proxy's fence row lock (the very thing under test: a proxy
that checks the fence in one transaction and writes in another draws ids in the wrong order).
On SQLite, one writer at a time, the id is the commit order.

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
``stale_commit``       a committed write whose fence is below one the proxy had already
                       honoured before the write was sent (a claim + fenced read, or an
                       acknowledged write, answered before the ``write`` event), or below a
                       highest the database had committed before the write committed (``fence``
                       rows, in ``seq`` order). Blames the stale writer.
``lease_overlap``      a grant to another holder while the previous lease was provably live
                       (see ``_check_leases``)
=====================  ===============================================================

Lease exclusivity, judged only on times that cannot raise a false alarm when a process is
starved of CPU: a lease A is provably live from its grant until ``max(attempt, renewal sends) +
ttl`` (lockd handled each request after it was sent, and set the expiry ``ttl`` after that),
cut at A's release send. A later fence B (granted after A) was granted at the latest when B
logged ``acquired``. B's grant inside A's live window, by more than ``LEASE_SLACK_S``, is a
violation. Starvation only delays the *logging* of ``acquired`` (B looks later: no alarm) and
the actual *sending* of renewals and releases (A really lived longer: no alarm).

What a 409 can be checked against: ``highest`` is not always a *committed* fence, since a claim
(fenced read) raises it without writing, so "highest <= the max fence committed so far" does not
hold by design. What must hold is that some worker was granted ``highest`` before the 409 was
answered: workers log ``acquired`` before they send the claim, and stamp each event with the
machine's real uptime (``/proc/uptime``, which libfaketime does not fake; 10 ms resolution).
"""

from __future__ import annotations

import bisect
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
    "LEASE_SLACK_S",
    "revived_writes",
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
    "stale_commit",
    "lease_overlap",
)

LEASE_SLACK_S = 0.1
"""Clock slack of the lease check (s): lockd's clock vs ``/proc/uptime``, and its 10 ms steps."""

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
    kind: str = "counter"
    """``counter``, ``mark_ins``, ``mark_del`` (``op`` = the mark's id) or ``fence``."""
    seq: int | None = None
    """Commit order stamped by the database (None: use the id)."""


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
    write: dict[str, Any] | None = None
    """``{fence, read, wrote}`` of a counter write (``{fence, mark, via}`` of a blind mark
    write), once it was sent; ``up`` when it was sent."""
    read_up: float | None = None
    """When the fenced read (after its claim) was answered: the fence was honoured by then."""
    acked_up: float | None = None
    renewals: list[float] = field(default_factory=list)
    """Send times (uptime) of this lease's successful renewals."""
    release_up: float | None = None
    fenced_read: bool = True
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
            rec.read_up = e.get("up")
            rec.fenced_read = bool(e.get("fenced", True))
        elif kind == "write":
            if "mark" in e:
                rec.write = {"fence": int(e["fence"]), "mark": str(e["mark"]),
                             "via": e.get("via"), "up": e.get("up")}
            elif e.get("read") is not None:
                rec.write = {"fence": int(e["fence"]), "read": int(e["read"]),
                             "wrote": int(e["wrote"]), "up": e.get("up")}
            else:  # a blind SQL statement (the ``sql`` workload): no value read
                rec.write = {"fence": int(e["fence"]), "via": e.get("via"), "up": e.get("up"),
                             "claimed": bool(e.get("claimed", True))}
        elif kind == "renewed":
            if isinstance(e.get("sent"), int | float):
                rec.renewals.append(float(e["sent"]))
        elif kind == "release":
            rec.release_up = e.get("up")
        elif kind in _OUTCOMES:
            if kind == "ack":
                rec.acked_up = e.get("up")
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


def _check_stale_commits(ordered: Sequence[HistoryRow],
                         writes: Sequence[tuple[HistoryRow, OpRecord | None, int]],
                         ops: Mapping[str, OpRecord], add) -> None:
    """``stale_commit``, blaming the stale writer (once per write):

    - by the logs: a fence ``h`` was honoured (a claim + fenced read, or an acknowledged write,
      answered) before the write was sent (its ``write`` event, ``UP_SLACK_S`` earlier), yet the
      write committed with a fence below ``h``;
    - by the database: the proxy's fence table had committed a highest above the write's fence
      before the write committed (``fence`` rows earlier in ``seq`` order)."""
    honoured = sorted(
        [(r.read_up, r.fence, r.op) for r in ops.values()
         if r.fenced_read and isinstance(r.read_up, int | float) and r.fence is not None]
        + [(r.acked_up, int(r.write["fence"]), r.op) for r in ops.values()
           if r.write is not None and isinstance(r.acked_up, int | float)])
    ups = [h[0] for h in honoured]
    prefix: list[tuple[float, int, str]] = []
    for h in honoured:
        prefix.append(h if not prefix or h[1] > prefix[-1][1] else prefix[-1])
    blamed: set[str] = set()
    for row, rec, fence in writes:
        if rec is None or rec.write is None or not isinstance(rec.write.get("up"), int | float):
            continue
        sent = rec.write["up"]
        i = bisect.bisect_left(ups, sent - UP_SLACK_S)
        best = prefix[i - 1] if i else None
        if best is not None and best[1] > fence and rec.op not in blamed:
            blamed.add(rec.op)
            add(Violation("stale_commit", f"{row.kind} write with fence {fence} sent at uptime "
                                          f"{sent:.2f} committed, though {best[2]} had fence "
                                          f"{best[1]} honoured at {best[0]:.2f}", rec.op))
    high = 0
    by_row = {id(row): (rec, fence) for row, rec, fence in writes}
    for row in ordered:
        if row.kind == "fence":
            high = max(high, row.fence)
            continue
        found = by_row.get(id(row))
        if found is None:
            continue
        rec, fence = found
        op_id = rec.op if rec is not None else row.op
        if fence < high and op_id not in blamed:
            blamed.add(op_id)
            add(Violation("stale_commit", f"{row.kind} write with fence {fence} committed (seq "
                                          f"{row.seq}) after the database had recorded highest "
                                          f"{high}", op_id))


def _check_leases(grants: list[OpRecord], ttl: float, add) -> None:
    """``lease_overlap``: a grant inside a lower fence's provably live window (module docstring)."""
    by_fence = sorted((r for r in grants if isinstance(r.granted_up, int | float)),
                      key=lambda r: r.fence or 0)
    live: tuple[float, OpRecord] | None = None  # the latest provable end among lower fences
    for rec in by_fence:
        if live is not None and rec.granted_up + LEASE_SLACK_S < live[0]:
            add(Violation("lease_overlap", f"fence {rec.fence} granted by uptime "
                                           f"{rec.granted_up:.2f}, while {live[1].op} (fence "
                                           f"{live[1].fence}) was live until at least "
                                           f"{live[0]:.2f}", rec.op))
        starts = [rec.attempt_up] if isinstance(rec.attempt_up, int | float) else []
        end = max(starts + rec.renewals, default=None)
        if end is None:
            continue
        end += ttl
        if isinstance(rec.release_up, int | float):
            end = min(end, rec.release_up)
        if live is None or end > live[0]:
            live = (end, rec)


def _deleters(ops: Mapping[str, OpRecord]) -> dict[str, OpRecord]:
    """Mark id -> the one operation its ``mark_del`` row is attributed to.

    A mark may be the target of several DELETEs: a worker whose DELETE was refused (409) deletes
    the same mark again in its next operation, under a newer fence. The row the database records
    is the old mark's, so it does not say which DELETE removed it: attribute it to an
    acknowledged DELETE if there is one, else to one whose outcome is unknown, and only when
    every DELETE of that mark was refused to a refused one (then ``rejected_committed``).
    Ties go to the first sent."""
    rank = {"ack": 0, "stale": 2, "rejected": 2}
    candidates: dict[str, list[OpRecord]] = {}
    for rec in ops.values():
        if rec.write is not None and rec.write.get("via") == "delete":
            candidates.setdefault(rec.write["mark"], []).append(rec)
    return {mark: min(recs, key=lambda r: (rank.get(r.outcome or "", 1), r.write["up"]))
            for mark, recs in candidates.items()}


def _writes(ordered: Sequence[HistoryRow], ops: Mapping[str, OpRecord],
            deleters: Mapping[str, OpRecord], add) -> list[tuple[HistoryRow, OpRecord | None, int]]:
    """Every committed data write in commit order: (row, the op that sent it, its fence)."""
    out = []
    for row in ordered:
        if row.kind == "mark_del":
            rec = deleters.get(row.op)
            if rec is None:
                add(Violation("phantom", f"history row {row.id}: mark {row.op} was deleted by "
                                         "no DELETE a worker sent", row.op))
                continue
            assert rec.write is not None
            out.append((row, rec, int(rec.write["fence"])))
        elif row.kind in ("counter", "mark_ins"):
            out.append((row, ops.get(row.op), row.fence))
    return out


def check(history: Sequence[HistoryRow], counter: int, events: Iterable[Mapping[str, Any]], *,
          initial: int = 0, ttl: float | None = None,
          epochs: Mapping[int, float] | None = None) -> CheckResult:
    """Check the run; see the module docstring for what each violation means. ``ttl``: the
    lease TTL in seconds (None: no lease-exclusivity check). ``epochs``: read epochs of shared
    leases granted beside these operations (epoch -> its first grant's uptime), which a 409
    may name as the highest once granted (a reader's fenced read honours its epoch)."""
    ordered = sorted(history, key=lambda r: (r.seq if r.seq is not None else r.id, r.id))
    rows = [r for r in ordered if r.kind == "counter"]
    ops = collect_ops(events)
    out = CheckResult()
    add = out.violations.append
    deleters = _deleters(ops)
    writes = _writes(ordered, ops, deleters, add)

    # 1. Commit order: fences never decrease; each write read its predecessor's value.
    prev_w: tuple[HistoryRow, int] | None = None
    for row, _rec, fence in writes:
        if prev_w is not None and fence < prev_w[1]:
            add(Violation("fence_decrease", f"{row.kind} row {row.id} committed fence {fence} "
                                            f"after {prev_w[0].kind} row {prev_w[0].id} with "
                                            f"fence {prev_w[1]}", row.op))
        prev_w = (row, fence)
    prev: HistoryRow | None = None
    for row in rows:
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
    inserted = {row.op: row for row in ordered if row.kind == "mark_ins"}
    deleted = {row.op: row for row in ordered if row.kind == "mark_del"}
    for rec in ops.values():
        if rec.write is not None and "mark" in rec.write:  # a blind mark write
            if rec.write.get("via") == "delete":  # the mark's deletion, if this op made it
                row = deleted.get(rec.write["mark"]) if deleters.get(
                    rec.write["mark"]) is rec else None
            else:
                row = inserted.get(rec.write["mark"])
        else:
            row = by_op.get(rec.op)
        if rec.outcome == "ack":
            if row is None:
                add(Violation("acked_missing", f"acknowledged write (fence {rec.fence}) is not "
                                               "in the history", rec.op))
            elif rec.write and "read" in rec.write and (row.fence, row.read, row.wrote) != (
                    rec.write["fence"], rec.write["read"], rec.write["wrote"]):
                add(Violation("ack_mismatch", f"acknowledged {rec.write}, history has fence "
                                              f"{row.fence} read {row.read} wrote {row.wrote}",
                              rec.op))
        elif row is not None and rec.phase == "write" and rec.outcome in ("stale", "rejected"):
            add(Violation("rejected_committed", f"write answered {rec.outcome} "
                                                f"(status {rec.status}) is in the history as row "
                                                f"{row.id}", rec.op))
    for row in rows + list(inserted.values()):
        rec = ops.get(row.op)
        if rec is None or rec.write is None:
            add(Violation("phantom", f"history row {row.id} (fence {row.fence}) matches no write "
                                     "a worker sent", row.op))
        elif rec.fence is not None and rec.fence != row.fence:
            add(Violation("ack_mismatch", f"row {row.id} has fence {row.fence}, the operation "
                                          f"was granted {rec.fence}", row.op))

    # 3b. No stale commit: by the workers' clocks and by the database's own commit order.
    _check_stale_commits(ordered, writes, ops, add)

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
    if ttl is not None:
        _check_leases(list(granted.values()), ttl, add)
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
        elif highest not in granted and highest not in (epochs or {}):
            problem = f"409 names highest {highest}, a fence no worker was granted"
        else:
            g_up = granted[highest].granted_up if highest in granted else None
            if epochs and highest in epochs:
                g_up = min(epochs[highest], g_up) if isinstance(g_up, int | float) \
                    else epochs[highest]
            s_up = rec.stale.get("up")
            if isinstance(g_up, int | float) and isinstance(s_up, int | float) \
                    and g_up > s_up + UP_SLACK_S:
                problem = (f"409 at uptime {s_up:.2f} names highest {highest}, granted only "
                           f"at {g_up:.2f}")
        if problem:
            add(Violation("bogus_stale", problem, rec.op))

    out.stats = _stats(ops, set(by_op) | {r.op for r in inserted.values()}
                       | {rec.op for m, rec in deleters.items() if m in deleted})
    out.stats["history_rows"] = len(rows)
    out.stats["counter"] = counter
    return out


def revived_writes(events: Iterable[Mapping[str, Any]], history: Sequence[HistoryRow],
                   pauses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the frozen holders did once thawed, linked to the pause that froze them.

    ``pauses``: ``{worker, incarnation, frozen_up, resumed_up, ...}`` per pause (uptimes). A
    *revived write* is a write of an operation granted before the freeze and sent after it (or
    in flight across it: logged at most 50 ms before). Its outcome: ``refused`` (409 or another
    definite refusal), ``committed`` (in the history), else ``unknown`` (no commit, no refusal).
    Returns totals and, per pause, its revived writes."""
    ops = collect_ops(events)
    committed = {r.op for r in history if r.kind in (
        "counter", "mark_ins", "account", "order_ins", "order_del", "line_ins", "line_upd",
        "line_out", "line_del", "smark", "near")}
    # an election's term entries are named "<op>.<n>": their operation committed a write
    committed |= {r.op.rsplit(".", 1)[0] for r in history if r.kind == "term"}
    deleters = _deleters(ops)
    deleted = {deleters[r.op].op for r in history if r.kind == "mark_del" and r.op in deleters}
    totals = {"pauses": len(pauses), "attempted": 0, "refused": 0, "committed": 0, "unknown": 0}
    per_pause = []
    for n, pause in enumerate(pauses):
        prefix = f"{pause['worker']}.{pause['incarnation']}."
        found = []
        for rec in ops.values():
            if not rec.op.startswith(prefix) or rec.write is None \
                    or not isinstance(rec.granted_up, int | float) \
                    or rec.granted_up > pause["frozen_up"] \
                    or not isinstance(rec.write.get("up"), int | float) \
                    or rec.write["up"] < pause["frozen_up"] - 0.05:
                continue
            if rec.write.get("via") == "delete":
                done = rec.op in deleted
            else:
                done = rec.op in committed
            if done:
                outcome = "committed"
            elif rec.phase == "write" and rec.outcome in ("stale", "rejected"):
                outcome = "refused"
            else:
                outcome = "unknown"
            totals["attempted"] += 1
            totals[outcome] += 1
            found.append({"op": rec.op, "fence": rec.fence, "outcome": outcome,
                          "answer": rec.outcome})
        per_pause.append({"pause": n, "worker": pause["worker"],
                          "variant": pause.get("variant"), "writes": found})
    return {**totals, "per_pause": per_pause}
