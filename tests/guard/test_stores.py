"""The fence stores: each claims atomically with the write. Per store, 32 writers race with
mixed stale and fresh tokens: the accepted writes land in fence order (nothing stale lands after
a higher fence), every refused write is a 409 ``StaleToken`` and left nothing behind. Real
SQLite files, the machine's PostgreSQL (the ``fencing`` schema) and Redis 7 (the functions)."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable

import psycopg
import pytest
import sqlalchemy as sa

from harness import sqlalchemy_url
from lockd.guard import MemoryFences, PostgresFences, SqliteFences, StaleToken
from lockd.guard.redis import RedisFences
from resource_proxy.dbfence import install

WRITERS = 32


def race(write: Callable[[int, int], None], fences: list[int]) -> tuple[list[int], dict[int, StaleToken]]:
    """``write(writer, fence)`` from one thread per fence, started together: (accepted writers,
    writer -> its StaleToken)."""
    barrier = threading.Barrier(len(fences))
    accepted: list[int] = []
    refused: dict[int, StaleToken] = {}
    errors: list[BaseException] = []

    def run(writer: int, fence: int) -> None:
        barrier.wait()
        try:
            write(writer, fence)
        except StaleToken as exc:
            refused[writer] = exc
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        else:
            accepted.append(writer)

    threads = [threading.Thread(target=run, args=(w, f)) for w, f in enumerate(fences)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return accepted, refused


def mixed_fences(seed: int) -> list[int]:
    """32 fences, shuffled: fresh and stale ones, some equal (the same holder writing twice).
    The highest, 20, is there twice: whatever order the writers commit in, both of its writes
    pass (an equal fence is honoured), so every race accepts at least two writes."""
    rng = random.Random(seed)
    fences = [rng.randint(1, 19) for _ in range(WRITERS - 2)] + [20, 20]
    rng.shuffle(fences)
    return fences


def assert_nothing_stale_landed(log: list[tuple[int, int]], fences: list[int],
                                accepted: list[int], refused: dict[int, StaleToken]) -> None:
    """``log``: (writer, fence) in commit order, read from the store itself."""
    landed = [f for _, f in log]
    assert landed == sorted(landed), f"a lower fence landed after a higher one: {landed}"
    assert sorted(w for w, _ in log) == sorted(accepted)
    assert refused and len(accepted) >= 2, (accepted, refused)  # the race had both outcomes
    for writer, exc in refused.items():
        assert exc.presented == fences[writer] < exc.highest and exc.status == 409


@pytest.mark.parametrize("seed", [1, 2])
def test_memory_store_race(guard, ring, lock, seed):
    store, log = MemoryFences(), []
    fences = mixed_fences(seed)

    def write(writer: int, fence: int) -> None:
        with store.transaction(guard.check(ring.sign(lock, fence), lock)):
            log.append((writer, fence))

    accepted, refused = race(write, fences)
    assert_nothing_stale_landed(log, fences, accepted, refused)
    assert store.highest(lock) == max(fences)


def test_memory_store_block_error_keeps_the_highest(guard, ring, lock):
    store = MemoryFences()
    with store.transaction(guard.check(ring.sign(lock, 5), lock)):
        pass
    with pytest.raises(RuntimeError), store.transaction(guard.check(ring.sign(lock, 9), lock)):
        raise RuntimeError("the write failed")
    assert store.highest(lock) == 5
    with store.transaction(guard.check(ring.sign(lock, 5), lock)):  # equal passes
        pass


def _sqlite(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def test_sqlite_store_race(guard, ring, lock, tmp_path):
    path = tmp_path / "service.db"
    fences_store = SqliteFences()
    with _sqlite(path) as setup:
        fences_store.install(setup)
        setup.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, writer INT, fence INT)")
        setup.commit()
    fences = mixed_fences(3)

    def write(writer: int, fence: int) -> None:
        conn = _sqlite(path)
        try:
            with fences_store.transaction(conn, guard.check(ring.sign(lock, fence), lock)):
                conn.execute("INSERT INTO log (writer, fence) VALUES (?, ?)", (writer, fence))
        finally:
            conn.close()

    accepted, refused = race(write, fences)
    with _sqlite(path) as conn:
        log = conn.execute("SELECT writer, fence FROM log ORDER BY seq").fetchall()
        assert_nothing_stale_landed(log, fences, accepted, refused)
        assert fences_store.highest(conn, lock) == max(fences)


def test_sqlite_store_refuses_an_open_transaction_and_rolls_back(guard, ring, lock, tmp_path):
    conn = _sqlite(tmp_path / "s.db")
    store = SqliteFences("my_fences")
    store.install(conn)
    conn.execute("CREATE TABLE t (v INT)")
    conn.commit()
    with pytest.raises(ValueError):
        SqliteFences("fences; DROP TABLE t")
    with store.transaction(conn, guard.check(ring.sign(lock, 4), lock)):
        conn.execute("INSERT INTO t VALUES (4)")
    with pytest.raises(StaleToken), store.transaction(conn, guard.check(ring.sign(lock, 3), lock)):
        conn.execute("INSERT INTO t VALUES (3)")
    with pytest.raises(RuntimeError), store.transaction(conn, guard.check(ring.sign(lock, 8), lock)):
        conn.execute("INSERT INTO t VALUES (8)")
        raise RuntimeError("the service's write failed")
    conn.execute("INSERT INTO t VALUES (0)")  # an implicit transaction is open now
    with pytest.raises(RuntimeError), store.transaction(conn, guard.check(ring.sign(lock, 9), lock)):
        pass
    conn.rollback()
    assert conn.execute("SELECT v FROM t").fetchall() == [(4,)]
    assert store.highest(conn, lock) == 4


@pytest.fixture
def pg_fenced(pg_dsn):
    """The test's own database with the ``fencing`` schema and a ``log`` table."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE log (seq bigserial PRIMARY KEY, writer int, fence bigint)")
    engine = sa.create_engine(sqlalchemy_url(pg_dsn), poolclass=sa.NullPool)
    install(engine, tables=[])
    engine.dispose()
    return pg_dsn


def test_postgres_store_race(guard, ring, lock, pg_fenced):
    store = PostgresFences()
    fences = mixed_fences(4)

    def write(writer: int, fence: int) -> None:
        with psycopg.connect(pg_fenced) as conn:
            conn.autocommit = True  # no transaction open: the store opens the one that commits
            with store.transaction(conn, guard.check(ring.sign(lock, fence), lock)):
                conn.execute("INSERT INTO log (writer, fence) VALUES (%s, %s)", (writer, fence))

    accepted, refused = race(write, fences)
    with psycopg.connect(pg_fenced) as conn:
        log = conn.execute("SELECT writer, fence FROM log ORDER BY seq").fetchall()
        highest = conn.execute("SELECT highest FROM fencing.fences WHERE lock = %s",
                               (lock,)).fetchone()
    assert_nothing_stale_landed(log, fences, accepted, refused)
    assert highest == (max(fences),)


def test_redis_store_race(guard, ring, lock, redis_client):
    store = RedisFences(redis_client, prefix=redis_client.test_prefix + "fence:")
    stream = redis_client.test_prefix + "log"
    fences = mixed_fences(5)

    def write(writer: int, fence: int) -> None:
        store.xadd(guard.check(ring.sign(lock, fence), lock), stream,
                   {"writer": writer, "fence": fence})

    accepted, refused = race(write, fences)
    log = [(int(e[b"writer"]), int(e[b"fence"])) for _, e in redis_client.xrange(stream)]
    assert_nothing_stale_landed(log, fences, accepted, refused)
    assert store.highest(lock) == max(fences)


def test_redis_functions_write_with_ttl_and_refuse_stale(guard, ring, lock, redis_client):
    store = RedisFences(redis_client, prefix=redis_client.test_prefix + "fence:")
    key, h = redis_client.test_prefix + "k", redis_client.test_prefix + "h"
    fence7 = guard.check(ring.sign(lock, 7), lock)
    assert store.set(fence7, key, "seven", ttl_ms=60_000) in (b"OK", True, "OK")
    assert 0 < redis_client.pttl(key) <= 60_000
    assert store.hset(fence7, h, {"a": 1, "b": "x"}) == 2 and redis_client.pttl(h) == -1
    with pytest.raises(StaleToken) as caught:
        store.set(guard.check(ring.sign(lock, 6), lock), key, "six")
    assert (caught.value.presented, caught.value.highest) == (6, 7)
    with pytest.raises(StaleToken):
        store.delete(guard.check(ring.sign(lock, 6), lock), key)
    assert redis_client.get(key) == b"seven"
    big = 2**63 - 1  # compared as text: a 64-bit fence is exact
    assert store.claim(guard.check(ring.sign(lock, big), lock)) == big
    with pytest.raises(StaleToken):
        store.set(guard.check(ring.sign(lock, big - 1), lock), key, "x")
    assert store.delete(guard.check(ring.sign(lock, big), lock), key) == 1
    assert redis_client.get(key) is None


def test_the_install_command_loads_the_library(redis_client):
    import subprocess
    import sys

    redis_client.function_delete("lockd_guard")
    assert not redis_client.function_list(library="lockd_guard")
    try:
        r = subprocess.run([sys.executable, "-m", "lockd.guard", "redis", "install",
                            "--redis-url", "redis://127.0.0.1:6379/0"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "lockd_guard" in r.stdout, r.stderr
        assert redis_client.function_list(library="lockd_guard")  # loaded again
        r = subprocess.run([sys.executable, "-m", "lockd.guard", "redis", "install",
                            "--redis-url", "redis://127.0.0.1:1/0"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "cannot load" in r.stderr and "Traceback" not in r.stderr
    finally:
        from lockd.guard.redis import install
        install(redis_client)
