"""Neighbour locks: names that contain one another, held and written beside each workload's own.

Every workload's key space holds names that contain one another and the workload's own: for
the counter's lock ``chaos/counter`` the neighbours ``chaos/counter/1``, ``chaos/counter/10``
and ``chaos/counter/1/x`` (``NEAR_SPACES``: one pair of templates per workload). Each is the
lock of the rows of two tables, bound by template (by the proxy, and under ``sql`` by the
database's own fence triggers)::

    near   (n integer, id text, fence bigint, PRIMARY KEY (n, id))   lock: first template, {n}
    near_x (n integer, id text, fence bigint, PRIMARY KEY (n, id))   lock: second template, {n}

so a check anywhere that matches lock names loosely (a prefix, ``strpos`` without delimiters,
a LIKE) takes one name for another while both are held and written, and the checker sees it.

A *near* operation (``--near`` of the operations) takes one neighbour lock exclusively (under
``sem``: a permit of a neighbour semaphore, ``chaos1`` or ``chaos/1``, whose slot locks nest
with ``chaos``'s), logs ``acquired {mode: near, fences: {lock: fence}}`` and ``blind``, thinks,
then inserts one row with no claim first (``write {mark, near: the row's lock}``): under its own
lock, or (``OVERREACH`` of them) under a neighbour's it does not hold, which must be refused
(403 ``lock_not_allowed``; under ``sql`` the triggers' ``lock_not_claimed``). The transfer
workloads' neighbours are account locks themselves (``accounts/1``, ``accounts/10``) and
``accounts/1/x``: near operations there contend with the transfers.

A *cross* operation (``CROSS`` of the near operations) tries a crossing of primitives the rules
forbid, logged ``acquired {mode: near, cross}`` with no ``fences`` (it holds nothing it may
write), then writes its row like any near operation, which must be refused:

- ``shared``: takes the neighbour lock SHARED (with a ``client_id``) and writes under that token
  (403 ``shared_token``; under ``sql`` the database refuses the read claim's row);
- ``campaign``: the same shared lease, then a campaign for the election of that name with the
  same ``client_id`` (409 ``client_id_conflict``: a shared lease never becomes a leader's); if
  lockd answers a leadership, the row is written with its token;
- under ``sem``, ``slot_campaign``: a campaign for the election named like a neighbour
  semaphore's slot lock (422: the name is the semaphore's). If lockd grants it, the grant is
  logged WITH its fence, as a grant of that slot lock, which its permits also hold.

A committed row of a cross operation is an ``unclaimed_commit``; a slot campaign's grant
breaks the slot lock's grant order and exclusion.

``check_near``: every committed near row was written by an operation holding its lock
(``chaos.rowlocks``: ``unclaimed_commit``, ``phantom``, ``rejected_committed``,
``fence_decrease``, ``stale_commit`` per lock), every acknowledged one is there
(``acked_missing``), and with ``leases`` each neighbour lock's grants are unique, in order and
exclusive (``fence_reused``, ``fence_order``, ``lease_overlap``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chaos.checker import (
    HistoryRow,
    OpRecord,
    Violation,
    _check_grant_order,
    _check_leases,
    collect_ops,
)
from chaos.rowlocks import check_row_locks
from chaos.rwwork import LeaseOps, RawLease, quoted
from lockd.client.errors import LockClientError

__all__ = ["NEAR_TABLES", "NEAR_SPACES", "NEAR_KEYS", "NEAR_SEMAPHORES", "NEAR_KIND", "NearOps",
           "near_lock", "near_names", "near_ops", "check_near"]

NEAR_TABLES = ("near", "near_x")
NEAR_KIND = "near"
"""History rows of the near tables (``worker`` = the row's lock, in full)."""
NEAR_SPACES: dict[str, tuple[str, str]] = {
    "counter": ("chaos/counter/{n}", "chaos/counter/{n}/x"),
    "rw": ("chaos/counter/{n}", "chaos/counter/{n}/x"),
    "election": ("chaos/election/{n}", "chaos/election/{n}/x"),
    "transfer": ("accounts/{n}", "accounts/{n}/x"),
    "sql": ("accounts/{n}", "accounts/{n}/x"),
    "sem": ("sem/chaos1/{n}", "sem/chaos/1/{n}"),
}
"""Per workload: the lock templates of ``near`` and ``near_x`` (``{n}``: the row's ``n``)."""
NEAR_KEYS = (("near", 1), ("near", 10), ("near_x", 1))
"""The rows (table, n) near operations write, so the locks they take (not under ``sem``)."""
NEAR_SEMAPHORES = (("near", "chaos1"), ("near_x", "chaos/1"))
"""Under ``sem``: the neighbour semaphores and the table their slot locks govern (n = slot)."""
NEAR_LIMIT = 2
OVERREACH = 0.25
"""Share of near operations that write a row of a neighbour lock they do not hold."""
CROSS = 0.4
"""Share of near operations that are cross operations (module docstring)."""


def near_lock(workload: str, table: str, n: int) -> str:
    """The lock of row ``n`` of near table ``table`` under ``workload``."""
    return NEAR_SPACES[workload][NEAR_TABLES.index(table)].replace("{n}", str(n))


def near_names(workload: str) -> list[str]:
    """Every lock name near operations of ``workload`` take or write."""
    if workload == "sem":
        return [near_lock(workload, t, slot) for t, _ in NEAR_SEMAPHORES
                for slot in range(NEAR_LIMIT)]
    return [near_lock(workload, t, n) for t, n in NEAR_KEYS]


class NearOps(LeaseOps):
    """One worker's near operations (module docstring); ``w`` is the ``chaos.workload.Worker``,
    ``sql`` its ``chaos.sqlwork.SqlOps`` under the ``sql`` workload (None: through the proxy)."""

    def __init__(self, worker: Any, sleep: Callable[[float], None], workload: str,
                 sql: Any = None):
        super().__init__(worker, sleep)
        self.workload = workload
        self.sql = sql

    def acquire(self) -> RawLease:
        w = self.w
        if w.rng.random() < CROSS:
            return self._cross()
        if self.workload == "sem":
            table, name = w.rng.choice(NEAR_SEMAPHORES)
            lease = self._take(f"/v1/semaphores/{quoted(name)}", "acquire",
                               {"limit": NEAR_LIMIT}, mode="near")
            n = int(lease.lock.rsplit("/", 1)[1])
        else:
            table, n = w.rng.choice(NEAR_KEYS)
            lease = self._take(f"/v1/locks/{quoted(near_lock(self.workload, table, n))}",
                               "acquire", {}, mode="near")
        lease.log_fields.update(fences={lease.lock: lease.fence}, near=lease.lock, table=table,
                                n=n)
        return lease

    def _cross(self) -> RawLease:
        """A cross operation's lease (module docstring); a refused one raises
        ``LockClientError`` (the operation is then not acquired)."""
        w = self.w
        if self.workload == "sem":
            table, _ = w.rng.choice(NEAR_SEMAPHORES)
            n = w.rng.randrange(NEAR_LIMIT)
            lock = near_lock(self.workload, table, n)
            lease = self._take(f"/v1/elections/{quoted(lock)}", "campaign", {"wait_ms": 0},
                               mode="near", cross="slot_campaign")
            lease.log_fields.update(fences={lease.lock: lease.fence}, near=lock, table=table,
                                    n=n)
            return lease
        table, n = w.rng.choice(NEAR_KEYS)
        lock = near_lock(self.workload, table, n)
        client_id = f"cross-{w.rng.getrandbits(64):016x}"
        lease = self._take(f"/v1/locks/{quoted(lock)}", "acquire",
                           {"mode": "shared", "client_id": client_id}, mode="near",
                           cross="shared")
        if w.rng.random() < 0.5:
            try:
                lease = self._take(f"/v1/elections/{quoted(lock)}", "campaign",
                                   {"wait_ms": 0, "client_id": client_id}, mode="near",
                                   cross="campaign")
            except LockClientError as exc:  # the rule: a shared lease never leads
                lease.log_fields["campaign"] = getattr(exc, "code", None) or type(exc).__name__
        lease.log_fields.update(near=lock, table=table, n=n)
        return lease

    def _rows(self) -> list[tuple[str, int]]:
        if self.workload == "sem":
            return [(t, slot) for t, _ in NEAR_SEMAPHORES for slot in range(NEAR_LIMIT)]
        return list(NEAR_KEYS)

    def run(self, op: str, lease: RawLease) -> None:
        w = self.w
        table, n = lease.log_fields["table"], lease.log_fields["n"]
        if "cross" not in lease.log_fields and w.rng.random() < OVERREACH:  # a neighbour's row: the lease does not hold its lock
            table, n = w.rng.choice([(t, k) for t, k in self._rows()
                                     if near_lock(self.workload, t, k) != lease.lock])
        lock = near_lock(self.workload, table, n)
        via = "sql" if self.sql is not None else w.rng.choice(("post", "batch"))
        self.sleep(w.rng.uniform(0.02, 0.06))  # setting up after the grant
        w.log("blind", op=op, fence=lease.fence, via=via, near=lock)
        self._think()
        w.log("write", op=op, fence=lease.fence, via=via, mark=op, near=lock, holds=lease.lock)
        row = {"n": n, "id": op, "fence": lease.fence}
        if self.sql is not None:
            if not self.sql.near(op, lease, table, row):
                return
        else:
            try:
                if via == "post":
                    w._plain("POST", f"/v1/tables/{table}/rows", lease, row)
                else:
                    w._plain("POST", "/v1/batch", lease,
                             {"ops": [{"op": "insert", "table": table, "row": row}]})
            except LockClientError as exc:
                w._outcome(op, "write", exc, lease.fence)
                return
        # no "mark": the nemesis thaws frozen holders after blind writes of THEIR lock
        w.log("ack", op=op, fence=lease.fence, via=via, near=lock,
              fences={lease.lock: lease.fence})


def near_ops(events: Iterable[Mapping[str, Any]]) -> set[str]:
    """The operations that were near operations (``acquired {mode: near}``)."""
    return {e["op"] for e in events if e.get("ev") == "acquired" and e.get("mode") == "near"
            and isinstance(e.get("op"), str)}


def check_near(history: Sequence[HistoryRow], events: Sequence[Mapping[str, Any]],
               add: Callable[[Violation], None], *, ttl: float | None = None,
               own: bool = True) -> dict[str, int]:
    """Judge the near operations among ``events`` (module docstring): their acknowledgements,
    and with ``own`` (their locks are not the workload's: not ``transfer``/``sql``, whose
    checkers judge them per account lock) their rows and, given the lease ``ttl`` (s), each
    neighbour lock's grants. Returns the stats ``near_ops``, ``near_rows``, ``near_refused``
    (writes of a lock the lease lacked, refused), ``cross_ops`` and ``cross_refused`` (cross
    operations, and those whose write was refused)."""
    mine = near_ops(events)
    evs = [e for e in events if e.get("op") in mine]
    ops = collect_ops(evs)
    count = check_row_locks(history, evs, (NEAR_KIND,), add) if own else \
        sum(r.kind == NEAR_KIND for r in history)
    committed = {r.op for r in history if r.kind == NEAR_KIND}
    for rec in ops.values():
        if rec.outcome == "ack" and rec.write is not None and rec.op not in committed:
            add(Violation("acked_missing", f"acknowledged near row of {rec.op} is not in the "
                                           "history", rec.op))
    overreach = {e["op"] for e in evs if e.get("ev") == "write" and e.get("near") != e.get("holds")}
    refused = sum(1 for op in overreach if ops[op].outcome == "rejected")
    if own and ttl is not None:
        per_lock: dict[str, list[OpRecord]] = defaultdict(list)
        locks = {e["op"]: str(e.get("near")) for e in evs  # grants of the lock: with fences
                 if e.get("ev") == "acquired" and "fences" in e}
        for rec in ops.values():
            if rec.fence is not None and rec.op in locks:
                per_lock[locks[rec.op]].append(rec)
        for lock, grants in sorted(per_lock.items()):
            seen: dict[int, OpRecord] = {}
            for rec in grants:
                other = seen.get(rec.fence or 0)
                if other is not None:
                    add(Violation("fence_reused", f"fence {rec.fence} of {lock} granted to "
                                                  f"{other.op} and {rec.op}", rec.op))
                else:
                    seen[rec.fence or 0] = rec
            _check_grant_order(list(seen.values()), add)
            _check_leases(list(seen.values()), ttl, add)
    cross = {e["op"] for e in evs if e.get("ev") == "acquired" and e.get("cross")}
    return {"near_ops": len(mine), "near_rows": count, "near_refused": refused,
            "cross_ops": len(cross),
            "cross_refused": sum(1 for op in cross if ops[op].outcome == "rejected")}
