"""Rotating and retiring the signing key under load: two lockd replicas sharing a PostgreSQL
store and a key directory, two proxies (each fetching the JWKS from its own replica), 20
clients holding, renewing and writing the whole time. No write may be refused for a key reason
(a new key is published before it signs; renewals move leases to it); a token of the retired
key is refused by both proxies once they refreshed their key set (``jwks_max_age_ms``)."""

from __future__ import annotations

import base64
import json
import threading
import time

import httpx

from harness import VENV_BIN, ServiceProcess, drop_database, free_port
from lockd import FencedSession, LockClient
from lockd.server.keydir import list_keys, retire, rotate
from lockd.tokens import KeyRing
from tests.proxy.conftest import assert_problem, make_database

CLIENTS = 20
MAX_TTL_MS = 3000
RELOAD_MS = 200
JWKS_MAX_AGE_MS = 1000


def _kid(token: str) -> str:
    header = token.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["kid"]


class Writer(threading.Thread):
    """Holds ``items/{key}`` (renewed in the background) and writes its row in a loop."""

    def __init__(self, index: int, lockd_url: str, proxy_url: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.key = f"w{index}"
        self.lockd_url, self.proxy_url, self.stop = lockd_url, proxy_url, stop
        self.errors: list[str] = []
        self.writes: list[float] = []  # monotonic time of each acknowledged write
        self.first_token = ""
        self.lease = None

    def run(self) -> None:
        try:
            with LockClient(self.lockd_url) as client, \
                    client.lock(f"items/{self.key}", ttl=1.5, wait=10) as lease, \
                    FencedSession(self.proxy_url, lease) as db:
                self.lease, self.first_token = lease, lease.token
                n = 0
                while not self.stop.is_set():
                    n += 1
                    db.upsert("items", self.key, {"v": str(n)})
                    self.writes.append(time.monotonic())
                    time.sleep(0.02)
        except Exception as exc:  # every failure is one, whatever its kind
            kid = _kid(self.lease.token) if self.lease is not None else "-"
            self.errors.append(f"{self.key}: {type(exc).__name__}: {exc} (token of key {kid} "
                               f"at {time.time():.2f})")


def test_rotate_and_retire_while_clients_hold_renew_and_write(tmp_path, pg_url, pg_admin_dsn,
                                                              lockd_factory):
    keys = tmp_path / "keys"
    old = KeyRing.load_or_create(keys).kid
    env = {"LOCKD_KEY_RELOAD_MS": str(RELOAD_MS), "LOCKD_MAX_TTL_MS": str(MAX_TTL_MS)}
    replicas = [lockd_factory(pg_url, key_dir=keys, env=env) for _ in range(2)]
    db = make_database("postgres", tmp_path, pg_admin_dsn)
    policy = tmp_path / "policy.yaml"
    policy.write_text('tables:\n  items: "items/{key}"\n')
    proxies = []
    try:
        for replica in replicas:
            port = free_port()
            proxies.append(ServiceProcess(
                [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", db.url,
                 "--port", str(port), "--lockd-url", replica.url, "--tables", "items",
                 "--policy", str(policy)],
                ready_url=f"http://127.0.0.1:{port}/healthz", log_path=tmp_path / f"p{port}.log",
                env={"PROXY_JWKS_MAX_AGE_MS": str(JWKS_MAX_AGE_MS)}).start())
        proxy_urls = [p.ready_url.removesuffix("/healthz") for p in proxies]
        stop = threading.Event()
        writers = [Writer(i, replicas[i % 2].url, proxy_urls[(i // 2) % 2], stop)
                   for i in range(CLIENTS)]
        for writer in writers:
            writer.start()
        deadline = time.monotonic() + 20
        while not all(w.writes for w in writers):
            assert time.monotonic() < deadline and not any(w.errors for w in writers), \
                [e for w in writers for e in w.errors]
            time.sleep(0.05)

        # published for longer than a replica's reload plus a proxy's refetch interval (1 s):
        # a proxy that loaded the set just before a replica published the key may refetch
        # again on the new kid only after that interval (2 s more for a loaded test machine)
        new = rotate(keys, publish_delay_s=(RELOAD_MS + 1000) / 1000 + 2.0).kid
        signs_from = next(k.signs_from for k in list_keys(keys) if k.kid == new)
        time.sleep(max(0.0, signs_from + MAX_TTL_MS / 1000 - time.time()) + 0.3)
        assert retire(keys, old, max_ttl_ms=MAX_TTL_MS) == f"retired {old}"  # no --force needed
        retired_at = time.monotonic()
        time.sleep((RELOAD_MS + JWKS_MAX_AGE_MS) / 1000 + 0.8)  # the bounded refresh

        old_token = writers[0].first_token
        assert _kid(old_token) == old
        with httpx.Client(timeout=10) as http:
            for url in proxy_urls:
                refused = http.put(f"{url}/v1/tables/items/rows/{writers[0].key}",
                                   json={"v": "old key"}, headers={"Fencing-Token": old_token})
                assert_problem(refused, 401, "invalid_token")
            for replica in replicas:
                published = {k["kid"] for k in http.get(replica.url + "/v1/keys").json()["keys"]}
                assert published == {new}
        time.sleep(0.3)
        stop.set()
        for writer in writers:
            writer.join(15)
        assert [e for w in writers for e in w.errors] == [], (old, new, signs_from)
        for writer in writers:  # every client went on writing after the retirement
            assert writer.writes[-1] > retired_at + 1, writer.key
            assert _kid(writer.lease.token) == new, writer.key
    finally:
        for proc in proxies:
            proc.stop()
        drop_database(db.dsn, pg_admin_dsn)
