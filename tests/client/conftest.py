"""Fixtures of the client suite: real ``lockd serve`` and ``resource-proxy serve`` processes.

``lockd_server``: a lockd of its own per test on a SQLite file, restartable on the same port and
store (or on a fresh store). ``shared_lockd`` + ``proxy``: one lockd and one proxy per module
for tests that only need them running (every test uses its own lock names). ``api``: the
behavioural suite runs once with ``LockClient`` and once with ``AsyncLockClient`` (driven
through a small blocking adapter, ``tests.client.adapters``), and ``test_behaviour`` once more
with each through the reusable ``Lock`` / ``AsyncLock`` objects (``sync-lock``, ``async-lock``).
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from harness import servers
from tests.client.adapters import AsyncApi, AsyncLockApi, SyncApi, SyncLockApi

RESOURCE_SCHEMA = [
    "CREATE TABLE items (id INTEGER PRIMARY KEY, owner TEXT NOT NULL DEFAULT '', n INTEGER)",
    "CREATE TABLE pairs (a TEXT NOT NULL, b INTEGER NOT NULL, v TEXT, PRIMARY KEY (a, b))",
]


class LockdServer(servers.LockdServer):
    """``lockd serve`` on a SQLite file in ``workdir``; ``restart()`` keeps port, keys, store."""

    def __init__(self, workdir: Path, port: int | None = None, env: dict[str, str] | None = None):
        self.workdir = workdir
        super().__init__(f"sqlite:///{workdir / 'lockd.db'}", log_dir=workdir,
                         key_dir=workdir / "keys", port=port, env=env)

    @property
    def db(self) -> Path:
        return Path(self.store_url.removeprefix("sqlite:///"))

    @property
    def store(self) -> str:
        return self.store_url

    def restart(self, *, fresh_store: bool = False) -> LockdServer:
        """Stop and start again; ``fresh_store`` points it at a new, empty SQLite file."""
        self.stop()
        if fresh_store:
            self.store_url = f"sqlite:///{self.workdir / f'lockd-{uuid.uuid4().hex[:8]}.db'}"
        return self.start()


class ProxyServer(servers.ProxyServer):
    """``resource-proxy serve`` on a SQLite resource DB with the tables of ``RESOURCE_SCHEMA``."""

    def __init__(self, workdir: Path, lockd_url: str):
        self.workdir = workdir
        self.db = workdir / "res.db"
        with sqlite3.connect(self.db) as conn:
            for stmt in RESOURCE_SCHEMA:
                conn.execute(stmt)
        policy = workdir / "policy.yaml"  # one lock per item; one per pairs.a (for batches)
        policy.write_text("tables: {items: 'items/{key}', pairs: 'pairs/{a}'}\n")
        super().__init__(f"sqlite:///{self.db}", lockd_url, log_dir=workdir, policy=policy)

    def rows(self, table: str) -> list[tuple]:
        """Read the resource DB directly (the ground truth, bypassing the proxy)."""
        with sqlite3.connect(self.db) as conn:
            return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()  # noqa: S608


def _workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture
def lockd_server():
    """A lockd of this test's own (restart, pause or kill it freely)."""
    server = LockdServer(_workdir("lockd-client-")).start()
    yield server
    server.stop()
    if sys.exc_info()[0] is None:
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_lockd():
    """One lockd for the module's tests that do not disturb it."""
    server = LockdServer(_workdir("lockd-shared-")).start()
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(shared_lockd: LockdServer):
    """A proxy over a fresh SQLite resource DB, trusting ``shared_lockd``'s keys."""
    server = ProxyServer(_workdir("proxy-client-"), shared_lockd.url)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
def name(request) -> str:
    """A lock name of this test's own."""
    node = re.sub(r"[^A-Za-z0-9.:/-]", "-", request.node.name[:60])
    return f"test/{node}/{uuid.uuid4().hex[:8]}"


API_KINDS = {"sync": SyncApi, "async": AsyncApi, "sync-lock": SyncLockApi,
             "async-lock": AsyncLockApi}


def api_maker(kind: str):
    """``make(url)`` building facades of ``kind`` (see ``API_KINDS``), and ``close()``."""
    made = []

    def make(url: str):
        api = API_KINDS[kind](url)
        made.append(api)
        return api

    make.kind = kind
    make.close = lambda: [api.close() for api in made]
    return make


@pytest.fixture(params=["sync", "async"])
def make_api(request):
    """Build blocking facades over ``LockClient`` (sync) or ``AsyncLockClient`` (async)."""
    make = api_maker(request.param)
    yield make
    make.close()
