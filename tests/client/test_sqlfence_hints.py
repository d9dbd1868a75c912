"""``fenced_transaction``'s errors name the fix: a database without the ``fencing`` schema
names ``resource-proxy db install``; ``LockNotClaimedError`` names the lock the transaction
holds, the lock the row needs, and that the table's installed lock template binds the row."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from harness import create_database, drop_database, pg_available, sqlalchemy_url
from lockd import LockClient
from lockd.client.sqlfence import LockNotClaimedError, TransactionStateError, fenced_transaction
from resource_proxy.dbfence import install
from resource_proxy.policy import Policy, TablePolicy, Template

pytestmark = pytest.mark.skipif(pg_available() is not None, reason="PostgreSQL not reachable")


@pytest.fixture
def bare_dsn():
    url = create_database(prefix="sqlhint")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
    yield url
    drop_database(url)


@pytest.fixture
def client(shared_lockd):
    with LockClient(shared_lockd.url) as lock_client:
        yield lock_client


def test_a_database_without_the_fencing_schema_names_db_install(bare_dsn, client, name):
    with client.lock(name, ttl=10) as lease, psycopg.connect(bare_dsn) as conn:
        with pytest.raises(TransactionStateError) as caught:
            with fenced_transaction(conn, lease):
                raise AssertionError("the block must not run")
    error = caught.value
    assert error.code == "fencing_not_installed"
    assert "resource-proxy db install" in str(error)
    assert 'schema "fencing"' in str(error)


def test_lock_not_claimed_names_the_held_lock_the_needed_lock_and_the_template(
        bare_dsn, client, name):
    template = "acct-" + bare_dsn.rsplit("/", 1)[1] + "/{id}"
    engine = sa.create_engine(sqlalchemy_url(bare_dsn), poolclass=sa.NullPool)
    install(engine, Policy({"accounts": TablePolicy(Template.parse(template, "accounts"))}),
            tables=["accounts"])
    engine.dispose()
    needed = template.replace("{id}", "42")
    with client.lock(name, ttl=10) as lease, psycopg.connect(bare_dsn) as conn:
        with pytest.raises(LockNotClaimedError) as caught:
            with fenced_transaction(conn, lease):
                conn.execute("INSERT INTO accounts VALUES (42, 100)")
    text = str(caught.value)
    assert caught.value.lock == needed
    assert caught.value.held == [name]
    assert f"needs lock {needed!r}" in text
    assert f"this transaction claimed {name!r}" in text
    assert "lock template" in text and "fencing.lock_for('accounts'" in text


def test_fencing_lock_for_gives_a_rows_lock_from_the_installed_triggers(bare_dsn):
    with psycopg.connect(bare_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pairs (a text, b int, v text, PRIMARY KEY (a, b))")
        conn.execute("CREATE TABLE settings (k text PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY)")
    engine = sa.create_engine(sqlalchemy_url(bare_dsn), poolclass=sa.NullPool)
    policy = Policy({
        "accounts": TablePolicy(Template.parse("accounts/{id}", "accounts")),
        "pairs": TablePolicy(Template.parse("pairs/{key}", "pairs")),
        "settings": TablePolicy(Template.parse("config", "settings")),
    })
    install(engine, policy, tables=["accounts", "pairs", "settings"])
    engine.dispose()
    with psycopg.connect(bare_dsn, autocommit=True) as conn:
        def lock_for(*args):
            marks = ", ".join(["%s"] * len(args))
            return conn.execute(f"SELECT fencing.lock_for({marks})", args).fetchone()[0]

        assert lock_for("accounts", "42") == "accounts/42"
        assert lock_for("pairs", "x y", "7") == "pairs/x:20y/7"  # the proxy's escaping
        assert lock_for("settings") == "config"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="not fenced"):
            lock_for("notes", "1")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"2 key value\(s\) \(a, b\)"):
            lock_for("pairs", "x")
