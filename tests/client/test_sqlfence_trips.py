"""``fenced_transaction`` on psycopg sends ``BEGIN`` and its claims as one message: round trips
counted on the wire, and the transaction's semantics kept (stale claims, rollbacks, savepoints,
autocommit on and off, quoting of lock names).

Round trips are counted by a TCP relay between psycopg and PostgreSQL that reads the server's
messages: one ``ReadyForQuery`` ends every round trip (the answer to a simple ``Query`` or to an
extended-protocol ``Sync``). The database side is ``resource_proxy.dbfence.install`` on
``accounts`` (lock ``acct-<database>/<id>``), as in test_sqlfence; tokens are signed here.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import psycopg
import pytest

from harness import pg_available
from lockd import StaleTokenError
from lockd.client.sqlfence import (
    TransactionStateError,
    async_fenced_transaction,
    fenced_transaction,
)
from lockd.tokens import KeyRing
from tests.client.test_sqlfence import account_lock, dsn, fences, notes  # noqa: F401

pytestmark = pytest.mark.skipif(pg_available() is not None, reason="PostgreSQL not reachable")

INSERT = "INSERT INTO notes (lock, body) VALUES (%s, %s)"


class Relay:
    """A TCP relay to PostgreSQL counting the server's ``ReadyForQuery`` messages (``ready``),
    counted before they are passed on, so a count read after a call includes its answers."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.ready = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        pending = b""
        try:
            while data := src.recv(65536):
                if count:  # the server's messages: type byte, int32 length (itself included)
                    pending += data
                    while len(pending) >= 5:
                        end = 1 + int.from_bytes(pending[1:5], "big")
                        if len(pending) < end:
                            break
                        self.ready += pending[0] == ord("Z")
                        pending = pending[end:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with _quiet():
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return isinstance(exc[1], OSError)


@pytest.fixture
def relay(dsn):  # noqa: F811
    hostport = dsn.split("@")[-1].split("/")[0]
    host, _, port = hostport.partition(":")
    server = Relay(host or "127.0.0.1", int(port or 5432))
    yield server
    server.close()


@pytest.fixture
def ring():
    return KeyRing.generate()


def _connect(dsn, relay, **kw):  # noqa: F811
    return psycopg.connect(dsn, port=relay.port, sslmode="disable", gssencmode="disable", **kw)


async def _aconnect(dsn, relay, **kw):  # noqa: F811
    return await psycopg.AsyncConnection.connect(dsn, port=relay.port, sslmode="disable",
                                                 gssencmode="disable", **kw)


@pytest.mark.parametrize("autocommit", [False, True])
def test_claim_insert_commit_is_three_round_trips(dsn, relay, ring, autocommit):  # noqa: F811
    lock = account_lock(dsn, 1)
    with _connect(dsn, relay, autocommit=autocommit) as conn:
        before = relay.ready
        with fenced_transaction(conn, ring.sign(lock, 4), jwks=ring.jwks()):
            conn.execute(INSERT, (lock, "three"))
        assert relay.ready - before == 3  # BEGIN + claim, INSERT, COMMIT
        assert conn.autocommit is autocommit
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert notes(dsn) == [(lock, "three")] and fences(dsn) == {lock: 4}


def test_a_multi_lock_claim_is_still_one_message(dsn, relay, ring):  # noqa: F811
    locks = {account_lock(dsn, 2): 3, account_lock(dsn, 1): 5}
    token = ring.sign_many(locks)
    with _connect(dsn, relay) as conn:
        before = relay.ready
        with fenced_transaction(conn, token, jwks=ring.jwks()):
            pass
        assert relay.ready - before == 2  # BEGIN + both claims, COMMIT
    assert fences(dsn) == locks


def test_async_claim_insert_commit_is_three_round_trips(dsn, relay, ring):  # noqa: F811
    lock = account_lock(dsn, 1)

    async def main():
        async with await _aconnect(dsn, relay, prepare_threshold=None) as conn:
            for n in range(2):
                before = relay.ready
                async with async_fenced_transaction(conn, ring.sign(lock, 4), jwks=ring.jwks()):
                    await conn.execute(INSERT, (lock, f"async {n}"))
                assert relay.ready - before == 3
                assert conn.autocommit is False
        # statements prepared from their first use: the claims' message never is (a prepared
        # statement cannot hold two commands)
        async with await _aconnect(dsn, relay, prepare_threshold=0) as conn:
            for n in range(2, 5):
                async with async_fenced_transaction(conn, ring.sign(lock, 4), jwks=ring.jwks()):
                    await conn.execute(INSERT, (lock, f"async {n}"))

    asyncio.run(main())
    assert notes(dsn) == [(lock, f"async {n}") for n in range(5)]


def test_a_connection_with_its_own_isolation_level_keeps_the_general_path(dsn, relay,  # noqa: F811
                                                                          ring):
    lock = account_lock(dsn, 1)
    with _connect(dsn, relay) as conn:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        before = relay.ready
        with fenced_transaction(conn, ring.sign(lock, 4), jwks=ring.jwks()):
            level = conn.execute("SHOW transaction_isolation").fetchone()[0]
        assert level == "serializable"
        assert relay.ready - before == 4  # BEGIN ISOLATION LEVEL ..., claim, SHOW, COMMIT
    assert fences(dsn) == {lock: 4}


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_stale_claim_sends_nothing_of_the_block_and_writes_nothing(dsn, relay, ring,  # noqa: F811
                                                                     autocommit):
    lock = account_lock(dsn, 1)
    with psycopg.connect(dsn) as conn, fenced_transaction(conn, ring.sign(lock, 9),
                                                          jwks=ring.jwks()):
        pass
    entered = False
    with _connect(dsn, relay, autocommit=autocommit) as conn:
        before = relay.ready
        with pytest.raises(StaleTokenError) as caught:
            with fenced_transaction(conn, ring.sign(lock, 7), jwks=ring.jwks()):
                entered = True
        assert relay.ready - before == 2  # the failed message, ROLLBACK
        assert conn.autocommit is autocommit
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not entered
    assert (caught.value.lock, caught.value.presented, caught.value.highest) == (lock, 7, 9)
    assert fences(dsn) == {lock: 9} and notes(dsn) == []


def test_lock_names_reach_the_claim_as_one_literal(dsn, ring):  # noqa: F811
    """No valid lock name holds a quote, but the message is built from literals anyway: a name
    full of SQL reaches ``fencing.claim`` whole, and is refused there as a name."""
    lock = account_lock(dsn, 1) + "/o'k\\x'); INSERT INTO accounts VALUES (9, 9); --"
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            with fenced_transaction(conn, ring.sign(lock, 11), jwks=ring.jwks()):
                pass
        assert "not a lock name" in str(caught.value)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (0,)
    assert fences(dsn) == {}


def test_a_savepoint_inside_the_block_rolls_back_alone(dsn, ring):  # noqa: F811
    lock = account_lock(dsn, 1)
    with psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, ring.sign(lock, 2), jwks=ring.jwks()):
            conn.execute(INSERT, (lock, "kept"))
            with pytest.raises(ZeroDivisionError), conn.transaction() as inner:
                assert inner.savepoint_name  # a savepoint in the fenced transaction
                conn.execute(INSERT, (lock, "undone"))
                raise ZeroDivisionError
            conn.execute("INSERT INTO accounts VALUES (1, 10)")  # the claim still holds
    assert notes(dsn) == [(lock, "kept")] and fences(dsn) == {lock: 2}


def test_the_blocks_exception_rolls_back_and_restores_autocommit(dsn, ring):  # noqa: F811
    lock = account_lock(dsn, 1)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(KeyError), fenced_transaction(conn, ring.sign(lock, 2),
                                                         jwks=ring.jwks()):
            conn.execute(INSERT, (lock, "lost"))
            raise KeyError("boom")
        assert conn.autocommit is False
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert notes(dsn) == [] and fences(dsn) == {}


def test_psycopg_rollback_in_the_block_rolls_back_quietly(dsn, ring):  # noqa: F811
    lock = account_lock(dsn, 1)
    with psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, ring.sign(lock, 2), jwks=ring.jwks()):
            conn.execute(INSERT, (lock, "lost"))
            raise psycopg.Rollback()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert notes(dsn) == [] and fences(dsn) == {}


def test_an_error_caught_in_the_block_still_refuses_to_commit(dsn, ring):  # noqa: F811
    lock = account_lock(dsn, 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(TransactionStateError) as caught:
            with fenced_transaction(conn, ring.sign(lock, 2), jwks=ring.jwks()):
                conn.execute(INSERT, (lock, "lost"))
                with pytest.raises(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1/0")
        assert caught.value.code == "transaction_aborted"
        assert conn.autocommit is True
    assert notes(dsn) == [] and fences(dsn) == {}


def test_a_block_that_commits_itself_is_reported(dsn, ring):  # noqa: F811
    lock = account_lock(dsn, 1)
    with psycopg.connect(dsn) as conn:
        with pytest.raises((TransactionStateError, psycopg.ProgrammingError)):
            with fenced_transaction(conn, ring.sign(lock, 2), jwks=ring.jwks()):
                conn.execute(INSERT, (lock, "early"))
                conn.commit()
        assert conn.autocommit is False
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
