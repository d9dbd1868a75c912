"""The guard's cost, measured against the same write unguarded in the same run (not a test;
prints figures and ratios). Each row runs ``--rounds`` (default 2) of ``--seconds`` (default 3, after a
warm-up) at ``--clients`` concurrent clients (default 8), alternated with its baseline's:

1. *service*: ``PUT /guarded/{i}`` of a FastAPI service (uvicorn, one process) whose route takes
   ``Fenced("bench/{i}")`` and writes one SQLite row inside ``SqliteFences.transaction`` (token
   verified, fence claimed with the write), against ``PUT /plain/{i}``: the same row written in
   a ``BEGIN IMMEDIATE`` transaction of its own, no token. The load comes from a separate
   process speaking HTTP/1.1 keep-alive over asyncio sockets (``bench.proxy_quick``'s client).
   Goal: guarded ≥ 0.7× unguarded.
2. *redis*: ``RedisFences.set`` (one ``FCALL lockd_fenced_set``: check, raise, SET) against a
   plain ``SET`` of the same key, from ``--clients`` threads, each with its own connection, on
   the machine's Redis (``--redis-url``; keys under a fresh prefix, deleted after).
   Goal: fenced ≥ 0.8× plain.

    .venv/bin/python -m bench.guard_quick [service|redis] [--seconds 3] [--clients 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from harness import ServiceProcess, free_port
from lockd.tokens import KeyRing

GOALS = {"service": 0.7, "redis": 0.8}


def create_app(db: str, jwks_file: str) -> Any:
    """The benchmarked service: a guarded and an unguarded route writing the same table."""
    from fastapi import Body, Depends, FastAPI

    from lockd.common.fencerule import Fence
    from lockd.guard import FenceGuard, SqliteFences
    from lockd.guard.web import Fenced, add_problem_handlers

    guard = FenceGuard(jwks=json.loads(Path(jwks_file).read_text()))
    fences, local = SqliteFences(), threading.local()

    def conn() -> sqlite3.Connection:
        c = getattr(local, "conn", None)
        if c is None:
            c = local.conn = sqlite3.connect(db, timeout=30, check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
        return c

    with sqlite3.connect(db) as setup:
        fences.install(setup)
        setup.execute("CREATE TABLE IF NOT EXISTS rows (id TEXT PRIMARY KEY, v TEXT NOT NULL)")
    app = FastAPI()
    add_problem_handlers(app)
    upsert = ("INSERT INTO rows (id, v) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET "
              "v = excluded.v")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.put("/guarded/{i}")
    def guarded(i: str, body: dict = Body(...),
                fence: Fence = Depends(Fenced("bench/{i}", guard=guard))) -> dict:
        c = conn()
        with fences.transaction(c, fence):
            c.execute(upsert, (i, json.dumps(body)))
        return {"fence": fence.fence}

    @app.put("/plain/{i}")
    def plain(i: str, body: dict = Body(...)) -> dict:
        c = conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute(upsert, (i, json.dumps(body)))
        except BaseException:
            c.rollback()
            raise
        c.commit()
        return {"fence": None}

    return app


def _load(port: int, requests: list[bytes], seconds: float, queue: Any) -> None:
    import asyncio

    from bench.proxy_quick import _client

    async def run() -> int:
        counts = [0] * len(requests)
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_client(port, r, deadline, counts, i)
                               for i, r in enumerate(requests)))
        return sum(counts)

    queue.put(asyncio.run(run()))


def _rate(port: int, requests: list[bytes], seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    for length in (1.0, seconds):  # a warm-up, then the counted run
        proc = ctx.Process(target=_load, args=(port, requests, length, queue))
        proc.start()
        done = queue.get()
        proc.join()
    return done / seconds


def bench_service(clients: int, seconds: float, rounds: int = 2) -> dict[str, float]:
    ring = KeyRing.generate()
    work = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    jwks = work / "jwks.json"
    jwks.write_text(json.dumps(ring.jwks()))
    port = free_port()
    argv = [sys.executable, "-m", "bench.guard_quick", "serve", "--port", str(port),
            "--db", str(work / "service.db"), "--jwks", str(jwks)]

    def request(path: str, i: int, token: str | None) -> bytes:
        body = json.dumps({"v": i}).encode()
        header = f"Fencing-Token: {token}\r\n" if token else ""
        return (f"PUT {path}/{i} HTTP/1.1\r\nHost: x\r\n{header}Content-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    with ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz",
                        log_path=work / "service.log") as _:
        plain_requests = [request("/plain", i, None) for i in range(clients)]
        guarded_requests = [request("/guarded", i, ring.sign(f"bench/{i}", 1))
                            for i in range(clients)]
        plain, guarded = [], []
        for _ in range(rounds):  # alternated: the machine's load drifts between rows
            plain.append(_rate(port, plain_requests, seconds))
            guarded.append(_rate(port, guarded_requests, seconds))
    return {"unguarded": sum(plain) / rounds, "guarded": sum(guarded) / rounds}


def bench_redis(url: str, clients: int, seconds: float, rounds: int = 2) -> dict[str, float]:
    import redis

    from lockd.common.fencerule import Fence
    from lockd.guard.redis import RedisFences, install

    prefix = f"bench-guard-{uuid.uuid4().hex[:8]}:"
    admin = redis.Redis.from_url(url)
    install(admin)

    def rate(fenced: bool) -> float:
        counts = [0] * clients
        start = time.monotonic() + 0.5
        deadline = start + seconds

        def worker(i: int) -> None:
            client = redis.Redis.from_url(url)
            fences = RedisFences(client, prefix=prefix + "fence:")
            fence, key = Fence(f"bench/{i}", 1), f"{prefix}{i}"
            while (now := time.monotonic()) < deadline:
                if fenced:
                    fences.set(fence, key, "v")
                else:
                    client.set(key, "v")
                if now >= start:
                    counts[i] += 1
            client.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts) / seconds

    try:
        plain, fenced = [], []
        for _ in range(rounds):  # alternated: the machine's load drifts between rows
            plain.append(rate(False))
            fenced.append(rate(True))
        return {"plain": sum(plain) / rounds, "fenced": sum(fenced) / rounds}
    finally:
        keys = list(admin.scan_iter(match=prefix + "*"))
        if keys:
            admin.delete(*keys)
        admin.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.guard_quick",
                                description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="?", choices=("all", "service", "redis", "serve"), default="all")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds per row (default 2)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--port", type=int, default=0, help="serve: the port")
    p.add_argument("--db", default="", help="serve: the SQLite file")
    p.add_argument("--jwks", default="", help="serve: the JWKS file")
    args = p.parse_args(argv)
    if args.what == "serve":
        import uvicorn

        uvicorn.run(create_app(args.db, args.jwks), host="127.0.0.1", port=args.port,
                    log_level="warning")
        return 0
    rows = []
    if args.what in ("all", "service"):
        r = bench_service(args.clients, args.seconds, args.rounds)
        rows.append(("guarded FastAPI write (SQLite)", "unguarded", r["guarded"], r["unguarded"],
                     GOALS["service"]))
    if args.what in ("all", "redis"):
        r = bench_redis(args.redis_url, args.clients, args.seconds, args.rounds)
        rows.append(("fenced Redis SET (FCALL)", "plain SET", r["fenced"], r["plain"],
                     GOALS["redis"]))
    print(f"{'row':34} {'clients':>7} {'ops/s':>9} {'baseline':>10} {'ops/s':>9} {'ratio':>6} goal")
    for name, base, rate, base_rate, goal in rows:
        ratio = rate / base_rate if base_rate else 0.0
        print(f"{name:34} {args.clients:7d} {rate:9.0f} {base:>10} {base_rate:9.0f} "
              f"{ratio:5.2f}x ≥ {goal}x {'met' if ratio >= goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
