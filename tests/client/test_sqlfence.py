"""``fenced_transaction`` / ``async_fenced_transaction`` on a real PostgreSQL and a real lockd.

Each test gets a database of its own with the database side installed by
``resource_proxy.dbfence.install`` (``fencing.claim`` raising SQLSTATE ``LF001`` when stale, the
row trigger raising ``LF002`` on table ``accounts``); leases come
from one lockd per module (``shared_lockd``) or from a lockd of the test's own.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from harness import create_database, drop_database, pg_available, sqlalchemy_url, wait_for
from lockd import AsyncLockClient, InvalidToken, LeaseState, LockClient, StaleTokenError
from lockd.client import sqlfence
from lockd.client.sqlfence import (
    LockNotClaimedError,
    TransactionStateError,
    async_fenced_transaction,
    fenced_transaction,
)
from lockd.tokens import KeyRing
from resource_proxy.dbfence import install
from resource_proxy.policy import Policy, TablePolicy, Template

pytestmark = pytest.mark.skipif(pg_available() is not None, reason="PostgreSQL not reachable")

# The real database side (``resource_proxy.dbfence.install``) on two tables: ``notes`` is not
# protected; ``accounts`` is, under lock ``acct-<database>/<id>`` (the database name keeps the lock
# names of tests apart).
TABLES = """
CREATE TABLE notes (id serial PRIMARY KEY, lock text NOT NULL, body text NOT NULL);
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
"""


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    lock: Mapped[str]
    body: Mapped[str]


@pytest.fixture
def dsn():
    """A database of this test's own with database-side fencing installed on ``accounts``."""
    url = create_database(prefix="sqlfence")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)
    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.NullPool)
    template = "acct-" + url.rsplit("/", 1)[1] + "/{id}"
    install(engine, Policy({"accounts": TablePolicy(Template.parse(template, "accounts"))}),
            tables=["accounts"])
    engine.dispose()
    yield url
    drop_database(url)


@pytest.fixture
def client(shared_lockd):
    with LockClient(shared_lockd.url) as lock_client:
        yield lock_client


@pytest.fixture
def engine(dsn):
    eng = sa.create_engine(sqlalchemy_url(dsn))
    yield eng
    eng.dispose()


def fences(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT lock, highest FROM fencing.fences").fetchall())


def notes(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT lock, body FROM notes ORDER BY id").fetchall()


def account_lock(dsn: str, account: int) -> str:
    return f"acct-{dsn.rsplit('/', 1)[1]}/{account}"


# --------------------------------------------------------------------------- each connection kind


def test_psycopg_claims_runs_the_block_and_commits(dsn, client, name):
    with client.lock(name, ttl=10) as lease, psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, lease) as claims:
            conn.execute("INSERT INTO notes (lock, body) VALUES (%s, 'psycopg')", (name,))
        assert claims.locks == {name: lease.fence}
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert notes(dsn) == [(name, "psycopg")]
    assert fences(dsn) == {name: lease.fence}


def test_psycopg_async_claims_runs_the_block_and_commits(dsn, shared_lockd, name):
    async def main():
        async with AsyncLockClient(shared_lockd.url) as aclient:
            async with aclient.lock(name, ttl=10) as lease:
                async with await psycopg.AsyncConnection.connect(dsn) as conn:
                    async with async_fenced_transaction(conn, lease) as claims:
                        await conn.execute("INSERT INTO notes (lock, body) VALUES (%s, 'apg')",
                                           (name,))
                return lease.fence, claims

    fence, claims = asyncio.run(main())
    assert claims.locks == {name: fence}
    assert notes(dsn) == [(name, "apg")]
    assert fences(dsn) == {name: fence}


def test_sqlalchemy_connection(dsn, engine, client, name):
    with client.lock(name, ttl=10) as lease, engine.connect() as conn:
        with fenced_transaction(conn, lease):
            conn.execute(sa.text("INSERT INTO notes (lock, body) VALUES (:l, 'sa')"), {"l": name})
        assert not conn.in_transaction()
    assert notes(dsn) == [(name, "sa")]
    assert fences(dsn) == {name: lease.fence}


def test_sqlalchemy_session_flushes_orm_changes_inside_the_fenced_transaction(
        dsn, engine, client, name):
    with client.lock(name, ttl=10) as lease, Session(engine) as session:
        with fenced_transaction(session, lease):
            session.add(Note(lock=name, body="orm"))  # flushed at commit, after the claim
        assert not session.in_transaction()
    assert notes(dsn) == [(name, "orm")]
    assert fences(dsn) == {name: lease.fence}


def test_sqlalchemy_async_session(dsn, shared_lockd, name):
    async def main():
        eng = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with AsyncLockClient(shared_lockd.url) as aclient, \
                    aclient.lock(name, ttl=10) as lease, AsyncSession(eng) as session:
                async with async_fenced_transaction(session, lease):
                    session.add(Note(lock=name, body="async orm"))
                return lease.fence
        finally:
            await eng.dispose()

    fence = asyncio.run(main())
    assert notes(dsn) == [(name, "async orm")]
    assert fences(dsn) == {name: fence}


def test_sqlalchemy_async_connection(dsn, shared_lockd, name):
    async def main():
        eng = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with AsyncLockClient(shared_lockd.url) as aclient, \
                    aclient.lock(name, ttl=10) as lease, eng.connect() as conn:
                async with async_fenced_transaction(conn, lease):
                    await conn.execute(sa.text("INSERT INTO notes (lock, body) VALUES (:l, 'x')"),
                                       {"l": name})
                return lease.fence
        finally:
            await eng.dispose()

    fence = asyncio.run(main())
    assert notes(dsn) == [(name, "x")]
    assert fences(dsn) == {name: fence}


# --------------------------------------------------------------------------- the fence


@pytest.fixture
def frozen(shared_lockd):
    """A client whose clock stands still, like a process paused past its lease: its leases
    never pass their local deadline, so only the fence can tell them stale."""
    with LockClient(shared_lockd.url, clock=lambda: 0.0) as lock_client:
        yield lock_client


def _revived_and_newer(frozen: LockClient, client: LockClient, name: str):
    """Lease A expires unrenewed (A froze); B is granted the lock with a higher fence."""
    stale = frozen.acquire(name, ttl=0.3, auto_renew=False)
    wait_for(lambda: not client.status(name).held, timeout=5, what="the 0.3 s lease to expire")
    newer = client.acquire(name, ttl=10, wait=5)
    assert newer.fence > stale.fence
    return stale, newer


@pytest.mark.parametrize("kind", ["psycopg", "sa-connection", "sa-session"])
def test_a_revived_holder_is_stale_after_a_newer_claim_and_nothing_commits(
        dsn, engine, frozen, client, name, kind):
    stale, newer = _revived_and_newer(frozen, client, name)
    with psycopg.connect(dsn) as conn, fenced_transaction(conn, newer):
        conn.execute("INSERT INTO notes (lock, body) VALUES (%s, 'newer')", (name,))
    ran = []
    with Writer(kind, dsn, engine) as (conn, write):
        with pytest.raises(StaleTokenError) as caught, fenced_transaction(conn, stale):
            ran.append(True)
            write(name, "stale")
    error = caught.value
    assert (error.lock, error.presented, error.highest) == (name, stale.fence, newer.fence)
    assert error.code == "stale_token" and error.status is None
    assert ran == [], "the block must not run after a refused claim"
    assert stale.state is LeaseState.LOST and stale.lost_reason.code == "stale_token"
    assert notes(dsn) == [(name, "newer")]
    assert fences(dsn) == {name: newer.fence}
    newer.release()


class Writer:
    """A connection of ``kind`` and a ``write(lock, body)`` that inserts a note through it."""

    def __init__(self, kind: str, dsn: str, engine: sa.Engine):
        self.kind, self.dsn, self.engine = kind, dsn, engine

    def __enter__(self):
        if self.kind == "psycopg":
            self.conn = psycopg.connect(self.dsn)
            return self.conn, lambda lock, body: self.conn.execute(
                "INSERT INTO notes (lock, body) VALUES (%s, %s)", (lock, body))
        self.conn = self.engine.connect() if self.kind == "sa-connection" else Session(self.engine)
        return self.conn, lambda lock, body: self.conn.execute(
            sa.text("INSERT INTO notes (lock, body) VALUES (:l, :b)"), {"l": lock, "b": body})

    def __exit__(self, *exc):
        self.conn.close()


def test_async_stale_claim_raises_the_same_error(dsn, frozen, client, name):
    stale, newer = _revived_and_newer(frozen, client, name)
    with psycopg.connect(dsn) as conn, fenced_transaction(conn, newer):
        pass

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with async_fenced_transaction(conn, stale):
                raise AssertionError("the block must not run")

    with pytest.raises(StaleTokenError) as caught:
        asyncio.run(main())
    assert (caught.value.presented, caught.value.highest) == (stale.fence, newer.fence)
    newer.release()


class RecordingCursor(psycopg.Cursor):
    """A real psycopg cursor that also keeps the (lock, fence) of every claim it sends, in
    order: from a claim's parameters, or from the literals of claims sent as one message."""

    sent: list = []

    def execute(self, query, params=None, **kw):
        text = query if isinstance(query, str) else bytes(query).decode()
        if "fencing.claim" in text:
            if params is not None:
                RecordingCursor.sent.append(tuple(params))
            else:
                RecordingCursor.sent.extend(
                    (lock, int(fence)) for lock, fence in
                    re.findall(r"fencing\.claim\(\s*'([^']*)'::text, (\d+)::bigint\)", text))
        return super().execute(query, params, **kw)


def test_a_multi_lock_lease_claims_every_lock_in_name_order(dsn, client, name):
    locks = [f"{name}/c", f"{name}/a", f"{name}/b"]
    RecordingCursor.sent = []
    with client.acquire_many(locks, ttl=10) as lease, \
            psycopg.connect(dsn, cursor_factory=RecordingCursor) as conn:
        with fenced_transaction(conn, lease) as claims:
            assert RecordingCursor.sent == [(lock, lease.fences[lock]) for lock in sorted(locks)]
            conn.execute("INSERT INTO notes (lock, body) VALUES (%s, 'multi')", (name,))
        assert claims.locks == lease.fences
    assert fences(dsn) == lease.fences


def test_a_trigger_refusal_is_lock_not_claimed_and_nothing_commits(dsn, client):
    mine, other = account_lock(dsn, 1), account_lock(dsn, 2)
    with client.lock(mine, ttl=10) as lease, psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, lease):
            conn.execute("INSERT INTO accounts VALUES (1, 100)")  # its lock is claimed
        with pytest.raises(LockNotClaimedError) as caught, fenced_transaction(conn, lease):
            conn.execute("UPDATE accounts SET balance = 50 WHERE id = 1")
            conn.execute("INSERT INTO accounts VALUES (2, 7)")  # lock `other` is not claimed
    assert caught.value.lock == other and caught.value.code == "lock_not_claimed"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT id, balance FROM accounts").fetchall() == [(1, 100)]


# --------------------------------------------------------------------------- the token


def test_a_forged_token_is_refused_before_any_sql(dsn, client, name):
    forged = KeyRing.generate().sign(name, 10**9)  # a key lockd never published
    with client.lock(name, ttl=10) as lease:
        header, payload, signature = lease.token.split(".")
        other = KeyRing.generate().sign(name, 10**9).split(".")[1]
        tampered = ".".join([header, other, signature])  # lockd's kid, claims it never signed
        with psycopg.connect(dsn) as conn:
            for token, why in [(forged, "unknown key"), (tampered, "signature")]:
                with pytest.raises(InvalidToken, match=why) as caught:
                    with fenced_transaction(conn, token, lockd_url=client.url):
                        raise AssertionError("the block must not run")
                assert caught.value.code == "invalid_token"
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with pytest.raises(InvalidToken):  # keys given explicitly: no lockd asked
                with fenced_transaction(conn, lease.token, jwks=KeyRing.generate().jwks()):
                    pass
    assert fences(dsn) == {}


def test_keys_are_cached_and_fetched_again_for_an_unknown_kid(dsn, lockd_server, name):
    sqlfence._keys.pop(lockd_server.url, None)
    with LockClient(lockd_server.url) as lock_client, psycopg.connect(dsn) as conn:
        with lock_client.lock(name, ttl=10) as lease, fenced_transaction(conn, lease):
            pass
        keys = sqlfence._keys[lockd_server.url]
        first, loads = keys.kids, keys.loads
        with lock_client.lock(name, ttl=10) as lease, fenced_transaction(conn, lease):
            pass
        assert keys.loads == loads, "the same key: no second fetch"
        lockd_server.key_dir = lockd_server.workdir / "rotated"  # a new signing key
        lockd_server.restart()
        # refetches are spaced (a restart quicker than the spacing would find no new key yet)
        wait_for(lambda: keys._clock() >= keys._last_load + keys._min_interval, timeout=30,
                 what="the refetch spacing to pass")
        with lock_client.lock(name, ttl=10) as lease, fenced_transaction(conn, lease) as claims:
            assert claims.locks == {name: lease.fence}
    assert sqlfence._keys[lockd_server.url] is keys and keys.kids.isdisjoint(first)
    assert fences(dsn) == {name: lease.fence}


def test_a_bare_token_needs_keys_or_a_lockd_url(dsn, client, name):
    with client.lock(name, ttl=10) as lease, psycopg.connect(dsn) as conn:
        with pytest.raises(TypeError, match="jwks= or lockd_url="):
            with fenced_transaction(conn, lease.token):
                pass
        jwks = httpx.get(client.url + "/v1/keys").json()
        with fenced_transaction(conn, lease.token, jwks=jwks) as claims:
            assert claims.locks == {name: lease.fence}


# --------------------------------------------------------------------------- the transaction


def test_the_blocks_exception_rolls_back_writes_and_claims(dsn, engine, client, name):
    boom = RuntimeError("boom")
    with client.lock(name, ttl=10) as lease, Session(engine) as session:
        with pytest.raises(RuntimeError) as caught, fenced_transaction(session, lease):
            session.add(Note(lock=name, body="lost"))
            session.flush()
            raise boom
        assert caught.value is boom
    assert notes(dsn) == [] and fences(dsn) == {}


def test_an_open_transaction_is_refused_before_any_claim(dsn, engine, client, name):
    with client.lock(name, ttl=10) as lease:
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT 1")  # a non-autocommit connection has begun a transaction
            with pytest.raises(TransactionStateError, match="INTRANS") as caught:
                with fenced_transaction(conn, lease):
                    pass
            assert caught.value.code == "transaction_open"
        with Session(engine) as session:
            session.execute(sa.text("SELECT 1"))  # autobegun
            with pytest.raises(TransactionStateError, match="commit or roll back first"):
                with fenced_transaction(session, lease):
                    pass
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        with autocommit.connect() as conn:
            with pytest.raises(TransactionStateError) as caught:
                with fenced_transaction(conn, lease):
                    pass
            assert caught.value.code == "autocommit"
    assert fences(dsn) == {}


def test_an_error_caught_inside_the_block_does_not_commit_silently(dsn, client, name):
    with client.lock(name, ttl=10) as lease, psycopg.connect(dsn) as conn:
        with pytest.raises(TransactionStateError) as caught, fenced_transaction(conn, lease):
            conn.execute("INSERT INTO notes (lock, body) VALUES (%s, 'lost')", (name,))
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")
        assert caught.value.code == "transaction_aborted"
    assert notes(dsn) == [] and fences(dsn) == {}


def test_the_wrong_flavour_of_connection_is_a_type_error(dsn, client, name):
    with client.lock(name, ttl=10) as lease, psycopg.connect(dsn) as conn:
        with pytest.raises(TypeError, match="needs fenced_transaction"):
            asyncio.run(_enter_async(conn, lease))
        with pytest.raises(TypeError, match="psycopg"):
            with fenced_transaction(object(), lease):
                pass
    assert fences(dsn) == {}


async def _enter_async(conn, lease):
    async with async_fenced_transaction(conn, lease):
        pass


def test_a_trigger_refusal_at_the_async_sessions_flush_is_lock_not_claimed(dsn, shared_lockd):
    mine, other = account_lock(dsn, 1), account_lock(dsn, 2)

    async def main():
        eng = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with AsyncLockClient(shared_lockd.url) as aclient, \
                    aclient.lock(mine, ttl=10) as lease, AsyncSession(eng) as session:
                async with async_fenced_transaction(session, lease):
                    await session.execute(sa.text("INSERT INTO accounts VALUES (1, 100)"))
                async with async_fenced_transaction(session, lease):
                    await session.execute(sa.text("UPDATE accounts SET balance = 0"))
                    await session.execute(sa.text("INSERT INTO accounts VALUES (2, 7)"))
        finally:
            await eng.dispose()

    with pytest.raises(LockNotClaimedError) as caught:
        asyncio.run(main())
    assert caught.value.lock == other
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT id, balance FROM accounts").fetchall() == [(1, 100)]
