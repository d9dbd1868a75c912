"""The row triggers and ``fencing.claim`` on a real PostgreSQL: plain SQL without a claim is
refused naming the lock, a stale claim commits nothing, and the rows reached by another route
(a partition's name, an inheritance parent, a cascade, replica mode, TRUNCATE) obey the same
rule as the rows written directly."""

from __future__ import annotations

import psycopg
import pytest

from resource_proxy.dbfence import DbFencingError, install
from resource_proxy.dbfence.sql import PROXY_TRY_CLAIM
from tests.dbfence.conftest import policy


def refused(conn: psycopg.Connection, statement: str, params=None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    conn.rollback()
    return caught.value


@pytest.fixture
def accounts(db):
    db.run("CREATE TABLE acc (id bigint PRIMARY KEY, v text)",
           "CREATE TABLE line (id int PRIMARY KEY, acc_id bigint REFERENCES acc ON DELETE CASCADE)",
           "CREATE TABLE ledger (id int PRIMARY KEY, v text)",
           "CREATE TABLE notes (id int PRIMARY KEY, v text)")
    install(db.engine, policy({"acc": "acc/{id}", "line": "line/{id}"}),
            tables=["acc", "line", "ledger"])
    return db


def test_plain_update_without_a_claim_is_refused_naming_the_lock(accounts):
    with accounts.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/7', 3)")
        conn.execute("INSERT INTO acc VALUES (7, 'a')")
        conn.commit()
        error = refused(conn, "UPDATE acc SET v = 'b' WHERE id = 7")
        assert error.sqlstate == "LF002"
        assert 'lock "acc/7"' in str(error) and "highest fence 3" in str(error)
        assert error.diag.message_detail == "lock=acc/7 table=acc highest=3"
        error = refused(conn, "INSERT INTO acc VALUES (8, 'x')")
        assert error.sqlstate == "LF002" and 'lock "acc/8"' in str(error)
        assert conn.execute("SELECT v FROM acc WHERE id = 7").fetchone() == ("a",)


def test_a_stale_claim_raises_and_nothing_commits(accounts):
    with accounts.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/1', 5)")
        conn.execute("INSERT INTO acc VALUES (1, 'five')")
        conn.commit()
        conn.execute("INSERT INTO notes VALUES (1, 'side effect')")  # unprotected table
        error = refused(conn, "SELECT fencing.claim('acc/1', 4)")
        assert error.sqlstate == "LF001"
        assert str(error).startswith('stale fence 4 for lock "acc/1": highest is 5')
        assert error.diag.message_detail == "lock=acc/1 presented=4 highest=5"
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (0,)
        assert conn.execute("SELECT highest FROM fencing.fences WHERE lock = 'acc/1'"
                            ).fetchone() == (5,)


def test_try_claim_reports_the_highest_and_claims_only_when_equal(accounts):
    with accounts.connect() as conn:
        assert conn.execute("SELECT fencing.try_claim('acc/2', 6)").fetchone() == (6,)
        conn.commit()
        assert conn.execute("SELECT fencing.try_claim('acc/2', 5)").fetchone() == (6,)
        assert conn.execute("SELECT fencing.claimed('acc/2')").fetchone() == (False,)
        assert refused(conn, "INSERT INTO acc VALUES (2, 'x')").sqlstate == "LF002"
        assert conn.execute("SELECT fencing.try_claim('acc/2', 7)").fetchone() == (7,)
        conn.execute("INSERT INTO acc VALUES (2, 'x')")
        conn.commit()
        # the claim ends with the transaction
        assert conn.execute("SELECT fencing.claimed('acc/2')").fetchone() == (False,)
        conn.rollback()


def test_a_claim_rolled_back_to_a_savepoint_is_gone(accounts):
    with accounts.connect() as conn:
        conn.execute("SAVEPOINT s")
        conn.execute("SELECT fencing.claim('acc/3', 1)")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        assert refused(conn, "INSERT INTO acc VALUES (3, 'x')").sqlstate == "LF002"


def test_a_key_change_needs_both_locks(accounts):
    with accounts.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/4', 1)")
        conn.execute("INSERT INTO acc VALUES (4, 'x')")
        conn.commit()
        conn.execute("SELECT fencing.claim('acc/4', 1)")
        error = refused(conn, "UPDATE acc SET id = 5 WHERE id = 4")
        assert 'lock "acc/5"' in str(error)
        conn.execute("SELECT fencing.claim('acc/5', 1)")
        error = refused(conn, "UPDATE acc SET id = 5 WHERE id = 4")
        assert 'lock "acc/4"' in str(error)
        conn.execute("SELECT fencing.claim('acc/4', 1), fencing.claim('acc/5', 1)")
        conn.execute("UPDATE acc SET id = 5 WHERE id = 4")
        conn.commit()


def test_on_delete_cascade_needs_the_referencing_rows_lock(accounts):
    with accounts.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/1', 1), fencing.claim('line/10', 1)")
        conn.execute("INSERT INTO acc VALUES (1, 'a')")
        conn.execute("INSERT INTO line VALUES (10, 1)")
        conn.commit()
        conn.execute("SELECT fencing.claim('acc/1', 1)")
        error = refused(conn, "DELETE FROM acc WHERE id = 1")
        assert error.sqlstate == "LF002" and 'lock "line/10"' in str(error)
        assert conn.execute("SELECT count(*) FROM line").fetchone() == (1,)
        conn.execute("SELECT fencing.claim('acc/1', 1), fencing.claim('line/10', 1)")
        conn.execute("DELETE FROM acc WHERE id = 1")
        conn.commit()
        assert conn.execute("SELECT count(*) FROM line").fetchone() == (0,)


def test_replica_mode_and_truncate_do_not_skip_the_check(accounts):
    with accounts.connect() as conn:
        conn.execute("SET session_replication_role = replica")
        assert refused(conn, "INSERT INTO acc VALUES (9, 'x')").sqlstate == "LF002"
        conn.execute("RESET session_replication_role")
        error = refused(conn, "TRUNCATE acc CASCADE")
        assert error.sqlstate == "LF002" and "TRUNCATE of table" in str(error)


def test_exempt_roles_skip_the_check(db):
    db.run("CREATE TABLE t (id int PRIMARY KEY)",
           "DROP ROLE IF EXISTS dbfence_migrator", "CREATE ROLE dbfence_migrator",
           "GRANT ALL ON t TO dbfence_migrator")
    try:
        install(db.engine, policy({"t": "t/{id}"}), exempt_roles=["dbfence_migrator"])
        with db.connect() as conn:
            assert refused(conn, "INSERT INTO t VALUES (1)").sqlstate == "LF002"
            conn.execute("SET ROLE dbfence_migrator")
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("TRUNCATE t")
            conn.commit()
    finally:
        db.run("DROP OWNED BY dbfence_migrator", "DROP ROLE dbfence_migrator")
    with pytest.raises(DbFencingError, match="do not exist"):
        install(db.engine, policy({"t": "t/{id}"}), exempt_roles=["no_such_role_x"])


def test_a_literal_lock_guards_every_row_of_its_table(accounts):
    with accounts.connect() as conn:
        assert 'lock "ledger"' in str(refused(conn, "INSERT INTO ledger VALUES (1, 'x')"))
        conn.execute("SELECT fencing.claim('ledger', 2)")
        conn.execute("INSERT INTO ledger SELECT g, 'x' FROM generate_series(1, 100) g")
        conn.commit()
        assert refused(conn, "UPDATE ledger SET v = 'y'").sqlstate == "LF002"


def test_the_proxys_one_statement_claim_and_write_passes_the_trigger(accounts):
    """The gated write of the proxy with its fence CTE made of ``fencing.try_claim``."""
    gated = (f"WITH fence AS ({PROXY_TRY_CLAIM}), w AS (INSERT INTO acc (id, v) "
             "SELECT %(id)s, 'p' WHERE EXISTS (SELECT 1 FROM fence WHERE highest = "
             "%(fence)s::bigint) RETURNING 1) "
             "SELECT (SELECT highest FROM fence), (SELECT count(*) FROM w)")
    with accounts.connect(autocommit=True) as conn:
        assert conn.execute(gated, {"lock": "acc/20", "fence": 4, "id": 20}).fetchone() == (4, 1)
        assert conn.execute(gated, {"lock": "acc/21", "fence": 4, "id": 21}).fetchone() == (4, 1)
        conn.execute("SELECT fencing.claim('acc/22', 9)")
        stale = conn.execute(gated, {"lock": "acc/22", "fence": 8, "id": 22}).fetchone()
        assert stale == (9, 0)
        assert conn.execute("SELECT count(*) FROM acc").fetchone() == (2,)


def test_a_key_too_long_for_a_lock_name_is_refused(db):
    db.run("CREATE TABLE t (k text PRIMARY KEY)")
    install(db.engine, policy({"t": "t/{k}"}))
    with db.connect() as conn:
        error = refused(conn, "INSERT INTO t VALUES (repeat('é', 100))")
        assert error.sqlstate == "LF002" and "cannot be bound to a lock name" in str(error)


def test_the_proxys_gated_update_and_delete_and_its_batch_claim(accounts):
    def gated(write: str) -> str:
        return (f"WITH fence AS ({PROXY_TRY_CLAIM}), w AS ({write} AND EXISTS (SELECT 1 FROM "
                "fence WHERE highest = %(fence)s::bigint) RETURNING 1) "
                "SELECT (SELECT highest FROM fence), (SELECT count(*) FROM w)")
    with accounts.connect(autocommit=True) as conn:
        conn.execute("SELECT fencing.claim('acc/30', 2)")
        with conn.transaction():
            conn.execute("SELECT fencing.claim('acc/30', 2)")
            conn.execute("INSERT INTO acc VALUES (30, 'a')")
        update = gated("UPDATE acc SET v = 'b' WHERE id = %(id)s")
        assert conn.execute(update, {"lock": "acc/30", "fence": 2, "id": 30}).fetchone() == (2, 1)
        assert conn.execute(update, {"lock": "acc/30", "fence": 1, "id": 30}).fetchone() == (2, 0)
        delete = gated("DELETE FROM acc WHERE id = %(id)s")
        assert conn.execute(delete, {"lock": "acc/30", "fence": 3, "id": 30}).fetchone() == (3, 1)
        with conn.transaction():
            rows = conn.execute("SELECT * FROM fencing.try_claim_many(%s, %s)",
                                (["acc/32", "acc/31", "line/9"], [5, 5, 1])).fetchall()
            assert rows == [("acc/31", 5), ("acc/32", 5), ("line/9", 1)]
            conn.execute("INSERT INTO acc VALUES (31, 'x'), (32, 'y')")
        with conn.transaction():
            rows = conn.execute("SELECT * FROM fencing.try_claim_many(%s, %s)",
                                (["acc/31", "acc/32"], [5, 4])).fetchall()
            assert rows == [("acc/31", 5), ("acc/32", 5)]
            assert conn.execute("SELECT fencing.claimed('acc/32')").fetchone() == (False,)
