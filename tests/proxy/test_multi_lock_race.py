"""Real races of multi-lock batches: three proxy processes on one PostgreSQL database.

1. Opposite orders never deadlock. Threads send two-row batches under one multi-lock token,
   half of them as [A, B] and half as [B, A], all at once. Every batch locks the fence rows of
   the locks it touches first, in lock-name order, so no two transactions wait for each other in
   a cycle: every batch answers 200 (a PostgreSQL deadlock would abort one: 503). Each batch
   writes a pair that sums to TOTAL, so the final rows must be ONE batch's pair (all or nothing).
2. Transfers conserve money. Threads move money between random pairs of accounts, in random op
   order, through ``FencedSession`` with a multi-lock lease. A simulated lockd grants both
   locks at once (local locks taken in name order, then a new, higher fence from a shared
   counter); the session claims both, reads both rows and writes both in one batch. Now and
   then a holder "pauses past its TTL": its locks are freed before it sends the batch, so a
   newer holder may claim and write in between; the old batch must then be stale (409, retried
   under a new grant). Every transfer completes, nothing but 200/409 is seen, and each account
   ends at its start plus the acknowledged transfers: none lost, none doubled.

The multi-lock lease is a stand-in (token from ``KeyRing.sign_many`` + ``fences``) until the
client's ``acquire_many`` is merged.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest

from harness import sqlalchemy_url
from lockd.client.errors import StaleTokenError
from lockd.client.fenced import FencedSession
from lockd.tokens import KeyRing
from tests.jitter import hold_sync
from tests.proxy.conftest import write_jwks

SCHEMA = """
CREATE TABLE acct (id integer PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0),
                   last_fence bigint);
"""
POLICY = """
tables:
  acct: {lock: "acct/{id}", fence_column: last_fence}
"""
PROXIES = 3
TOTAL = 1000


class StandInLease:
    """What ``client.acquire_many`` returns, as far as ``FencedSession`` is concerned."""

    def __init__(self, ring: KeyRing, fences: Mapping[str, int]):
        self.fences = dict(fences)
        self.token = ring.sign_many(self.fences)
        self.lost = False

    def _mark_lost(self, reason: Any) -> bool:
        self.lost = True
        return True


@pytest.fixture
def proxies(pg_dsn, tmp_path, start_proxy) -> tuple[list[str], KeyRing]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    ring = KeyRing.generate()
    jwks = write_jwks(tmp_path, ring)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ("--jwks-file", str(jwks), "--policy", str(policy))
    return [start_proxy(sqlalchemy_url(pg_dsn), *args)[0] for _ in range(PROXIES)], ring


def _rows(dsn: str) -> dict[int, tuple[int, int | None]]:
    with psycopg.connect(dsn) as conn:
        return {i: (b, f) for i, b, f in conn.execute("SELECT id, balance, last_fence FROM acct")}


def _seed(dsn: str, balances: Mapping[int, int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for account, balance in balances.items():
            conn.execute("INSERT INTO acct (id, balance) VALUES (%s, %s)", (account, balance))


def _run(threads: int, work: Callable[[int], None]) -> None:
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            work(n)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    started = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join(120)
    assert not any(t.is_alive() for t in started), "a worker hung"
    assert not errors, errors[:3]


def test_opposite_order_batches_never_deadlock(pg_dsn, proxies):
    urls, ring = proxies
    threads, batches = 24, 12
    _seed(pg_dsn, {1: TOTAL, 2: 0})
    token = {"Fencing-Token": ring.sign_many({"acct/1": 1, "acct/2": 1})}  # equal fences pass
    written: list[tuple[int, int]] = []
    statuses: list[int] = []
    guard = threading.Lock()

    def work(n: int) -> None:
        rng = random.Random(n)
        with httpx.Client(base_url=urls[n % len(urls)], timeout=20) as client:
            for _ in range(batches):
                x = rng.randint(0, TOTAL)
                ops = [{"op": "update", "table": "acct", "key": 1, "row": {"balance": x}},
                       {"op": "update", "table": "acct", "key": 2, "row": {"balance": TOTAL - x}}]
                if n % 2:
                    ops.reverse()
                r = client.post("/v1/batch", headers=token, json={"ops": ops})
                with guard:
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        written.append((x, TOTAL - x))

    _run(threads, work)
    assert len(statuses) == threads * batches
    assert set(statuses) == {200}, sorted(set(statuses))
    rows = _rows(pg_dsn)
    final = (rows[1][0], rows[2][0])
    assert sum(final) == TOTAL and final in written, final


def test_concurrent_transfers_through_fenced_sessions_conserve_the_total(pg_dsn, proxies):
    urls, ring = proxies
    threads, transfers, accounts = 8, 8, 4
    start = {i: TOTAL for i in range(1, accounts + 1)}
    _seed(pg_dsn, start)
    fences = itertools.count(1)
    guard = threading.Lock()
    held = {i: threading.Lock() for i in start}  # the simulated lockd's locks
    applied: list[tuple[int, int, int]] = []  # (from, to, amount) acknowledged
    stale = [0]

    def work(n: int) -> None:
        rng = random.Random(1000 + n)
        with httpx.Client(timeout=60) as http:
            for _ in range(transfers):
                src, dst = rng.sample(range(1, accounts + 1), 2)
                for _attempt in range(50):
                    granted = [held[i] for i in sorted((src, dst))]
                    for lock in granted:  # all at once, in name order: no hold-and-wait cycle
                        lock.acquire()
                    with guard:
                        fence = next(fences)
                    lease = StandInLease(ring, {f"acct/{src}": fence, f"acct/{dst}": fence})
                    db = FencedSession(urls[rng.randrange(len(urls))], lease, http_client=http)
                    try:
                        assert db.lock_for("acct", src) == f"acct/{src}"
                        have = db.get("acct", src)["balance"]
                        to = db.get("acct", dst)["balance"]
                        assert db.claimed and set(db.highests) == set(lease.fences)
                        amount = min(rng.randint(1, 50), have)
                        ops = [{"op": "update", "table": "acct", "key": src,
                                "row": {"balance": have - amount}},
                               {"op": "update", "table": "acct", "key": dst,
                                "row": {"balance": to + amount}}]
                        if rng.random() < 0.5:
                            ops.reverse()
                        if rng.random() < 0.3:  # paused past the TTL: lockd frees the locks
                            for lock in granted:
                                lock.release()
                            granted = []
                            hold_sync(None, 0.03)
                        db.batch(ops)
                    except StaleTokenError as exc:
                        assert exc.problem["stale"] and lease.lost
                        with guard:
                            stale[0] += 1
                        continue
                    finally:
                        for lock in granted:
                            lock.release()
                    with guard:
                        applied.append((src, dst, amount))
                    break
                else:
                    raise AssertionError("a transfer never completed")

    _run(threads, work)
    assert len(applied) == threads * transfers, "every transfer completes"
    expected = dict(start)
    for src, dst, amount in applied:
        expected[src] -= amount
        expected[dst] += amount
    rows = _rows(pg_dsn)
    assert sum(b for b, _ in rows.values()) == TOTAL * accounts, "money created or destroyed"
    assert {i: Decimal(b) for i, (b, _) in rows.items()} == expected, "a transfer lost or doubled"
    assert stale[0] > 0, "the race must make some attempts stale"
