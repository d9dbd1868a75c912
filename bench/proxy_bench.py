"""Section 5: fenced writes through resource-proxy against the same fenced statement sent
straight to PostgreSQL (``proxy``). ``bench.scenarios`` registers it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

from bench import loadgen
from bench.peers import sqlalchemy_url
from bench.report import Section, median, pct, ratio

if TYPE_CHECKING:
    from bench.scenarios import Bench

__all__ = ["FLOOR", "proxy"]

_DIRECT = "direct fenced statement, psycopg (baseline)"
FLOOR = "SQL-PATH FLOOR: BEGIN; claim; UPDATE as one message, then COMMIT (psycopg)"


def proxy(bench: Bench) -> Section:
    from lockd.common.serving.workers import default_workers
    from lockd.tokens import KeyRing
    from resource_proxy.fencing import Fence
    from resource_proxy.policy import load_policy
    from resource_proxy.rows.writes import build_op, set_fence
    from resource_proxy.store import prepare
    from resource_proxy.store.sql import POSTGRES, SqlBuilder

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
        FLOOR: {
            "workload": "fenced_tx_floor", "dsn": dsn, "prefix": "bench5t",
            "table": "bench_sqlfence"},
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
                         "connection per client: the token verified offline, BEGIN and SELECT "
                         "fencing.claim(lock, fence) in one message, the UPDATE of the client's "
                         "row in bench_sqlfence (whose fence trigger, resource_proxy.dbfence, "
                         "checks the claim), COMMIT: three round trips where the baseline sends "
                         "one. 'SQL-PATH FLOOR': the same claim and UPDATE with no lockd code, "
                         "sent with BEGIN as one message (literals), then COMMIT: the two round "
                         "trips a claim travelling with the caller's statement would cost, the "
                         "limit of the fenced_transaction goal.")
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
