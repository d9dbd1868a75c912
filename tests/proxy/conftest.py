"""Fixtures of the proxy suites: a real ``resource-proxy serve`` process in front of a real
database (SQLite file or PostgreSQL database), tokens signed by a ``KeyRing`` the test owns.

``deployment`` is parametrized over both backends (one process per backend and module; every
test uses its own lock names and row keys). ``start_proxy`` starts more processes for tests that
need their own configuration.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from harness import VENV_BIN, ServiceProcess, create_database, drop_database, free_port
from lockd.tokens import KeyRing

PG_SCHEMA = """
CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric(20,4) NOT NULL DEFAULT 0
                       CHECK (balance >= 0), owner text, last_fence bigint);
CREATE TABLE items (id text PRIMARY KEY, v text, n integer);
CREATE TABLE pairs (a integer, b text, v text, PRIMARY KEY (a, b));
CREATE TABLE kinds (id integer PRIMARY KEY, i integer, n numeric(40,20), f double precision,
                    t text, vc varchar(5), b boolean, ts timestamptz, d date, u uuid, j jsonb);
CREATE TABLE history (id bigserial PRIMARY KEY, fence bigint NOT NULL, writer text NOT NULL);
CREATE TABLE children (id integer PRIMARY KEY, account_id bigint NOT NULL REFERENCES accounts(id));
CREATE TABLE secrets (id integer PRIMARY KEY, v text);
CREATE TABLE audit (id bigserial PRIMARY KEY, v text);
"""

SQLITE_SCHEMA = """
CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance NUMERIC(20,4) NOT NULL DEFAULT 0
                       CHECK (balance >= 0), owner TEXT, last_fence INTEGER);
CREATE TABLE items (id TEXT PRIMARY KEY, v TEXT, n INTEGER);
CREATE TABLE pairs (a INTEGER, b TEXT, v TEXT, PRIMARY KEY (a, b));
CREATE TABLE kinds (id INTEGER PRIMARY KEY, i INTEGER, n NUMERIC(40,20), f REAL, t TEXT,
                    vc VARCHAR(5), b BOOLEAN, ts TIMESTAMP, d DATE, u UUID, j JSON);
CREATE TABLE history (id INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER NOT NULL,
                      writer TEXT NOT NULL);
CREATE TABLE children (id INTEGER PRIMARY KEY,
                       account_id INTEGER NOT NULL REFERENCES accounts(id));
CREATE TABLE secrets (id INTEGER PRIMARY KEY, v TEXT);
CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT);
"""

SERVED = "accounts,items,pairs,kinds,history,children,audit"

# Every row of the contract suite has its own lock (tests use their own keys), except pairs
# (one lock per value of ``a``, so a batch can write several rows) and history (one lock).
POLICY = """
tables:
  accounts: {lock: "accounts/{key}", fence_column: last_fence}
  items: "items/{key}"
  pairs: "pairs/{a}"
  kinds: "kinds/{id}"
  children: "children/{key}"
  audit: {unfenced: true}
"""


@dataclass
class Database:
    """Direct access to the protected database, to check what the proxy did (or did not) do."""

    backend: str
    url: str  # what the proxy is given
    dsn: str = ""  # PostgreSQL: libpq DSN
    path: str = ""  # SQLite: file

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run ``sql`` (``?`` placeholders on both backends) and return its rows."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.path, timeout=10) as conn:
                return conn.execute(sql, tuple(params)).fetchall()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), tuple(params))
            return cur.fetchall() if cur.description else []

    def script(self, sql: str) -> None:
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                conn.executescript(sql)
            return
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql)


@dataclass
class Deployment:
    """A running proxy: its URL, an HTTP client, the key ring that signs its tokens, its DB."""

    url: str
    client: httpx.Client
    ring: KeyRing
    db: Database
    process: ServiceProcess

    @property
    def backend(self) -> str:
        return self.db.backend

    def token(self, lock: str, fence: int) -> str:
        return self.ring.sign(lock, fence)

    def auth(self, lock: str, fence: int) -> dict[str, str]:
        return {"Fencing-Token": self.token(lock, fence)}


def unique(prefix: str = "t") -> str:
    """A fresh name for a lock or a key (tests never share them)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def unique_id() -> int:
    """A fresh integer key."""
    return uuid.uuid4().int % 1_000_000_000 + 1


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with ``status`` and ``code``; return its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["status"] == status and body["code"] == code, body
    assert body["type"] == f"urn:lockd:problem:{code}"
    assert body["title"] and body["detail"]
    assert "Traceback" not in response.text
    return body


def write_jwks(directory: Path, *rings: KeyRing) -> Path:
    path = directory / f"jwks-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"keys": [k for ring in rings for k in ring.jwks()["keys"]]}))
    return path


def proxy_argv(database_url: str, port: int, *extra: str) -> list[str]:
    return [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", database_url,
            "--port", str(port), *extra]


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[..., tuple[str, ServiceProcess]]]:
    """Start ``resource-proxy serve`` processes (stopped at teardown, each must exit 0)."""
    started: list[ServiceProcess] = []

    def start(database_url: str, *extra: str) -> tuple[str, ServiceProcess]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = ServiceProcess(proxy_argv(database_url, port, *extra), ready_url=f"{url}/healthz",
                              log_path=tmp_path / f"proxy-{port}.log")
        started.append(proc.start())
        return url, proc

    yield start
    for proc in started:
        assert proc.stop() == 0, proc.log()


def make_database(backend: str, directory: Path, admin_dsn: str | None) -> Database:
    if backend == "sqlite":
        path = str(directory / "resource.db")
        db = Database("sqlite", f"sqlite:///{path}", path=path)
        db.script(SQLITE_SCHEMA)
        return db
    assert admin_dsn is not None
    dsn = create_database(admin_dsn, prefix="proxy")
    db = Database("postgres", dsn.replace("postgresql://", "postgresql+psycopg://", 1), dsn=dsn)
    db.script(PG_SCHEMA)
    return db


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The contract suite's proxy: one process per backend, tables ``SERVED``, policy ``POLICY``."""
    backend = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"proxy-{backend}")
    db = make_database(backend, directory, admin)
    ring = KeyRing.generate()
    jwks = write_jwks(directory, ring)
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ServiceProcess(
        proxy_argv(db.url, port, "--jwks-file", str(jwks), "--tables", SERVED, "--policy", str(policy)),
        ready_url=f"{url}/healthz", log_path=directory / "proxy.log",
    )
    proc.start()
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield Deployment(url, client, ring, db, proc)
        assert proc.stop() == 0, proc.log()
    finally:
        proc.stop()
        if backend == "postgres":
            drop_database(db.dsn, admin)
