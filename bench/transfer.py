"""Section 8 of ``make bench``: fenced transfers through the proxy (multi-lock batches).

A *transfer* is one two-row transaction: the balances of accounts ``a`` and ``b`` (row ``a`` is
governed by lock ``xfer/a``, row ``b`` by ``xfer/b``) set in one ``POST /v1/batch`` under ONE
multi-lock token holding both locks. The proxy runs: BEGIN, the fence upsert of both locks (one
statement, lock-name order), UPDATE a, UPDATE b, COMMIT. Client ``i`` owns accounts ``2i`` and
``2i + 1`` (its token fences both at 1), so clients do not contend and the figures show the
proxy's cost, not lock waits. Every other cycle sends the ops in the opposite order.

Rows (transfers/s, latency of one transfer, same clients):

- through the proxy: the batch over HTTP;
- the same fenced transaction straight to PostgreSQL with psycopg (the proxy's very statements:
  the two-lock fence upsert and both UPDATEs in one transaction; the baseline);
- a plain two-UPDATE transaction with psycopg, no fence (what fencing costs in the database).

The workloads are registered into ``loadgen.WORKLOADS`` (their generator processes import
``bench.loadgen``, which imports this module's ``WORKLOADS``); ``loadgen`` is imported lazily
here so either module can be imported first.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from bench.report import Section, median, pct, ratio

__all__ = ["WORKLOADS", "transfers"]

TOTAL = 1_000_000
_DDL = ("CREATE TABLE bench_acct (id bigint PRIMARY KEY, balance bigint NOT NULL "
        "CHECK (balance >= 0), last_fence bigint)")
_POLICY = "tables: {bench_acct: {lock: 'xfer/{id}', fence_column: last_fence}}\n"


def _ops(i: int, n: int) -> list[dict[str, Any]]:
    a, b = 2 * i, 2 * i + 1
    x = n % 1000
    ops = [{"op": "update", "table": "bench_acct", "key": a, "row": {"balance": TOTAL - x}},
           {"op": "update", "table": "bench_acct", "key": b, "row": {"balance": x}}]
    return ops[::-1] if n % 2 else ops


async def _proxy_transfer(spec: dict, i: int) -> tuple[Callable[[], Awaitable[None]],
                                                       Callable[[], Awaitable[None]]]:
    """One transfer through the proxy: ``POST /v1/batch`` of two updates, one multi-lock token."""
    from bench.loadgen import Http, HttpError

    http = await Http(spec["host"], spec["port"]).connect()
    headers = f"Fencing-Token: {spec['tokens'][i]}\r\n"
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        status, data = await http.request("POST", "/v1/batch",
                                          json.dumps({"ops": _ops(i, n)}).encode(), headers)
        if status != 200:
            raise HttpError(status, data)

    return cycle, http.close


async def _direct_transfer(spec: dict, i: int) -> tuple[Callable[[], Awaitable[None]],
                                                        Callable[[], Awaitable[None]]]:
    """The same transaction with psycopg: ``spec["fence_sql"]`` (None: no fence check) and the
    two UPDATEs (``spec["update_sql"]``: ``%(v)s`` the balance, ``%(id)s`` the key)."""
    from bench.loadgen import HttpError

    conn = await psycopg.AsyncConnection.connect(spec["dsn"], prepare_threshold=1)
    fence_sql = spec.get("fence_sql")
    fence_params = {"locks": [f"xfer/{2 * i}", f"xfer/{2 * i + 1}"], "fences": [1, 1],
                    "purposes": ["write", "write"]}
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        async with conn.transaction():
            if fence_sql is not None:
                rows = await (await conn.execute(fence_sql, fence_params)).fetchall()
                if any(highest != 1 for _, highest in rows):
                    raise HttpError(409, f"stale fence: {rows}".encode())
            for op in _ops(i, n):
                cur = await conn.execute(spec["update_sql"],
                                         {"v": op["row"]["balance"], "id": op["key"]})
                if await cur.fetchone() is None:
                    raise HttpError(404, b"no such account")

    return cycle, conn.close


WORKLOADS = {"proxy_transfer": _proxy_transfer, "direct_transfer": _direct_transfer}


def transfers(bench: Any) -> Section:
    """Fenced transfers/s through the proxy beside the same transaction straight to PostgreSQL."""
    from bench import loadgen
    from lockd.tokens import KeyRing
    from resource_proxy.store.sql import POSTGRES, SqlBuilder

    s = bench.settings
    most = max(s.proxy_clients)
    dsn = bench.ws.database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_DDL)
        conn.execute("INSERT INTO bench_acct (id, balance) SELECT g, %s FROM "
                     "generate_series(0, %s) g", (TOTAL, 2 * most - 1))
    ring = KeyRing.generate()
    tokens = [ring.sign_many({f"xfer/{2 * i}": 1, f"xfer/{2 * i + 1}": 1}) for i in range(most)]
    server = bench.ws.proxy(dsn, ring.jwks(), _POLICY, name="proxy-transfer")
    update = "UPDATE bench_acct SET balance = %(v)s, last_fence = 1 WHERE id = %(id)s RETURNING id"
    plain = "UPDATE bench_acct SET balance = %(v)s WHERE id = %(id)s RETURNING id"
    baseline = "same fenced transaction, psycopg (baseline)"
    cases: dict[str, dict[str, Any]] = {
        baseline: {"workload": "direct_transfer", "dsn": dsn,
                   "fence_sql": SqlBuilder(POSTGRES).fence_upsert_many(), "update_sql": update},
        "through the proxy (POST /v1/batch, multi-lock token)": {
            "workload": "proxy_transfer", **server.addr(), "tokens": tokens},
        "plain two-UPDATE transaction, no fence, psycopg": {
            "workload": "direct_transfer", "dsn": dsn, "fence_sql": None, "update_sql": plain},
    }
    res: dict[tuple[str, int], list[dict]] = {}
    for _ in range(s.rounds):
        for c in s.proxy_clients:
            for name, spec in cases.items():
                out = loadgen.run_closed({**spec, "warmup": s.warmup, "seconds": s.seconds}, c,
                                         s.procs)
                res.setdefault((name, c), []).append(out)
    section = Section(
        "8", "Fenced transfers: two rows under two locks in one transaction (PostgreSQL)",
        "the same fenced transaction (two-lock fence upsert + two UPDATEs) sent straight to "
        "PostgreSQL with psycopg, same clients",
        [("path", "str"), ("clients", "int"), ("transfers/s", "int"), ("× direct fenced", "x"),
         ("p50 ms", "ms"), ("p99 ms", "ms"), ("errors", "int")])
    for c in s.proxy_clients:
        base = median([x["cycles"] / x["seconds"] for x in res[(baseline, c)]])
        for name in cases:
            runs = res[(name, c)]
            rate = median([x["cycles"] / x["seconds"] for x in runs])
            lat = [v for x in runs for v in x["lat_ms"]]
            section.rows.append([name, c, rate, ratio(rate, base), pct(lat, 50), pct(lat, 99),
                                 sum(x["errors"] for x in runs)])
            section.data[f"{name} @{c}"] = {
                "transfers_per_s": [x["cycles"] / x["seconds"] for x in runs],
                "first_error": next((x["first_error"] for x in runs if x["first_error"]), None)}
    section.notes.append(
        "Client i owns accounts 2i and 2i+1 (locks xfer/2i, xfer/2i+1; one multi-lock token "
        "with fence 1 for both) and sets both balances per transfer, alternating the op order; "
        "no contention between clients. The proxy's transaction is BEGIN, one fence upsert of "
        "both locks, two UPDATEs, COMMIT, as is the baseline's.")
    return section
