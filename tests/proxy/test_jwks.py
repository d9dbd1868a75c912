"""``--lockd-url``: the proxy reads lockd's JWKS from ``{lockd}/v1/keys`` and refetches it when a
token names a key it does not know (lockd rotated, or started after the proxy), rate limited.

The JWKS is served by a tiny real HTTP server whose document the test swaps, standing in for
lockd's ``GET /v1/keys``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from harness import free_port, wait_for
from lockd.tokens import KeyRing
from tests.proxy.conftest import assert_problem, make_database


class JwksServer:
    """Serves ``self.jwks`` at ``/v1/keys`` and counts the fetches."""

    def __init__(self, port: int | None = None):
        self.jwks: dict = {"keys": []}
        self.fetches = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                if self.path != "/v1/keys":
                    self.send_error(404)
                    return
                outer.fetches += 1
                body = json.dumps(outer.jwks).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: ThreadingHTTPServer | None = None
        self._handler = Handler

    def start(self) -> JwksServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def jwks_server():
    server = JwksServer()
    yield server
    server.stop()


def test_unknown_kid_triggers_a_rate_limited_refetch(jwks_server, tmp_path, start_proxy, monkeypatch):
    old, new, stranger = KeyRing.generate(), KeyRing.generate(), KeyRing.generate()
    db = make_database("sqlite", tmp_path, None)
    # The proxy starts before "lockd" answers: it must come up anyway and fetch keys on demand.
    monkeypatch.setenv("PROXY_JWKS_REFETCH_INTERVAL_MS", "500")
    url, _ = start_proxy(db.url, "--lockd-url", jwks_server.url)
    client = httpx.Client(base_url=url)

    def put(ring: KeyRing, fence: int = 1) -> httpx.Response:
        return client.put("/v1/tables/items/rows/k", json={"v": "x"},
                          headers={"Fencing-Token": ring.sign("items", fence)})  # no policy: lock = table

    assert_problem(put(old), 503, "lockd_unreachable")  # not "unknown key": see below
    jwks_server.jwks = old.jwks()
    jwks_server.start()
    assert wait_for(lambda: put(old).status_code == 200, timeout=10, what="keys fetched from lockd")

    assert_problem(put(new), 401, "invalid_token")  # lockd does not publish it (yet)
    jwks_server.jwks = {"keys": old.jwks()["keys"] + new.jwks()["keys"]}  # lockd rotates
    assert wait_for(lambda: put(new, 2).status_code == 200, timeout=10, what="refetch on the new kid")
    assert put(old, 2).status_code == 200, "tokens of the previous key still verify"

    before, started = jwks_server.fetches, time.monotonic()
    for _ in range(40):  # a flood of tokens signed by a key lockd never published
        assert_problem(put(stranger, 3), 401, "invalid_token")
    elapsed = time.monotonic() - started
    fetched = jwks_server.fetches - before
    assert fetched <= elapsed / 0.5 + 2, f"{fetched} JWKS fetches in {elapsed:.2f} s: not rate limited"
    assert put(new, 3).status_code == 200, "known keys are verified without any fetch"
    client.close()


def test_proxy_started_before_lockd_says_so(jwks_server, tmp_path, start_proxy, monkeypatch):
    """The start-up warning names the JWKS URL; while the keys cannot be fetched a
    token gets 503 lockd_unreachable naming the URL (not 401 "unknown key"); /healthz shows it."""
    ring = KeyRing.generate()
    db = make_database("sqlite", tmp_path, None)
    monkeypatch.setenv("PROXY_JWKS_REFETCH_INTERVAL_MS", "100")
    url, proc = start_proxy(db.url, "--lockd-url", jwks_server.url)
    keys_url = f"{jwks_server.url}/v1/keys"
    warning = [line for line in proc.log().splitlines() if "could not load the JWKS" in line]
    assert len(warning) == 1 and f"could not load the JWKS from {keys_url}: " in warning[0], warning
    with httpx.Client(base_url=url) as client:
        health = client.get("/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "degraded", "jwks": "unavailable",
                                 "server": "resource-proxy"}
        put = client.put("/v1/tables/items/rows/k", json={"v": "x"},
                         headers={"Fencing-Token": ring.sign("items", 1)})
        problem = assert_problem(put, 503, "lockd_unreachable")
        assert problem["jwks_url"] == keys_url and put.headers["retry-after"] == "1"
        assert problem["detail"].startswith(
            f"lockd unreachable: the token's key is unknown and the keys could not be fetched "
            f"from {keys_url} (")
        assert client.get("/v1/tables/items/rows/k").status_code == 404, "nothing was written"
        jwks_server.jwks = ring.jwks()
        jwks_server.start()
        # once past the refetch interval the keys are fetched again and the write goes through
        put = wait_for(lambda: (r := client.put(
            "/v1/tables/items/rows/k", json={"v": "x"},
            headers={"Fencing-Token": ring.sign("items", 1)})).status_code == 200 and r,
            timeout=5, what="a write verified by the refetched keys")
        assert put.status_code == 200, put.text
        assert client.get("/healthz").json() == {"status": "ok", "jwks": "ok", "server": "resource-proxy"}


def test_verified_tokens_are_cached_lru_and_verified_once():
    """A token's first use pays the Ed25519 check, later uses none; when the cache is full the
    least recently used token is evicted (not the hot ones); a rotation clears it."""
    import asyncio

    from resource_proxy.jwks import KeySource

    ring = KeyRing.generate()

    async def load():
        return ring.jwks()

    async def run() -> list[str]:
        keys = KeySource(load, cache_max=2)
        await keys.reload(force=True)
        checked: list[str] = []
        real = keys._verifier.verify

        def counting(token: str):
            checked.append(token)
            return real(token)

        keys._verifier.verify = counting  # type: ignore[method-assign]
        a, b, c = (ring.sign(f"lru/{n}", 1) for n in "abc")
        for token in (a, a, b, a, c):  # c evicts b (least recent), not a
            await keys.verify(token)
        assert checked == [a, b, c]
        assert keys.peek(a) is not None and keys.peek(b) is None
        await keys.verify(a)
        await keys.verify(b)
        return [t[-6:] for t in checked]

    assert len(asyncio.run(run())) == 4
