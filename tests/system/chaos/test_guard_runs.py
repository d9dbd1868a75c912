"""The counter workload through a service guarded by ``lockd.guard`` (``--via guard``,
``chaos.guarded``) instead of the proxy, the checker unchanged: the fence holds under the faults
that make frozen holders write, and the guard's planted bug (its PostgreSQL store writes without
claiming) is caught."""

from __future__ import annotations

import pytest

from chaos.mutants import MUTANTS, run_mutant
from chaos.runner import RunConfig, run
from harness import ThrowawayPostgres

pytestmark = pytest.mark.slow

FAULTS = ("pause", "pause_grant", "kill_after_read", "handoff", "stop_proxy", "db_delay")


def test_the_guarded_service_holds_the_fence(tmp_path):
    cluster = ThrowawayPostgres().init().start()
    try:
        report = run(RunConfig(store="sqlite", seconds=25, seed=4242, via="guard", kinds=FAULTS,
                               pg=cluster, workdir=tmp_path / "run"))
    finally:
        cluster.destroy()
    why = (f"violations {report['violations_by_kind']}: {report['violations'][:5]}; ops "
           f"{report['ops']}; faults {report['faults']}; logs in {report['workdir']}")
    assert report["via"] == "guard" and report["violation_count"] == 0 and report["passed"], why
    assert report["ops"]["acknowledged"] >= 10 and report["ops"]["stale"] >= 1, why
    assert report["revived"]["attempted"] >= 1, why


def test_the_checker_catches_the_guard_writing_unclaimed():
    mutant = next(m for m in MUTANTS if m.name == "guard_no_claim")
    out = run_mutant(mutant, seconds=25, seed=4242)
    assert out["report"]["via"] == "guard"
    assert out["detected"] and "stale_commit" in out["kinds"], out["kinds"]


REDIS_FAULTS = ("pause", "pause_grant", "pause_write", "kill_after_read", "handoff", "stop_proxy",
                "kill_worker", "kill_lockd")


def test_the_guards_redis_functions_hold_the_fence(tmp_path):
    """``--via redis-guard``: the counter in Redis, every write one call of the guard's Redis
    functions, the history read back from the run's stream; its keys are gone afterwards."""
    import redis

    report = run(RunConfig(store="sqlite", seconds=25, seed=4242, via="redis-guard",
                           kinds=REDIS_FAULTS, workdir=tmp_path / "run"))
    why = (f"violations {report['violations_by_kind']}: {report['violations'][:5]}; ops "
           f"{report['ops']}; faults {report['faults']}; logs in {report['workdir']}")
    assert report["via"] == "redis-guard" and report["violation_count"] == 0 and report["passed"], why
    assert report["ops"]["acknowledged"] >= 10 and report["ops"]["history_rows"] >= 5, why
    assert report["revived"]["attempted"] >= 1, why
    with redis.Redis.from_url("redis://127.0.0.1:6379/0") as client:
        assert "lockd_guard_chaos_" not in str(client.function_list())  # the run's library
        assert not list(client.scan_iter(match="chaos_*", count=1000))  # and its keys
