"""The SQLite store (one node, file lock, durability) and ``open_store`` URL dispatch."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time

import pytest

from harness import free_port
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store import open_store, redact_url
from lockd.server.store.sqlite import SqliteStore
from lockd.server.store.values import Grant, Holder
from tests.server.calls import acquire, release, state
from tests.server.conftest import LOCKD


def test_second_lockd_on_the_same_file_fails_fast_with_a_clear_message(lockd_factory, tmp_path,
                                                                        http):
    url = f"sqlite:///{tmp_path}/shared.db"
    first = lockd_factory(url)
    lease = acquire(http, first.url, "jobs/a").json()
    started = time.monotonic()
    second = subprocess.run(
        [LOCKD, "serve", "--store", url, "--port", str(free_port()),
         "--key-dir", str(tmp_path / "k2")],
        capture_output=True, text=True, timeout=60,
    )
    assert second.returncode == 1
    assert time.monotonic() - started < 15
    assert "already in use by another lockd" in second.stderr
    assert f"pid {first.proc.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert state(http, first.url, "jobs/a")["fence"] == lease["fence"]  # first one unharmed

    assert first.stop() == 0  # the lock file is free again: a successor starts on the file
    successor = lockd_factory(url)
    release(http, successor.url, "jobs/a", lease["lease_id"])
    assert acquire(http, successor.url, "jobs/a").json()["fence"] == lease["fence"] + 1


def test_store_level_contract_and_file_lock(tmp_path):
    path = str(tmp_path / "s.db")
    now = [1_000.0]

    async def scenario() -> None:
        store = SqliteStore(path, clock=lambda: now[0])
        await store.open()
        freed: list[str] = []
        store.subscribe(freed.append)
        other = SqliteStore(path)
        with pytest.raises(StoreUnavailable, match="already in use"):
            await other.open()

        g = await store.acquire("a", lease_id="L1", ttl_ms=1_000, owner="o", client_id="c")
        assert g == Grant("a", "L1", 1, 1_000, "o")
        now[0] += 0.25
        h = await store.acquire("a", lease_id="L2", ttl_ms=1_000, owner="p", client_id=None)
        assert h == Holder("a", "o", 750, 1)
        same = await store.acquire("a", lease_id="L3", ttl_ms=2_000, owner="o", client_id="c")
        assert same == Grant("a", "L1", 1, 2_000, "o")
        renewed = await store.renew("a", "L1", 500)
        assert renewed.fence == 1 and renewed.ttl_ms == 500
        with pytest.raises(LeaseLost):
            await store.renew("a", "nope", 500)
        await store.release("a", "L1")
        assert freed == ["a"]
        with pytest.raises(LeaseLost):
            await store.release("a", "L1")
        g2 = await store.acquire("a", lease_id="L4", ttl_ms=100, owner="", client_id=None)
        assert g2.fence == 2
        now[0] += 0.1
        with pytest.raises(LeaseLost):  # expired: cannot be released back to life
            await store.release("a", "L4")
        assert (await store.get("a")).held is False
        assert (await store.get("never")).fence == 0
        for n in ["b/1", "b/2", "b/3", "c"]:
            await store.acquire(n, lease_id=n, ttl_ms=1_000, owner="", client_id=None)
        assert [s.lock for s in await store.list("b/", 2, None)] == ["b/1", "b/2"]
        assert [s.lock for s in await store.list("b/", 2, "b/2")] == ["b/3"]
        assert [s.lock for s in await store.list("", 10, "b/3")] == ["c"]
        await store.close()
        await store.close()  # idempotent

        reopened = SqliteStore(path, clock=lambda: now[0])  # the file lock was dropped
        await reopened.open()
        g3 = await reopened.acquire("a", lease_id="L5", ttl_ms=100, owner="", client_id=None)
        assert g3.fence == 3  # fences survive a reopen
        await reopened.close()

    asyncio.run(scenario())
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unopenable_database_is_store_unavailable(tmp_path):
    async def scenario() -> None:
        store = SqliteStore(str(tmp_path / "missing-dir" / "x.db"))
        with pytest.raises(StoreUnavailable, match="missing-dir"):
            await store.open()
        with pytest.raises(StoreUnavailable, match="not open"):
            await store.get("a")

    asyncio.run(scenario())


def test_open_store_dispatches_on_the_url_scheme():
    async def memory() -> None:
        store = open_store("sqlite:///:memory:", clock=time.time)
        assert isinstance(store, SqliteStore) and store.path == ":memory:"
        await store.open()
        g = await store.acquire("m", lease_id="x", ttl_ms=1_000, owner="", client_id=None)
        assert g.fence == 1
        await store.close()

    asyncio.run(memory())
    assert open_store("sqlite:///./rel/l.db", clock=time.time).path == "./rel/l.db"
    assert open_store("sqlite:////abs/l.db", clock=time.time).path == "/abs/l.db"
    pg = open_store("postgresql+psycopg://u:pw@127.0.0.1:1/db", clock=time.time)
    assert type(pg).__name__ == "PostgresStore"
    assert type(open_store("postgresql://127.0.0.1:1/db", clock=time.time)).__name__ == \
        "PostgresStore"
    with pytest.raises(ValueError, match="sqlite://, postgresql://, postgresql\\+psycopg://"):
        open_store("mysql://localhost/db", clock=time.time)
    with pytest.raises(ValueError, match="no scheme"):
        open_store("lockd.db", clock=time.time)
    with pytest.raises(ValueError, match="no host"):
        open_store("sqlite://host/x.db", clock=time.time)


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://lockd:s3cr:t@db:5432/locks", "postgresql+psycopg://lockd:***@db:5432/locks"),
    ("postgresql://lockd@db/locks?password=hunter2&sslmode=require",
     "postgresql://lockd@db/locks?password=***&sslmode=require"),
    ("etcd://root:pw@h1:2379,h2:2379", "etcd://root:***@h1:2379,h2:2379"),
    ("sqlite:///./lockd.db", "sqlite:///./lockd.db"),
    ("postgresql://db:5432/locks", "postgresql://db:5432/locks"),
])
def test_redact_url_hides_passwords(url, shown):
    assert redact_url(url) == shown
