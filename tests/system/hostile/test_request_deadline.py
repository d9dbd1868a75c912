"""The request deadline (``--request-timeout-ms``) bounds how long a request takes to ARRIVE,
not how long it takes to answer: a waiting acquire outlives it; a pipelined half-sent request
behind a complete one does not."""

from __future__ import annotations

import socket
import time

import httpx

from harness import free_port
from harness.servers import LockdServer
from tests.server.calls import acquire


def test_waiting_is_not_arriving_and_pipelining_is_no_loophole(tmp_path, http):
    lockd = LockdServer(f"sqlite:///{tmp_path}/r.db", key_dir=tmp_path / "keys", log_dir=tmp_path,
                        port=free_port(), env={"LOCKD_REQUEST_TIMEOUT_MS": "300"}).start()
    try:
        holder = acquire(http, lockd.url, "deadline/a", 1_000).json()
        started = time.monotonic()
        waited = acquire(http, lockd.url, "deadline/a", 1_000, wait_ms=5_000)
        assert waited.status_code == 200, waited.text  # granted at the holder's expiry, ~1 s
        assert waited.json()["fence"] > holder["fence"]
        assert time.monotonic() - started > 0.6

        with socket.create_connection(("127.0.0.1", lockd.port)) as s:
            s.settimeout(5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"POST /v1/locks/deadline/b/acquire HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 40\r\n\r\n{\"ttl")
            start, data = time.monotonic(), b""
            while chunk := s.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1, data
            assert time.monotonic() - start < 1.5
        assert httpx.get(f"{lockd.url}/v1/locks/deadline/b").json()["held"] is False
    finally:
        lockd.stop()
