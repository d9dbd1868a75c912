"""Fixtures for lockd's suite: one contract suite over every store, against real HTTP servers.

- ``store_url`` is parametrized over ``STORE_KINDS``: every test that takes it (directly or via
  ``lockd``) runs once per store. To add a store, append its kind and add a branch below.
- ``lockd`` is a real ``lockd serve`` process on that store (``harness.servers.LockdServer``).
- ``inproc_lockd`` runs ``create_app(settings, clock=fake_clock)`` under uvicorn in a thread on
  a real port, for expiry tests that move the clock instead of sleeping (SQLite: the only store
  whose expiry clock is lockd's own).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import uvicorn

from harness import free_port, wait_for
from harness.servers import LockdServer
from lockd.server.app import create_app
from lockd.server.settings import Settings

STORE_KINDS = ["sqlite", "postgres", "etcd"]

LOCKD = str(Path(sys.executable).parent / "lockd")


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each kind, as the URL ``lockd serve --store`` takes."""
    kind = request.param
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/lockd.db"
    if kind == "postgres":
        return request.getfixturevalue("pg_url")
    if kind == "etcd":
        return request.getfixturevalue("etcd_url")  # shared 3-member cluster, own key prefix
    raise AssertionError(f"unknown store kind {kind!r}")


@pytest.fixture
def lockd_factory(tmp_path: Path):
    """``start(store_url, **kw) -> LockdServer``; every server is stopped after the test."""
    servers: list[LockdServer] = []

    def start(store_url: str, *, key_dir: Path | None = None, port: int | None = None,
              env: dict[str, str] | None = None) -> LockdServer:
        server = LockdServer(store_url, key_dir=key_dir or tmp_path / f"keys-{len(servers)}",
                             log_dir=tmp_path, port=port, env=env)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def lockd(store_url: str, lockd_factory) -> LockdServer:
    """A running ``lockd serve`` on a fresh store of each kind."""
    return lockd_factory(store_url)


@pytest.fixture
def http():
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def name() -> str:
    """A lock name of this test's own."""
    return f"test/{uuid.uuid4().hex[:12]}"


class FakeClock:
    """Wall seconds that move only when told to (thread-safe enough: one float)."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class InProcessLockd:
    """``create_app(settings, clock=clock)`` served by uvicorn in a thread on a real port."""

    def __init__(self, settings: Settings, clock: FakeClock):
        self.clock = clock
        self.app = create_app(settings, clock=clock)
        self.url = f"http://127.0.0.1:{settings.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=settings.port,
                                log_config=None, access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> InProcessLockd:
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), timeout=20,
                 interval=0.01, what="the in-process lockd to start")
        if not self.server.started:
            raise RuntimeError("in-process lockd did not start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)


@pytest.fixture
def inproc_lockd(tmp_path: Path):
    """An in-process lockd on a fresh SQLite file whose clock is a ``FakeClock``."""
    started: list[InProcessLockd] = []

    def start(**overrides) -> InProcessLockd:
        settings = Settings(store=f"sqlite:///{tmp_path}/clock-{len(started)}.db",
                            key_dir=tmp_path / "keys", port=free_port(), **overrides)
        server = InProcessLockd(settings, FakeClock())
        started.append(server)
        return server.start()

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()
