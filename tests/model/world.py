"""The real things the model test drives: one lockd, one resource-proxy, one protected database.

``World`` is what the state machine talks to: lockd's HTTP API (an admin key for
force-release), the proxy's HTTP API, and ``lockd.fenced_transaction`` on a connection of its
own to the proxy's PostgreSQL database (fence triggers installed by ``resource-proxy db
install``). ``pass_time`` makes shortened leases run out: on SQLite it moves lockd's injectable
clock; on PostgreSQL and etcd real time passes and the caller waits for the condition.
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg

from harness import VENV_BIN, ServiceProcess, free_port, wait_for
from lockd.client.errors import FencingError, LockClientError
from lockd.client.sqlfence import fenced_transaction
from lockd.tokens import Claims, InvalidToken, Verifier
from tests.model.names import POLICY, SCHEMA, TABLES

__all__ = ["ADMIN_KEY", "World", "install_database", "start_proxy"]

ADMIN_KEY = "model-admin-key-0123456789abcdef"


class InfrastructureError(RuntimeError):
    """A server answered 5xx or not at all: not a rule broken, the test cannot go on."""


@dataclass
class World:
    """One store's lockd, the proxy in front of the database, and how time passes there.

    ``expiries``: how many expiries one run may ask for (None: any number; each costs real time
    on PostgreSQL and etcd, about a second on etcd, whose leases last whole seconds).
    ``short_ttl_ms``: the TTL a lease is renewed with before it is left to run out.
    """

    store: str
    lockd_url: str
    proxy_url: str
    dsn: str
    advance: Callable[[float], None] | None = None
    expiries: int | None = None
    short_ttl_ms: int = 100
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))
    _runs: itertools.count = field(default_factory=lambda: itertools.count(1))
    _conn: psycopg.Connection | None = None
    _verifier: Verifier | None = None

    def new_run(self) -> str:
        return f"r{next(self._runs)}"

    def close(self) -> None:
        self.http.close()
        if self._conn is not None:
            self._conn.close()

    # --- lockd ---------------------------------------------------------------------------

    def post(self, path: str, body: dict[str, Any] | None = None, *,
             admin: bool = False) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"} if admin else {}
        try:
            response = self.http.post(self.lockd_url + path, json=body or {}, headers=headers)
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"POST {path}: {exc!r}") from exc
        return _checked(f"POST {path}", response)

    def get(self, path: str, *, refusable: bool = False) -> dict[str, Any] | None:
        """The 200 answer's body; None for a 422 if ``refusable`` (a reserved name)."""
        try:
            response = self.http.get(self.lockd_url + path)
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"GET {path}: {exc!r}") from exc
        _checked(f"GET {path}", response)
        if refusable and response.status_code == 422:
            return None
        if response.status_code != 200:
            raise InfrastructureError(f"GET {path}: {response.status_code} {response.text}")
        return response.json()

    def claims(self, token: str) -> Claims:
        """The claims of a token lockd signed: verified (keys fetched once), or, if a verifier
        refuses them (``refusal`` says why), as the token's payload states them."""
        try:
            return self._verifier_of_lockd().verify(token)
        except InvalidToken:
            return _unverified(token)

    def refusal(self, token: str) -> str | None:
        """Why a verifier refuses ``token`` (None: it does not)."""
        try:
            self._verifier_of_lockd().verify(token)
        except InvalidToken as exc:
            return str(exc)
        return None

    def _verifier_of_lockd(self) -> Verifier:
        if self._verifier is None:
            self._verifier = Verifier(self.get("/v1/keys"))
        return self._verifier

    def pass_time(self, seconds: float) -> None:
        """SQLite: move lockd's clock; elsewhere the caller waits for the store's own clock."""
        if self.advance is not None:
            self.advance(seconds)

    def wait(self, predicate: Callable[[], Any], what: str) -> None:
        wait_for(predicate, timeout=20.0, interval=0.05, what=what)

    # --- the protected rows --------------------------------------------------------------

    def claim(self, lock: str, token: str) -> httpx.Response:
        """``POST /v1/fences/{lock}/claim`` at the proxy (a claim-for-read for a shared token)."""
        path = f"/v1/fences/{lock}/claim"
        try:
            response = self.http.post(self.proxy_url + path,
                                      headers={"Fencing-Token": token})
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"POST {path}: {exc!r}") from exc
        return _checked(f"proxy POST {path}", response)

    def proxy_write(self, table: str, key: tuple[object, ...], value: int,
                    token: str) -> httpx.Response:
        """``PUT`` the row (insert or replace) through the proxy with ``token``."""
        path = f"/v1/tables/{table}/rows/" + ",".join(quote(str(k), safe="") for k in key)
        try:
            response = self.http.put(self.proxy_url + path, json={"v": value},
                                     headers={"Fencing-Token": token})
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"PUT {path}: {exc!r}") from exc
        return _checked(f"proxy PUT {path}", response)

    def sql_write(self, table: str, columns: tuple[str, ...], key: tuple[object, ...],
                  value: int, token: str) -> str | None:
        """Upsert the row in ``fenced_transaction(conn, token)``: None if it committed, else
        the refusal: the class name of the client's fencing error (``StaleTokenError``: a claim
        was below the highest; ``LockNotClaimedError``: the trigger refused a row of a lock this
        transaction did not claim; any other refusal), or the SQLSTATE of a fence error
        (class ``LF``) the client did not translate."""
        conn = self._connection()
        names = ", ".join(columns)
        sql = (f"INSERT INTO {table} ({names}, v) VALUES ({', '.join(['%s'] * len(key))}, %s)"
               f" ON CONFLICT ({names}) DO UPDATE SET v = excluded.v")
        try:
            with fenced_transaction(conn, token, lockd_url=self.lockd_url):
                conn.execute(sql, (*key, value))
        except FencingError as exc:
            return type(exc).__name__
        except LockClientError as exc:
            raise InfrastructureError(f"fenced write of {table} {key}: {exc!r}") from exc
        except psycopg.Error as exc:
            if (exc.sqlstate or "").startswith("LF"):
                return f"SQLSTATE {exc.sqlstate}"
            raise InfrastructureError(f"fenced write of {table} {key}: {exc!r}") from exc
        return None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn)
        return self._conn


def _unverified(token: str) -> Claims:
    """A token's claims as its payload states them, unchecked."""
    payload = token.split(".")[1]
    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    if "locks" in doc:
        return Claims(None, None, "", dict(doc["locks"]), multi=True,
                      shared=frozenset(doc.get("shared", [])))
    lock, fence = doc.get("lock"), doc.get("fence")
    shared = frozenset((lock,)) if doc.get("mode") == "shared" else frozenset()
    return Claims(lock, fence, "", {lock: fence}, shared=shared)


def _checked(what: str, response: httpx.Response) -> httpx.Response:
    if response.status_code >= 500:
        raise InfrastructureError(f"{what}: {response.status_code} {response.text}")
    return response


def install_database(dsn: str, directory: Path) -> Path:
    """The model's tables in the (empty) database at ``dsn``, the fence triggers installed by
    ``resource-proxy db install``; returns the policy file."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    policy = directory / "model-policy.yaml"
    policy.write_text(POLICY)
    done = subprocess.run([str(VENV_BIN / "resource-proxy"), "db", "install", "--database-url",
                           dsn, "--policy", str(policy), "--tables", ",".join(TABLES)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"db install failed: {done.stdout}{done.stderr}")
    return policy


def start_proxy(dsn: str, policy: Path, lockd_url: str, log_dir: Path) -> tuple[str, ServiceProcess]:
    """``resource-proxy serve`` on the database, keys from lockd, triggers required."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", dsn, "--port", str(port),
            "--lockd-url", lockd_url, "--policy", str(policy), "--tables", ",".join(TABLES),
            "--require-db-fencing"]
    proc = ServiceProcess(argv, ready_url=f"{url}/healthz", log_path=log_dir / "model-proxy.log")
    return url, proc.start()
