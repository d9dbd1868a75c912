"""The seven measurements, each returning a ``report.Section``.

Servers are started lazily and shared between scenarios (``Bench.server``); each scenario uses
its own lock names. Settings come from the environment (see ``bench/__main__.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import loadgen
from bench.objects import objects
from bench.peers import Server, Workspace, rss_mb, sqlalchemy_url
from bench.primitives import primitives
from bench.report import Section, fmt, median, pct, ratio
from bench.transfer import transfers
from bench.waiter_memory import WARM_WAITERS

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
                    ("p50 ms", "ms"), ("p99 ms", "ms"), ("p99 × etcd", "x"), ("errors", "int")])
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
            section.rows.append([name, c, rate, ratio(rate, base_rate), p50, p99,
                                 ratio(p99, base_p99), errors])
            data[f"{name} @{c}"] = {"rates": rates, "p50_ms": p50, "p99_ms": p99,
                                    "errors": errors, "first_error": next(
                                        (x["first_error"] for x in runs if x["first_error"]),
                                        None)}
    section.data = data
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


# --- 5. proxy ---------------------------------------------------------------------------------

_DIRECT = "direct fenced statement, psycopg (baseline)"


def proxy(bench: Bench) -> Section:
    from lockd.common.serving.workers import default_workers
    from lockd.tokens import KeyRing
    from resource_proxy.fencing import Fence
    from resource_proxy.policy import load_policy
    from resource_proxy.store import prepare
    from resource_proxy.store.sql import POSTGRES, SqlBuilder
    from resource_proxy.writes import build_op, set_fence

    s = bench.settings
    bench.retire("lockd-")  # sections 1-4's lockd servers and their pools: not used from here
    dsn = bench.ws.database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v bigint NOT NULL)")
        conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, 1023) g")
        conn.execute("CREATE TABLE bench_batch (grp bigint, id bigint, v bigint NOT NULL,"
                     " PRIMARY KEY (grp, id))")
        conn.execute("CREATE TABLE bench_sqlfence (id bigint PRIMARY KEY, v bigint NOT NULL)")
        conn.execute("INSERT INTO bench_sqlfence SELECT g, 0 FROM generate_series(0, 1023) g")
    ring = KeyRing.generate()
    most = max(s.proxy_clients)
    # fenced_transaction's table: row i under lock bench5t/i, guarded by the fence triggers.
    # Its own table, installed before any proxy starts: the proxy rows keep the proxy's fence
    # table, and their writes to bench_rows are not refused by triggers they do not claim for.
    _install_triggers(bench, dsn, "tables: {bench_sqlfence: 'bench5t/{key}'}\n")
    sql_tokens = [ring.sign(f"bench5t/{i}", 1) for i in range(most)]
    # One row, one lock: row i of bench_rows is written under lock bench5/i (client i's), and
    # every row of group i of bench_batch under bench5b/i (a batch client's own 100 rows).
    policy = "tables: {bench_rows: 'bench5/{key}', bench_batch: 'bench5b/{grp}'}\n"
    policy_file = bench.ws.dir / "section5-policy.yaml"
    policy_file.write_text(policy)
    tokens = [ring.sign(f"bench5/{i}", 1) for i in range(most)]
    batch_tokens = [ring.sign(f"bench5b/{i}", 1) for i in range(most)]
    server = bench.ws.proxy(dsn, ring.jwks(), policy, args=("--workers", "1"))
    cpus = default_workers()
    pooled = bench.ws.proxy(dsn, ring.jwks(), policy, "proxy-workers",
                            args=("--workers", str(cpus)))
    limit_c = 4 * most  # the physical-limit rows: enough clients to saturate PostgreSQL
    table = prepare(dsn, ["bench_rows", "bench_batch"], load_policy(policy_file)).catalog["bench_rows"]
    builder = SqlBuilder(POSTGRES)
    fenced_sql, fenced_params = [], []
    for i in range(limit_c):
        op = build_op("upsert", table, (i,), {"v": 0})
        set_fence(op, 1)
        sql, params = builder.write(op, Fence(f"bench5/{i}", 1))
        fenced_sql.append(sql)
        fenced_params.append(params)
    v_param = f"v{list(op.values).index('v')}"
    cases = {
        _DIRECT: {
            "workload": "direct_sql", "dsn": dsn, "sql": fenced_sql, "params": fenced_params,
            "counter": v_param, "check_first": [1] * most},
        "through the proxy (PUT, fenced)": {
            "workload": "proxy_write", **server.addr(), "tokens": tokens, "table": "bench_rows"},
        "direct plain UPDATE, no fence, psycopg": {
            "workload": "direct_sql", "dsn": dsn,
            "sql": "UPDATE bench_rows SET v = %(v)s WHERE id = %(id)s RETURNING id",
            "params": [{"v": 0, "id": i} for i in range(limit_c)], "counter": "v"},
        f"through the proxy, --workers {cpus} (PUT, fenced)": {
            "workload": "proxy_write", **pooled.addr(), "tokens": tokens, "table": "bench_rows"},
        "through the proxy, a new token every write": {
            "workload": "proxy_write", **server.addr(), "table": "bench_rows",
            "fresh_tokens": None},
        f"through the proxy, --workers {cpus}, a new token every write": {
            "workload": "proxy_write", **pooled.addr(), "table": "bench_rows",
            "fresh_tokens": None},
        "do-nothing FastAPI, one process (HTTP stack ceiling)": {
            "workload": "noop", **bench.server("noop-fastapi").addr(), "requests_per_cycle": 1},
        f"through the proxy, batches of {s.batch} upserts": {
            "workload": "proxy_batch", **server.addr(), "tokens": batch_tokens,
            "table": "bench_batch", "batch": s.batch, "grouped": True},
        "fenced_transaction, psycopg (claim + UPDATE)": {
            "workload": "fenced_tx", "dsn": dsn, "tokens": sql_tokens, "jwks": ring.jwks(),
            "sql": "UPDATE bench_sqlfence SET v = %(v)s WHERE id = %(id)s RETURNING id",
            "params": [{"v": 0, "id": i} for i in range(most)]},
    }
    # BENCH_PEERS narrows the rows (the baseline always runs: every ratio is to it)
    cases = {name: spec for name, spec in cases.items()
             if name == _DIRECT or bench.wanted(name)}
    # the physical limit: PostgreSQL's own commit rate for the same single-row statements, from
    # the same generator with limit_c clients (a pgbench-like run: enough to saturate it)
    limits = {name: spec for name, spec in (
        (f"PostgreSQL limit: fenced statement, psycopg, {limit_c} clients", cases[_DIRECT]),
        (f"PostgreSQL limit: plain UPDATE, psycopg, {limit_c} clients",
         cases.get("direct plain UPDATE, no fence, psycopg"))) if spec and bench.wanted(name)}
    per_client = int(300 * (s.warmup + s.seconds)) + 100  # more than a client can send
    res: dict[tuple[str, int], list[dict]] = {}
    for r in range(s.rounds):
        for name, spec in limits.items():
            out = loadgen.run_closed({**spec, "check_first": None, "warmup": s.warmup,
                                      "seconds": s.seconds}, limit_c, s.procs)
            res.setdefault((name, limit_c), []).append(out)
        for c in s.proxy_clients:
            for name, spec in cases.items():
                if "fresh_tokens" in spec:  # new rows (so new locks) each run: fences 1, 2, 3, ...
                    base = 10_000 * (1 + r * 2 * len(s.proxy_clients) + 2 * s.proxy_clients.index(c)
                                     + ("--workers" in name))
                    spec = {**spec, "row_base": base, "fresh_tokens": [
                        [ring.sign(f"bench5/{base + i}", f) for f in range(1, per_client + 1)]
                        for i in range(c)]}
                out = loadgen.run_closed({**spec, "warmup": s.warmup, "seconds": s.seconds}, c,
                                         s.procs)
                res.setdefault((name, c), []).append(out)
    section = Section(
        "5", "Fenced single-row writes (PostgreSQL)",
        "the same fenced statement (fence upsert + row upsert, one CTE) sent straight to "
        "PostgreSQL with psycopg, same clients",
        [("path", "str"), ("clients", "int"), ("rows/s", "int"), ("× direct fenced", "x"),
         ("p50 ms", "ms"), ("p99 ms", "ms"), ("errors", "int")])
    for c in s.proxy_clients:
        base = median([x["cycles"] / x["seconds"] for x in res[(_DIRECT, c)]])
        for name in cases:
            runs = res[(name, c)]
            per = s.batch if "batches" in name else 1
            rows = median([x["cycles"] * per / x["seconds"] for x in runs])
            lat = [v for x in runs for v in x["lat_ms"]]
            section.rows.append([name, c, rows, ratio(rows, base), pct(lat, 50), pct(lat, 99),
                                 sum(x["errors"] for x in runs)])
            section.data[f"{name} @{c}"] = {
                "rows_per_s": [x["cycles"] * per / x["seconds"] for x in runs],
                "first_error": next((x["first_error"] for x in runs if x["first_error"]), None)}
        for name in limits:
            runs = res[(name, limit_c)]
            rows = median([x["cycles"] / x["seconds"] for x in runs])
            lat = [v for x in runs for v in x["lat_ms"]]
            section.rows.append([name, limit_c, rows, ratio(rows, base), pct(lat, 50),
                                 pct(lat, 99), sum(x["errors"] for x in runs)])
            section.data[f"{name} @{limit_c}"] = {
                "rows_per_s": [x["cycles"] / x["seconds"] for x in runs]}
    section.notes.append("Each client owns one lock (a token with fence 1) and one row; the "
                         "batch clients write their own 100 rows (one group of bench_batch, one lock) per request. Latency of a batch "
                         "row is the whole batch's. The proxy caches verified tokens, so the "
                         "'new token every write' row shows the cost of verifying each new "
                         "lease's token (its first write).")
    section.notes.append("'fenced_transaction': lockd's async_fenced_transaction on a psycopg "
                         "connection per client: the token verified offline, BEGIN, SELECT "
                         "fencing.claim(lock, fence), the UPDATE of the client's row in "
                         "bench_sqlfence (whose fence trigger, resource_proxy.dbfence, checks "
                         "the claim), COMMIT: four round trips where the baseline sends one.")
    section.notes.append(f"'--workers {cpus}': the same proxy as {cpus} processes on one port "
                         "(the default: one per CPU); the other proxy rows are one process "
                         "(--workers 1), whose ceiling is the do-nothing FastAPI row: the same "
                         "HTTP stack answering GET /noop with no work at all. The 'PostgreSQL "
                         "limit' rows are the database's own "
                         f"commit rate for the same single-row statements with {limit_c} "
                         "psycopg clients from the same generator: what no proxy can exceed "
                         "on this machine.")
    return section


def _install_triggers(bench: Bench, dsn: str, policy_text: str) -> None:
    """``resource_proxy.dbfence.install`` of ``policy_text``'s tables on the database ``dsn``."""
    import sqlalchemy as sa

    from resource_proxy.dbfence import install
    from resource_proxy.policy import load_policy

    path = bench.ws.dir / "section5-sql-policy.yaml"
    path.write_text(policy_text)
    policy = load_policy(path)
    engine = sa.create_engine(sqlalchemy_url(dsn))
    try:
        install(engine, policy, tables=list(policy.tables))
    finally:
        engine.dispose()


# --- 6. scale ---------------------------------------------------------------------------------


def scale(bench: Bench, store: str = "postgres") -> Section:
    s = bench.settings
    # One anonymous identity holds every lease here: lift its lease limit (100,000 by default)
    # above the held leases plus the probes'.
    server = bench.ws.lockd(store, f"lockd-scale-{store}",
                            args=("--max-leases-per-identity", str(s.scale_leases + 10_000)))
    addr = server.addr()
    idle = rss_mb(server.pid)
    small = 100
    fill_s = []
    res = loadgen.run("fill", {**addr, "prefix": "bench6/held", "count": small})
    fill_s.append(res["seconds"])
    time.sleep(0.5)
    rss_small = rss_mb(server.pid)
    probe_small = loadgen.run("probe", {**addr, "prefix": "bench6/p100", "samples": 300})
    big = s.scale_leases
    res = loadgen.run("fill", {**addr, "prefix": "bench6/held", "start": small,
                               "count": big - small, "connections": 32}, timeout=1800)
    fill_s.append(res["seconds"])
    errors = res["errors"]
    time.sleep(0.5)
    rss_big = rss_mb(server.pid)
    probe_big = loadgen.run("probe", {**addr, "prefix": "bench6/pbig", "samples": 300})
    store_mb = None
    if store == "postgres":
        dsn = server.extra["store"].replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(dsn) as conn:
            store_mb = conn.execute(
                "SELECT pg_total_relation_size('lockd.locks')").fetchone()[0] / 2**20
            held = conn.execute("SELECT count(*) FROM lockd.locks WHERE expires_at > now()"
                                " AND name LIKE 'bench6/held/%'").fetchone()[0]
    else:
        held = None
    per_lease = (rss_big - rss_small) * 2**20 / (big - small)
    section = Section(
        "6", f"Scale: lockd ({store}) holding {big:,} leases",
        f"the same lockd process holding {small} leases",
        [("figure", "str"), (f"at {small}", "num"), (f"at {big:,}", "num"), ("×", "x")])
    a50, b50 = pct(probe_small["acquire_ms"], 50), pct(probe_big["acquire_ms"], 50)
    a99, b99 = pct(probe_small["acquire_ms"], 99), pct(probe_big["acquire_ms"], 99)
    section.rows += [
        ["lockd resident memory, MiB", rss_small, rss_big, ratio(rss_big, rss_small)],
        ["acquire latency p50, ms (1 client)", a50, b50, ratio(b50, a50)],
        ["acquire latency p99, ms (1 client)", a99, b99, ratio(b99, a99)],
    ]
    section.notes.append(f"Memory per held lease in lockd: {per_lease:.0f} bytes "
                         f"((RSS at {big:,} − RSS at {small}) / {big - small:,}); idle lockd "
                         f"{idle:.1f} MiB. Leases live in the store, not in lockd's memory.")
    if store_mb is not None:
        section.notes.append(f"PostgreSQL table lockd.locks with its index: {store_mb:.1f} MiB "
                             f"({store_mb * 2**20 / big:.0f} bytes a lock); {held:,} leases "
                             "live at the end.")
    section.notes.append(f"Filling took {sum(fill_s):.1f} s ({(big - small) / fill_s[-1]:,.0f} "
                         f"acquires/s over 32 connections), {errors} errors.")
    section.data = {"rss_idle_mb": idle, "rss_small_mb": rss_small, "rss_big_mb": rss_big,
                    "bytes_per_lease": per_lease, "store_mb": store_mb, "fill_s": fill_s,
                    "errors": errors, "acquire_ms_small": [a50, a99],
                    "acquire_ms_big": [b50, b99]}
    server.stop()
    return section


# --- 7. load -----------------------------------------------------------------------------------

_WARM_WAITERS = WARM_WAITERS  # the warm-up round, as ``bench.waiter_memory`` runs it


def load(bench: Bench, store: str = "postgres", baseline: Section | None = None) -> Section:
    s = bench.settings
    # Every waiter has its own connection, plus the admin one: above lockd's default cap of
    # 1,000 open connections the last waiter would be refused with 503 (and counted an error).
    server = bench.ws.lockd(store, f"lockd-load-{store}",
                            env={"LOCKD_MAX_CONNECTIONS": str(s.load_waiters + 64)})
    fresh = rss_mb(server.pid)
    mgr = loadgen.manager()
    # A first round of waiters queued and served pays lockd's one-time costs (the store pool's
    # connections, caches, lazily built validators), so the per-waiter figure is what a waiter
    # holds, not what lockd allocates once.
    loadgen.run("queue_load", {
        **server.addr(), "prefix": "bench7warm", "locks": s.load_locks,
        "waiters": _WARM_WAITERS, "hold_ms": 2, "queued": mgr.Event()})
    idle = rss_mb(server.pid)
    queued = mgr.Event()
    proc, out = loadgen.start_job("queue_load", {
        **server.addr(), "prefix": "bench7", "locks": s.load_locks, "waiters": s.load_waiters,
        "hold_ms": 2, "queued": queued})
    peak = idle
    while not queued.is_set():
        if proc.exitcode is not None:
            break
        peak = max(peak, rss_mb(server.pid))
        time.sleep(0.2)
    queued_rss = rss_mb(server.pid)
    res = loadgen._get(out, [proc], 600)
    proc.join(10)
    if "fatal" in res:
        raise RuntimeError(res["fatal"])
    after = rss_mb(server.pid)
    p50, p99 = pct(res["handoffs_ms"], 50), pct(res["handoffs_ms"], 99)
    base = None
    label = {"postgres": "lockd · PostgreSQL", "sqlite": "lockd · SQLite"}.get(store)
    if baseline is not None and label in baseline.data:
        base = baseline.data[label]["p99_ms"]
    section = Section(
        "7", f"Load: {s.load_waiters:,} waiting acquires over {s.load_locks} locks, lockd "
             f"({store})",
        f"memory: the same lockd idle after a warm-up round; handoff: {label} with 16 "
        "waiters (section 2)",
        [("figure", "str"), ("value", "str"), ("×", "x")])
    section.rows += [
        ["served in first-come order per lock", "yes" if res["fifo"] else "NO", None],
        ["waiters served", fmt(res["served"], "int"), None],
        ["errors / dropped connections", fmt(res["errors"], "int"), None],
        ["lockd RSS fresh, MiB", fmt(fresh, "mb"), None],
        [f"lockd RSS idle after {_WARM_WAITERS} waiters served, MiB", fmt(idle, "mb"),
         ratio(idle, fresh)],
        [f"lockd RSS with {s.load_waiters:,} queued, MiB", fmt(queued_rss, "mb"),
         ratio(queued_rss, idle)],
        ["lockd RSS after, MiB", fmt(after, "mb"), ratio(after, idle)],
        ["handoff p50 ms", fmt(p50, "ms"), None],
        ["handoff p99 ms", fmt(p99, "ms"), ratio(p99, base)],
        ["seconds to serve everyone", fmt(res["serve_s"], "num"), None],
    ]
    section.data = {k: v for k, v in res.items() if k != "handoffs_ms"}
    section.data.update({"rss_fresh_mb": fresh, "rss_idle_mb": idle, "rss_queued_mb": queued_rss,
                         "rss_after_mb": after,
                         "rss_peak_while_queueing_mb": max(peak, queued_rss),
                         "handoff_p50_ms": p50, "handoff_p99_ms": p99,
                         "bytes_per_waiter": (queued_rss - idle) * 2**20 / s.load_waiters,
                         "bytes_per_waiter_from_fresh":
                             (queued_rss - fresh) * 2**20 / s.load_waiters})
    section.notes.append(
        "Each waiter has its own connection and is confirmed queued (GET shows the waiter "
        "count) before the next is sent, so the arrival order is known; each holds its grant "
        f"2 ms. Memory per queued waiter: {section.data['bytes_per_waiter']:.0f} bytes "
        f"((RSS queued − RSS idle after the warm-up) / {s.load_waiters:,}); counted from the "
        f"fresh lockd instead, with its one-time first-use costs: "
        f"{section.data['bytes_per_waiter_from_fresh']:.0f} bytes. `python -m "
        "bench.waiter_memory` shows where a waiter's bytes go.")
    if res.get("first_error"):
        section.notes.append(f"first error: {res['first_error']}")
    mgr.shutdown()
    server.stop()
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
