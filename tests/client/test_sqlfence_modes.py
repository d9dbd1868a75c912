"""``fenced_transaction`` under shared (read) leases, on a real PostgreSQL and a real lockd: every
exclusive lock of the token is claimed for writing, every shared one for reading, so a shared
lease reads under its fence and never writes its lock's rows, and a reader at a newer epoch
fences off a writer whose lease lapsed.

The database side is ``resource_proxy.dbfence.install`` on ``accounts`` (lock
``acct-<database>/<id>``), as in test_sqlfence.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from harness import pg_available
from lockd import SharedTokenError, StaleTokenError
from lockd.client.sqlfence import async_fenced_transaction, fenced_transaction
from lockd.tokens import KeyRing
from tests.client.test_sqlfence import account_lock, client, dsn, fences  # noqa: F401

pytestmark = pytest.mark.skipif(pg_available() is not None, reason="PostgreSQL not reachable")


def balances(dsn: str) -> dict[int, int]:  # noqa: F811 - the fixture's value
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT id, balance FROM accounts").fetchall())


def _seed(dsn: str, client, rows: dict[int, int]) -> None:  # noqa: F811
    """Insert ``rows`` as their locks' exclusive holder."""
    locks = [account_lock(dsn, key) for key in rows]
    with client.acquire_many(locks, ttl=10) as lease, psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, lease):
            for key, balance in rows.items():
                conn.execute("INSERT INTO accounts VALUES (%s, %s)", (key, balance))


def test_two_readers_of_one_row_can_read_it_and_neither_can_write_it(dsn, client):  # noqa: F811
    lock = account_lock(dsn, 42)
    _seed(dsn, client, {42: 100})
    with client.lock(lock, ttl=10, shared=True) as r1, \
            client.lock(lock, ttl=10, shared=True) as r2:
        assert r1.mode == r2.mode == "shared" and r1.fence == r2.fence
        for reader, amount in ((r1, 1), (r2, 2)):
            with psycopg.connect(dsn) as conn:
                with pytest.raises(SharedTokenError) as caught, fenced_transaction(conn, reader):
                    assert conn.execute("SELECT balance FROM accounts WHERE id = 42"
                                        ).fetchone() == (100,)
                    conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = 42",
                                 (amount,))
                error = caught.value
                assert error.lock == lock and error.code == "shared_token"
                assert "claimed for reading only" in str(error)
    assert balances(dsn) == {42: 100}, "nothing committed"


def test_an_async_reader_cannot_write_either(dsn, client, shared_lockd):  # noqa: F811
    lock = account_lock(dsn, 7)
    _seed(dsn, client, {7: 5})

    async def main(reader):
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with async_fenced_transaction(conn, reader):
                await conn.execute("DELETE FROM accounts WHERE id = 7")

    with client.lock(lock, ttl=10, shared=True) as reader:
        with pytest.raises(SharedTokenError) as caught:
            asyncio.run(main(reader))
    assert caught.value.lock == lock
    assert balances(dsn) == {7: 5}


def test_a_multi_lock_lease_writes_the_rows_of_its_exclusive_locks_only(dsn, client):  # noqa: F811
    a, b = account_lock(dsn, 1), account_lock(dsn, 2)
    _seed(dsn, client, {1: 10, 2: 20})
    with client.acquire_many([a, b], ttl=10, shared=[b]) as lease, psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, lease) as claims:
            assert conn.execute("SELECT balance FROM accounts WHERE id = 2").fetchone() == (20,)
            conn.execute("UPDATE accounts SET balance = 11 WHERE id = 1")
        assert claims.locks == lease.fences
        with pytest.raises(SharedTokenError) as caught, fenced_transaction(conn, lease):
            conn.execute("UPDATE accounts SET balance = 12 WHERE id = 1")
            conn.execute("UPDATE accounts SET balance = 21 WHERE id = 2")
        assert caught.value.lock == b
    assert balances(dsn) == {1: 11, 2: 20}


def test_a_reader_at_a_newer_epoch_fences_off_the_lapsed_writer(dsn):  # noqa: F811
    """Writer E holds the lock at fence 4 and writes; its lease lapses and lockd grants the
    lock shared at a new epoch (5). The reader's fenced transaction raises the highest to 5 (a
    read claim), so E's next transaction is stale and commits nothing."""
    ring = KeyRing.generate()
    jwks = ring.jwks()
    lock = account_lock(dsn, 5)
    writer = ring.sign(lock, 4)
    with psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, writer, jwks=jwks):
            conn.execute("INSERT INTO accounts VALUES (5, 10)")
        with fenced_transaction(conn, ring.sign(lock, 5, extra={"mode": "shared"}), jwks=jwks):
            assert conn.execute("SELECT balance FROM accounts WHERE id = 5").fetchone() == (10,)
        assert fences(dsn) == {lock: 5}
        with pytest.raises(StaleTokenError) as caught, fenced_transaction(conn, writer, jwks=jwks):
            conn.execute("UPDATE accounts SET balance = 0 WHERE id = 5")
    error = caught.value
    assert (error.lock, error.presented, error.highest) == (lock, 4, 5)
    assert balances(dsn) == {5: 10}
