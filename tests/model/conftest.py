"""The model test's world, once per store: lockd on SQLite (in process, on an injectable clock),
on PostgreSQL and on etcd (real ``lockd serve`` processes), each with a ``resource-proxy serve``
in front of a fresh PostgreSQL database with the fence triggers installed. Every process and
database is stopped or dropped when the test ends, whatever failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import create_database, drop_database, free_port
from harness.servers import LockdServer
from lockd.server.settings import Settings
from tests.model.world import ADMIN_KEY, World, install_database, start_proxy
from tests.server.conftest import FakeClock, InProcessLockd

STORES = ["sqlite", "postgres", "etcd"]

EXPIRIES = {"sqlite": None, "postgres": 4, "etcd": 1}
"""Expiries one run may ask for: any number on SQLite (lockd's clock is moved), few where real
time must pass (an etcd lease lasts whole seconds)."""


@pytest.fixture(params=STORES)
def world(request: pytest.FixtureRequest, tmp_path: Path, pg_admin_dsn: str) -> Iterator[World]:
    kind = request.param
    with contextlib.ExitStack() as stack:
        advance = None
        if kind == "sqlite":
            clock = FakeClock()
            settings = Settings(store=f"sqlite:///{tmp_path}/lockd.db", key_dir=tmp_path / "keys",
                                port=free_port(), admin_keys=ADMIN_KEY, log_level="warning")
            lockd = InProcessLockd(settings, clock).start()
            stack.callback(lockd.stop)
            lockd_url, advance = lockd.url, clock.advance
        else:
            store = request.getfixturevalue("pg_url" if kind == "postgres" else "etcd_url")
            server = LockdServer(store, key_dir=tmp_path / "keys", log_dir=tmp_path,
                                 env={"LOCKD_ADMIN_KEYS": ADMIN_KEY, "LOCKD_LOG_LEVEL": "warning"})
            stack.callback(server.stop)
            lockd_url = server.start().url
        dsn = create_database(pg_admin_dsn, prefix="model")
        stack.callback(drop_database, dsn, pg_admin_dsn)
        policy = install_database(dsn, tmp_path)
        proxy_url, proxy = start_proxy(dsn, policy, lockd_url, tmp_path)
        stack.callback(proxy.stop)
        the_world = World(kind, lockd_url, proxy_url, dsn, advance=advance,
                          expiries=EXPIRIES[kind])
        stack.callback(the_world.close)
        yield the_world
