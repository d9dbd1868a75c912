"""Neighbour locks: every workload's key space holds names that contain one another, their rows
name their lock in full, and the near checker flags a row of a lock its writer did not hold, a
missing acknowledged row, a stale row and a neighbour lock granted twice."""

from __future__ import annotations

import sqlite3

import pytest

from chaos.checker import HistoryRow
from chaos.db import account_ids
from chaos.near import NEAR_SEMAPHORES, NEAR_SPACES, check_near, near_lock, near_names, near_ops
from chaos.services import ACCOUNT_LOCKS, ELECTION, LOCK, SEMAPHORE
from chaos.workload import WORKLOADS

OWN = {"counter": [LOCK], "rw": [LOCK], "election": [ELECTION],
       "transfer": [ACCOUNT_LOCKS.replace("{key}", str(i)) for i in account_ids()],
       "sql": [ACCOUNT_LOCKS.replace("{key}", str(i)) for i in account_ids()],
       "sem": [f"sem/{SEMAPHORE}", *(f"sem/{SEMAPHORE}/{slot}" for slot in (0, 1))]}
"""The workload's own names (a semaphore's: its own and its slot locks')."""


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workloads_key_space_has_names_that_contain_one_another(workload):
    assert set(NEAR_SPACES) == set(WORKLOADS)
    names = set(OWN[workload]) | set(near_names(workload))
    if workload == "sem":  # the neighbour semaphores themselves: chaos1, chaos/1
        names |= {f"sem/{name}" for _, name in NEAR_SEMAPHORES}
    pairs = [(a, b) for a in names for b in names if a != b and b.startswith(a)]
    # a prefix that is no segment of the other (accounts/1, accounts/10) ...
    assert any(b[len(a)] != "/" for a, b in pairs), sorted(names)
    # ... and one that is (accounts/1, accounts/1/x)
    assert any(b[len(a)] == "/" for a, b in pairs), sorted(names)
    # and the neighbours nest with the workload's own names, not only among themselves
    assert any(a in OWN[workload] or b in OWN[workload] for a, b in pairs), sorted(names)


def test_account_ids_nest_and_stay_unique():
    ids = account_ids()
    assert len(ids) == 8 and len(set(account_ids(20))) == 20
    assert {1, 10, 100} <= set(ids)


def test_a_near_row_names_its_lock_in_full(tmp_path):
    from chaos.db import ResourceDB

    db = ResourceDB(f"sqlite:///{tmp_path / 'r.db'}")
    db.create_schema(3, NEAR_SPACES["transfer"])
    conn = sqlite3.connect(tmp_path / "r.db")
    conn.execute("INSERT INTO near (n, id, fence) VALUES (10, 'a', 3)")
    conn.execute("INSERT INTO near_x (n, id, fence) VALUES (1, 'b', 4)")
    conn.commit()
    assert sorted(conn.execute("SELECT id FROM accounts")) == [(1,), (2,), (10,)]
    conn.close()
    _, history = db.final_state()
    assert [(r.kind, r.op, r.worker, r.fence) for r in history] == [
        ("near", "a", "accounts/10", 3), ("near", "b", "accounts/1/x", 4)]


def near(op: str, lock: str, fence: int, *, row: str | None = None, outcome: str = "ack",
         granted: float = 10.0, up: float = 10.2, w: str = "w1") -> list[dict]:
    """A near operation holding ``lock`` that writes a row of ``row`` (default: its own)."""
    row = row or lock
    events = [
        {"ev": "attempt", "op": op, "w": w, "up": granted - 0.01},
        {"ev": "acquired", "op": op, "w": w, "fence": fence, "mode": "near",
         "fences": {lock: fence}, "near": lock, "up": granted},
        {"ev": "write", "op": op, "w": w, "fence": fence, "via": "post", "mark": op,
         "near": row, "holds": lock, "up": up},
        {"ev": outcome, "op": op, "w": w, "phase": "write", "fence": fence, "up": up + 0.01,
         **({"status": 403, "code": "lock_not_allowed"} if outcome == "rejected" else {})},
        {"ev": "release", "op": op, "w": w, "fence": fence, "up": up + 0.05},
    ]
    return events


def nrow(i: int, op: str, lock: str, fence: int) -> HistoryRow:
    return HistoryRow(i, op, lock, fence, 0, 0, kind="near", seq=i)


def fence_row(i: int, lock: str, highest: int) -> HistoryRow:
    return HistoryRow(i, lock, "", highest, 0, 0, kind="fence", seq=i)


def judge(history, events, ttl=1.0):
    found = []
    stats = check_near(history, events, found.append, ttl=ttl)
    return {v.kind for v in found}, found, stats


def test_a_clean_near_history_passes():
    events = (near("a", "chaos/counter/1", 1, up=10.2)
              + near("b", "chaos/counter/10", 1, granted=10.1, up=10.3)
              + near("c", "chaos/counter/1", 2, granted=10.5, up=10.6)
              + near("d", "chaos/counter/1/x", 1, row="chaos/counter/1", outcome="rejected",
                     granted=10.7, up=10.8))
    history = [fence_row(1, "chaos/counter/1", 1), nrow(2, "a", "chaos/counter/1", 1),
               fence_row(3, "chaos/counter/10", 1), nrow(4, "b", "chaos/counter/10", 1),
               fence_row(5, "chaos/counter/1", 2), nrow(6, "c", "chaos/counter/1", 2)]
    kinds, found, stats = judge(history, events)
    assert found == []
    assert stats == {"near_ops": 4, "near_rows": 3, "near_refused": 1, "cross_ops": 0,
                     "cross_refused": 0}
    assert near_ops(events) == {"a", "b", "c", "d"}


def test_a_row_of_a_lock_the_writer_did_not_hold_is_flagged():
    # d holds chaos/counter/1/x, and its row of chaos/counter/1 committed: a loose match of
    # chaos/counter/1 in chaos/counter/1/x (or of accounts/1 in accounts/10) let it through
    for holds, row in (("chaos/counter/1/x", "chaos/counter/1"),
                       ("chaos/counter/10", "chaos/counter/1")):
        events = near("d", holds, 1, row=row)
        kinds, found, _ = judge([nrow(1, "d", row, 1)], events)
        assert kinds == {"unclaimed_commit"}, found


def test_a_stale_near_row_a_missing_ack_and_a_reused_fence_are_flagged():
    lock = near_lock("counter", "near", 10)
    # a (fence 1) was frozen; b (fence 2) wrote; a's row committed after the highest was 2
    events = near("a", lock, 1, up=12.0) + near("b", lock, 2, granted=11.2, up=11.3)
    history = [fence_row(1, lock, 2), nrow(2, "b", lock, 2), nrow(3, "a", lock, 1)]
    assert judge(history, events)[0] == {"fence_decrease"}
    history = [fence_row(1, lock, 2), nrow(2, "a", lock, 1)]
    assert judge(history, events)[0] == {"stale_commit", "acked_missing"}
    twice = near("a", lock, 1) + near("b", lock, 1, granted=10.5, up=10.6)
    assert "fence_reused" in judge([], twice)[0]
    overlap = near("a", lock, 1, up=10.3) + near("b", lock, 2, granted=10.1, up=10.4)
    assert "lease_overlap" in judge([], overlap)[0]


def cross(op: str, lock: str, fence: int, kind: str, **kw) -> list[dict]:
    """A cross operation: a shared lease (or what a campaign answered for it) of ``lock``,
    logged with no ``fences`` (it holds nothing it may write)."""
    events = near(op, lock, fence, **kw)
    del events[1]["fences"]
    events[1]["cross"] = kind
    return events


def test_a_cross_operations_committed_row_is_flagged_and_its_lease_is_no_grant():
    lock = near_lock("counter", "near", 1)
    refused = cross("s", lock, 1, "shared", outcome="rejected", granted=10.0, up=10.4)
    kinds, found, stats = judge([fence_row(1, lock, 1), nrow(2, "a", lock, 1)],
                                near("a", lock, 1, granted=10.1, up=10.2) + refused)
    assert found == [] and (stats["cross_ops"], stats["cross_refused"]) == (1, 1)
    landed = cross("c", lock, 1, "campaign", granted=10.3, up=10.5)  # a leadership's token wrote
    kinds, found, _ = judge([fence_row(1, lock, 1), nrow(2, "c", lock, 1)], landed)
    assert kinds == {"unclaimed_commit"}, found
