"""The database goes away (a crash like a power cut) and comes back, under a steady write load.

While it is down every write answers quickly (never hangs, never 500): 503
``database_unavailable`` when nothing was committed, or 502 ``outcome_unknown`` for a write
whose statement was in flight when the database died. ``/healthz`` answers 503; once it is back
the proxy serves again by itself (no restart), and every write it acknowledged before the crash
is still there (fsync'd commit before the 2xx).
"""

from __future__ import annotations

import threading
import time

import httpx
import psycopg

from harness import wait_for
from lockd.tokens import KeyRing
from tests.jitter import hold_sync
from tests.proxy.conftest import assert_problem, write_jwks


def test_database_outage_answers_503_then_recovers_without_losing_acknowledged_writes(
        throwaway_pg, tmp_path, start_proxy, monkeypatch):
    with psycopg.connect(throwaway_pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id integer PRIMARY KEY, v text NOT NULL)")
    ring = KeyRing.generate()
    monkeypatch.setenv("PROXY_DB_TIMEOUT_MS", "1000")
    url, _ = start_proxy(throwaway_pg.dsn, "--jwks-file", str(write_jwks(tmp_path, ring)))
    token = {"Fencing-Token": ring.sign("items", 1)}  # no policy: lock = table

    outcomes: dict[int, httpx.Response] = {}
    slowest = [0.0]
    stop = threading.Event()

    def writer() -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            key = 0
            while not stop.is_set():
                key += 1
                started = time.monotonic()
                outcomes[key] = client.put(f"/v1/tables/items/rows/{key}", json={"v": f"v{key}"},
                                           headers=token)
                slowest[0] = max(slowest[0], time.monotonic() - started)
                if outcomes[key].status_code != 200:
                    hold_sync(None, 0.05)  # a pause before the next try

    def count(status: int) -> int:
        return sum(1 for r in list(outcomes.values()) if r.status_code == status)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: count(200) >= 50, timeout=30, what="writes before the crash")
        throwaway_pg.stop("immediate")
        wait_for(lambda: count(503) >= 5, timeout=30, what="503 answers while the database is down")
        assert_problem(httpx.get(f"{url}/healthz", timeout=10), 503, "database_unavailable")
        acknowledged_before = count(200)
        throwaway_pg.start()
        wait_for(lambda: count(200) >= acknowledged_before + 20, timeout=60,
                 what="writes succeeding again after the database returned")
    finally:
        stop.set()
        thread.join(60)

    statuses = {r.status_code for r in outcomes.values()}
    assert statuses <= {200, 502, 503}, statuses
    unknown = [r for r in outcomes.values() if r.status_code == 502]
    assert len(unknown) <= 3, "only writes in flight at the crash can have an unknown outcome"
    for response in unknown:
        assert_problem(response, 502, "outcome_unknown")
    for response in outcomes.values():
        if response.status_code == 503:
            assert_problem(response, 503, "database_unavailable")
            assert response.headers["retry-after"] == "1"
    assert slowest[0] < 10, f"a request hung for {slowest[0]:.1f} s"
    assert httpx.get(f"{url}/healthz").status_code == 200

    with psycopg.connect(throwaway_pg.dsn) as conn:
        stored = dict(conn.execute("SELECT id, v FROM items").fetchall())
    acknowledged = [key for key, r in outcomes.items() if r.status_code == 200]
    missing = [key for key in acknowledged if stored.get(key) != f"v{key}"]
    assert not missing, f"acknowledged writes lost in the crash: {missing}"
    # A 503 is safe to retry: the same write with the same token now succeeds.
    with httpx.Client(base_url=url) as client:
        for key in [k for k, r in outcomes.items() if r.status_code == 503][:10]:
            retry = client.put(f"/v1/tables/items/rows/{key}", json={"v": f"v{key}"}, headers=token)
            assert retry.status_code == 200, retry.text
