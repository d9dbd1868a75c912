"""Read claims in the database: ``fencing.claim_read``/``try_claim_read`` raise the highest and
refuse a stale fence exactly like a write claim, but no row trigger accepts them (SQLSTATE
``LF003`` says the lock was claimed for reading only); readers at one epoch do not wait for each
other; ``try_claim_many`` takes a purpose per lock."""

from __future__ import annotations

import psycopg
import pytest

from resource_proxy.dbfence import install
from tests.proxy.dbfence.conftest import policy
from tests.proxy.dbfence.test_triggers import refused


@pytest.fixture
def acc(db):
    db.run("CREATE TABLE acc (id bigint PRIMARY KEY, v text)",
           "CREATE TABLE lit (id int PRIMARY KEY)")
    install(db.engine, policy({"acc": "acc/{id}", "lit": "lit"}))
    return db


def _highest(db, lock: str) -> int | None:
    row = db.one("SELECT highest FROM fencing.fences WHERE lock = %s", (lock,))
    return None if row is None else row[0]


def test_a_read_claim_raises_the_highest_and_refuses_a_stale_fence(acc):
    with acc.connect() as conn:
        assert conn.execute("SELECT fencing.claim_read('acc/1', 4)").fetchone() == (4,)
        conn.commit()
        assert _highest(acc, "acc/1") == 4
        assert conn.execute("SELECT fencing.claim_read('acc/1', 6)").fetchone() == (6,)
        conn.commit()
        error = refused(conn, "SELECT fencing.claim_read('acc/1', 5)")
        assert error.sqlstate == "LF001"
        assert str(error).startswith('stale fence 5 for lock "acc/1": highest is 6')
        assert error.diag.message_detail == "lock=acc/1 presented=5 highest=6"
        assert conn.execute("SELECT fencing.try_claim_read('acc/1', 5)").fetchone() == (6,)
        assert conn.execute("SELECT fencing.try_claim_read('acc/1', 6)").fetchone() == (6,)
        conn.rollback()
        # a writer below the read epoch is stale: the reader fenced it off
        assert refused(conn, "SELECT fencing.claim('acc/1', 5)").sqlstate == "LF001"
    assert _highest(acc, "acc/1") == 6


@pytest.mark.parametrize(("table", "lock", "statement"), [
    ("acc", "acc/1", "INSERT INTO acc VALUES (1, 'x')"),
    ("lit", "lit", "INSERT INTO lit VALUES (1)"),
])
def test_no_row_is_written_under_a_read_claim(acc, table, lock, statement):
    with acc.connect() as conn:
        conn.execute("SELECT fencing.claim_read(%s, 3)", (lock,))
        assert conn.execute("SELECT fencing.claimed(%s)", (lock,)).fetchone() == (False,)
        error = refused(conn, statement)
        assert error.sqlstate == "LF003"
        assert f'lock "{lock}", which this transaction claimed for reading only' in str(error)
        assert "a shared (read) lease never writes" in str(error)
        assert error.diag.message_detail == f"lock={lock} table={table} highest=3"
        conn.execute("SELECT fencing.claim_read(%s, 3), fencing.claim(%s, 3)", (lock, lock))
        conn.execute(statement)  # a write claim of the lock in the same transaction writes
        conn.commit()
    assert acc.one(f"SELECT count(*) FROM {table}") == (1,)


def test_readers_at_one_epoch_do_not_wait_for_each_other(acc):
    with acc.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/2', 5)")
        conn.commit()
    with acc.connect() as first, acc.connect() as second:
        first.execute("SELECT fencing.claim_read('acc/2', 5)")  # its transaction stays open
        second.execute("SET lock_timeout = '200ms'")
        assert second.execute("SELECT fencing.claim_read('acc/2', 5)").fetchone() == (5,)
        second.commit()
        # a reader raising the highest takes the fence row lock until it ends, as a writer does
        first.execute("SELECT fencing.claim_read('acc/2', 7)")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            second.execute("SELECT fencing.claim_read('acc/2', 7)")
        second.rollback()
        first.commit()
    assert _highest(acc, "acc/2") == 7


def test_try_claim_many_claims_each_lock_for_its_purpose(acc):
    with acc.connect() as conn:
        rows = conn.execute(
            "SELECT lock, highest FROM fencing.try_claim_many(%s, %s, %s)",
            (["acc/9", "acc/8", "acc/7"], [3, 4, 2], ["read", "write", "write"])).fetchall()
        assert rows == [("acc/7", 2), ("acc/8", 4), ("acc/9", 3)]  # lock-name order
        conn.execute("INSERT INTO acc VALUES (8, 'w')")
        assert refused(conn, "INSERT INTO acc VALUES (9, 'r')").sqlstate == "LF003"
        error = refused(conn, "SELECT * FROM fencing.try_claim_many(%s, %s, %s)",
                        (["acc/1"], [1], ["own"]))
        assert error.sqlstate == "22023" and "purpose 'own'" in str(error)
        error = refused(conn, "SELECT * FROM fencing.try_claim_many(%s, %s, %s)",
                        (["acc/1"], [1], ["read", "write"]))
        assert error.sqlstate == "22023"
