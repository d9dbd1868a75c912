"""SQLite store durability per batch: a commit that grants or renews is fsynced
(``synchronous=FULL``) before anyone hears of it; a batch of nothing but releases and reads
commits without an fsync of its own (``NORMAL``), made durable by the next fsynced commit.

Checked on the store's own connection after each batch: what matters for safety is that NO batch
holding a grant or a renewal ever runs with less than FULL, whatever it is mixed with.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from lockd.server.store.sqlite import SqliteStore, locks
from lockd.server.store.sqlite import store as store_mod

FULL, NORMAL = 2, 1


def _mode(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA synchronous").fetchone()[0]


def test_grants_and_renewals_commit_fsynced_releases_alone_do_not(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(str(tmp_path / "locks.db"))
        await store.open()
        try:
            conn = store._conn
            assert conn is not None and _mode(conn) == FULL
            grant = await store.acquire("d/a", lease_id="l1", ttl_ms=5000, owner="o",
                                        client_id=None)
            assert _mode(conn) == FULL
            await store.release("d/a", "l1")
            assert _mode(conn) == NORMAL  # a release-only batch: no fsync of its own
            await store.get("d/a")
            assert _mode(conn) == NORMAL
            again = await store.acquire("d/a", lease_id="l2", ttl_ms=5000, owner="o",
                                        client_id=None)
            assert _mode(conn) == FULL and again.fence == grant.fence + 1
            await store.renew("d/a", "l2", None)
            assert _mode(conn) == FULL
            many = await store.acquire_many(("d/b", "d/c"), lease_id="m.1", ttl_ms=5000,
                                            owner="o", client_id=None)
            assert _mode(conn) == FULL and set(many.fences) == {"d/b", "d/c"}
            await store.release_many("m.1")
            assert _mode(conn) == NORMAL
        finally:
            await store.close()

    asyncio.run(main())


def test_a_batch_mixing_a_release_with_a_grant_is_fsynced(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / "mixed.db"), isolation_level=None,
                           check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        store_mod._create_schema(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        store_mod._SYNC_MODE[id(conn)] = "NORMAL"
        clock = lambda: 1000.0  # noqa: E731 - wall seconds
        first = store_mod._run_batch(conn, clock, [
            (locks._acquire, ("m/a", "l1", 5000, "o", None), None)])
        assert first[0].error is None and _mode(conn) == FULL
        store_mod._run_batch(conn, clock, [(locks._release, ("m/a", "l1"), None)])
        assert _mode(conn) == NORMAL
        mixed = store_mod._run_batch(conn, clock, [
            (locks._release, ("m/x", "nobody"), None),  # LeaseLost: confined to itself
            (locks._acquire, ("m/a", "l2", 5000, "o", None), None)])
        assert isinstance(mixed[0].error, Exception) and mixed[1].error is None
        assert _mode(conn) == FULL
    finally:
        store_mod._SYNC_MODE.pop(id(conn), None)
        conn.close()


def test_shared_grants_permits_and_election_writes_are_fsynced(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(str(tmp_path / "new.db"))
        await store.open()
        try:
            conn = store._conn
            assert conn is not None

            async def lazy() -> None:  # a release-only batch first, so FULL below is news
                await store.get("x")
                assert _mode(conn) == NORMAL

            await lazy()
            await store.acquire("d/s", lease_id="s1", ttl_ms=5000, owner="o", client_id=None,
                                mode="shared")
            assert _mode(conn) == FULL
            await lazy()
            await store.renew("d/s", "s1", None)
            assert _mode(conn) == FULL
            await store.release("d/s", "s1")
            assert _mode(conn) == NORMAL
            await store.sem_acquire("q", limit=2, lease_id="p1", ttl_ms=5000, owner="o",
                                    client_id=None)
            assert _mode(conn) == FULL
            await lazy()
            await store.sem_renew("q", "p1", None)
            assert _mode(conn) == FULL
            await store.sem_release("q", "p1")
            await store.sem_get("q")
            assert _mode(conn) == NORMAL
            await store.elect_campaign("e", lease_id="l1", ttl_ms=5000, owner="o",
                                       client_id=None, value="v")
            assert _mode(conn) == FULL
            for write in (store.elect_proclaim("e", "l1", "w"), store.elect_handover("e", "x"),
                          store.elect_renew("e", "l1", None), store.elect_resign("e", "l1")):
                await lazy()
                await write
                assert _mode(conn) == FULL  # a log entry once seen is never handed out again
            await store.elect_get("e")
            await store.elect_log("e", 0, 10)
            assert _mode(conn) == NORMAL
        finally:
            await store.close()

    asyncio.run(main())
