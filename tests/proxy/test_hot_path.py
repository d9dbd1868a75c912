"""The hot path (``resource_proxy.hot``): fenced PUT, PATCH, batch and object PUT served in front of
FastAPI's stack answer exactly as the full stack does, and are really served there.

In process, on a real SQLite file: the same sequence of requests (successes, stale and missing
tokens, bad JSON, an oversized body, unknown tables and routes, a percent-encoded key, an API
key missing) is sent to one app with the hot path and to one without (``_front`` None); every
answer (status, content type, body without its request id) and the rows written must be equal.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from lockd.tokens import KeyRing
from resource_proxy.app import create_app
from resource_proxy.hot import ProxyApp, is_hot_path
from resource_proxy.settings import Settings
from tests.proxy.conftest import write_jwks

API_KEY = "hot-path-test-key"


def _setup(tmp: Path, name: str, ring: KeyRing) -> tuple[ProxyApp, str]:
    db = str(tmp / f"{name}.db")
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (id TEXT PRIMARY KEY, v TEXT, n INTEGER)")
        conn.execute("CREATE TABLE pairs (a INTEGER, b TEXT, v TEXT, PRIMARY KEY (a, b))")
    policy = tmp / f"{name}.yaml"
    policy.write_text('tables:\n  items: "items/{key}"\n  pairs: "pairs/{a}"\n')
    settings = Settings(database_url=f"sqlite:///{db}", jwks_file=write_jwks(tmp, ring),
                        tables=["items", "pairs"], policy=policy, max_body_bytes=2048,
                        api_keys=[API_KEY])
    app = create_app(settings)
    assert isinstance(app, ProxyApp)
    return app, db


def _requests(ring: KeyRing) -> list[tuple[str, str, dict[str, str], bytes]]:
    def auth(lock: str, fence: int) -> dict[str, str]:
        return {"Fencing-Token": ring.sign(lock, fence), "Authorization": f"Bearer {API_KEY}"}

    key = {"Authorization": f"Bearer {API_KEY}"}
    row = json.dumps({"v": "a", "n": 1}).encode()
    batch = json.dumps({"ops": [{"op": "insert", "table": "pairs",
                                 "row": {"a": 1, "b": "x", "v": "p"}},
                                {"op": "update", "table": "pairs", "key": [1, "x"],
                                 "row": {"v": "q"}}]}).encode()
    return [
        ("PUT", "/v1/tables/items/rows/k1", auth("items/k1", 2), row),
        ("PUT", "/v1/tables/items/rows/k1", auth("items/k1", 1), row),  # stale
        ("PUT", "/v1/tables/items/rows/k1", key, row),  # no token
        ("PUT", "/v1/tables/items/rows/k1", {}, row),  # no API key
        ("PUT", "/v1/tables/items/rows/k1", auth("items/k1", 2), b"{not json"),
        ("PUT", "/v1/tables/items/rows/k1", auth("items/k1", 2), b'{"v": "' + b"x" * 4096 + b'"}'),
        ("PUT", "/v1/tables/items/rows/k1", {**key, "Fencing-Token": "x" * 5000}, row),
        ("PUT", "/v1/tables/items/rows/k1", auth("items/k2", 3), row),  # another lock's token
        ("PUT", "/v1/tables/nope/rows/k1", auth("items/k1", 2), row),
        ("PUT", "/v1/tables/items/rows/a%2Fb", auth("items/a%2Fb", 1), row),
        ("PUT", "/v1/tables/items/rows/", auth("items/", 1), row),
        ("PATCH", "/v1/tables/items/rows/k1", auth("items/k1", 2), b'{"n": 7}'),
        ("PATCH", "/v1/tables/items/rows/k1", auth("items/k1", 3), b'{"zz": 7}'),
        ("PATCH", "/v1/tables/items/rows/missing", auth("items/missing", 1), b'{"n": 7}'),
        ("POST", "/v1/batch", auth("pairs/1", 1), batch),
        ("POST", "/v1/batch", auth("pairs/1", 1), b'{"ops": 3}'),
        ("POST", "/v1/batch", auth("pairs/1", 0), batch),
        ("POST", "/v1/batch/", auth("pairs/1", 1), batch),  # not a route
        ("DELETE", "/v1/tables/items/rows/k1", auth("items/k1", 3), b""),  # not hot
        ("GET", "/v1/tables/items/rows/a%2Fb", key, b""),  # not hot
        ("PUT", "/v1/objects/b/k/x", auth("b", 1), b"x"),  # hot (no objects served here: 404)
        ("GET", "/v1/objects/b/k/x", key, b""),  # not hot
    ]


async def _run(app: ProxyApp, requests: list, seen: list[dict[str, Any]]) -> list[tuple]:
    async def recording(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)
        await app(scope, receive, send)

    answers = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=recording)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            for method, path, headers, body in requests:
                r = await client.request(method, path, headers=headers, content=body)
                answer: Any = r.text
                if r.headers.get("content-type", "").endswith("json"):
                    answer = r.json()
                    if isinstance(answer, dict):
                        answer.pop("request_id", None)
                        answer.pop("instance", None)
                answers.append((method, path, r.status_code,
                                r.headers.get("content-type"), answer))
    return answers


def _rows(db: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return (conn.execute("SELECT * FROM items ORDER BY id").fetchall()
                + conn.execute("SELECT * FROM pairs ORDER BY a, b").fetchall())


def test_hot_path_answers_as_the_full_stack_does(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    hot, hot_db = _setup(tmp_path, "hot", ring)
    full, full_db = _setup(tmp_path, "full", ring)
    full._front = None  # every request through FastAPI's stack
    requests = _requests(ring)
    hot_seen: list[dict[str, Any]] = []
    full_seen: list[dict[str, Any]] = []
    hot_answers = asyncio.run(_run(hot, requests, hot_seen))
    full_answers = asyncio.run(_run(full, requests, full_seen))
    for h, f in zip(hot_answers, full_answers, strict=True):
        assert h == f
    statuses = [a[2] for a in hot_answers]
    assert statuses[0] == 200 and statuses[11] == 200 and statuses[14] == 200, hot_answers
    assert 409 in statuses and 413 in statuses and 401 in statuses, hot_answers
    assert _rows(hot_db) == _rows(full_db) != []
    # served by the hot path: no router saw the request (Starlette's router marks the scope)
    for (method, path, *_), scope in zip(requests, hot_seen, strict=True):
        hot_route = method in ("PUT", "PATCH") or path == "/v1/batch"
        assert ("router" not in scope) == hot_route, (method, path)
    # (the request without an API key is refused before any routing, on either path)
    assert all("router" in scope for scope, a in zip(full_seen, full_answers, strict=True)
               if a[2] != 401)


def test_is_hot_path_matches_only_the_hot_routes() -> None:
    def scope(method: str, path: str) -> dict[str, Any]:
        return {"type": "http", "method": method, "path": path, "root_path": ""}

    assert is_hot_path(scope("PUT", "/v1/tables/t/rows/k"))
    assert is_hot_path(scope("PATCH", "/v1/tables/t/rows/a/b"))
    assert is_hot_path(scope("POST", "/v1/batch"))
    assert is_hot_path(scope("PUT", "/v1/objects/b/k/x"))
    for method, path in (("GET", "/v1/objects/b/k"), ("HEAD", "/v1/objects/b/k"),
                         ("DELETE", "/v1/objects/b/k"), ("PUT", "/v1/objects/b"),
                         ("GET", "/v1/objects/b"),("GET", "/v1/tables/t/rows/k"), ("DELETE", "/v1/tables/t/rows/k"),
                         ("POST", "/v1/tables/t/rows"), ("PUT", "/v1/tables/t/rows"),
                         ("POST", "/v1/batch/"), ("GET", "/v1/batch"),
                         ("PUT", "/v1/tables/t/lock")):
        assert not is_hot_path(scope(method, path)), (method, path)
    assert not is_hot_path({"type": "lifespan"})
