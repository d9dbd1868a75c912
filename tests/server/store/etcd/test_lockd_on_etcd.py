"""Real ``lockd serve`` processes on a real 3-member etcd cluster, under faults.

- kill -9 of the etcd leader while holders renew and waiters queue: lockd keeps serving,
  never two live leases, fences keep increasing, held leases survive;
- two lockd replicas on one cluster: mutual exclusion across them, and a release on one wakes a
  waiter on the other through the etcd watch (well under the TTL);
- quorum lost: 503 ``store_unavailable``, nothing granted, service resumes with the quorum.

Intervals are measured on this test process's monotonic clock: a holder's interval runs from
the acquire's response to the moment its release is SENT, so two intervals of one lock that
overlap mean two clients were granted it at once.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness import TIMING_SLACK, wait_for
from harness.etcd import EtcdCluster
from harness.servers import LockdServer
from tests.jitter import hold_sync

pytestmark = pytest.mark.slow


@pytest.fixture
def lockds(tmp_path: Path):
    """``start(store_url) -> base URL``: ``lockd serve`` replicas sharing one key directory (as
    replicas behind a load balancer must, so every token verifies against one JWKS)."""
    servers: list[LockdServer] = []

    def start(store_url: str) -> str:
        server = LockdServer(store_url, key_dir=tmp_path / "keys", log_dir=tmp_path)
        servers.append(server)
        return server.start().url

    yield start
    for server in servers:
        server.stop()


@dataclass
class Ledger:
    """Every grant a client saw: (lock, fence, granted_at, released_at), thread-safe."""

    grants: list[tuple[str, int, float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, lock: str, fence: int, start: float, end: float) -> None:
        with self.lock:
            self.grants.append((lock, fence, start, end))

    def check(self) -> None:
        """No two grants of one lock overlap; fences increase in grant order."""
        by_lock: dict[str, list[tuple[int, float, float]]] = {}
        for lock, fence, start, end in self.grants:
            by_lock.setdefault(lock, []).append((fence, start, end))
        for lock, grants in by_lock.items():
            grants.sort(key=lambda g: g[1])
            for (f1, _s1, e1), (f2, s2, _e2) in zip(grants, grants[1:], strict=False):
                assert s2 >= e1, f"{lock}: two live leases (fences {f1} and {f2})"
                assert f2 > f1, f"{lock}: fence went from {f1} to {f2}"


def cycle_worker(base: str, lock: str, ledger: Ledger, stop: threading.Event, hold_s: float,
                 ttl_ms: int = 2000, wait_ms: int = 8000) -> None:
    """Loop: acquire (waiting), hold ``hold_s`` (renewing), release. 503s are retried."""
    with httpx.Client(base_url=base, timeout=30) as http:
        while not stop.is_set():
            r = http.post(f"/v1/locks/{lock}/acquire",
                          json={"ttl_ms": ttl_ms, "wait_ms": wait_ms, "owner": "cycler"})
            if r.status_code in (409, 503):
                hold_sync(None, 0.05)  # a pause before the retry
                continue
            assert r.status_code == 200, r.text
            start = time.monotonic()
            lease = r.json()
            deadline = start + hold_s
            while time.monotonic() < deadline:
                hold_sync(None, min(0.2, max(0.0, deadline - time.monotonic())))
                rr = http.post(f"/v1/locks/{lock}/renew",
                               json={"lease_id": lease["lease_id"], "ttl_ms": ttl_ms})
                if rr.status_code == 410:
                    ledger.errors.append(f"{lock}: lease lost while holding: {rr.text}")
                    break
            end = time.monotonic()
            ledger.add(lock, lease["fence"], start, end)
            wait_for(lambda lease=lease: http.post(f"/v1/locks/{lock}/release", json={
                         "lease_id": lease["lease_id"]}).status_code != 503,
                     timeout=5.0, interval=0.1, what=f"{lock}: a release answered (not 503)")


LONG_TTL_MS = 2000


def long_holder(base: str, lock: str, results: dict, stop: threading.Event,
                kill_at: list[float]) -> None:
    """Hold ``lock`` for the whole run, renewing every fifth of its TTL (``LONG_TTL_MS``)."""
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post(f"/v1/locks/{lock}/acquire", json={"ttl_ms": LONG_TTL_MS, "owner": "long"})
        assert r.status_code == 200, r.text
        lease = r.json()
        out = results.setdefault(lock, {"fence": lease["fence"], "lost": False, "unavailable": 0,
                                        "ok_after_kill": 0})
        while not stop.is_set():
            hold_sync(None, LONG_TTL_MS / 5000)  # renewal pacing
            rr = http.post(f"/v1/locks/{lock}/renew",
                           json={"lease_id": lease["lease_id"], "ttl_ms": LONG_TTL_MS})
            if rr.status_code == 410:
                out["lost"] = True
                return
            if rr.status_code == 503:
                out["unavailable"] += 1
                continue
            assert rr.status_code == 200, rr.text
            assert rr.json()["fence"] == lease["fence"]
            if kill_at:
                out["ok_after_kill"] += 1
        http.post(f"/v1/locks/{lock}/release", json={"lease_id": lease["lease_id"]})


def test_leader_kill_lockd_keeps_serving(etcd_cluster: EtcdCluster, lockds):
    leader = etcd_cluster.leader()
    order = [leader] + [i for i in range(3) if i != leader]  # lockd talks to the leader first
    store = "etcd://" + ",".join(etcd_cluster.endpoints[i] for i in order) + "/kill"
    a, b = lockds(store), lockds(store)
    tag = uuid.uuid4().hex[:6]
    ledger, stop, kill_at = Ledger(), threading.Event(), []
    holders: dict = {}
    threads = [threading.Thread(target=cycle_worker,
                                args=(base, f"cyc/{tag}/{i % 2}", ledger, stop, 0.15))
               for i, base in enumerate([a, b, a, b, a, b])]
    threads += [threading.Thread(target=long_holder,
                                 args=(base, f"long/{tag}/{i}", holders, stop, kill_at))
                for i, base in enumerate([a, b])]
    for t in threads:
        t.start()
    wait_for(lambda: len(ledger.grants) >= 4 and len(holders) == 2, timeout=20,
             what="grants and both long holders before the kill")
    grants_before = len(ledger.grants)
    kill_at.append(time.monotonic())
    etcd_cluster.kill_member(leader)
    # How long until a lockd grants a fresh lock again.
    with httpx.Client(base_url=a, timeout=30) as http:

        def granted() -> bool:
            r = http.post(f"/v1/locks/fresh/{tag}/{uuid.uuid4().hex[:4]}/acquire",
                          json={"ttl_ms": 2000})
            if r.status_code != 200:
                assert r.status_code == 503, r.text
                assert r.json()["code"] == "store_unavailable"
            return r.status_code == 200

        wait_for(granted, timeout=15, interval=0.05, what="a fresh grant after the leader kill")
        served_after = time.monotonic() - kill_at[0]
    # proves: two TTLs after the kill, the held leases live on through renewals alone
    time.sleep(2 * LONG_TTL_MS / 1000)
    stop.set()
    for t in threads:
        t.join(40)
    new_leader = etcd_cluster.leader()
    ledger.check()
    assert ledger.errors == []
    grants_after = [g for g in ledger.grants if g[2] > kill_at[0]]
    assert len(grants_after) >= 4, "lockd did not keep serving after the re-election"
    assert grants_before >= 2
    for lock, out in holders.items():
        assert not out["lost"], f"{lock} was lost across the failover"
        assert out["ok_after_kill"] >= 3, f"{lock}: renewals did not resume: {out}"
    print(f"\nleader kill -9 (member {leader} -> {new_leader}): lockd granted again after "
          f"{served_after:.2f}s; grants before/after {grants_before}/{len(grants_after)}; "
          f"holders {holders}")


def test_two_replicas_exclusion_and_cross_replica_wakeup(etcd_url: str, lockds):
    a, b = lockds(etcd_url), lockds(etcd_url)
    tag = uuid.uuid4().hex[:6]
    # Mutual exclusion with clients spread over both replicas.
    ledger, stop = Ledger(), threading.Event()
    threads = [threading.Thread(target=cycle_worker,
                                args=(base, f"mx/{tag}", ledger, stop, 0.05, 5000))
               for base in [a, b, a, b, a, b]]
    for t in threads:
        t.start()
    wait_for(lambda: len(ledger.grants) >= 40, timeout=30, what="40 grants across both replicas")
    stop.set()
    for t in threads:
        t.join(30)
    ledger.check()
    assert len(ledger.grants) >= 10
    fences = sorted(ledger.grants, key=lambda g: g[2])
    assert [g[1] for g in fences] == sorted({g[1] for g in fences})

    # A release on one replica wakes a waiter on the other: TTL 10 s, so only the watch can
    # explain a wake-up well under a second.
    latencies = []
    with httpx.Client(timeout=30) as http:
        for i in range(5):
            holder_at, waiter_at = (a, b) if i % 2 == 0 else (b, a)
            lock = f"wake/{tag}/{i}"
            lease = http.post(f"{holder_at}/v1/locks/{lock}/acquire",
                              json={"ttl_ms": 10_000, "owner": "holder"}).json()
            got: dict = {}

            def waiter(lock=lock, waiter_at=waiter_at, got=got):
                r = httpx.post(f"{waiter_at}/v1/locks/{lock}/acquire",
                               json={"ttl_ms": 10_000, "wait_ms": 20_000, "owner": "waiter"},
                               timeout=30)
                got["at"], got["resp"] = time.monotonic(), r

            t = threading.Thread(target=waiter)
            t.start()
            wait_for(lambda lock=lock, waiter_at=waiter_at:
                     http.get(f"{waiter_at}/v1/locks/{lock}").json()["waiters"] == 1,
                     timeout=10, what="the waiter to queue")
            released_at = time.monotonic()
            r = http.post(f"{holder_at}/v1/locks/{lock}/release",
                          json={"lease_id": lease["lease_id"]})
            assert r.status_code == 200, r.text
            t.join(30)
            assert got["resp"].status_code == 200, got["resp"].text
            assert got["resp"].json()["fence"] > lease["fence"]
            latencies.append(got["at"] - released_at)
    assert max(latencies) < 1.0 * TIMING_SLACK, latencies  # the TTL is 10 s: this was the watch
    print(f"\ncross-replica wake-up after release: median {statistics.median(latencies)*1000:.0f} ms,"
          f" max {max(latencies)*1000:.0f} ms")


def test_quorum_loss_answers_503_and_grants_nothing(etcd_cluster: EtcdCluster, lockds):
    base = lockds(etcd_cluster.url("quorum"))
    with httpx.Client(base_url=base, timeout=30) as http:
        held = http.post("/v1/locks/q/held/acquire", json={"ttl_ms": 5000, "owner": "h"}).json()
        leader = etcd_cluster.leader()
        down = [leader, (leader + 1) % 3]
        for i in down:
            etcd_cluster.kill_member(i)
        timings = {}
        for what, method, path, body in [
            ("acquire", "POST", "/v1/locks/q/new/acquire", {"ttl_ms": 2000}),
            ("acquire_wait", "POST", "/v1/locks/q/new2/acquire", {"ttl_ms": 2000, "wait_ms": 5000}),
            ("renew", "POST", "/v1/locks/q/held/renew", {"lease_id": held["lease_id"]}),
            ("healthz", "GET", "/healthz", None),
        ]:
            t0 = time.monotonic()
            r = http.request(method, path, json=body)
            timings[what] = round(time.monotonic() - t0, 2)
            assert r.status_code == 503, (what, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            problem = r.json()
            assert problem["code"] == "store_unavailable", problem
            assert problem["type"] == "urn:lockd:problem:store_unavailable"
            assert "Traceback" not in r.text
            assert timings[what] < 4.0 * TIMING_SLACK, timings
        for i in down:
            etcd_cluster.restart_member(i)
        t0 = time.monotonic()
        wait_for(lambda: http.get("/healthz").status_code == 200, timeout=20, interval=0.1,
                 what="lockd healthy again")
        timings["healthy_again_after_restart_s"] = round(time.monotonic() - t0, 2)
        # Nothing was granted while the quorum was gone; the held lease lived through it.
        for lock in ("q/new", "q/new2"):
            state = http.get(f"/v1/locks/{lock}").json()
            assert state["held"] is False and state["fence"] == 0, state
        r = http.post("/v1/locks/q/held/renew", json={"lease_id": held["lease_id"], "ttl_ms": 5000})
        assert r.status_code == 200 and r.json()["fence"] == held["fence"], r.text
        r = http.post("/v1/locks/q/new/acquire", json={"ttl_ms": 2000})
        assert r.status_code == 200 and r.json()["fence"] > held["fence"], r.text
    print(f"\nquorum loss through lockd: {timings}")
