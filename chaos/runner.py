"""One chaos run: services up, workers looping, nemesis injecting, then the checker's verdict.

``run(RunConfig(...))`` returns the report (a dict, also written as JSON when ``results_dir`` is
given: ``<store>-<seed>.json``, or ``<store>-<mode>-<seed>.json`` for a control mode, with
``-<workload>`` after the mode for a workload other than ``counter``)::

    {"store", "resource", "mode", "seed", "seconds", "workers", "ttl", "elapsed_s",
     "ops": {"attempted", "acknowledged", "stale", "unknown", ...},
     "faults": {kind: count}, "fault_log": [...], "schedule": [...],
     "violation_count", "violations_by_kind", "violations": [...],
     "revived": {"pauses", "attempted", "refused", "committed", "unknown", "per_pause": [...]},
     "worker_crashes": [...], "nemesis_errors": [...], "expect_violations", "passed", "workdir"}

``passed`` is the run's verdict against its expectation: no violation in ``fenced`` mode, at
least one in the control modes; and a run that froze holders must have seen at least one of
them write after it was thawed (``revived.attempted`` > 0), or its pauses proved nothing. Timeline: services start, workers start, the nemesis begins
1.5 s in; at ``seconds`` the nemesis stops and heals everything, workers get SIGTERM (they finish
their operation, SIGKILL after 8 s), and the checker reads the database and every log.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import Violation, check, load_events, revived_writes
from chaos.db import ACCOUNTS, INITIAL_BALANCE, ResourceDB
from chaos.electcheck import check_election
from chaos.near import check_near, near_ops
from chaos.nemesis import Nemesis, kinds_for, make_schedule
from chaos.pool import WorkerPool, faketime_lib
from chaos.rwcheck import check_rw, check_sem
from chaos.services import ACCOUNT_LOCKS, ELECTION, LOCK, SEMAPHORE, Services
from chaos.sqlcheck import check_sql
from chaos.transfers import check_transfers
from chaos.workload import MODES, WORKLOADS
from harness import ThrowawayPostgres
from lockd.client.fenced import FencedSession

__all__ = ["RunConfig", "run", "format_summary", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RunConfig:
    """One run. ``ttl`` defaults to 1 s (2 s on etcd, whose leases are whole seconds checked
    about every 500 ms); ``think`` is the worker's pause between read and write (seconds)."""

    store: str = "sqlite"
    seconds: float = 30.0
    seed: int = 1
    workers: int = 4
    mode: str = "fenced"
    resource: str = "postgres"
    ttl: float | None = None
    workload: str = "counter"
    via: str = "proxy"
    """What the workers write through: ``proxy``, ``guard`` (``chaos.guarded``: the counter
    workload's tables behind ``lockd.guard`` on PostgreSQL), or ``redis-guard``
    (``chaos.redisguarded``: the counter in Redis, each write one call of the guard's Redis
    functions, the history read back from its stream); the checker unchanged."""
    think: tuple[float, float] = (0.05, 0.4)
    near: float = 0.1
    """Share of operations on neighbour locks (``chaos.near``; of them ``CROSS`` cross ones)."""
    churn: int = 0
    """Tasks of background acquire/release churn on locks of their own (``chaos.churn``; 0:
    none), so the PostgreSQL store's batches form beside the workload's grants."""
    accounts: int = ACCOUNTS
    """Account rows (``transfer`` workload; each transfer takes two of their locks)."""
    kinds: tuple[str, ...] | None = None
    """Fault kinds to inject (default: every kind that applies; the control modes: pauses)."""
    workdir: Path | None = None
    results_dir: Path | None = None
    keep: bool = False
    """Keep the work directory (logs, databases) even when the run passed."""
    pg: ThrowawayPostgres | None = None
    """A started throwaway PostgreSQL cluster to use instead of making one."""
    extra: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[str], Any] | None = None
    """Called with a one-line progress report every ``PROGRESS_S`` seconds of the run."""

    @property
    def effective_ttl(self) -> float:
        return self.ttl if self.ttl is not None else (2.0 if self.store == "etcd" else 1.0)


def _worker_argv(cfg: RunConfig, services: Services, lock: str) -> list[str]:
    return [sys.executable, "-m", "chaos.workload", "--lockd", services.lockd_url,
            "--proxy", services.front_url, "--mode", cfg.mode,
            "--db", services.worker_db_url if cfg.workload == "sql" else services.db_url,
            "--lock", lock, "--ttl", str(cfg.effective_ttl), "--think-min", str(cfg.think[0]),
            "--think-max", str(cfg.think[1]), "--seed", str(cfg.seed),
            "--workload", cfg.workload, "--accounts", str(cfg.accounts),
            "--near", "0" if cfg.via != "proxy" else str(cfg.near)]  # the guard serves no neighbours


def _start_churn(cfg: RunConfig, services: Services, workdir: Path) -> subprocess.Popen:
    with (workdir / "churn.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "chaos.churn", "--lockd", services.lockd_url, "--out",
             str(workdir / "churn.json"), "--tasks", str(cfg.churn), "--seed", str(cfg.seed)],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_churn(proc: subprocess.Popen | None, workdir: Path) -> dict[str, Any] | None:
    """Stop the churn and read its verdict; a churn that left none is a failed run."""
    if proc is None:
        return None
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out = workdir / "churn.json"
    if not out.exists():
        return {"grants": 0, "refused": 0, "errors": 0, "violations": [
            {"kind": "churn_crashed", "detail": f"exit {proc.returncode}; see churn.log"}]}
    return json.loads(out.read_text())


PROGRESS_S = 30.0


def progress_line(elapsed: float, seconds: float, faults: dict[str, int],
                  logs: list[Path]) -> str:
    """``t 120/600 s · faults 14 · writes acked 310, refused stale 12, unknown 1``, read from
    the workers' logs so far. Violations are judged at the end: the checker needs the whole
    history (a write in flight now may still commit), so none is claimed mid-run."""
    seen = {"ack": 0, "stale": 0, "unknown": 0}
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for event in seen:
            seen[event] += text.count(f'"ev": "{event}"')
    return (f"  t {elapsed:.0f}/{seconds:g} s · faults {sum(faults.values())} · writes acked "
            f"{seen['ack']}, refused stale {seen['stale']}, unknown {seen['unknown']} "
            "(violations: judged at the end)")


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` to the end and return its report (see the module docstring)."""
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    if cfg.workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}")
    workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix=f"chaos-{cfg.store}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    lib = faketime_lib()
    kinds = cfg.kinds or (("pause",) if cfg.mode != "fenced"
                          else kinds_for(cfg.store, cfg.resource, faketime=lib is not None,
                                         workload=cfg.workload))
    if cfg.workload == "sql" and cfg.kinds is None:  # no proxy in the workers' path
        kinds = tuple(k for k in kinds if k != "stop_proxy")
    if cfg.via == "redis-guard" and cfg.kinds is None:  # the protected database is off the path
        kinds = tuple(k for k in kinds
                      if k != "db_delay" and (k != "crash_pg" or cfg.store == "postgres"))
    ttl = cfg.effective_ttl
    schedule = make_schedule(cfg.seed, kinds, cfg.seconds, ttl)
    lock = LOCK  # what the proxy names for table counter; checked once it runs
    services = Services(cfg.store, cfg.resource, workdir, pg=cfg.pg, accounts=cfg.accounts,
                        workload=cfg.workload, via=cfg.via)
    pool = WorkerPool(cfg.workers, [], workdir / "logs", REPO_ROOT)
    variants = {"unfenced-read": ("race",), "nofence": ("race", "late"),
                "noclaim": ("race", "late")}.get(
        cfg.mode, ("race", "late", "edge"))
    nemesis = Nemesis(schedule, services, pool, ttl=ttl, faketime=lib, pause_variants=variants)
    started = time.monotonic()
    churn: subprocess.Popen | None = None
    churned: dict[str, Any] | None = None
    try:
        try:
            services.start()
            with FencedSession(services.proxy_url) as proxy:
                named = proxy.lock_for("counter")  # the proxy decides the lock, never by hand
                account = proxy.lock_for("accounts", 1)
            if named is None:
                raise RuntimeError("the proxy writes the counter unfenced")
            if account != ACCOUNT_LOCKS.replace("{key}", "1"):
                raise RuntimeError(f"the proxy binds account 1 to {account!r}")
            lock = {"counter": named, "rw": named, "election": ELECTION,
                    "sem": SEMAPHORE}.get(cfg.workload, ACCOUNT_LOCKS)
            pool.argv = _worker_argv(cfg, services, lock)
            if cfg.churn:
                churn = _start_churn(cfg, services, workdir)
            pool.start_all()
            nemesis.start()
            deadline = nemesis.t0 + cfg.seconds
            next_report = nemesis.t0 + PROGRESS_S
            while time.monotonic() < deadline:
                pool.supervise()
                time.sleep(0.2)
                if cfg.progress is not None and time.monotonic() >= next_report:
                    next_report += PROGRESS_S
                    cfg.progress(progress_line(time.monotonic() - nemesis.t0, cfg.seconds,
                                               nemesis.counts(), pool.log_paths()))
        finally:
            try:
                if nemesis.ident is not None:  # started: stop it, resume, restart, heal
                    nemesis.finish()
            finally:
                pool.stop_all()
                churned = _stop_churn(churn, workdir)
        counter, history = (services.redis_state() if cfg.via == "redis-guard"
                            else ResourceDB(services.db_url).final_state())
        balances = ResourceDB(services.db_url).balances()
    finally:
        services.close()
    events = load_events(pool.log_paths())
    near = near_ops(events)  # neighbour locks: judged by check_near, not as the workload's own
    own = [e for e in events if e.get("op") not in near]
    if cfg.workload == "transfer":  # there the neighbours are account locks, judged per lock
        result = check_transfers(history, balances, events, initial=INITIAL_BALANCE, ttl=ttl)
    elif cfg.workload == "sql":
        result = check_sql(history, balances, events, initial=INITIAL_BALANCE, ttl=ttl)
    elif cfg.workload == "rw":
        result = check_rw(history, counter, own, ttl=ttl)
    elif cfg.workload == "sem":
        result = check_sem(history, own, ttl=ttl, lock_prefix=f"sem/{SEMAPHORE}/")
    elif cfg.workload == "election":
        result = check_election(history, own, lock=ELECTION, ttl=ttl)
    else:
        result = check(history, counter, own, ttl=ttl)
    result.stats.update(check_near(history, events, result.violations.append, ttl=ttl,
                                   own=cfg.workload not in ("transfer", "sql")))
    if churned is not None:
        result.violations += [Violation(v["kind"], v["detail"]) for v in churned["violations"]]
        result.stats.update({f"churn_{k}": churned[k] for k in ("grants", "refused", "errors")})
    revived = revived_writes(events, history, nemesis.pauses())
    expect = cfg.mode in ("unfenced-read", "nofence")
    idle_pauses = revived["pauses"] > 0 and revived["attempted"] == 0
    verdict = (result.violations != []) == expect and not idle_pauses
    if cfg.mode == "noclaim":  # every write refused by the triggers: none committed
        verdict = (not result.violations and result.stats.get("committed_writes") == 0
                   and result.stats.get("sql_refused", 0) > 0)
    report: dict[str, Any] = {
        "store": cfg.store, "resource": cfg.resource, "via": cfg.via, "mode": cfg.mode,
        "seed": cfg.seed,
        "seconds": cfg.seconds, "workers": cfg.workers, "ttl": ttl, "lock": lock,
        "elapsed_s": round(time.monotonic() - started, 1),
        "ops": result.stats, "faults": nemesis.counts(), "fault_kinds": list(kinds),
        **result.as_dict(), "revived": revived, "workload": cfg.workload,
        "pauses_without_revived_write": idle_pauses,
        "worker_crashes": pool.crashes, "nemesis_errors": nemesis.errors,
        "fault_log": nemesis.records, "schedule": nemesis.planned(),
        "faketime": lib, "expect_violations": expect,
        "passed": verdict,
        "workdir": str(workdir), **cfg.extra,
    }
    if cfg.results_dir is not None:
        cfg.results_dir.mkdir(parents=True, exist_ok=True)
        name = cfg.store if cfg.mode == "fenced" else f"{cfg.store}-{cfg.mode}"
        if cfg.workload != "counter":
            name = f"{name}-{cfg.workload}"
        if cfg.via != "proxy":
            name = f"{name}-via-{cfg.via}"
        path = cfg.results_dir / f"{name}-{cfg.seed}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        report["report_path"] = str(path)
    if report["passed"] and not cfg.keep and cfg.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
        report["workdir"] = None
    return report


_VIA_TEXT = {"guard": " via the guard", "redis-guard": ", counter in Redis via the guard's functions"}


def format_summary(report: dict[str, Any]) -> str:
    """A few human lines: what ran, what happened to the operations, faults, the verdict."""
    ops = report["ops"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(report["faults"].items())) or "none"
    kinds = report["violations_by_kind"]
    verdict = "PASS" if report["passed"] else "FAIL"
    expect = "violations expected" if report["expect_violations"] else "no violation allowed"
    if report["mode"] == "noclaim":
        expect = "every write refused, none committed"
    lines = [
        f"chaos {report['store']} (protected {report['resource']}"
        f"{_VIA_TEXT.get(report.get('via'), '')}, mode {report['mode']}, "
        f"seed {report['seed']}, {report['seconds']:g} s, {report['workers']} workers, "
        f"ttl {report['ttl']:g} s)",
        f"  operations: attempted {ops['attempted']}, acknowledged {ops['acknowledged']}, "
        f"stale {ops['stale']} (read {ops['stale_at_read']}, write {ops['stale_at_write']}), "
        f"unknown {ops['unknown']} ({ops['unknown_committed']} committed), "
        f"not acquired {ops['not_acquired']}, failed before write {ops['failed_before_write']}",
        (f"  transfers committed {ops['transfers_committed']} ({ops['history_rows']} account "
         f"updates), total balance {ops['counter']}" if "transfers_committed" in ops else
         f"  history rows {ops['history_rows']}, counter {ops['counter']}"),
        *([f"  sql: operations committed {ops['committed_writes']}, order/line rows "
           f"{ops['sql_rows']}, writes refused by the triggers {ops['sql_refused']}"]
          if "sql_rows" in ops else []),
        *([f"  readers: {ops['readers']} shared leases, reads allowed {ops['reads_allowed']}, "
           f"refused stale {ops['reads_stale']}; writes under a shared token refused "
           f"{ops['shared_writes_refused']}"] if "readers" in ops else []),
        *([f"  permits granted {ops['permits']}"] if "permits" in ops else []),
        *([f"  near locks: {ops['near_ops']} operations, rows committed {ops['near_rows']}, "
           f"writes of a lock not held refused {ops['near_refused']}, cross-primitive "
           f"operations {ops['cross_ops']} (refused {ops['cross_refused']})"]
          if ops.get("near_ops") else []),
        *([f"  churn (chaos.churn): grants {ops['churn_grants']}, refused {ops['churn_refused']}, "
           f"errors {ops['churn_errors']}"] if "churn_grants" in ops else []),
        *([f"  leaders {ops['leaders']}, terms written {ops['terms_written']}, entries "
           f"acknowledged {ops['entries_acked']}, refused stale {ops['entries_stale']}"]
          if "leaders" in ops else []),
        f"  faults: {faults}",
        f"  pauses {report['revived']['pauses']}: revived writes attempted "
        f"{report['revived']['attempted']}, refused {report['revived']['refused']}, committed "
        f"{report['revived']['committed']}, unknown {report['revived']['unknown']}"
        + (" (FAIL: no frozen holder wrote after its thaw)"
           if report["pauses_without_revived_write"] else ""),
        f"  violations: {report['violation_count']}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})" if kinds else ""),
    ]
    for v in report["violations"][:5]:
        lines.append(f"    {v['kind']}: {v['detail']}")
    if ops.get("unavailable_but_committed"):
        lines.append(f"  note: {ops['unavailable_but_committed']} write(s) answered 503 "
                     "(\"nothing written\") did commit")
    if report["worker_crashes"]:
        lines.append(f"  worker crashes: {len(report['worker_crashes'])}")
    if report["nemesis_errors"]:
        lines.append(f"  nemesis errors: {report['nemesis_errors'][:3]}")
    lines.append(f"  {verdict} ({expect})"
                 + (f"; report {report['report_path']}" if report.get("report_path") else ""))
    return "\n".join(lines)
