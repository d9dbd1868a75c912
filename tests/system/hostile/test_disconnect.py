"""A client that disconnects in the middle of its request body costs lockd one
DEBUG line, never an ERROR with a traceback (any client could otherwise flood the logs)."""

from __future__ import annotations

import socket
import time

import httpx

from harness import wait_for


def _half_body_then_close(url: str, path: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n"
                  b'{"ttl_ms": 1000, "owner": "')
        # settles: lockd starts reading the body (the disconnect line awaited below needs it)
        time.sleep(0.2)


def test_a_client_gone_mid_body_is_one_debug_line(lockd_factory, tmp_path, name):
    lockd = lockd_factory(f"sqlite:///{tmp_path}/d.db", env={"LOCKD_LOG_LEVEL": "debug"})
    paths = [f"/v1/locks/{name}/acquire", f"/v1/locks/{name}/renew", f"/v1/locks/{name}/release",
             f"/v1/locks/{name}/force-release"]
    for path in paths:
        _half_body_then_close(lockd.url, path)
    wait_for(lambda: lockd.log().count("client disconnected during the body") >= 3, timeout=5,
             what="the disconnect lines")
    log = lockd.log()
    assert "Traceback" not in log and " ERROR " not in log, log
    lines = [line for line in log.splitlines() if "client disconnected during the body" in line]
    assert len(lines) == 3 and all(" DEBUG " in line for line in lines), lines
    assert httpx.get(f"{lockd.url}/healthz").status_code == 200
