"""Short chaos runs of the lock modes against real processes: shared readers beside exclusive
writers (``rw``; also writers thawed past their lease right after a reader's read),
semaphore permits writing their slots (``sem``) and leaders writing a term log
(``election``) hold their rules under faults. That the checkers report a planted bug of each new
rule is ``make mutants``'s job (``tests/system/chaos/test_mutants.py`` checks every mutant still
applies; the checkers' own tests feed them bad histories).

Each run starts lockd (on SQLite), the proxy in front of a throwaway PostgreSQL cluster shared
by the module's runs, and four worker processes; the nemesis injects faults from a fixed seed.
"""

from __future__ import annotations

import pytest

from chaos.runner import RunConfig, run
from harness import ThrowawayPostgres

pytestmark = pytest.mark.slow

SHORT_S = 30


@pytest.fixture(scope="module")
def chaos_pg():
    cluster = ThrowawayPostgres().init().start()
    yield cluster
    cluster.destroy()


def _explain(report: dict) -> str:
    return (f"violations {report['violations_by_kind']}: {report['violations'][:5]}; "
            f"faults {report['faults']}; ops {report['ops']}; crashes {report['worker_crashes']}; "
            f"nemesis errors {report['nemesis_errors']}; logs in {report['workdir']}")


def test_readers_on_shared_locks_never_write_nor_read_stale_under_faults(chaos_pg, tmp_path):
    report = run(RunConfig(store="sqlite", seconds=SHORT_S, seed=2701, workload="rw",
                           pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["violation_count"] == 0 and report["passed"], why
    ops = report["ops"]
    assert ops["readers"] >= 10 and ops["reads_allowed"] >= 5, why  # the readers did read
    assert ops["shared_writes_refused"] >= 1, why  # and their writes were turned away
    assert ops["acknowledged"] >= 5 and ops["history_rows"] == ops["counter"], why
    assert report["worker_crashes"] == [] and report["nemesis_errors"] == [], why


def test_a_writer_thawed_past_its_lease_after_a_readers_read_is_refused(chaos_pg, tmp_path):
    """Writers frozen right after their read or grant, past their lease, and thawed 50 ms after
    a reader's fenced read of the lock (``pause_shared``): each thawed write arrives while
    readers hold the lock shared, and none may commit (``lapsed_write``)."""
    report = run(RunConfig(store="sqlite", seconds=SHORT_S, seed=2703, workload="rw",
                           kinds=("pause_shared",), pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    thawed = [r for r in report["fault_log"] if r.get("resumed_after_shared_read")]
    assert len(thawed) >= 3, why  # the scenario ran
    assert report["revived"]["attempted"] >= 3, why  # and the lapsed writers did write
    assert report["violation_count"] == 0 and report["passed"], why


def test_leaders_write_their_terms_in_order_under_faults(chaos_pg, tmp_path):
    report = run(RunConfig(store="sqlite", seconds=SHORT_S, seed=2801, workload="election",
                           pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["violation_count"] == 0 and report["passed"], why
    ops = report["ops"]
    assert ops["leaders"] >= 5 and ops["terms_written"] >= 3, why
    assert ops["entries_acked"] >= 5, why
    assert report["worker_crashes"] == [] and report["nemesis_errors"] == [], why


def test_semaphore_permits_stay_within_the_limit_under_faults(chaos_pg, tmp_path):
    report = run(RunConfig(store="sqlite", seconds=20, seed=2702, workload="sem",
                           pg=chaos_pg, workdir=tmp_path / "run"))
    why = _explain(report)
    assert report["violation_count"] == 0 and report["passed"], why
    assert report["ops"]["permits"] >= 10 and report["ops"]["acknowledged"] >= 5, why
