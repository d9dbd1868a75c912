"""Lock names with an empty, ``.`` or ``..`` segment are invalid everywhere, so a
name means the same lock on every path: 422 at lockd (raw socket: no client rewrote the path),
422 at the proxy's fence routes, and refused by the client library before any request."""

from __future__ import annotations

import socket
import time

import pytest

from lockd.client import LockClient
from lockd.client.errors import ValidationError
from lockd.client.fenced import FencedSession
from lockd.client.lease import Lease
from tests.proxy.conftest import Deployment, assert_problem

BAD = ["a/../b", "a/./b", "..", ".", "a//b", "/a", "a/", "/", "a/b/.."]
GOOD = ["a", "a/b", "a.b/c..d", "...", "a/.b", "jobs:nightly/x-1"]


def test_the_rule():
    from lockd.common.names import is_lock_name

    assert [n for n in BAD if is_lock_name(n)] == []
    assert [n for n in GOOD if not is_lock_name(n)] == []


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_lockd_refuses_dot_segments_sent_as_is(inproc_lockd, http):
    srv = inproc_lockd()
    body = b'{"ttl_ms": 1000}'
    for bad in ("a/../b", "a/./b", "a//b", "a/b/.."):
        answer = _raw(srv.url, b"POST /v1/locks/" + bad.encode() + b"/acquire HTTP/1.1\r\n"
                      b"Host: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert answer.startswith(b"HTTP/1.1 422 "), (bad, answer[:300])
        assert b"invalid_request" in answer
    assert http.get(f"{srv.url}/v1/locks").json()["items"] == []  # nothing was granted


def test_the_proxy_fence_routes_refuse_dot_segments(deployment: Deployment):
    d = deployment
    for bad in ("a/%2E%2E/b", "a/%2E/b", "a//b", "%2E%2E"):
        assert_problem(d.client.get(f"/v1/fences/{bad}"), 422, "invalid_request")
        token = d.token(bad.replace("%2E", "."), 3)
        r = d.client.post(f"/v1/fences/{bad}/claim", headers={"Fencing-Token": token})
        assert_problem(r, 422, "invalid_request")


def test_the_client_library_refuses_them_before_any_request():
    client = LockClient("http://127.0.0.1:9")  # nothing listens: a request would fail otherwise
    for bad in ("a/../b", "a//b", "/a", "a/"):
        with pytest.raises(ValidationError) as info:
            client.try_acquire(bad, 1.0)
        assert info.value.status is None and info.value.code == "invalid_request"
        with pytest.raises(ValidationError):
            client.status(bad)
    lease = Lease(client, {"lock": "x/../y", "lease_id": "l" * 32, "fence": 1, "token": "t.t.t",
                           "ttl_ms": 1000, "owner": ""}, sent_at=time.monotonic())
    with pytest.raises(ValidationError):
        FencedSession("http://127.0.0.1:9", lease).claim()
