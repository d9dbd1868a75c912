"""At the proxy: the same connection bounds as lockd (``resource-proxy serve
--request-timeout-ms --max-connections``): half-open connections are closed once the request
timeout passes, and connections beyond the cap are answered 503 ``overloaded`` with
``Retry-After``; the one cut in the middle of its body costs no ERROR traceback (an empty
SQLite database is enough: no request reaches a table)."""

from __future__ import annotations

import socket
import time

import httpx

from lockd.tokens import KeyRing
from tests.proxy.conftest import write_jwks


def _read_all(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything ``s`` receives until the server closes it, and how long that took."""
    s.settimeout(timeout)
    start, data = time.monotonic(), b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


def test_the_proxy_closes_half_open_connections_and_caps_them(start_proxy, tmp_path):
    jwks = write_jwks(tmp_path, KeyRing.generate())
    url, proc = start_proxy(f"sqlite:///{tmp_path}/r.db", "--jwks-file", str(jwks),
                         "--request-timeout-ms", "500", "--max-connections", "4")
    port = int(url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    held[1].sendall(b"GET /healthz HTTP/1.1\r\nHo")  # half the headers
    held[2].sendall(b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    time.sleep(0.1)  # settles: the proxy has taken the four half-open connections
    extra = socket.create_connection(("127.0.0.1", port))
    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer, _ = _read_all(extra, 5)
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"retry-after: 1" in answer.lower() and b"overloaded" in answer
    for s in held:
        data, waited = _read_all(s, 5)
        assert waited < 1.5, "a half-open connection outlived the request timeout"
        s.close()
    extra.close()
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    assert "Traceback" not in proc.log(), "a client gone mid-body is not an error"
