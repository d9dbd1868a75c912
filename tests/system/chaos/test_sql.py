"""The ``sql`` chaos workload: plain SQL inside ``fenced_transaction`` on a database whose own
fence triggers decide (no proxy), under faults, checked by the history checker; and its control,
the same SQL without claims, which the triggers must refuse to the last row.

Short runs (a few seconds of faults each) on one throwaway PostgreSQL cluster, lockd on SQLite.
"""

from __future__ import annotations

import pytest

from chaos.checker import HistoryRow, Violation
from chaos.rowlocks import check_row_locks
from chaos.runner import RunConfig, run
from harness import ThrowawayPostgres

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chaos_pg():
    cluster = ThrowawayPostgres().init().start()
    yield cluster
    cluster.destroy()


def _explain(report: dict) -> str:
    return (f"violations {report['violations_by_kind']}: {report['violations'][:5]}; "
            f"faults {report['faults']}; ops {report['ops']}; crashes {report['worker_crashes']}; "
            f"nemesis errors {report['nemesis_errors']}; logs in {report['workdir']}")


def test_plain_sql_in_fenced_transactions_holds_the_fence_under_faults(chaos_pg, tmp_path):
    report = run(RunConfig(store="sqlite", seconds=20, seed=26, workload="sql", pg=chaos_pg,
                           kinds=("pause_grant", "pause", "kill_worker", "db_delay"),
                           workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["violation_count"] == 0, why
    assert report["passed"], why
    ops = report["ops"]
    # writes committed, of every shape: transfers (read-modify-write and blind set-based
    # UPDATEs), orders and lines (inserts, updates, cascaded deletes)
    assert ops["committed_writes"] >= 10, why
    assert ops["transfers_committed"] >= 5, why
    assert ops["sql_rows"] >= 5, why
    assert ops["counter"] == 8 * 1000, why  # the total balance, read back from the database
    # writes reaching account locks the lease lacks (a cascade, a key-changing UPDATE) were
    # refused by the triggers, and none of them committed (the checker's unclaimed_commit)
    assert ops["sql_refused"] >= 1, why
    assert report["worker_crashes"] == [] and report["nemesis_errors"] == [], why


def test_plain_sql_without_a_claim_commits_nothing(chaos_pg, tmp_path):
    report = run(RunConfig(store="sqlite", seconds=6, seed=7, workload="sql", mode="noclaim",
                           pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["violation_count"] == 0, why
    assert report["ops"]["committed_writes"] == 0, why
    assert report["ops"]["sql_refused"] >= 5, why
    assert report["passed"], why


def _row(id_: int, kind: str, op: str, account: int, seq: int, fence: int = 0) -> HistoryRow:
    return HistoryRow(id_, op, str(account), fence, 0, 0, kind=kind, seq=seq)


def test_the_lock_rule_flags_rows_of_unheld_locks_and_stale_fences():
    """The checker half, without a run: a cascade into a lock the lease lacks, a claimless
    commit, and a row below the lock's committed fence are each reported."""
    events = [
        {"ev": "acquired", "op": "a", "fence": 5, "fences": {"accounts/1": 5, "accounts/2": 4}},
        {"ev": "write", "op": "a", "fence": 5, "via": "drop", "up": 1.0},
        {"ev": "ack", "op": "a", "fence": 5},
        {"ev": "acquired", "op": "b", "fence": 7, "fences": {"accounts/1": 7, "accounts/3": 6}},
        {"ev": "write", "op": "b", "fence": 7, "via": "order", "up": 2.0},
        {"ev": "ack", "op": "b", "fence": 7},
        {"ev": "acquired", "op": "c", "fence": 8, "fences": {"accounts/4": 8, "accounts/5": 8}},
        {"ev": "write", "op": "c", "fence": 8, "via": "touch", "claimed": False, "up": 3.0},
        {"ev": "rejected", "op": "c", "phase": "write", "code": "lock_not_claimed"},
    ]
    history = [
        _row(1, "order_ins", "b", 1, 1),
        _row(2, "line_ins", "b", 3, 2),
        _row(3, "order_del", "a", 1, 3),   # fence 5 after b's fence 7 on accounts/1
        _row(4, "line_del", "a", 3, 4),    # accounts/3 is not in a's lease: the cascade
        _row(5, "line_upd", "c", 4, 5),    # c claimed nothing (and was answered rejected)
    ]
    found: list[Violation] = []
    assert check_row_locks(history, events, ("order_ins", "order_del", "line_ins", "line_upd",
                                             "line_del"), found.append) == 5
    kinds = sorted((v.kind, v.op) for v in found)
    assert kinds == [("fence_decrease", "a"), ("rejected_committed", "c"),
                     ("unclaimed_commit", "a"), ("unclaimed_commit", "c")], found
