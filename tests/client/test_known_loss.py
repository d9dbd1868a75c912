"""A lease the client already knows is lost is refused before any write: ``fenced_transaction``,
``FencedSession`` and the ``Lock`` object's token raise ``LeaseLostError`` (nothing sent, nothing
written); ``refuse_lost=False`` is the explicit opt-out for tools that want the pure fencing
rule (the database or proxy alone decides)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from harness import create_database, drop_database, pg_available, sqlalchemy_url, wait_for
from lockd import LeaseLostError, LeaseState, LockClient
from lockd.client.fenced import FencedSession
from lockd.client.sqlfence import fenced_transaction
from resource_proxy.dbfence import install
from resource_proxy.policy import Policy, TablePolicy, Template


def _lost_lease(client: LockClient, name: str):
    """A lease lost by its local deadline (never renewed) while nobody else took the lock."""
    lease = client.acquire(name, ttl=0.3, auto_renew=False)
    wait_for(lambda: lease.state is LeaseState.LOST, timeout=5, what="the local deadline")
    return lease


@pytest.fixture
def client(shared_lockd):
    with LockClient(shared_lockd.url) as lock_client:
        yield lock_client


@pytest.fixture
def dsn():
    if pg_available() is not None:
        pytest.skip("PostgreSQL not reachable")
    url = create_database(prefix="knownloss")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)")
    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.NullPool)
    template = "kl-" + url.rsplit("/", 1)[1] + "/{id}"  # the database's name keeps tests apart
    install(engine, Policy({"notes": TablePolicy(Template.parse(template, "notes"))}),
            tables=["notes"])
    engine.dispose()
    yield url
    drop_database(url)


def _notes(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, body FROM notes").fetchall()


def test_fenced_transaction_refuses_a_lease_known_lost(client, dsn):
    lease = _lost_lease(client, "kl-" + dsn.rsplit("/", 1)[1] + "/7")
    with psycopg.connect(dsn) as conn:
        with pytest.raises(LeaseLostError):
            with fenced_transaction(conn, lease):
                raise AssertionError("the block must not run")
        assert _notes(dsn) == []
        # the opt-out: the database's fence alone decides (nobody claimed after us: it commits)
        with fenced_transaction(conn, lease, refuse_lost=False):
            conn.execute("INSERT INTO notes VALUES (7, 'pure rule')")
    assert _notes(dsn) == [(7, "pure rule")]


def test_fenced_session_refuses_a_lease_known_lost(client, proxy, name):
    lease = _lost_lease(client, f"items/{abs(hash(name)) % 10**6}")
    key = int(lease.lock.rsplit("/", 1)[1])
    with FencedSession(proxy.url, lease) as db:
        with pytest.raises(LeaseLostError):
            db.insert("items", {"id": key, "n": 1})
    assert [r for r in proxy.rows("items") if r[0] == key] == []
    with FencedSession(proxy.url, lease, refuse_lost=False) as db:
        db.insert("items", {"id": key, "n": 2})
    assert [r[2] for r in proxy.rows("items") if r[0] == key] == [2]


def test_the_lock_objects_token_refuses_a_lease_known_lost(client, name):
    lock = client.lock(name, ttl=0.3, auto_renew=False)
    assert lock.acquire()
    token = lock.token
    wait_for(lambda: lock.lost.is_set(), timeout=5, what="the local deadline")
    with pytest.raises(LeaseLostError):
        lock.token  # noqa: B018 - the property raises
    assert lock.lease.token == token  # the opt-out: the lease itself still gives it
