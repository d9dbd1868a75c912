"""The worked examples as real servers against a real lockd (and the machine's Redis): the
current holder writes, a superseded one gets 409 ``stale_token`` with ``presented`` and
``highest``, a shared token 403, another lock's token 403, a forged one 401, none 428; the
SQLite example keeps refusing after a restart. And the ASGI middleware on a plain app."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lockd import LockClient
from lockd.guard import FenceGuard
from lockd.guard.web import FenceMiddleware
from lockd.tokens import KeyRing
from tests.guard.services import ExampleService


def _put(url: str, path: str, token: str | None, body: dict) -> httpx.Response:
    headers = {"Fencing-Token": token} if token is not None else {}
    return httpx.put(url + path, json=body, headers=headers, timeout=10)


def _problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code and body["status"] == status
    return body


def exercise(service_url: str, lockd_url: str, lock: str, path: str) -> None:
    with LockClient(lockd_url) as client:
        a = client.acquire(lock, 30, auto_renew=False)
        assert _put(service_url, path, a.token, {"v": "a"}).status_code == 200
        client.release(a)
        b = client.acquire(lock, 30, auto_renew=False)
        assert _put(service_url, path, b.token, {"v": "b"}).status_code == 200
        stale = _problem(_put(service_url, path, a.token, {"v": "a2"}), 409, "stale_token")
        assert (stale["lock"], stale["presented"], stale["highest"]) == (lock, a.fence, b.fence)
        client.release(b)
        shared = client.acquire(lock, 30, auto_renew=False, shared=True)
        _problem(_put(service_url, path, shared.token, {"v": "s"}), 403, "shared_token")
        client.release(shared)
        other = client.acquire(lock + "-other", 30, auto_renew=False)
        _problem(_put(service_url, path, other.token, {"v": "o"}), 403, "lock_not_allowed")
        client.release(other)
    forged = KeyRing.generate().sign(lock, 10**15)
    _problem(_put(service_url, path, forged, {"v": "f"}), 401, "invalid_token")
    _problem(_put(service_url, path, None, {"v": "n"}), 428, "token_required")


def test_orders_sqlite_example(shared_lockd, tmp_path):
    service = ExampleService(tmp_path, "orders_sqlite.py", "--lockd-url", shared_lockd.url,
                             "--db", str(tmp_path / "orders.db")).start()
    try:
        lock = f"orders/{tmp_path.name}"
        path = f"/orders/{tmp_path.name}"
        exercise(service.url, shared_lockd.url, lock, path)
        assert httpx.get(service.url + path).json()["v"] == "b"
        with LockClient(shared_lockd.url) as client:
            old = client.acquire(lock, 30, auto_renew=False)
            client.release(old)
            new = client.acquire(lock, 30, auto_renew=False)
            assert _put(service.url, path, new.token, {"v": "new"}).status_code == 200
            service.restart()  # the fences are in the service's database: still refused
            _problem(_put(service.url, path, old.token, {"v": "old"}), 409, "stale_token")
            client.release(new)
        assert httpx.get(service.url + path).json()["v"] == "new"
    finally:
        service.stop()


def test_cache_redis_example(shared_lockd, redis_client, tmp_path):
    prefix = redis_client.test_prefix
    service = ExampleService(tmp_path, "cache_redis.py", "--lockd-url", shared_lockd.url,
                             "--prefix", prefix).start()
    try:
        exercise(service.url, shared_lockd.url, f"cache/{tmp_path.name}", f"/cache/{tmp_path.name}")
        assert httpx.get(f"{service.url}/cache/{tmp_path.name}").json()["value"] is None
        assert redis_client.get(f"{prefix}{tmp_path.name}") == b"null"  # body {"v": ...}: no value
    finally:
        service.stop()


def test_asgi_middleware_answers_problems_and_passes_the_fence():
    ring = KeyRing.generate()

    async def put(request: Request) -> JSONResponse:
        fence = request.state.fence
        return JSONResponse({"lock": fence.lock, "fence": fence.fence})

    async def free(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    inner = Starlette(routes=[Route("/orders/{order_id}", put, methods=["PUT"]),
                              Route("/free", free, methods=["PUT"])])
    app = FenceMiddleware(inner, FenceGuard(jwks=ring.jwks()),
                          [("PUT", "/orders/{order_id}", "orders/{order_id}")])
    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://service") as http:
            ok = await http.put("/orders/7", headers={"Fencing-Token": ring.sign("orders/7", 3)})
            assert ok.status_code == 200 and ok.json() == {"lock": "orders/7", "fence": 3}
            wrong = await http.put("/orders/8",
                                   headers={"Fencing-Token": ring.sign("orders/7", 3)})
            assert wrong.status_code == 403 and wrong.json()["code"] == "lock_not_allowed"
            shared = await http.put("/orders/7", headers={
                "Fencing-Token": ring.sign("orders/7", 3, extra={"mode": "shared"})})
            assert shared.status_code == 403 and shared.json()["code"] == "shared_token"
            assert (await http.put("/orders/7")).status_code == 428
            assert (await http.put("/free")).json() == {"ok": True}  # not a guarded route

    asyncio.run(calls())


@pytest.mark.parametrize("template,params,expected", [
    ("orders/{order_id}", {"order_id": "42"}, "orders/42"),
    ("t/{a}/{b}", {"a": "x", "b": "y"}, "t/x/y"),
    ("{x.__class__}", {"x": "1"}, "{x.__class__}"),  # only {name}: nothing of str.format
])
def test_lock_templates(template, params, expected):
    from lockd.guard.web import lock_name

    assert lock_name(template, params) == expected
