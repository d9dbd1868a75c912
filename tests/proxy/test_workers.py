"""``resource-proxy serve --workers N``: N processes on one port, each with its own pool and key
set, the fence check still one database transaction; SIGTERM stops them all; a dead worker stops
the proxy (fail-stop); SQLite refuses more than one."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import psycopg

from harness import ServiceProcess, free_port, wait_for
from lockd.tokens import KeyRing
from tests.proxy.conftest import PG_SCHEMA, SQLITE_SCHEMA, assert_problem, proxy_argv, write_jwks


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _established(pid: int, port: int) -> int:
    """TCP connections of process ``pid`` accepted on ``port`` (from /proc, no tools needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01" and fields[9] in inodes:
                count += 1
    return count


def _start(pg_dsn: str, tmp_path: Path, ring: KeyRing, workers: int = 2) -> tuple[str, ServiceProcess]:
    port = free_port()
    proc = ServiceProcess(proxy_argv(pg_dsn, port, "--jwks-file", str(write_jwks(tmp_path, ring)),
                                     "--workers", str(workers)),
                          ready_url=f"http://127.0.0.1:{port}/healthz",
                          env={"PROXY_POOL_SIZE": "2"}, log_path=tmp_path / "proxy.log")
    return f"http://127.0.0.1:{port}", proc.start(timeout=30)


def _backends(pg_dsn: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND pid <> pg_backend_pid()").fetchone()[0]


def test_workers_serve_one_port_with_their_own_pools_and_one_fence(pg_dsn, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(PG_SCHEMA)
    ring = KeyRing.generate()
    url, proxy = _start(pg_dsn, tmp_path, ring)
    try:
        workers = _children(proxy.pid)
        assert len(workers) == 2 and all(map(_alive, workers)), proxy.log()
        # each worker opened its own pool of 2 (PROXY_POOL_SIZE): 4 connections in all
        wait_for(lambda: _backends(pg_dsn) == 4, timeout=10, what="both workers' pools")
        # SO_REUSEPORT: the kernel spreads connections over both workers (16 keep-alive
        # clients all on one worker: odds 2 in 65536)
        port = int(url.rsplit(":", 1)[1])
        clients = [httpx.Client(base_url=url) for _ in range(16)]
        try:
            for client in clients:
                assert client.get("/healthz").status_code == 200
            spread = [_established(pid, port) for pid in workers]
            assert sum(spread) == 16 and min(spread) > 0, spread
        finally:
            for client in clients:
                client.close()
        # a fresh connection per request: the kernel spreads them over both workers, and the
        # fence raised through one is honoured by the other (it lives in the database)
        for n in range(1, 11):
            with httpx.Client(base_url=url) as client:
                ok = client.put(f"/v1/tables/items/rows/k{n}", json={"v": "x"},
                                headers={"Fencing-Token": ring.sign("items", 5)})
                assert ok.status_code == 200, ok.text
        for _ in range(10):
            with httpx.Client(base_url=url) as client:
                stale = client.put("/v1/tables/items/rows/k1", json={"v": "old"},
                                   headers={"Fencing-Token": ring.sign("items", 4)})
                body = assert_problem(stale, 409, "stale_token")
                assert body["highest"] == 5
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT count(*), min(v), max(v) FROM items").fetchone() == (10, "x", "x")
    finally:
        code = proxy.stop()
    assert code == 0, proxy.log()
    assert not any(map(_alive, workers)), "SIGTERM stops every worker"


def test_a_worker_that_dies_stops_the_proxy(pg_dsn, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(PG_SCHEMA)
    _, proxy = _start(pg_dsn, tmp_path, KeyRing.generate())
    workers = _children(proxy.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    try:
        assert proxy.proc.wait(15) == 1, proxy.log()
    finally:
        proxy.stop()
    wait_for(lambda: not _alive(workers[1]), timeout=5, interval=0.05,
             what="the other worker to be stopped too")
    assert "exited" in proxy.log()


def test_workers_do_not_outlive_a_killed_parent(pg_dsn, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(PG_SCHEMA)
    _, proxy = _start(pg_dsn, tmp_path, KeyRing.generate())
    workers = _children(proxy.pid)
    assert len(workers) == 2
    proxy.kill()  # SIGKILL: the parent gets no chance to stop them
    wait_for(lambda: not any(map(_alive, workers)), timeout=10, interval=0.05,
             what="every worker to stop (orphans would keep serving the port)")


def test_sqlite_serves_from_one_process(tmp_path):
    db = tmp_path / "r.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(SQLITE_SCHEMA)
    argv = proxy_argv(f"sqlite:///{db}", free_port(), "--jwks-file",
                      str(write_jwks(tmp_path, KeyRing.generate())), "--workers", "2")
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--workers" in refused.stderr
