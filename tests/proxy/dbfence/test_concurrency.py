"""Concurrent claimers of one lock, for real (threads, one connection each): the fence row lock
``fencing.claim`` takes is held until COMMIT, so no lower fence commits after a higher one."""

from __future__ import annotations

import itertools
import random
import threading

import psycopg

from resource_proxy.dbfence import install
from tests.jitter import hold_sync
from tests.proxy.dbfence.conftest import policy


def test_concurrent_claimers_cannot_commit_a_lower_fence_after_a_higher_one(db):
    db.run("CREATE TABLE log (id bigserial PRIMARY KEY, fence bigint NOT NULL)")
    install(db.engine, policy({"log": "race"}))
    counter = itertools.count(1)
    lock = threading.Lock()
    outcomes = {"committed": 0, "stale": 0}
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with db.connect() as conn:
                for _ in range(25):
                    with lock:
                        fence = next(counter)
                    hold_sync(rng, 0.003)  # let later fences overtake this one
                    try:
                        conn.execute("SELECT fencing.claim('race', %s)", (fence,))
                    except psycopg.Error as exc:
                        assert exc.sqlstate == "LF001", exc
                        conn.rollback()
                        with lock:
                            outcomes["stale"] += 1
                        continue
                    seen = conn.execute("SELECT coalesce(max(fence), 0) FROM log").fetchone()[0]
                    assert seen <= fence, f"fence {fence} claimed after {seen} committed"
                    conn.execute("INSERT INTO log (fence) VALUES (%s)", (fence,))
                    hold_sync(rng, 0.002)  # hold the fence row lock a while
                    conn.commit()
                    with lock:
                        outcomes["committed"] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0]
    with db.connect(autocommit=True) as conn:
        fences = [row[0] for row in conn.execute("SELECT fence FROM log ORDER BY id")]
    assert fences == sorted(fences), "a lower fence committed after a higher one"
    assert len(fences) == outcomes["committed"] and outcomes["committed"] + outcomes["stale"] == 200
    assert outcomes["stale"] > 0  # the race really happened
    assert db.one("SELECT highest FROM fencing.fences WHERE lock = 'race'") == (fences[-1],)
