"""A real race: two proxy processes on one PostgreSQL database, 50 threads writing for ONE lock
with interleaved fences (new grants keep arriving while older holders keep writing).

How the tests see commit order. Each write appends (fence, writer) to a history table whose id is
a bigserial, in the same transaction as the write. Identity values are assigned at INSERT time,
not at COMMIT, so in general id order is not commit order. Here it is, for the writes of one
lock: every write first takes the row lock on that lock's fence row (the conditional upsert) and
keeps it until COMMIT, and only then inserts its history row. So the critical sections of two
writes for the lock cannot overlap: if T1 commits before T2, T2's upsert was still waiting for
T1's row lock when T1 drew its id, and T2 draws its id after T1 committed. Hence, for one lock,
history id order == commit order, and "fences in id order never decrease" is exactly invariant 4
("a lower fence never commits after a higher one"). Without the fence check the random fences
below would commit out of order and the assertion would fail.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import httpx
import psycopg
import pytest

from harness import sqlalchemy_url
from lockd.tokens import KeyRing
from tests.proxy.conftest import unique, write_jwks

THREADS = 50
WRITES_PER_THREAD = 4

SCHEMA = """
CREATE TABLE counter (id text PRIMARY KEY, writer text NOT NULL, last_fence bigint);
CREATE TABLE history (id bigserial PRIMARY KEY, fence bigint NOT NULL, writer text NOT NULL);
CREATE TABLE counter2 (id text PRIMARY KEY, writer text NOT NULL, last_fence bigint);
CREATE TABLE history2 (id bigserial PRIMARY KEY, fence bigint NOT NULL, writer text NOT NULL);
CREATE FUNCTION log_counter2() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO history2 (fence, writer) VALUES (NEW.last_fence, NEW.writer);
  RETURN NEW;
END $$;
CREATE TRIGGER counter2_log AFTER INSERT OR UPDATE ON counter2
  FOR EACH ROW EXECUTE FUNCTION log_counter2();
"""

POLICY = """
tables:
  counter: {lock: race, fence_column: last_fence}
  history: race
  counter2: {lock: race2, fence_column: last_fence}
"""


def _race(urls: list[str], ring: KeyRing, lock: str,
          send: Callable[[httpx.Client, str, int, str], httpx.Response]) -> list[tuple[int, str, int, dict]]:
    """Run THREADS x WRITES_PER_THREAD writes; return (fence, writer, status, body) of each.

    Fences follow a simulated lockd: a shared grant counter that threads bump now and then,
    while each write presents the current grant or one up to three grants older (a holder that
    lost its lease and does not know yet).
    """
    granted = [1]
    guard = threading.Lock()
    results: list[tuple[int, str, int, dict]] = []
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            with httpx.Client(base_url=urls[n % len(urls)], timeout=60) as client:
                barrier.wait(timeout=30)
                for i in range(WRITES_PER_THREAD):
                    with guard:
                        if rng.random() < 0.3:
                            granted[0] += 1
                        fence = max(1, granted[0] - rng.randint(0, 3))
                    writer = f"w{n}-{i}"
                    response = send(client, ring.sign(lock, fence), fence, writer)
                    with guard:
                        body = response.json() if response.content else {}
                        results.append((fence, writer, response.status_code, body))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == THREADS * WRITES_PER_THREAD
    return results


def _check(results: list[tuple[int, str, int, dict]], history: list[tuple[int, str]],
           final: tuple[str, int], lock: str) -> None:
    statuses = {status for _, _, status, _ in results}
    assert statuses <= {200, 409}, statuses
    ok = {writer: fence for fence, writer, status, _ in results if status == 200}
    stale = {writer for _, writer, status, _ in results if status == 409}
    assert ok and stale, "the race must produce both honoured and rejected writes"

    fences = [fence for fence, _ in history]
    assert fences == sorted(fences), f"a lower fence committed after a higher one: {fences}"
    logged = [writer for _, writer in history]
    assert sorted(logged) == sorted(ok), "every acknowledged write is in the history, once"
    assert not stale & set(logged), "a rejected write left a trace"
    assert dict((w, f) for f, w in history) == ok
    for fence, _, status, body in results:
        if status == 409:
            assert body["code"] == "stale_token" and body["lock"] == lock
            assert body["presented"] == fence < body["highest"]
    assert final == (history[-1][1], history[-1][0]), "the row holds the last committed write"


@pytest.fixture
def two_proxies(pg_dsn, tmp_path, start_proxy):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    ring = KeyRing.generate()
    jwks = write_jwks(tmp_path, ring)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ("--jwks-file", str(jwks), "--policy", str(policy))
    urls = [start_proxy(sqlalchemy_url(pg_dsn), *args)[0], start_proxy(pg_dsn, *args)[0]]
    return urls, ring


def _rows(dsn: str, sql: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def test_race_batches_on_two_proxies_commit_in_fence_order(pg_dsn, two_proxies):
    urls, ring = two_proxies
    lock, key = "race", unique()  # one lock governs counter and history (a literal template)

    def send(client: httpx.Client, token: str, fence: int, writer: str) -> httpx.Response:
        return client.post("/v1/batch", headers={"Fencing-Token": token}, json={"ops": [
            {"op": "upsert", "table": "counter", "key": key, "row": {"writer": writer}},
            {"op": "insert", "table": "history", "row": {"fence": fence, "writer": writer}},
        ]})

    results = _race(urls, ring, lock, send)
    history = _rows(pg_dsn, "SELECT fence, writer FROM history ORDER BY id")
    [final] = _rows(pg_dsn, f"SELECT writer, last_fence FROM counter WHERE id = '{key}'")
    _check(results, history, final, lock)


def test_race_single_row_writes_on_two_proxies_commit_in_fence_order(pg_dsn, two_proxies):
    """The one-statement path (fence upsert + write in a CTE); a trigger appends the history
    row inside the write's own transaction, under the same fence row lock."""
    urls, ring = two_proxies
    lock, key = "race2", unique()

    def send(client: httpx.Client, token: str, fence: int, writer: str) -> httpx.Response:
        return client.put(f"/v1/tables/counter2/rows/{key}", headers={"Fencing-Token": token},
                          json={"writer": writer})

    results = _race(urls, ring, lock, send)
    history = _rows(pg_dsn, "SELECT fence, writer FROM history2 ORDER BY id")
    [final] = _rows(pg_dsn, f"SELECT writer, last_fence FROM counter2 WHERE id = '{key}'")
    _check(results, history, final, lock)
