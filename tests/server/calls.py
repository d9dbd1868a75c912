"""Thin HTTP helpers for lockd's tests (plain httpx against a real server, no client library)."""

from __future__ import annotations

from typing import Any

import httpx

from harness import wait_for

__all__ = ["acquire", "renew", "release", "state", "assert_problem", "wait_until"]


def acquire(http: httpx.Client, url: str, name: str, ttl_ms: int = 10_000, **fields: Any
            ) -> httpx.Response:
    return http.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": ttl_ms, **fields})


def renew(http: httpx.Client, url: str, name: str, lease_id: str, **fields: Any) -> httpx.Response:
    return http.post(f"{url}/v1/locks/{name}/renew", json={"lease_id": lease_id, **fields})


def release(http: httpx.Client, url: str, name: str, lease_id: str) -> httpx.Response:
    return http.post(f"{url}/v1/locks/{name}/release", json={"lease_id": lease_id})


def state(http: httpx.Client, url: str, name: str) -> dict[str, Any]:
    r = http.get(f"{url}/v1/locks/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``r`` is an RFC 9457 problem with ``status`` and ``code``; returns the body."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["type"] == f"urn:lockd:problem:{code}", body
    assert body["code"] == code and body["status"] == status, body
    assert isinstance(body["title"], str) and isinstance(body["detail"], str), body
    assert "Traceback" not in r.text
    return body


def wait_until(predicate, timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll ``predicate`` every 5 ms until truthy (``harness.wait_for``); ``AssertionError``
    after ``timeout``, so a wait that never ends fails the test like an assertion."""
    try:
        return wait_for(predicate, timeout=timeout, interval=0.005, what=what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
