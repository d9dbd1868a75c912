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

from harness import TIMING_SLACK, VENV_BIN, ServiceProcess, drop_database, free_port, wait_for
from lockd import FencedSession, LockClient
from lockd.server.keydir import list_keys, retire, rotate
from lockd.tokens import KeyRing
from tests.jitter import hold_sync
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
                    hold_sync(None, 0.02)  # write pacing
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

        def all_writing() -> bool:
            assert not any(w.errors for w in writers), [e for w in writers for e in w.errors]
            return all(w.writes for w in writers)

        wait_for(all_writing, timeout=20, interval=0.05, what="every client's first write")

        # published for longer than a replica's reload plus a proxy's refetch interval (1 s):
        # a proxy that loaded the set just before a replica published the key may refetch
        # again on the new kid only after that interval (2 s more for a loaded test machine)
        new = rotate(keys, publish_delay_s=(RELOAD_MS + 1000) / 1000 + 2.0).kid
        signs_from = next(k.signs_from for k in list_keys(keys) if k.kid == new)
        # every token of the old key has expired (its signing ended plus the longest TTL)
        wait_for(lambda: time.time() > signs_from + MAX_TTL_MS / 1000 + 0.3,
                 timeout=MAX_TTL_MS / 1000 + 15, what="the old key's last token to expire")
        assert retire(keys, old, max_ttl_ms=MAX_TTL_MS) == f"retired {old}"  # no --force needed
        retired_at = time.monotonic()
        bound = (RELOAD_MS + JWKS_MAX_AGE_MS) / 1000 + 0.8  # the bounded refresh

        old_token = writers[0].first_token
        assert _kid(old_token) == old
        with httpx.Client(timeout=10) as http:

            def old_key_gone() -> bool:
                published = [{k["kid"] for k in http.get(r.url + "/v1/keys").json()["keys"]}
                             for r in replicas]
                refused = [http.put(f"{url}/v1/tables/items/rows/{writers[0].key}",
                                    json={"v": "old key"}, headers={"Fencing-Token": old_token})
                           for url in proxy_urls]
                return all(p == {new} for p in published) and \
                    all(r.status_code == 401 for r in refused) and refused

            refused = wait_for(old_key_gone, timeout=bound * 3 * TIMING_SLACK, interval=0.05,
                               what="the retired key dropped by every replica and proxy")
            assert time.monotonic() - retired_at < bound * TIMING_SLACK
            for r in refused:
                assert_problem(r, 401, "invalid_token")
        # every client went on writing after the retirement
        wait_for(lambda: all(w.writes[-1] > retired_at + 1 for w in writers), timeout=15,
                 what="every client's write a second after the retirement")
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
