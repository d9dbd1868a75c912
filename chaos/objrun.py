"""The ``objects`` chaos workload: fenced writes of ONE object, frozen holders, a crashing proxy.

``python -m chaos --workload objects [--seconds S] [--seed N] [--workers W] [--resource R]``
(``make chaos CHAOS_WORKLOAD=objects``). lockd (SQLite store) and a proxy serving
``--objects-dir`` (its database: PostgreSQL or SQLite, ``--resource``) run as processes; W
workers (``chaos.objwork``) take lock ``B`` in turn and write object ``B/state`` through the
proxy; a reader polls the object all along. The nemesis, every 0.5-1.5 s, one of:

- ``pause`` (three times as often as each other kind): SIGSTOP the holder (or, with none, any
  worker) for 1.5-2.5 TTLs and until a newer holder's write is visible (its lease lapses, a
  newer holder writes; when thawed it sends its next write with its old token);
- ``crash_proxy``: SIGKILL the proxy with PUTs in flight (between a blob and its commit, some)
  and start it again (only in the first half of the run, so the end sees a quiet tail);
- ``stall_proxy``: SIGSTOP the proxy for 0.2-0.8 s (the blob store and the database slowed).

At the end the workers stop, the blobs are compared with the pointers (``orphan_kept``: an
unreferenced blob written after the last crash), then the proxy is restarted with a zero grace
so its start-up sweep runs, and nothing unreferenced may remain (``orphan_survived``). The
checker (``chaos.objcheck``) judges the logs and the reads. The report has the fields the
other workloads' have where they apply (``violation_count``, ``violations_by_kind``, ``ops``,
``faults``, ``passed``); lockd runs on SQLite whatever ``--store`` says.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from chaos.objcheck import check_objects, load_log
from chaos.objwork import tag_of
from harness import (
    PG_ADMIN_DSN,
    VENV_BIN,
    ServiceProcess,
    create_database,
    drop_database,
    free_port,
)
from harness.servers import LockdServer, blob_deletes_settled

__all__ = ["run_objects"]

BUCKET, KEY = "chaos-objects", "state"
GRACE_MS = 60_000  # long runs see the periodic sweep; the end always sees stale blobs


class _Cluster:
    def __init__(self, workdir: Path, resource: str):
        self.dir = workdir
        self.lockd_port, self.proxy_port = free_port(), free_port()
        self.lockd_url = f"http://127.0.0.1:{self.lockd_port}"
        self.proxy_url = f"http://127.0.0.1:{self.proxy_port}"
        self.pg = create_database(PG_ADMIN_DSN, prefix="chaosobj") if resource == "postgres" \
            else None
        self.db_url = (self.pg.replace("postgresql://", "postgresql+psycopg://", 1) if self.pg
                       else f"sqlite:///{workdir / 'resource.db'}")
        self.root = workdir / "objects"
        self.lockd = LockdServer(f"sqlite:///{workdir / 'lockd.db'}", log_dir=workdir,
                                 key_dir=workdir / "keys", port=self.lockd_port)
        self.proxy: ServiceProcess | None = None

    def start_proxy(self, grace_ms: int = GRACE_MS) -> None:
        self.proxy = ServiceProcess(
            [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", self.db_url,
             "--lockd-url", self.lockd_url, "--objects-dir", str(self.root),
             "--objects-grace-ms", str(grace_ms), "--objects-sweep-interval-ms", "500",
             "--port", str(self.proxy_port)],
            ready_url=f"{self.proxy_url}/healthz", log_path=self.dir / "proxy.log")
        self.proxy.start(timeout=30)

    def pointers(self) -> set[str]:
        if self.pg:
            with psycopg.connect(self.pg, autocommit=True) as conn:
                return {r[0] for r in conn.execute("SELECT blob FROM resource_proxy.objects")}
        with sqlite3.connect(self.dir / "resource.db", timeout=10) as conn:
            return {r[0] for r in conn.execute("SELECT blob FROM resource_proxy_objects")}

    def unreferenced(self, newer_than: float) -> list[str]:
        """Blob files (complete or not) no pointer names, last written after ``newer_than``
        (unix time)."""
        named = self.pointers()
        found = []
        for path in self.root.rglob("*"):
            try:
                if path.is_file() and path.name not in named \
                        and path.stat().st_mtime > newer_than:
                    found.append(str(path.relative_to(self.root)))
            except FileNotFoundError:
                continue  # swept meanwhile
        return sorted(found)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.lockd.stop()
        if self.pg:
            drop_database(self.pg, PG_ADMIN_DSN)


def _reader(url: str, stop: threading.Event, reads: list[dict[str, Any]]) -> None:
    with httpx.Client(timeout=3.0) as http:
        while not stop.is_set():
            start = time.monotonic()
            try:
                r = http.get(f"{url}/v1/objects/{BUCKET}/{KEY}")
            except httpx.HTTPError:
                time.sleep(0.02)
                continue
            if r.status_code == 200:
                reads.append({"start": start, "end": time.monotonic(), "tag": tag_of(r.content),
                              "fence": int(r.headers["x-object-fence"]),
                              "version": int(r.headers["x-object-version"])})
            time.sleep(0.02)


def _holder(lockd_url: str) -> tuple[int, int] | None:
    """The worker that holds the lock now (lockd's ``owner``) and the fence it was granted;
    None if nobody or unknown."""
    try:
        state = httpx.get(f"{lockd_url}/v1/locks/{BUCKET}", timeout=1.0).json()
        owner = state.get("owner")
        if owner and owner.startswith("objwork-"):
            return int(owner.rsplit("-", 1)[1]), int(state["fence"])
    except (httpx.HTTPError, ValueError, AttributeError, IndexError, KeyError, TypeError):
        pass
    return None


def _object_fence(proxy_url: str) -> int:
    """The fence of the object's visible version (0: none yet or no answer)."""
    try:
        r = httpx.head(f"{proxy_url}/v1/objects/{BUCKET}/{KEY}", timeout=1.0)
        return int(r.headers.get("x-object-fence", 0)) if r.status_code == 200 else 0
    except (httpx.HTTPError, ValueError):
        return 0


def _freeze_holder(cluster: _Cluster, procs: list[Any], rng: random.Random, ttl: float) -> None:
    """SIGSTOP the holder until its lease has lapsed AND a newer holder's write is visible
    (at least 1.5-2.5 TTLs; at most 4 s more on a machine too loaded to get there), so the
    write it sends when thawed meets a higher fence: every pause of a holder is a stale write
    tried, not a chance of one. With no holder, any worker is frozen for the span."""
    held = _holder(cluster.lockd_url)
    victim = procs[held[0] if held is not None else rng.randrange(len(procs))]
    victim.send_signal(signal.SIGSTOP)
    try:
        time.sleep(ttl * rng.uniform(1.5, 2.5))
        give_up = time.monotonic() + 4.0
        while held is not None and time.monotonic() < give_up \
                and _object_fence(cluster.proxy_url) <= held[1]:
            time.sleep(0.05)
    finally:
        victim.send_signal(signal.SIGCONT)


def run_objects(*, seconds: float, seed: int, workers: int, resource: str, ttl: float = 1.0,
                results_dir: Path | None = None, keep: bool = False,
                faults: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One run (see the module doc); its report."""
    rng = random.Random(seed)
    kinds = faults or ("pause", "crash_proxy", "stall_proxy")
    workdir = Path(tempfile.mkdtemp(prefix="chaos-objects-"))
    cluster = _Cluster(workdir, resource)
    procs: list[Any] = []
    reads: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    last_crash = 0.0
    started = time.monotonic()
    stop = threading.Event()
    try:
        cluster.lockd.start(timeout=30)
        cluster.start_proxy()
        import subprocess

        for w in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "chaos.objwork", "--lockd", cluster.lockd_url, "--proxy",
                 cluster.proxy_url, "--bucket", BUCKET, "--key", KEY, "--log",
                 str(workdir / f"worker-{w}.log"), "--worker", str(w), "--ttl", str(ttl),
                 "--seed", str(seed)], stdout=subprocess.DEVNULL, stderr=open(
                    workdir / f"worker-{w}.err", "ab")))
        reader = threading.Thread(target=_reader, args=(cluster.proxy_url, stop, reads),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + seconds
        quiet = time.monotonic() + 0.5 * seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.5, 1.5))
            weighted = [k for k in kinds for _ in range(3 if k == "pause" else 1)]
            kind = rng.choice([k for k in weighted if k != "crash_proxy"
                               or time.monotonic() < quiet] or ["pause"])
            counts[kind] = counts.get(kind, 0) + 1
            assert cluster.proxy is not None
            if kind == "pause":  # the holder, mid-work: thawed, it writes with its old token
                _freeze_holder(cluster, procs, rng, ttl)
            elif kind == "crash_proxy":
                cluster.proxy.kill()
                last_crash = time.time()
                cluster.start_proxy()
            elif kind == "stall_proxy":
                cluster.proxy.signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.2, 0.8))
                cluster.proxy.signal(signal.SIGCONT)
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        stop.set()
        reader.join(5)
        blob_deletes_settled(cluster.proxy_url)  # replaced blobs go after the answers
        kept = cluster.unreferenced(last_crash + 0.5)
        assert cluster.proxy is not None
        cluster.proxy.stop()
        cluster.start_proxy(grace_ms=0)  # its start-up sweep: every unreferenced blob goes
        time.sleep(1.5)
        survived = cluster.unreferenced(0.0)
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
        cluster.close()
    events = load_log(sorted(workdir.glob("worker-*.log")))
    result = check_objects(events, reads, kept, survived)
    stats = result["stats"]
    passed = result["violation_count"] == 0 and stats["stale"] > 0
    report = {"store": "sqlite", "resource": resource, "mode": "fenced", "seed": seed,
              "seconds": seconds, "workers": workers, "ttl": ttl, "workload": "objects",
              "elapsed_s": round(time.monotonic() - started, 1), "ops": stats,
              "faults": counts, "fault_kinds": list(kinds), **result, "passed": passed,
              "workdir": str(workdir)}
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        path = results_dir / f"sqlite-objects-{seed}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        report["report_path"] = str(path)
    if passed and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
        report["workdir"] = None
    return report


def format_objects(report: dict[str, Any]) -> str:
    ops = report["ops"]
    lines = [f"chaos objects (proxy database {report['resource']}, seed {report['seed']}, "
             f"{report['seconds']:g} s, {report['workers']} workers, ttl {report['ttl']:g} s)",
             f"  writes attempted {ops['attempted']}, acknowledged {ops['acknowledged']}, "
             f"refused stale {ops['stale']}, unknown {ops['unknown']}, reads {ops['reads']}",
             "  faults: " + (", ".join(f"{k} {v}" for k, v in sorted(report["faults"].items()))
                             or "none"),
             f"  orphans: after the last crash {ops['orphans_after_crash']}, after the sweep "
             f"{ops['orphans_after_sweep']}",
             f"  violations: {report['violation_count']}"
             + (f" ({report['violations_by_kind']})" if report["violation_count"] else "")]
    lines += [f"    {v['kind']}: {v['detail']}" for v in report["violations"][:5]]
    if report["ops"]["stale"] == 0:
        lines.append("  FAIL: no stale write was refused (the pauses proved nothing)")
    lines.append(f"  {'PASS' if report['passed'] else 'FAIL'} (no violation allowed)"
                 + (f"; report {report['report_path']}" if report.get("report_path") else ""))
    return "\n".join(lines)


__all__ += ["format_objects"]

