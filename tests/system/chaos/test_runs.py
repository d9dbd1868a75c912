"""Short chaos runs against real processes: the fence holds under every fault kind (and frozen
holders did write once thawed), and the checker finds the violations of the two control modes
(proof that it can fail).

Each run starts lockd, the proxy and four worker processes; the nemesis injects faults from a
fixed seed. The runs share one throwaway PostgreSQL cluster (the protected database; lockd's
store in the PostgreSQL run), which the ``crash_pg`` fault crashes and restarts.
"""

from __future__ import annotations

import pytest

from chaos.pool import faketime_lib
from chaos.runner import RunConfig, run
from harness import ThrowawayPostgres
from tests.conftest import require

pytestmark = pytest.mark.slow

SHORT_S = 45
CONTROL_S = 15


@pytest.fixture(scope="module")
def chaos_pg():
    cluster = ThrowawayPostgres().init().start()
    yield cluster
    cluster.destroy()


def _explain(report: dict) -> str:
    return (f"violations {report['violations_by_kind']}: {report['violations'][:5]}; "
            f"faults {report['faults']}; ops {report['ops']}; crashes {report['worker_crashes']}; "
            f"nemesis errors {report['nemesis_errors']}; logs in {report['workdir']}")


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_the_fence_holds_under_every_fault(store, chaos_pg, tmp_path):
    require(None if faketime_lib() else "libfaketime not installed (make system-deps)",
            "faketime")
    # on PostgreSQL, churn beside the workload so that lockd's batched grants are judged too
    report = run(RunConfig(store=store, seconds=SHORT_S, seed=20240 + len(store),
                           pg=chaos_pg, workdir=tmp_path / "run",
                           churn=8 if store == "postgres" else 0))
    why = _explain(report)
    assert report["violation_count"] == 0, why
    assert report["passed"], why
    if store == "postgres":
        assert report["ops"]["churn_grants"] >= 100, why
    # every applicable kind was injected, skews included
    assert set(report["fault_kinds"]) == {
        "pause", "pause_grant", "pause_write", "handoff", "kill_after_read", "stop_proxy",
        "db_delay", "kill_worker", "kill_lockd", "crash_pg", "skew_wall", "skew_all"}
    assert set(report["faults"]) == set(report["fault_kinds"]), why
    # frozen holders did write once thawed (or the pauses proved nothing)
    assert report["revived"]["attempted"] >= 1, why
    # the run exercised the fence: writes committed, and frozen holders were turned away
    ops = report["ops"]
    assert ops["acknowledged"] >= 10, why
    assert ops["stale"] >= 1, why
    assert ops["history_rows"] == ops["counter"] >= 10, why
    assert report["worker_crashes"] == [] and report["nemesis_errors"] == [], why


@pytest.mark.parametrize(("mode", "resource"), [("nofence", "sqlite"),
                                                ("unfenced-read", "postgres")])
def test_the_checker_catches_the_control_modes(mode, resource, chaos_pg, tmp_path):
    report = run(RunConfig(store="sqlite", seconds=CONTROL_S, seed=7, mode=mode,
                           resource=resource, pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["faults"].get("pause", 0) >= 2, why
    assert report["violation_count"] > 0, why
    kinds = report["violations_by_kind"]
    # two holders both read v and wrote v + 1: the read chain breaks and an increment is lost
    assert kinds.get("interleaving", 0) >= 1 and kinds.get("lost_update") == 1, why
    if mode == "nofence":
        # a "late" pause: the frozen holder writes after later holders committed higher fences
        assert kinds.get("fence_decrease", 0) >= 1, why
    else:
        assert "fence_decrease" not in kinds, why  # the fenced writes still keep fence order
    assert report["passed"], why


TRANSFER_S = 30


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_transfers_through_multi_lock_leases_are_conserved_under_faults(store, chaos_pg, tmp_path):
    """The ``transfer`` workload: two-account transfers through multi-lock leases
    and fenced batches, and blind multi-lock batches, under the nemesis: money conserved, each
    transfer once and whole, no lower fence after a higher one on any account lock, leases
    exclusive per lock."""
    report = run(RunConfig(store=store, seconds=TRANSFER_S, seed=31 + len(store),
                           workload="transfer", pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["violation_count"] == 0, why
    assert report["passed"], why
    ops = report["ops"]
    # about two ops in five are blind multi-lock batches (no claim first): both kinds committed
    assert ops["transfers_committed"] >= 10, why
    assert ops["account_marks"] >= 5, why
    assert ops["counter"] == 8 * 1000, why  # the total balance, read back from the database
    assert ops["stale"] >= 1, why  # frozen holders were turned away
    assert report["revived"]["attempted"] >= 1, why
    assert report["worker_crashes"] == [] and report["nemesis_errors"] == [], why


def test_transfers_without_fencing_lose_money(chaos_pg, tmp_path):
    """The control: the same transfers with the locks alone (reads and writes straight to the
    database) lose or double money once a frozen holder writes after its lease expired."""
    report = run(RunConfig(store="sqlite", seconds=CONTROL_S, seed=7, mode="nofence",
                           resource="sqlite", workload="transfer", pg=chaos_pg,
                           workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["faults"].get("pause", 0) >= 2, why
    kinds = report["violations_by_kind"]
    # a transfer read a balance another had already moved on and overwrote it: a lost transfer
    assert kinds.get("interleaving", 0) >= 1, why
    assert report["passed"], why
