"""``lockd serve --workers N``: N processes on one port, one PostgreSQL store.

Real processes, real HTTP, real PostgreSQL and etcd. Which worker a keep-alive connection landed on is
read from ``/proc`` (the worker that holds the server side of the TCP connection), so each test
can put a holder on one worker and a waiter on the other. What ``--workers`` promises (see
``lockd.server.cli``): mutual exclusion and rising fences as for one process (the store decides
every grant), a release on one worker wakes the waiters queued on another (the store's release
notification), and FIFO only among the waiters of one worker. SQLite refuses ``--workers 2``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import ServiceProcess, free_port, wait_for

LOCKD = str(Path(sys.executable).parent / "lockd")


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def _server_side_inode(server_port: int, client_port: int) -> str | None:
    """The inode of the accepted socket ``127.0.0.1:server_port`` ↔ ``client_port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if (int(local.rsplit(":", 1)[1], 16) == server_port
                and int(remote.rsplit(":", 1)[1], 16) == client_port and fields[3] == "01"):
            return fields[9]
    return None


class Conn:
    """One keep-alive HTTP connection to lockd; ``worker``: the pid that accepted it."""

    def __init__(self, port: int, workers: list[int]):
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.get("/healthz")
        client_port = self.http.sock.getsockname()[1]
        inode = wait_for(lambda: _server_side_inode(port, client_port), timeout=5,
                         what="the accepted socket in /proc/net/tcp")
        owners = [pid for pid in workers if inode in _socket_inodes(pid)]
        assert len(owners) == 1, owners
        self.worker = owners[0]

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"content-type": "application/json"}
        self.http.request(method, path, body=data, headers=headers)
        r = self.http.getresponse()
        return r.status, json.loads(r.read() or b"null")

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def post(self, path: str, body: dict) -> tuple[int, Any]:
        return self.request("POST", path, body)

    def close(self) -> None:
        self.http.close()


@contextlib.contextmanager
def _serve_workers(store_url: str, tmp_path: Path):
    """``lockd serve --store store_url --workers 2``: yields (port, worker pids)."""
    port = free_port()
    proc = ServiceProcess([LOCKD, "serve", "--store", store_url, "--port", str(port),
                           "--key-dir", str(tmp_path / "keys"), "--workers", "2"],
                          ready_url=f"http://127.0.0.1:{port}/healthz",
                          log_path=tmp_path / "lockd.log").start(timeout=30)
    try:
        # both workers up: each logs its ready line with its pid
        wait_for(lambda: proc.log().count("lockd listening on") == 2, timeout=20,
                 what="both workers ready")
        workers = _children(proc.pid)
        assert len(workers) == 2, proc.log()
        yield port, workers
    finally:
        assert proc.stop() == 0, proc.log()
        assert "stopping the others" not in proc.log(), proc.log()


@pytest.fixture(params=["postgres", "etcd"])
def two_workers(request, tmp_path):
    """Two workers on a fresh store of each kind that allows them: (port, worker pids)."""
    url = request.getfixturevalue("pg_url" if request.param == "postgres" else "etcd_url")
    with _serve_workers(url, tmp_path) as served:
        yield served


@pytest.fixture
def two_pg_workers(pg_url, tmp_path):
    """Two workers on a fresh PostgreSQL database: (port, worker pids)."""
    with _serve_workers(pg_url, tmp_path) as served:
        yield served


def _conns_on_both(port: int, workers: list[int], per_worker: int) -> dict[int, list[Conn]]:
    """Open connections until each worker holds ``per_worker`` of them (extra ones closed)."""
    by_worker: dict[int, list[Conn]] = {pid: [] for pid in workers}
    for _ in range(200):
        if all(len(c) >= per_worker for c in by_worker.values()):
            return by_worker
        conn = Conn(port, workers)
        if len(by_worker[conn.worker]) < per_worker:
            by_worker[conn.worker].append(conn)
        else:
            conn.close()
    raise AssertionError("200 connections did not reach both workers")


def test_connections_land_on_both_workers_and_stop_is_clean(two_workers):
    port, workers = two_workers
    conns = [Conn(port, workers) for _ in range(16)]
    try:
        # SO_REUSEPORT spreads connections by address hash; 16 all on one: odds 2 in 65536
        assert {c.worker for c in conns} == set(workers)
        for c in conns:
            assert c.get("/healthz")[0] == 200
    finally:
        for c in conns:
            c.close()


def test_release_on_one_worker_wakes_a_waiter_on_the_other(two_workers, name):
    port, workers = two_workers
    by_worker = _conns_on_both(port, workers, 2)
    try:
        last_fence = 0
        for n in range(4):  # both directions, twice
            holder_pid, waiter_pid = workers[n % 2], workers[1 - n % 2]
            holder, (waiter, watcher) = by_worker[holder_pid][0], by_worker[waiter_pid]
            status, held = holder.post(f"/v1/locks/{name}/acquire",
                                       {"ttl_ms": 30_000, "owner": "holder"})
            assert status == 200, held
            assert held["fence"] > last_fence
            result: dict = {}

            def wait_for_lock(waiter=waiter, result=result):
                result["answer"] = waiter.post(f"/v1/locks/{name}/acquire",
                                               {"ttl_ms": 30_000, "wait_ms": 25_000,
                                                "owner": "waiter"})
                result["at"] = time.monotonic()

            thread = threading.Thread(target=wait_for_lock)
            thread.start()
            # the waiter is queued on its own worker (the count is per worker)
            wait_for(lambda watcher=watcher: watcher.get(f"/v1/locks/{name}")[1]["waiters"] == 1,
                     timeout=10, what="the waiter queued on the other worker")
            released_at = time.monotonic()
            status, body = holder.post(f"/v1/locks/{name}/release",
                                       {"lease_id": held["lease_id"]})
            assert status == 200, body
            thread.join(40)
            status, granted = result["answer"]
            assert status == 200, granted
            assert granted["fence"] > held["fence"]  # etcd: revisions, so a jump
            # Woken by the release (the store's notification), not by the holder's 30 s expiry.
            assert result["at"] - released_at < 15, result["at"] - released_at
            status, body = waiter.post(f"/v1/locks/{name}/release",
                                       {"lease_id": granted["lease_id"]})
            assert status == 200, body
            last_fence = granted["fence"]
    finally:
        for conns in by_worker.values():
            for c in conns:
                c.close()


def test_concurrent_acquires_through_both_workers_never_overlap(two_pg_workers, pg_dsn, name):
    port, workers = two_pg_workers
    by_worker = _conns_on_both(port, workers, 6)
    conns = [c for cs in by_worker.values() for c in cs]
    guard = threading.Lock()
    holder: list[str | None] = [None]
    overlaps: list[str] = []
    grants: list[tuple[int, int]] = []  # (fence, worker) in grant order

    def client(conn: Conn) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as db:
            for _ in range(5):
                status, lease = conn.post(f"/v1/locks/{name}/acquire",
                                          {"ttl_ms": 20_000, "wait_ms": 20_000})
                assert status == 200, lease
                with guard:
                    if holder[0] is not None:
                        overlaps.append(f"fence {lease['fence']} granted while {holder[0]} holds")
                    holder[0] = lease["lease_id"]
                    grants.append((lease["fence"], conn.worker))
                # the store itself: one live lease for the lock, and it is this one
                live = db.execute("SELECT lease_id, fence FROM lockd.locks"
                                  " WHERE name = %s AND expires_at > now()", [name]).fetchall()
                assert live == [(lease["lease_id"], lease["fence"])]
                with guard:
                    assert holder[0] == lease["lease_id"]
                    holder[0] = None
                status, body = conn.post(f"/v1/locks/{name}/release",
                                         {"lease_id": lease["lease_id"]})
                assert status == 200, body

    try:
        with ThreadPoolExecutor(len(conns)) as pool:
            for future in [pool.submit(client, c) for c in conns]:
                future.result()
    finally:
        for c in conns:
            c.close()
    assert overlaps == []
    fences = [f for f, _ in grants]
    assert fences == list(range(1, len(conns) * 5 + 1))  # every grant one more, in grant order
    assert {w for _, w in grants} == set(workers)  # both workers handed out grants


def test_sqlite_store_refuses_more_than_one_worker(tmp_path):
    done = subprocess.run([LOCKD, "serve", "--store", f"sqlite:///{tmp_path}/l.db",
                           "--port", str(free_port()), "--key-dir", str(tmp_path / "keys"),
                           "--workers", "2"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done
    assert "--workers: the SQLite store serves from one process" in done.stderr
    assert not (tmp_path / "l.db").exists() and not (tmp_path / "keys").exists()


def test_workers_on_a_port_in_use_exit_1_with_one_line(pg_url, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([LOCKD, "serve", "--store", pg_url, "--port", str(port),
                               "--key-dir", str(tmp_path / "keys"), "--workers", "2"],
                              capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done
    assert f"lockd cannot start: cannot listen on 127.0.0.1:{port}: address already in use" \
        in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
