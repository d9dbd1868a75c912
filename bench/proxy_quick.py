"""Quick throughput check of the proxy's hot path on PostgreSQL (not a test; prints figures).

Two measurements, each ``--seconds`` long at ``--clients`` concurrent clients (default 8):

1. *proxy*: fenced single-row writes (``PUT /v1/tables/bench_rows/rows/{k}`` with a
   ``Fencing-Token``) through a ``resource-proxy serve`` process. Each client owns one lock and
   one row. The load comes from a separate process speaking minimal HTTP/1.1 keep-alive over
   asyncio sockets, so the client costs little of the machine's CPU.
2. *direct*: the very statement the proxy sends for that write (fence upsert + upsert in one
   CTE, autocommit) straight from ``--clients`` psycopg threads, no HTTP.

    .venv/bin/python bench/proxy_quick.py [--seconds 5] [--clients 8] [--dsn postgresql://…]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cpu import process_seconds  # noqa: E402
from harness import (  # noqa: E402
    PG_ADMIN_DSN,
    VENV_BIN,
    ServiceProcess,
    create_database,
    drop_database,
    free_port,
)
from lockd.tokens import KeyRing  # noqa: E402
from resource_proxy.fencing import Fence  # noqa: E402
from resource_proxy.rows.tables import Column, Kind, Table  # noqa: E402
from resource_proxy.rows.writes import build_op, set_fence  # noqa: E402
from resource_proxy.store.sql import POSTGRES, SqlBuilder  # noqa: E402

DDL = "CREATE TABLE bench_rows (id bigint PRIMARY KEY, v bigint NOT NULL, last_fence bigint)"


async def _client(port: int, request: bytes, deadline: float, counts: list[int], i: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.monotonic() < deadline:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        counts[i] += 1
    writer.close()


def _load(port: int, tokens: list[str], seconds: float, queue: multiprocessing.Queue) -> None:
    async def run() -> int:
        counts = [0] * len(tokens)
        deadline = time.monotonic() + seconds
        requests = []
        for i, token in enumerate(tokens):
            body = json.dumps({"v": i}).encode()
            requests.append(
                f"PUT /v1/tables/bench_rows/rows/{i} HTTP/1.1\r\nHost: x\r\n"
                f"Fencing-Token: {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body
            )
        await asyncio.gather(*(_client(port, r, deadline, counts, i) for i, r in enumerate(requests)))
        return sum(counts)

    queue.put(asyncio.run(run()))


def bench_proxy(dsn: str, policy: Path, clients: int, seconds: float) -> tuple[float, float]:
    ring = KeyRing.generate()
    jwks = Path(tempfile.mkstemp(suffix=".json")[1])
    jwks.write_text(json.dumps(ring.jwks()))
    port = free_port()
    argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", dsn,
            "--jwks-file", str(jwks), "--policy", str(policy), "--port", str(port),
            "--log-level", "warning"]
    tokens = [ring.sign(f"bench/{i}", 1) for i in range(clients)]
    with ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz") as proxy:
        queue = multiprocessing.get_context("spawn").Queue()
        _load_in_process(port, tokens, 1.0, queue)  # warm-up (prepared statements, pool)
        queue.get()
        cpu = process_seconds(proxy.pid)
        _load_in_process(port, tokens, seconds, queue)
        done = queue.get()
        cpu = process_seconds(proxy.pid) - cpu
        return done / seconds, cpu / done


def _load_in_process(port, tokens, seconds, queue) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_load, args=(port, tokens, seconds, queue))
    proc.start()
    proc.join()


def bench_direct(dsn: str, clients: int, seconds: float) -> float:
    table = Table(
        "bench_rows",
        {
            "id": Column("id", Kind.INTEGER, False, "bigint", int_bits=64),
            "v": Column("v", Kind.INTEGER, False, "bigint", int_bits=64),
            "last_fence": Column("last_fence", Kind.INTEGER, True, "bigint", int_bits=64),
        },
        ("id",),
        "last_fence",
    )
    builder = SqlBuilder(POSTGRES)
    counts = [0] * clients
    deadline = time.monotonic() + 1.0 + seconds
    start_counting = time.monotonic() + 1.0

    def worker(i: int) -> None:
        fence = Fence(f"direct/{i}", 1)
        op = build_op("upsert", table, (i,), {"v": i})
        set_fence(op, fence.fence)
        sql, params = builder.write(op, fence)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while (now := time.monotonic()) < deadline:
                conn.execute(sql, params).fetchone()
                if now >= start_counting:
                    counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--dsn", default=PG_ADMIN_DSN, help="admin DSN; a fresh database is made")
    args = parser.parse_args()
    dsn = create_database(args.dsn, prefix="bench")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
        policy = Path(tempfile.mkstemp(suffix=".yaml")[1])
        # one row, one lock: client i's lock bench/i is the lock of row i
        policy.write_text("tables:\n  bench_rows: {lock: 'bench/{key}', fence_column: last_fence}\n")
        proxy, cpu_per_write = bench_proxy(dsn, policy, args.clients, args.seconds)
        direct = bench_direct(dsn, args.clients, args.seconds)
    finally:
        drop_database(dsn, args.dsn)
    print(f"fenced single-row writes/s at {args.clients} clients, {args.seconds:.0f} s each:")
    print(f"  through resource-proxy (HTTP, PostgreSQL): {proxy:8.0f}/s")
    print(f"  same statement straight from psycopg     : {direct:8.0f}/s")
    print(f"  proxy / direct                           : {proxy / direct:8.2f}")
    print(f"  proxy process CPU per write              : {cpu_per_write * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
