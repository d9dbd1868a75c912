"""What a queued acquire holds in lockd: one task, its wait's (memory per waiter).

On lockd's HTTP protocol a waiting acquire is parked: its ASGI call ends and the wait runs as one
task, which the connection's loss cancels (``lockd.common.serving.connections``); on plain uvicorn
it waits inside its request's ASGI call with a second task polling ``receive()``. Both ways (lockd's own HTTP protocol, and plain uvicorn without the
watch) a client that hangs up leaves the queue at once and the rest are served in order.
Figures (bytes per waiter) are in bench/notes/waiters.md, not asserted here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from harness import free_port, wait_for
from lockd.common.serving.server import install_http_protocol
from lockd.server.app import create_app
from lockd.server.settings import Settings
from tests.server.calls import acquire, release, state, wait_until


class _Served:
    """``create_app`` under uvicorn in a thread; ``watch``: with lockd's HTTP protocol (as
    ``lockd serve`` runs it), else uvicorn's plain one."""

    def __init__(self, tmp_path: Path, watch: bool, **options: Any):
        settings = Settings(store=f"sqlite:///{tmp_path}/w.db", key_dir=tmp_path / "keys",
                            port=free_port(), **options)
        self.app = create_app(settings)
        self.url = f"http://127.0.0.1:{settings.port}"
        self.port = settings.port
        config = uvicorn.Config(self.app, host="127.0.0.1", port=settings.port,
                                log_config=None, access_log=False, lifespan="on")
        if watch:
            install_http_protocol(config, settings)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

        def started() -> bool:
            assert self.thread.is_alive(), "the server thread ended before it started"
            return self.server.started

        wait_for(started, timeout=20, interval=0.01, what="the in-process server to start")

    def tasks(self) -> int:
        """How many asyncio tasks the server's loop has now."""
        loop = self.app.state.core.store._loop

        async def count() -> int:
            return len(asyncio.all_tasks())

        return asyncio.run_coroutine_threadsafe(count(), loop).result(10)

    def waiting_frames(self) -> list[list[str]]:
        """For each task now inside ``WaitQueues.acquire``: its coroutines, outermost first."""
        loop = self.app.state.core.store._loop

        async def chains() -> list[list[str]]:
            found = []
            for task in asyncio.all_tasks():
                chain, coro = [], task.get_coro()
                while coro is not None and hasattr(coro, "cr_await"):
                    chain.append(coro.__qualname__)
                    coro = coro.cr_await
                if "WaitQueues.acquire" in chain:
                    found.append(chain)
            return found

        return asyncio.run_coroutine_threadsafe(chains(), loop).result(10)

    def parked_scopes(self) -> list[dict]:
        """The scopes of the requests parked by the server's connections (their keys)."""
        loop = self.app.state.core.store._loop

        async def scopes() -> list[dict]:
            return [dict.fromkeys(c.cycle.scope) for c in self.server.server_state.connections
                    if c.cycle is not None and not c.cycle.response_complete]

        return asyncio.run_coroutine_threadsafe(scopes(), loop).result(10)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)


@pytest.fixture(params=[True, False], ids=["watch", "polling"])
def served(request: pytest.FixtureRequest, tmp_path: Path):
    server = _Served(tmp_path, request.param)
    yield server
    server.stop()


def _send_acquire(port: int, name: str, owner: str) -> socket.socket:
    """A waiting acquire on a raw connection (closing it is a client going away)."""
    body = json.dumps({"ttl_ms": 10_000, "wait_ms": 60_000, "owner": owner}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/locks/{name}/acquire HTTP/1.1\r\nHost: t\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    return sock


def _response(sock: socket.socket) -> dict:
    sock.settimeout(20)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return json.loads(rest[:length])


def test_a_queued_acquire_has_no_task_of_its_own_and_leaves_when_its_client_hangs_up(served):
    name = "footprint/one"
    with httpx.Client(timeout=30) as http:
        holder = acquire(http, served.url, name, owner="holder").json()
        before = served.tasks()
        socks = []
        for i in range(5):
            socks.append(_send_acquire(served.port, name, f"w{i}"))
            wait_until(lambda i=i: state(http, served.url, name)["waiters"] == i + 1,
                       what=f"waiter {i} queued")
        extra = served.tasks() - before
        if served.server.config.http != "auto":  # lockd's protocol: the wait's task only
            assert extra == 5, extra
        else:  # plain uvicorn: the request's task, the work and a receive() watcher
            assert extra == 15, extra
        socks.pop(1).close()  # the second waiter hangs up
        wait_until(lambda: state(http, served.url, name)["waiters"] == 4, timeout=2,
                   what="the hung-up waiter removed")
        assert state(http, served.url, name)["waiting_owners"] == ["w0", "w2", "w3", "w4"]
        lease_id = holder["lease_id"]
        for owner, sock in zip(["w0", "w2", "w3", "w4"], socks, strict=True):
            assert release(http, served.url, name, lease_id).status_code == 200
            lease = _response(sock)
            assert lease["owner"] == owner
            lease_id = lease["lease_id"]
            sock.close()
        assert release(http, served.url, name, lease_id).status_code == 200
        wait_until(lambda: served.tasks() <= before, what="no task left behind")
        assert state(http, served.url, name)["waiters"] == 0


def test_requests_pipelined_behind_a_waiting_acquire_are_answered_in_order(served):
    name = "footprint/pipelined"
    with httpx.Client(timeout=30) as http:
        holder = acquire(http, served.url, name, owner="holder").json()
        body = json.dumps({"ttl_ms": 10_000, "wait_ms": 60_000, "owner": "piped"}).encode()
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(f"POST /v1/locks/{name}/acquire HTTP/1.1\r\nHost: t\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                         .encode() + body
                         + f"GET /v1/locks/{name} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
                         + b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            wait_until(lambda: state(http, served.url, name)["waiters"] == 1, what="queued")
            assert release(http, served.url, name, holder["lease_id"]).status_code == 200
            sock.settimeout(20)
            data = b""
            while data.count(b"HTTP/1.1 200") < 3:
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
        first, second, third = data.split(b"HTTP/1.1 200")[1:]
        assert b'"owner":"piped"' in first and b'"lease_id"' in first
        assert b'"held":true' in second and b'"owner":"piped"' in second
        assert b'"status":"ok"' in third


def test_a_parked_acquire_keeps_no_asgi_frame_and_its_answer_goes_through_the_middleware(served):
    """With lockd's protocol the request's ASGI call ends while it waits: only the wait's own
    coroutines remain (no middleware, handler or uvicorn frame), the parked request's scope is
    cut down to what its answer needs, and the late answer still carries the request id."""
    if served.server.config.http == "auto":
        pytest.skip("plain uvicorn: the wait runs inside the request's ASGI call")
    name = "footprint/frames"
    with httpx.Client(timeout=30) as http:
        holder = acquire(http, served.url, name, owner="holder").json()
        body = json.dumps({"ttl_ms": 10_000, "wait_ms": 60_000, "owner": "w"}).encode()
        sock = socket.create_connection(("127.0.0.1", served.port))
        sock.sendall(f"POST /v1/locks/{name}/acquire HTTP/1.1\r\nHost: t\r\n"
                     f"X-Request-Id: parked-1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: state(http, served.url, name)["waiters"] == 1, what="queued")
        asleep = [["LockService.acquire", "WaitQueues.acquire"]]  # (not asking the store now)
        wait_until(lambda: served.waiting_frames() == asleep, what="asleep with no ASGI frame")
        scopes = served.parked_scopes()
        assert scopes and all("headers" not in scope for scope in scopes), scopes
        assert release(http, served.url, name, holder["lease_id"]).status_code == 200
        sock.settimeout(20)
        data = b""
        while b'"lease_id"' not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and b"x-request-id: parked-1" in data.lower()
        assert b'"owner":"w"' in data
        sock.close()


def _outcomes(http: httpx.Client, url: str) -> dict[str, float]:
    text = http.get(f"{url}/metrics").text
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^lockd_acquires_total\{outcome="(\w+)"\} (\S+)', text, re.M)}


def test_a_parked_waiter_counts_against_its_identity_until_it_hangs_up_then_is_a_499(
        tmp_path, caplog):
    """Parked requests keep the per-identity waiter limit, the 499 log line and the acquire
    metrics of a wait inside the ASGI call."""
    caplog.set_level(logging.INFO, logger="lockd.server.core.answers")
    served = _Served(tmp_path, True, max_waiters_per_identity=1)
    name = "footprint/limits"
    try:
        with httpx.Client(timeout=30) as http:
            holder = acquire(http, served.url, name, owner="holder").json()
            before = _outcomes(http, served.url)
            first = _send_acquire(served.port, name, "first")
            wait_until(lambda: state(http, served.url, name)["waiters"] == 1, what="queued")
            assert acquire(http, served.url, name, owner="x", wait_ms=5_000).status_code == 429
            first.close()
            wait_until(lambda: state(http, served.url, name)["waiters"] == 0, what="gone")
            wait_until(lambda: "client went away while waiting for lock 'footprint/limits'"
                       in caplog.text, what="the 499 logged")
            second = _send_acquire(served.port, name, "second")  # the slot was given back
            wait_until(lambda: state(http, served.url, name)["waiters"] == 1, what="queued")
            assert release(http, served.url, name, holder["lease_id"]).status_code == 200
            assert _response(second)["owner"] == "second"
            second.close()
            after = _outcomes(http, served.url)
            assert after.get("granted", 0) - before.get("granted", 0) == 1
            assert after.get("error", 0) - before.get("error", 0) >= 2  # the 499 and the 429
    finally:
        served.stop()
