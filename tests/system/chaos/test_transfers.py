"""The transfer checker on small hand-made histories: a conserved history with every outcome
passes; a doubled transfer, a half-applied one, a lost update and a lower fence committed after
a higher one (per account lock) are each flagged."""

from __future__ import annotations

from chaos.checker import HistoryRow
from chaos.transfers import check_transfers

INITIAL = 100


def transfer(op_id: str, src: int, dst: int, amount: int, reads: dict[int, int],
             fences: dict[int, int], *, outcome: str | None = "ack", up: float = 10.0,
             granted: float | None = None, worker: str = "w1", **extra) -> list[dict]:
    """The events one worker logs for one transfer (``outcome`` None: killed mid-write):
    ``attempt`` and ``acquired`` at uptime ``granted`` (default ``up`` - 0.5), the rest at
    ``up``."""
    granted = up - 0.5 if granted is None else granted
    fmap = {f"accounts/{a}": f for a, f in fences.items()}
    top = max(fences.values())
    events = [
        {"ev": "attempt", "op": op_id, "w": worker, "up": granted},
        {"ev": "acquired", "op": op_id, "w": worker, "fence": top, "fences": fmap, "up": granted},
        {"ev": "read", "op": op_id, "w": worker, "fence": top, "value": reads[src],
         "balances": {str(k): v for k, v in reads.items()}, "via": "batch", "up": up},
        {"ev": "write", "op": op_id, "w": worker, "fence": top, "read": reads[src],
         "wrote": reads[src] - amount, "via": "batch", "src": src, "dst": dst, "amount": amount,
         "reads": {str(k): v for k, v in reads.items()}, "up": up},
    ]
    if outcome is not None:
        events.append({"ev": outcome, "op": op_id, "w": worker, "phase": "write", "fence": top,
                       "up": up + 0.1, **extra})
    return events


class History:
    """Account rows in commit order (``seq`` = id), as the database's trigger writes them."""

    def __init__(self) -> None:
        self.rows: list[HistoryRow] = []

    def update(self, op_id: str, account: int, fence: int, read: int, wrote: int) -> History:
        n = len(self.rows) + 1
        self.rows.append(HistoryRow(n, op_id, str(account), fence, read, wrote, kind="account",
                                    seq=n))
        return self

    def fence(self, account: int, highest: int) -> History:
        n = len(self.rows) + 1
        self.rows.append(HistoryRow(n, f"accounts/{account}", "", highest, 0, 0, kind="fence",
                                    seq=n))
        return self


def kinds(result) -> set[str]:
    return {v.kind for v in result.violations}


def _clean():
    """t1: 1 -> 2 (10); t2: 2 -> 3 (5), 409'd stale t3 on 1,3; t4 unknown and committed; t5
    killed and not committed."""
    events = (transfer("t1", 1, 2, 10, {1: 100, 2: 100}, {1: 1, 2: 1}, up=1)
              + transfer("t2", 2, 3, 5, {2: 110, 3: 100}, {2: 2, 3: 1}, up=2)
              + transfer("t3", 1, 3, 7, {1: 90, 3: 100}, {1: 2, 3: 2}, outcome="stale", up=3,
                         presented=2, highest=3, status=409)
              + transfer("t4", 3, 1, 20, {3: 105, 1: 90}, {1: 3, 3: 3}, outcome="unknown", up=4)
              + transfer("t5", 2, 1, 1, {2: 105, 1: 110}, {1: 4, 2: 3}, outcome=None, up=5))
    history = (History().fence(1, 1).fence(2, 1).update("t1", 1, 1, 100, 90)
               .update("t1", 2, 1, 100, 110).fence(2, 2).fence(3, 1)
               .update("t2", 2, 2, 110, 105).update("t2", 3, 1, 100, 105)
               .fence(1, 3).fence(3, 3).update("t4", 3, 3, 105, 85).update("t4", 1, 3, 90, 110))
    balances = {1: 110, 2: 105, 3: 85}
    return history, balances, events


def test_a_conserved_history_with_every_outcome_passes():
    history, balances, events = _clean()
    result = check_transfers(history.rows, balances, events, initial=INITIAL, ttl=1.0)
    assert result.ok, result.violations
    assert result.stats["transfers_committed"] == 3
    assert result.stats["acknowledged"] == 2
    assert result.stats["stale"] == 1
    assert result.stats["unknown"] == 2 and result.stats["unknown_committed"] == 1
    assert result.stats["counter"] == 300


def test_a_doubled_transfer_is_flagged():
    history, balances, events = _clean()
    # t4's batch landed twice (e.g. a retried unknown outcome): account 3 and 1 updated again
    history.update("t4", 3, 3, 85, 65).update("t4", 1, 3, 110, 130)
    balances = {1: 130, 2: 105, 3: 65}
    result = check_transfers(history.rows, balances, events, initial=INITIAL)
    assert "doubled_transfer" in kinds(result), result.violations
    assert "not_conserved" not in kinds(result)  # the sum still holds: only the ids tell


def test_a_half_applied_transfer_is_flagged():
    history, balances, events = _clean()
    history.rows = [r for r in history.rows if not (r.op == "t4" and r.worker == "1")]
    balances = {1: 90, 2: 105, 3: 85}
    result = check_transfers(history.rows, balances, events, initial=INITIAL)
    assert {"partial_transfer", "not_conserved"} <= kinds(result), result.violations


def test_a_lost_update_is_flagged():
    """t2 and t6 both read account 2 at 110: t6's write overwrote t2's (a lost transfer),
    though each batch alone moved its amount and the accounts' sum even looks right."""
    history, balances, events = _clean()
    events += transfer("t6", 2, 1, 10, {2: 110, 1: 110}, {1: 5, 2: 4}, up=6)
    history.update("t6", 2, 4, 110, 100).update("t6", 1, 4, 110, 120)
    balances = {1: 120, 2: 100, 3: 85}
    result = check_transfers(history.rows, balances, events, initial=INITIAL)
    assert "interleaving" in kinds(result), result.violations
    assert "not_conserved" in kinds(result)


def test_a_final_balance_no_write_left_is_a_lost_update():
    history, balances, events = _clean()
    result = check_transfers(history.rows, {**balances, 2: 106, 3: 84}, events, initial=INITIAL)
    assert kinds(result) == {"lost_update"}, result.violations


def test_a_lower_fence_after_a_higher_one_on_one_account_is_flagged():
    """t7 (fences 1:5, 2:5) was frozen; t8 (1:6, 3:4) committed on account 1; t7 thawed and its
    batch was accepted: on lock accounts/1 fence 5 landed after 6."""
    history, balances, events = _clean()
    events += (transfer("t8", 1, 3, 10, {1: 110, 3: 85}, {1: 6, 3: 4}, up=7)
               + transfer("t7", 1, 2, 10, {1: 100, 2: 105}, {1: 5, 2: 5}, up=8, granted=0.0))
    history.fence(1, 6).fence(3, 4).update("t8", 1, 6, 110, 100).update("t8", 3, 4, 85, 95)
    history.fence(2, 5).update("t7", 1, 5, 100, 90).update("t7", 2, 5, 105, 115)
    balances = {1: 90, 2: 115, 3: 95}
    result = check_transfers(history.rows, balances, events, initial=INITIAL)
    found = kinds(result)
    assert {"fence_decrease", "stale_commit"} <= found, result.violations
    blamed = {v.op for v in result.violations if v.kind == "stale_commit"}
    assert blamed == {"t7"}  # the stale writer, not its successor


def test_a_refused_transfer_that_committed_and_a_missing_ack_are_flagged():
    history, balances, events = _clean()
    # t3 was answered 409 but its batch is in the history; t1 was acked but is gone
    history.rows = [r for r in history.rows if r.op != "t1"]
    history.update("t3", 1, 2, 100, 93).update("t3", 3, 2, 85, 92)
    result = check_transfers(history.rows, balances, events, initial=INITIAL)
    assert {"rejected_committed", "acked_missing"} <= kinds(result), result.violations


def test_per_lock_leases_are_exclusive():
    """Two transfers granted the same fence of accounts/2 is a reused fence; a grant of
    accounts/1 while the previous lease on it was provably live is an overlap."""
    history, balances, events = _clean()
    events = [e for e in events if e["op"] not in ("t4", "t5")]
    history.rows = [r for r in history.rows if r.op not in ("t4",)]
    balances = {1: 90, 2: 105, 3: 105}
    events += transfer("t9", 2, 3, 1, {2: 105, 3: 105}, {2: 2, 3: 9}, outcome=None, up=9)
    result = check_transfers(history.rows, balances, events, initial=INITIAL, ttl=1.0)
    assert "fence_reused" in kinds(result), result.violations
    overlap = (transfer("u1", 1, 4, 1, {1: 0, 4: 0}, {1: 10, 4: 1}, outcome=None, up=20.0,
                        granted=20.0)
               + transfer("u2", 1, 5, 1, {1: 0, 5: 0}, {1: 11, 5: 1}, outcome=None, up=20.3,
                          granted=20.3))
    result = check_transfers([], {1: 100}, overlap, initial=INITIAL, ttl=1.0)
    assert kinds(result) == {"lease_overlap"}, result.violations
