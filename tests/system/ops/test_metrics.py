"""``/metrics`` scraped before and after real scenarios: the right series move, and only those.

Crash-path expiry (a holder process killed with SIGKILL while renewing), renewal failure (a
renew after the lease lapsed), handoff to a queued waiter, a stale write refused by the proxy,
and the store clock skew (lockd run under libfaketime against PostgreSQL).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness import TIMING_SLACK, wait_for
from tests.system.ops.conftest import scrape

HOLDER_TTL_S = 0.6
HOLDER = f"""
import sys, threading
from lockd.client import LockClient
client = LockClient(sys.argv[1])
lease = client.acquire(sys.argv[2], {HOLDER_TTL_S}, renew_every=0.15, owner="doomed holder")
print("fence", lease.fence, flush=True)
threading.Event().wait()  # holds (renewing) until killed
"""
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def _acquire(http: httpx.Client, url: str, name: str, ttl_ms: int, **extra) -> dict:
    response = http.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": ttl_ms, **extra})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_crash_path_expiry_moves_expirations_and_hold_time(store, start_lockd, name):
    lockd = start_lockd(store)
    before = scrape(lockd.url)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, lockd.url, name],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("fence ")
        wait_for(lambda: scrape(lockd.url).value("lockd_renewals_total", outcome="ok")
                 >= before.value("lockd_renewals_total", outcome="ok") + 2,
                 timeout=5, what="two renewals")
        during = scrape(lockd.url)
        assert during.value("lockd_leases_active") == 1
        assert during.value("lockd_lease_expirations_total") == before.value(
            "lockd_lease_expirations_total")
        assert during.value("lockd_renewal_margin_seconds_count") >= 2
    finally:
        holder.kill()  # SIGKILL: no release, no more renewals
        holder.wait()
    killed_at = time.monotonic()
    wait_for(lambda: scrape(lockd.url).value("lockd_lease_expirations_total")
             == before.value("lockd_lease_expirations_total") + 1, timeout=5,
             what="the expiry to be counted")
    detected_after = time.monotonic() - killed_at
    time.sleep(HOLDER_TTL_S)  # proves: counted once, not again by a later sweep (one TTL)
    after = scrape(lockd.url)
    assert after.value("lockd_lease_expirations_total") == before.value(
        "lockd_lease_expirations_total") + 1
    assert after.value("lockd_leases_active") == 0
    assert after.value("lockd_lease_hold_seconds_count", outcome="expired") == 1
    assert after.value("lockd_lease_hold_seconds_count", outcome="released") == 0
    assert after.value("lockd_releases_total", kind="released") == 0
    assert after.value("lockd_lease_ttl_seconds_count") == 1
    assert 0.3 <= after.value("lockd_lease_ttl_seconds_sum") <= 0.6
    assert detected_after < 2.0 * TIMING_SLACK  # TTL 0.6 s + sweep, not minutes


def test_renewal_failure_and_margin(start_lockd, name):
    lockd = start_lockd("sqlite")
    with httpx.Client(timeout=10) as http:
        before = scrape(lockd.url)
        ttl_ms = 1000
        lease = _acquire(http, lockd.url, name, ttl_ms)
        time.sleep(ttl_ms / 5000)  # proves: the margin counts the time used (a fifth of the TTL)
        ok = http.post(f"{lockd.url}/v1/locks/{name}/renew",
                       json={"lease_id": lease["lease_id"], "ttl_ms": 300})
        assert ok.status_code == 200
        mid = scrape(lockd.url)
        margin = mid.value("lockd_renewal_margin_seconds_sum") - before.value(
            "lockd_renewal_margin_seconds_sum")
        ratio = mid.value("lockd_renewal_margin_ratio_sum") - before.value(
            "lockd_renewal_margin_ratio_sum")
        assert 0.5 <= margin <= 0.81, margin  # ~0.8 s of the 1 s lease was left (4/5 of it)
        assert 0.5 <= ratio <= 0.81, ratio
        wait_for(lambda: not http.get(f"{lockd.url}/v1/locks/{name}").json()["held"],
                 timeout=5, what="the 300 ms renewal to lapse")
        lost = http.post(f"{lockd.url}/v1/locks/{name}/renew",
                         json={"lease_id": lease["lease_id"]})
        assert lost.status_code == 410
        wait_for(lambda: scrape(lockd.url).value("lockd_renewal_failures_total",
                                                 reason="lease_lost") >= 1
                 and scrape(lockd.url).value("lockd_lease_expirations_total") >= 1,
                 timeout=5, what="the failure and the expiry counted")
        after = scrape(lockd.url)
    assert after.value("lockd_renewal_failures_total", reason="lease_lost") == 1
    assert after.value("lockd_renewal_failures_total", reason="store_unavailable") == 0
    assert after.value("lockd_renewals_total", outcome="lease_lost") == 1
    assert after.value("lockd_renewals_total", outcome="ok") == 1
    assert after.value("lockd_lease_expirations_total") == 1  # the sweep or the 410: once
    assert after.value("lockd_renewal_margin_seconds_count") == 1  # a failed renewal has none


def test_handoff_wait_time_and_waiting_gauge(start_lockd, name):
    queued_s = 0.3  # how long the waiter is kept queued
    lockd = start_lockd("sqlite")
    with httpx.Client(timeout=10) as http:
        holder = _acquire(http, lockd.url, name, 10_000, owner="first")
        held = http.post(f"{lockd.url}/v1/locks/{name}/acquire", json={"ttl_ms": 1000})
        assert held.status_code == 409
        got: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: got.append(httpx.post(
            f"{lockd.url}/v1/locks/{name}/acquire", json={"ttl_ms": 1000, "wait_ms": 5000},
            timeout=10)))
        waiter.start()
        wait_for(lambda: scrape(lockd.url).value("lockd_acquires_waiting") == 1, timeout=5,
                 what="one queued waiter")
        time.sleep(queued_s)  # proves: the wait histogram counts the queued span
        assert http.post(f"{lockd.url}/v1/locks/{name}/release",
                         json={"lease_id": holder["lease_id"]}).status_code == 200
        waiter.join(10)
    assert got and got[0].status_code == 200 and got[0].json()["fence"] == holder["fence"] + 1
    after = scrape(lockd.url)
    assert after.value("lockd_acquires_waiting") == 0
    assert after.value("lockd_handoffs_total") == 1
    assert after.value("lockd_acquires_total", outcome="granted") == 2
    assert after.value("lockd_acquires_total", outcome="held") == 1
    assert after.value("lockd_acquire_wait_seconds_count", outcome="granted") == 2
    assert after.value("lockd_acquire_wait_seconds_sum", outcome="granted") >= queued_s
    assert after.value("lockd_lease_hold_seconds_count", outcome="released") == 1
    assert after.value("lockd_releases_total", kind="released") == 1
    assert after.value("lockd_leases_active") == 1


def test_stale_write_moves_proxy_series(start_lockd, start_proxy):
    name = "items/k1"  # the lock of row k1 (policy items/{key})
    lockd = start_lockd("sqlite")
    proxy = start_proxy(lockd)
    with httpx.Client(timeout=10) as http:
        before = scrape(proxy.url)
        old = _acquire(http, lockd.url, name, 300)
        row = f"{proxy.url}/v1/tables/items/rows/k1"
        assert http.put(row, json={"id": "k1", "v": "old"},
                        headers={"Fencing-Token": old["token"]}).status_code == 200
        wait_for(lambda: not http.get(f"{lockd.url}/v1/locks/{name}").json()["held"],
                 timeout=5, what="the 300 ms lease to expire")
        new = _acquire(http, lockd.url, name, 5000)
        assert new["fence"] == old["fence"] + 1
        assert http.put(row, json={"id": "k1", "v": "new"},
                        headers={"Fencing-Token": new["token"]}).status_code == 200
        stale = http.put(row, json={"id": "k1", "v": "revived"},
                         headers={"Fencing-Token": old["token"]})
        assert stale.status_code == 409 and stale.json()["code"] == "stale_token"
        activity = http.get(f"{proxy.url}/v1/activity").json()
    after = scrape(proxy.url)

    def delta(metric: str, **labels: str) -> float:
        return after.value(metric, **labels) - before.value(metric, **labels)

    assert delta("resource_proxy_writes_total", op="upsert", outcome="ok") == 2
    assert delta("resource_proxy_writes_total", op="upsert", outcome="stale") == 1
    assert delta("resource_proxy_writes_total", op="insert", outcome="ok") == 0
    assert delta("resource_proxy_stale_rejections_total", call="upsert") == 1
    assert delta("resource_proxy_fence_lag_count") == 1
    assert delta("resource_proxy_fence_lag_sum") == 1  # highest 2 - presented 1
    assert delta("resource_proxy_write_seconds_count", op="upsert") == 3
    assert delta("resource_proxy_requests_total", call="upsert", status="409") == 1
    assert after.value("resource_proxy_jwks_loads_total") >= 1
    assert activity["stale_total"] == 1
    assert activity["rejections"][0]["code"] == "stale_token"
    assert activity["rejections"][0]["presented"] == old["fence"]
    assert activity["rejections"][0]["highest"] == new["fence"]
    assert {"lock": name, "highest": new["fence"]}.items() <= activity["fences"][0].items()
    lockd_after = scrape(lockd.url)
    assert lockd_after.value("lockd_lease_expirations_total") == 1


def test_store_clock_skew(start_lockd):
    """PostgreSQL judges expiry by its clock: lockd measures how far its own is off. A lockd
    whose wall clock runs 30 s ahead (libfaketime) reports the store 30 s behind."""
    if not FAKETIME_LIB.exists():
        pytest.skip("libfaketime is not installed (make system-deps)")
    fast = {"LOCKD_SKEW_INTERVAL_MS": "200", "LD_PRELOAD": str(FAKETIME_LIB),
            "FAKETIME": "+30s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    skewed = start_lockd("postgres", env=fast)
    honest = start_lockd(skewed.store_url, env={"LOCKD_SKEW_INTERVAL_MS": "200"})
    sqlite = start_lockd("sqlite", env={"LOCKD_SKEW_INTERVAL_MS": "200"})
    wait_for(lambda: -31 < scrape(skewed.url).value("lockd_store_clock_skew_seconds") < -29,
             timeout=10, what="the skewed lockd's measured store clock skew")
    assert abs(scrape(honest.url).value("lockd_store_clock_skew_seconds")) < 0.5
    assert scrape(sqlite.url).value("lockd_store_clock_skew_seconds") == 0
    for server in (skewed, honest, sqlite):
        assert scrape(server.url).value("lockd_store_clock_skew_errors_total") == 0
    assert os.environ.get("LD_PRELOAD") is None  # the test process itself is not skewed
