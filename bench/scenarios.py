"""The measurements, each returning a ``report.Section``.

Servers are started lazily and shared between scenarios (``Bench.server``); each scenario uses
its own lock names. Settings come from the environment (see ``bench/__main__.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import cpu, loadgen
from bench.capacity import load, scale
from bench.objects import objects
from bench.peers import Server, Workspace, sqlalchemy_url
from bench.primitives import primitives
from bench.proxy_bench import proxy
from bench.report import Section, median, pct, ratio
from bench.transfer import transfers

__all__ = ["Bench", "Settings", "SCENARIOS"]

LOCKD_STORES = {"lockd · SQLite": "sqlite", "lockd · PostgreSQL": "postgres",
                "lockd · etcd": "etcd"}
LOCKD_WORKERS = 2  # ``lockd serve --workers`` of the "--workers" rows (PostgreSQL and etcd stores)
# Each PostgreSQL worker's pool_max in those rows and the replicas row: the single-process lockd
# keeps its default 32, the limit rows open 32 more, and PostgreSQL here allows 100 in all.
WORKERS_POOL_MAX = 8
# The replicas row: that many ``lockd serve`` processes on one PostgreSQL store, each with
# pool_max = WORKERS_POOL_MAX like a --workers worker (PostgreSQL's 100 connections: see above).
LOCKD_REPLICAS = 2
REPLICAS_ROW = f"lockd · PostgreSQL · {LOCKD_REPLICAS} replicas"
# lockd on PostgreSQL with ``?batch=0``: each acquire and release its own statement (the store
# sends those of one event-loop turn together by default). Only when BENCH_PEERS names it: its
# pool would take PostgreSQL past its 100 connections in a full run.
NOBATCH_ROW = "lockd · PostgreSQL · batch=0"
# Limit rows that run whatever BENCH_PEERS says, like the baselines: the goals table puts them
# beside each goal (bench/goals.py).
CEILING_ROWS = ("do-nothing HTTP (generator ceiling)", "do-nothing FastAPI (HTTP stack ceiling)")


@dataclass
class Settings:
    seconds: float = 2.0
    rounds: int = 3
    warmup: float = 0.5
    clients: tuple[int, ...] = (1, 8, 32)
    procs: int = 1
    proxy_clients: tuple[int, ...] = (8,)
    batch: int = 100
    scale_leases: int = 100_000
    load_waiters: int = 1000
    load_locks: int = 10
    takeover_samples: int = 3
    renew_ttl_ms: int = 3000
    peers: tuple[str, ...] = ()  # empty: all


@dataclass
class Bench:
    """The run's settings, workspace and the servers started so far."""

    settings: Settings
    ws: Workspace = field(default_factory=Workspace)
    servers: dict[str, Server] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.skipped = Workspace.missing()

    def has(self, need: str) -> bool:
        return need not in self.skipped

    def server(self, name: str) -> Server:
        """``etcd``, ``noop-raw``, ``noop-fastapi``, ``lockd-sqlite``, ``lockd-postgres``,
        ``lockd-etcd`` (on the shared etcd, its own key prefix), ``lockd-sqlite-tls`` (https)."""
        if name not in self.servers:
            if name == "etcd":
                server = self.ws.etcd()
            elif name.startswith("noop-"):
                server = self.ws.noop(name.split("-", 1)[1])
            elif name == "lockd-postgres-nobatch":  # each request its own statement
                server = self.ws.lockd(sqlalchemy_url(self.ws.database()) + "?batch=0", name)
            elif name == "lockd-sqlite-tls":
                server = self.ws.lockd("sqlite", name, tls=True)
            elif name == "lockd-etcd":
                url = self.server("etcd").extra["url"]
                server = self.ws.lockd(url, name)
            elif name in ("lockd-postgres-workers", "lockd-etcd-workers"):
                store = name.split("-")[1]
                if store == "etcd":
                    url = self.server("etcd").extra["url"]
                else:  # N × pool_max connections in all: see section 1's notes
                    url = sqlalchemy_url(self.ws.database()) + f"?pool_max={WORKERS_POOL_MAX}"
                server = self.ws.lockd(url, name, args=("--workers", str(LOCKD_WORKERS)))
            elif name.startswith("lockd-"):
                server = self.ws.lockd(name.split("-", 1)[1], name)
            else:
                raise KeyError(name)
            self.servers[name] = server
        return self.servers[name]

    def replicas(self) -> list[Server]:
        """The replicas row's lockd processes on one fresh PostgreSQL database (started once)."""
        names = [f"lockd-postgres-replica-{k}" for k in range(LOCKD_REPLICAS)]
        if names[0] not in self.servers:
            url = sqlalchemy_url(self.ws.database()) + f"?pool_max={WORKERS_POOL_MAX}"
            for name, server in zip(names, self.ws.lockd_replicas(
                    url, "lockd-postgres-replica", LOCKD_REPLICAS), strict=True):
                self.servers[name] = server
        return [self.servers[n] for n in names]

    def retire(self, prefix: str) -> None:
        """Stop the servers whose name starts with ``prefix`` (``server()`` starts them again if
        a later section asks): PostgreSQL here allows 100 connections, and an idle lockd keeps
        the pool it grew under load."""
        for name in [n for n in self.servers if n.startswith(prefix)]:
            self.servers.pop(name).stop()

    def wanted(self, peer: str) -> bool:
        """Whether BENCH_PEERS asks for ``peer``: a word it contains, or ``=name`` exactly."""
        return not self.settings.peers or any(
            p[1:] == peer if p.startswith("=") else p.lower() in peer.lower()
            for p in self.settings.peers)


def _lockd_server(bench: Bench, label: str) -> Server:
    return bench.server(f"lockd-{LOCKD_STORES[label]}")


def _lockd_schema(dsn: str) -> str:
    """``dsn`` with lockd's PostgreSQL schema created in it (for the physical-limit row): the
    store's own list of DDL, so the grant statement finds every column it reads."""
    from lockd.server.store.postgres.store import SCHEMA

    with psycopg.connect(dsn, autocommit=True) as conn:
        for ddl in SCHEMA:
            conn.execute(ddl)
    return dsn


def _tls_spec(bench: Bench, prefix: str) -> dict[str, Any]:
    server = bench.server("lockd-sqlite-tls")
    return {**server.addr(), "prefix": prefix, "tls_ca": server.extra["tls_ca"]}


def _needs(label: str) -> str | None:
    if "PostgreSQL" in label or "advisory" in label:
        return "postgres"
    if "etcd" in label:
        return "etcd"
    if "redis" in label:
        return "redis"
    return None


# --- 1. lock cycles ---------------------------------------------------------------------------


def lock_cycles(bench: Bench) -> Section:
    s = bench.settings
    peers: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {
        "etcd lock API (baseline)": lambda: ("etcd", {**bench.server("etcd").addr(),
                                                      "prefix": "bench1"}),
        "lockd · SQLite": lambda: ("lockd", {**_lockd_server(bench, "lockd · SQLite").addr(),
                                             "prefix": "bench1"}),
        "lockd · PostgreSQL": lambda: ("lockd", {
            **_lockd_server(bench, "lockd · PostgreSQL").addr(), "prefix": "bench1"}),
        "lockd · etcd": lambda: ("lockd", {**_lockd_server(bench, "lockd · etcd").addr(),
                                           "prefix": "bench1"}),
        NOBATCH_ROW: lambda: ("lockd", {**bench.server("lockd-postgres-nobatch").addr(),
                                        "prefix": "bench1"}),
        # Multi-lock leases: one atomic grant of 2 or 8 locks, then one release.
        **{f"{label} · {n} locks/lease": (lambda label=label, n=n: ("lockd_many", {
            **_lockd_server(bench, label).addr(), "prefix": f"bench1m{n}", "locks": n}))
           for label in LOCKD_STORES for n in (2, 8)},
        # TLS: the handshake is paid once per keep-alive connection; the last two
        # rows open a new connection every cycle, with and without TLS, to show its price.
        "lockd · SQLite · TLS": lambda: ("lockd", _tls_spec(bench, "bench1t")),
        "lockd · SQLite · TLS, new connection each cycle": lambda: ("lockd", {
            **_tls_spec(bench, "bench1tr"), "reconnect": True}),
        "lockd · SQLite, new connection each cycle": lambda: ("lockd", {
            **_lockd_server(bench, "lockd · SQLite").addr(), "prefix": "bench1r",
            "reconnect": True}),
        f"lockd · PostgreSQL · --workers {LOCKD_WORKERS}": lambda: ("lockd", {
            **bench.server("lockd-postgres-workers").addr(), "prefix": "bench1w"}),
        # Replicas of one lockd service: separate processes on one store, the clients split
        # between them round-robin (measured beside the single lockd, same clients).
        REPLICAS_ROW: lambda: ("lockd", {
            **bench.replicas()[0].addr(), "prefix": "bench1p",
            "replicas": [[r.host, r.port] for r in bench.replicas()]}),
        f"lockd · etcd · --workers {LOCKD_WORKERS}": lambda: ("lockd", {
            **bench.server("lockd-etcd-workers").addr(), "prefix": "bench1w"}),
        # The physical limit: lockd's own grant + release statements sent by psycopg
        # from the generator, no HTTP and no lockd: what PostgreSQL can do for one lock cycle.
        "PostgreSQL limit: lockd's grant + release statements, psycopg": lambda: (
            "lockd_sql", {"dsn": _lockd_schema(bench.ws.database()), "prefix": "bench1s"}),
        "redis-py Lock": lambda: ("redis", {"prefix": bench.ws.redis_prefix + "/1"}),
        "PostgreSQL advisory lock": lambda: ("pgadv", {"dsn": bench.ws.database()}),
        "do-nothing HTTP (generator ceiling)": lambda: ("noop", {
            **bench.server("noop-raw").addr()}),
        "do-nothing FastAPI (HTTP stack ceiling)": lambda: ("noop", {
            **bench.server("noop-fastapi").addr()}),
    }
    chosen = {name: make for name, make in peers.items()
              if (bench.wanted(name) or "baseline" in name or name in CEILING_ROWS)
              and (name != NOBATCH_ROW or s.peers)  # asked for only: 32 more connections
              and bench.has(_needs(name) or "")}
    specs = {name: make() for name, make in chosen.items()}
    _count_cpu(bench, specs)
    results: dict[tuple[str, int], list[dict]] = {}
    names = list(specs)
    for r in range(s.rounds):
        for c in s.clients:
            order = names[r % len(names):] + names[:r % len(names)]  # rotate: no fixed slot
            for name in order:
                workload, spec = specs[name]
                spec = {**spec, "workload": workload, "warmup": s.warmup, "seconds": s.seconds}
                res = loadgen.run_closed(spec, c, s.procs)
                results.setdefault((name, c), []).append(res)
    bench.retire("lockd-postgres-workers")
    bench.retire("lockd-postgres-nobatch")
    bench.retire("lockd-etcd-workers")
    bench.retire("lockd-postgres-replica-")
    section = Section(
        "1", "Lock cycles: acquire + release, each client its own lock",
        "etcd's lock API through its JSON gateway (lease grant + lock + unlock + revoke), same "
        "clients", [("peer", "str"), ("clients", "int"), ("cycles/s", "int"), ("× etcd", "x"),
                    ("p50 ms", "ms"), ("p99 ms", "ms"), ("p99 × etcd", "x"),
                    ("CPU ms/cycle", "ms"), ("errors", "int")])
    data: dict[str, Any] = {}
    for c in s.clients:
        base_runs = results.get(("etcd lock API (baseline)", c), [])
        base_rate = median([x["cycles"] / x["seconds"] for x in base_runs])
        base_p99 = pct([v for x in base_runs for v in x["lat_ms"]], 99)
        for name in names:
            runs = results[(name, c)]
            rates = [x["cycles"] / x["seconds"] for x in runs]
            lat = [v for x in runs for v in x["lat_ms"]]
            rate, p50, p99 = median(rates), pct(lat, 50), pct(lat, 99)
            errors = sum(x["errors"] for x in runs)
            cpu_ms = _cpu_per_cycle(runs)
            section.rows.append([name, c, rate, ratio(rate, base_rate), p50, p99,
                                 ratio(p99, base_p99), cpu_ms.get("machine"), errors])
            data[f"{name} @{c}"] = {"rates": rates, "p50_ms": p50, "p99_ms": p99,
                                    "errors": errors, "first_error": next(
                                        (x["first_error"] for x in runs if x["first_error"]),
                                        None), "cpu_ms": cpu_ms, "cores": os.cpu_count()}
    section.data = data
    section.notes.append(
        "CPU ms/cycle: the CPU time every core of the machine spent busy (/proc/stat) within the "
        "counted window, divided by the cycles counted: the cost of one cycle to the server, the "
        "store and the generator together. Its split for the lockd · PostgreSQL rows, in ms per "
        "cycle (servers = the lockd processes the row talks to; PostgreSQL = every postgres "
        "process): " + "; ".join(
            f"{key}: " + ", ".join(f"{part} {v['cpu_ms'][part]:.3f}" for part in cpu.PARTS
                                   if v["cpu_ms"].get(part) is not None)
            for key, v in data.items()
            if key.startswith("lockd · PostgreSQL") and "locks/lease" not in key
            and v["cpu_ms"]) + ".")
    section.notes.append(
        "TLS rows: lockd on SQLite serving https (TLS 1.3, ECDSA P-256 certificate); "
        "'new connection each cycle' rows open one connection (and one handshake) per cycle.")
    section.notes.append(
        "'N locks/lease' rows: one multi-lock lease of N locks of the client's own "
        "(POST /v1/leases/acquire, then /v1/leases/release): 2 HTTP requests a cycle, every "
        "lock granted and released in one atomic store step.")
    section.notes.append(
        f"'--workers {LOCKD_WORKERS}' rows: `lockd serve --workers {LOCKD_WORKERS}`, that many "
        "processes on one port (SO_REUSEPORT); on PostgreSQL each worker has "
        f"pool_max={WORKERS_POOL_MAX} ({LOCKD_WORKERS * WORKERS_POOL_MAX} connections in all: "
        f"with the single process's 32, the replicas' {LOCKD_REPLICAS * WORKERS_POOL_MAX} and "
        "the limit rows' 32, PostgreSQL's 100 are near); the 'PostgreSQL limit' row sends lockd's own "
        "grant and release statements straight from the generator with psycopg (2 autocommit "
        "statements a cycle, no HTTP): the database's own rate for one lock cycle here.")
    section.notes.append(
        f"'{REPLICAS_ROW}': {LOCKD_REPLICAS} `lockd serve` processes (harness LockdServer) on "
        f"one PostgreSQL database and one key directory, each with pool_max={WORKERS_POOL_MAX} "
        "like a --workers worker (half the single lockd's 32 connections in all: PostgreSQL's "
        f"100 are shared by every row); client i talks to replica i mod {LOCKD_REPLICAS}. The "
        "ceiling rows (do-nothing servers) run whatever "
        "BENCH_PEERS says: the goals table puts them beside each goal.")
    section.notes.append(
        "A cycle is 2 HTTP requests for lockd and the do-nothing servers, 4 for etcd's lock API, "
        "2 Redis commands (SET NX PX; EVALSHA) for redis-py, 2 statements for advisory locks.")
    section.notes.append(
        "Generator: one uvloop process, one keep-alive connection per client, "
        f"{s.procs} process(es); its ceiling is the do-nothing HTTP row. For redis-py and "
        "advisory locks the client library's work runs in the generator process itself.")
    for key in bench.skipped:
        section.notes.append(f"skipped {key}: {bench.skipped[key]}")
    return section


def _count_cpu(bench: Bench, specs: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Ask every row's generator for the CPU spent in its counted window (``bench.cpu``), with
    the pids of the server process(es) the row talks to, found by port."""
    by_port = {srv.port: srv for srv in bench.servers.values()}
    for _, spec in specs.values():
        ports = [port for _, port in spec.get("replicas", [])] or [spec.get("port")]
        spec["cpu"] = True
        spec["cpu_pids"] = [by_port[p].pid for p in ports if p in by_port]


def _cpu_per_cycle(runs: list[dict]) -> dict[str, float]:
    """Median CPU ms per counted cycle of each ``bench.cpu`` part over ``runs`` (rounds); {}
    when no run measured it (or counted no cycle)."""
    per: dict[str, list[float]] = {}
    for run in runs:
        if run.get("cpu") and run["cycles"]:
            for part, seconds in run["cpu"].items():
                per.setdefault(part, []).append(seconds * 1000 / run["cycles"])
    return {part: median(values) for part, values in per.items()}


# --- 2. handoff -------------------------------------------------------------------------------


HANDOFF_PEERS = {
    "etcd lock API (baseline)": ("etcd", "etcd", {}),
    "lockd · SQLite": ("lockd", "lockd-sqlite", {}),
    "lockd · PostgreSQL": ("lockd", "lockd-postgres", {}),
    "lockd · etcd": ("lockd", "lockd-etcd", {}),
    "redis-py Lock (sleep 0.1 s, its default)": ("redis", None, {"sleep": 0.1}),
    "redis-py Lock (sleep 0.01 s)": ("redis", None, {"sleep": 0.01}),
}


def handoff(bench: Bench, waiters: int = 16) -> Section:
    s = bench.settings
    chosen = {n: p for n, p in HANDOFF_PEERS.items()
              if (bench.wanted(n) or "baseline" in n) and bench.has(_needs(n) or "")}
    pooled: dict[str, dict[str, list]] = {n: {"h": [], "rate": [], "err": []} for n in chosen}
    for r in range(s.rounds):
        for name, (peer, server, extra) in chosen.items():
            addr = bench.server(server).addr() if server else {}
            lock = (f"{bench.ws.redis_prefix}/2/{r}" if peer == "redis" else f"bench2/{r}")
            res = loadgen.run("handoff", {"peer": peer, **addr, **extra, "name": lock,
                                          "clients": waiters, "warmup": s.warmup,
                                          "seconds": s.seconds, "hold_ms": 1})
            pooled[name]["h"] += res["handoffs_ms"]
            pooled[name]["rate"].append(res["grants"] / res["seconds"])
            pooled[name]["err"].append(res["errors"])
    section = Section(
        "2", f"Handoff under contention: {waiters} waiters on one lock, each holds it 1 ms",
        "etcd's lock API (waiters block in /v3/lock/lock)",
        [("peer", "str"), ("grants/s", "int"), ("handoff p50 ms", "ms"),
         ("p50 × etcd", "x"), ("handoff p99 ms", "ms"), ("p99 × etcd", "x"), ("errors", "int")])
    base = pooled.get("etcd lock API (baseline)", {"h": []})["h"]
    for name, p in pooled.items():
        p50, p99 = pct(p["h"], 50), pct(p["h"], 99)
        section.rows.append([name, median(p["rate"]), p50, ratio(p50, pct(base, 50)), p99,
                             ratio(p99, pct(base, 99)), sum(p["err"])])
        section.data[name] = {"p50_ms": p50, "p99_ms": p99, "samples": len(p["h"]),
                              "grants_per_s": p["rate"]}
    section.notes.append("Handoff: from the moment the holder sends its release (unlock) to "
                         "the next holder's grant arriving, both clocks in one process.")
    section.notes.append("redis-py's Lock has no queue: a blocked acquire polls every `sleep` "
                         "seconds (default 0.1), so order is not first-come.")
    return section


# --- 3. crash takeover ---------------------------------------------------------------------------


TAKEOVER_PEERS = {
    "etcd lock API (baseline)": ("etcd", "etcd"),
    "lockd · SQLite": ("lockd", "lockd-sqlite"),
    "lockd · PostgreSQL": ("lockd", "lockd-postgres"),
    "lockd · etcd": ("lockd", "lockd-etcd"),
    "redis-py Lock (sleep 0.1 s)": ("redis", None),
}


def takeover(bench: Bench, ttl_ms: int = 2000) -> Section:
    s = bench.settings
    mgr = loadgen.manager()
    chosen = {n: p for n, p in TAKEOVER_PEERS.items()
              if (bench.wanted(n) or "baseline" in n) and bench.has(_needs(n) or "")}
    samples: dict[str, list[float]] = {n: [] for n in chosen}
    after_kill: dict[str, list[float]] = {n: [] for n in chosen}
    for k in range(s.takeover_samples):
        for name, (peer, server) in chosen.items():
            addr = bench.server(server).addr() if server else {}
            lock = (f"{bench.ws.redis_prefix}/3/{k}" if peer == "redis" else f"bench3/{k}")
            report, ready = mgr.Queue(), mgr.Event()
            waiter_go = mgr.Event()
            waiter, wout = loadgen.start_job("takeover_wait", {
                "peer": peer, **addr, "name": lock, "ready": ready, "go": waiter_go})
            ready.wait(60)
            holder, _ = loadgen.start_job("hold_and_freeze", {
                "peer": peer, **addr, "name": lock, "ttl_ms": ttl_ms, "report": report})
            held = report.get(timeout=60)
            waiter_go.set()
            time.sleep(0.2)  # the waiter's acquire is in flight / queued
            holder.kill()  # SIGKILL: no release, no renewal
            killed = time.monotonic()
            holder.join(10)
            got = loadgen._get(wout, [waiter], 60)["granted"]
            waiter.join(10)
            lapse = held["granted"] + held["ttl_ms"] / 1000
            samples[name].append((got - lapse) * 1000)
            after_kill[name].append((got - killed) * 1000)
    section = Section(
        "3", f"Crash takeover: holder SIGKILLed, waiter blocked; TTL {ttl_ms} ms",
        "etcd's lock API (lease TTL 2 s, waiter blocked in /v3/lock/lock)",
        [("peer", "str"), ("after lapse p50 ms", "ms"), ("× etcd", "x"),
         ("after lapse max ms", "ms"), ("kill→grant p50 ms", "ms"), ("samples", "int")])
    base = median(samples.get("etcd lock API (baseline)", []))
    for name, vals in samples.items():
        section.rows.append([name, median(vals), ratio(median(vals), base), max(vals),
                             median(after_kill[name]), len(vals)])
        section.data[name] = {"after_lapse_ms": vals, "after_kill_ms": after_kill[name]}
    section.notes.append(
        "After lapse: waiter's grant minus (holder's grant + the TTL the store granted), both "
        "read on the same monotonic clock; the lapse is judged by the store's clock, so a small "
        "negative/positive skew of a few ms is measurement error. etcd checks lease expiry about "
        "every 500 ms; redis-py's waiter polls every 0.1 s.")
    mgr.shutdown()
    return section


# --- 4. renewal capacity ---------------------------------------------------------------------------


RENEW_PEERS = {
    "etcd lease keep-alive (baseline)": ("etcd", "etcd"),
    "lockd · SQLite": ("lockd", "lockd-sqlite"),
    "lockd · PostgreSQL": ("lockd", "lockd-postgres"),
    "lockd · etcd": ("lockd", "lockd-etcd"),
    "lockd · SQLite, renew-each": ("lockd-each", "lockd-sqlite"),
    "lockd · PostgreSQL, renew-each": ("lockd-each", "lockd-postgres"),
}
RENEW_STEPS = (250, 500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000)


def renewal_capacity(bench: Bench) -> Section:
    s = bench.settings
    ttl = s.renew_ttl_ms
    period, limit = ttl / 3, ttl / 10
    seconds = max(2 * period / 1000, s.seconds)
    chosen = {n: p for n, p in RENEW_PEERS.items()
              if (bench.wanted(n) or "baseline" in n) and bench.has(_needs(n) or "")}
    found: dict[str, dict[str, Any]] = {}
    for name, (peer, server) in chosen.items():
        steps = []
        best = 0
        for n in RENEW_STEPS:
            res = loadgen.run("renewals", {
                "peer": peer, **bench.server(server).addr(), "leases": n, "period_ms": period,
                "ttl_ms": ttl, "seconds": seconds, "prefix": f"bench4/{n}", "connections": 64})
            p99 = pct(res["lat_ms"], 99)
            ok = (p99 is not None and p99 <= limit and res["errors"] == 0
                  and res["misses"] == 0 and len(res["lat_ms"]) >= 0.95 * res["expected"])
            steps.append({"leases": n, "p50_ms": pct(res["lat_ms"], 50), "p99_ms": p99,
                          "done": len(res["lat_ms"]), "expected": res["expected"],
                          "misses": res["misses"], "errors": res["errors"], "ok": ok})
            if not ok:
                break
            best = n
        found[name] = {"capacity": best, "steps": steps}
    section = Section(
        "4", f"Renewal capacity: leases kept renewed every ttl/3 = {period:.0f} ms "
             f"(TTL {ttl} ms) with p99 renewal latency ≤ ttl/10 = {limit:.0f} ms",
        "etcd's own lease keep-alive (/v3/lease/keepalive) under the same schedule",
        [("peer", "str"), ("leases", "int"), ("× etcd", "x"), ("renewals/s", "int"),
         ("p99 ms at that", "ms"), ("p99 ms next step", "ms"), ("next step", "str")])
    base = found.get("etcd lease keep-alive (baseline)", {}).get("capacity")
    for name, f in found.items():
        steps = f["steps"]
        passed = [x for x in steps if x["ok"]]
        failed = [x for x in steps if not x["ok"]]
        last = passed[-1] if passed else None
        nxt = failed[0] if failed else None
        section.rows.append([
            name, f["capacity"], ratio(f["capacity"], base), f["capacity"] * 1000 / period,
            last["p99_ms"] if last else None, nxt["p99_ms"] if nxt else None,
            (f"{nxt['leases']:,} leases" if nxt else "not reached (largest step passed)")])
        section.data[name] = f
    section.notes.append(
        f"Open loop: each lease's renewal is due every {period:.0f} ms (phases spread evenly), "
        "sent over a pool of 64 keep-alive connections; latency runs from when it was due, so "
        f"queueing counts. Steps: {', '.join(map(str, RENEW_STEPS))} leases; capacity = the "
        "largest step with p99 within the limit, no errors and no lost lease.")
    section.notes.append("Capacity scales with the TTL: at ttl = 30 s the same renewals/s "
                         "keep 10× the leases.")
    section.notes.append("renew-each rows: the same leases held by clients of 1,000 leases "
                         "each, every client renewing all of its leases in one POST "
                         "/v1/leases/renew-each per tick (the Python client's background "
                         "renewal); each lease's latency is its request's.")
    return section


SCENARIOS: dict[str, Callable[..., Section]] = {
    "1": lock_cycles,
    "2": handoff,
    "3": takeover,
    "4": renewal_capacity,
    "5": proxy,
    "6": scale,
    "7": load,
    "8": transfers,
    "9": primitives,
    "10": objects,
}


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
