"""lockd's HTTP contract, run against a real ``lockd serve`` process on every store kind.

Each test takes ``lockd`` (parametrized by ``store_url`` over ``STORE_KINDS``) and its own lock
names, so the same assertions hold for SQLite, PostgreSQL and any store added later.
"""

from __future__ import annotations

import base64
import json
import queue
import signal
import statistics
import threading
import time

import httpx
import jwt
import pytest

from lockd.tokens import InvalidToken, KeyRing, UnknownKey, Verifier
from tests.server.calls import acquire, assert_problem, release, renew, state, wait_until


def _start_waiter(url: str, name: str, results: list, index: int, *, wait_ms: int = 20_000,
                  ttl_ms: int = 10_000, timeout: float = 30.0, then_release: bool = False,
                  **fields) -> threading.Thread:
    """Acquire ``name`` in a thread; append ``(index, response or exception, t_monotonic)``."""

    def run() -> None:
        with httpx.Client(timeout=timeout) as c:
            try:
                r = acquire(c, url, name, ttl_ms, wait_ms=wait_ms, **fields)
            except httpx.HTTPError as exc:
                results.append((index, exc, time.monotonic()))
                return
            results.append((index, r, time.monotonic()))
            if then_release and r.status_code == 200:
                release(c, url, name, r.json()["lease_id"])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _queue_waiters(http, url, name, count, results, **kw) -> list[threading.Thread]:
    """Start ``count`` waiters one after another, each confirmed queued before the next."""
    threads = []
    for i in range(count):
        threads.append(_start_waiter(url, name, results, i, **kw))
        wait_until(lambda n=i + 1: state(http, url, name)["waiters"] == n, what=f"{i + 1} queued")
    return threads


# --- fences: strictly increasing per lock, kept by a renewal ------------------------------------


def test_fence_increases_across_release_expiry_and_restarts(lockd, http, name):
    fences: list[int] = []

    def cycle(how: str) -> dict:
        r = acquire(http, lockd.url, name, 150 if how == "expire" else 5_000, owner=how)
        assert r.status_code == 200, r.text
        lease = r.json()
        fences.append(lease["fence"])
        if how == "release":
            assert release(http, lockd.url, name, lease["lease_id"]).json() == {"released": True}
        elif how == "expire":
            wait_until(lambda: not state(http, lockd.url, name)["held"], what="expiry")
        return lease

    for how in ["release", "expire", "release", "expire"]:
        cycle(how)

    held = cycle("hold")  # held across a clean restart: the lease survives it
    assert lockd.stop() == 0, lockd.log()
    assert f"lockd listening on http://127.0.0.1:{lockd.port} (store " in lockd.log()
    lockd.restart()
    renewed = renew(http, lockd.url, name, held["lease_id"], ttl_ms=5_000)
    assert renewed.status_code == 200 and renewed.json()["fence"] == held["fence"]
    assert state(http, lockd.url, name)["fence"] == held["fence"]
    release(http, lockd.url, name, held["lease_id"])
    cycle("release")

    cycle("expire")
    lockd.kill()  # kill -9 while a lease is live
    lockd.restart()
    wait_until(lambda: not state(http, lockd.url, name)["held"], what="expiry after crash")
    cycle("release")
    cycle("hold")
    lockd.kill()
    lockd.restart()
    assert state(http, lockd.url, name)["fence"] == fences[-1]
    r = acquire(http, lockd.url, name, 1_000)
    assert_problem(r, 409, "held")  # the crash did not free the held lease early

    assert fences == sorted(set(fences)), fences
    assert len(fences) == 9


# --- expiry: an expired lease is gone -----------------------------------------------------------


def test_expired_holder_loses_lock_and_waiter_is_granted_promptly(lockd, http, name):
    ttl_ms = 600
    sent = time.monotonic()
    holder = acquire(http, lockd.url, name, ttl_ms, owner="holder").json()
    results: list = []
    thread = _start_waiter(lockd.url, name, results, 0, wait_ms=10_000, owner="waiter")
    wait_until(lambda: state(http, lockd.url, name)["waiters"] == 1, what="waiter queued")
    thread.join(15)
    (_, r, granted_at), = results
    assert r.status_code == 200, r.text
    # The lease lapsed no earlier than sent + ttl (the store stamped it after we sent).
    # etcd: leases are whole seconds (600 ms runs 1 s, and the lease reports what etcd granted)
    # and etcd reaps expired leases on a ~500 ms tick, so its bound is that tick, not 100 ms.
    effective_ms = max(ttl_ms, holder["ttl_ms"])
    slack = 0.750 if lockd.store_url.startswith("etcd://") else 0.100
    late = granted_at - (sent + effective_ms / 1000)
    assert late >= 0, "granted before the holder's lease ran out"
    assert late < slack, f"waiter granted {late * 1000:.0f} ms after the expiry"
    lease = r.json()
    assert lease["fence"] > holder["fence"] and lease["owner"] == "waiter"

    body = assert_problem(renew(http, lockd.url, name, holder["lease_id"]), 410, "lease_lost")
    assert body["lock"] == name
    assert_problem(release(http, lockd.url, name, holder["lease_id"]), 410, "lease_lost")
    now = state(http, lockd.url, name)
    assert now["held"] and now["owner"] == "waiter" and now["fence"] == lease["fence"]


# --- FIFO handoff ---------------------------------------------------------------------------------


def test_release_hands_the_lock_to_waiters_in_arrival_order(lockd, http, name):
    holder = acquire(http, lockd.url, name).json()
    results: list = []
    threads = _queue_waiters(http, lockd.url, name, 5, results, then_release=True)
    assert release(http, lockd.url, name, holder["lease_id"]).status_code == 200
    for t in threads:
        t.join(15)
    assert [i for i, _, _ in results] == [0, 1, 2, 3, 4]
    fences = [r.json()["fence"] for _, r, _ in results]
    assert fences == sorted(set(fences)) and fences[0] > holder["fence"]
    assert state(http, lockd.url, name)["waiters"] == 0


def test_wait_zero_acquire_never_barges_ahead_of_queued_waiters(lockd, http, name):
    holder = acquire(http, lockd.url, name).json()
    results: list = []
    threads = _queue_waiters(http, lockd.url, name, 7, results, then_release=True)
    threads.append(_start_waiter(lockd.url, name, results, 7, owner="last"))  # keeps it
    wait_until(lambda: state(http, lockd.url, name)["waiters"] == 8, what="8 queued")
    attempts: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                r = acquire(c, lockd.url, name, 5_000, wait_ms=0, owner="barger")
                attempts.append(r.status_code)
                if r.status_code == 200:
                    release(c, lockd.url, name, r.json()["lease_id"])

    hammers = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for h in hammers:
        h.start()
    wait_until(lambda: len(attempts) > 4, what="hammer running")
    release(http, lockd.url, name, holder["lease_id"])
    for t in threads:
        t.join(15)
    stop.set()
    for h in hammers:
        h.join(10)
    assert [i for i, _, _ in results] == list(range(8))
    assert all(r.status_code == 200 for _, r, _ in results)
    # Every wait_ms=0 acquire was refused while the queue handed the lock down the line.
    assert set(attempts) == {409}, attempts
    assert state(http, lockd.url, name)["owner"] == "last"


def test_handoff_latency_measurement(lockd, name, store_url, capsys):
    """Release-to-grant latency over 200 handoffs (a measurement, printed; not a timed assert)."""
    rounds = 200
    grants: queue.Queue = queue.Queue()
    start = threading.Event()

    def waiter() -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(rounds):
                start.wait()
                start.clear()
                r = acquire(c, lockd.url, name, 10_000, wait_ms=20_000)
                grants.put((time.perf_counter(), r))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    latencies, fences = [], []
    with httpx.Client(timeout=30) as c:
        lease = acquire(c, lockd.url, name).json()
        for _ in range(rounds):
            start.set()
            wait_until(lambda: state(c, lockd.url, name)["waiters"] == 1, what="queued")
            t0 = time.perf_counter()
            release(c, lockd.url, name, lease["lease_id"])
            t1, r = grants.get(timeout=20)
            assert r.status_code == 200, r.text
            latencies.append(t1 - t0)
            lease = r.json()
            fences.append(lease["fence"])
        release(c, lockd.url, name, lease["lease_id"])
    thread.join(10)
    assert fences == sorted(set(fences))
    ms = sorted(x * 1000 for x in latencies)
    p50, p99 = statistics.median(ms), ms[int(len(ms) * 0.99) - 1]
    with capsys.disabled():
        print(f"\n[{store_url.split(':')[0]}] release-to-grant over {rounds} handoffs: "
              f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {ms[-1]:.2f} ms")


# --- waiters that leave ---------------------------------------------------------------------------


def test_waiters_that_give_up_or_disconnect_leave_nothing_behind(lockd, http, name):
    holder = acquire(http, lockd.url, name, 20_000, owner="holder").json()
    results: list = []

    def queue(index: int, owner: str = "", **kw) -> threading.Thread:
        owner = owner or f"w{index}"
        thread = _start_waiter(lockd.url, name, results, index, owner=owner, **kw)
        # by its label: on a loaded machine an earlier waiter may have given up meanwhile
        wait_until(lambda: owner in state(http, lockd.url, name)["waiting_owners"],
                   what=f"waiter {index} queued")
        return thread

    # w1 gives up before w0 if it queues within 1.5 s of w0; w2 hangs up after both
    queue(0, wait_ms=3_000)  # the head; gives up after 3 s
    queue(1, wait_ms=1_500)  # behind it; gives up first
    queue(2, wait_ms=20_000, timeout=4.5)  # becomes the head, then hangs up
    patient = queue(3, wait_ms=20_000, owner="patient")

    wait_until(lambda: len(results) == 3, timeout=10, what="three waiters gone")
    outcome = {i: r for i, r, _ in results}
    for i in (0, 1):
        body = assert_problem(outcome[i], 409, "held")
        assert body["owner"] == "holder" and 0 < body["ttl_ms"] <= 20_000 and body["lock"] == name
        assert int(outcome[i].headers["retry-after"]) >= 1
    assert isinstance(outcome[2], httpx.ReadTimeout)
    assert [i for i, _, _ in results] == [1, 0, 2]
    # The hung-up waiter is removed at once, not when its wait_ms would have run out.
    wait_until(lambda: state(http, lockd.url, name)["waiters"] == 1, timeout=0.5,
               what="disconnected waiter removed")

    released_at = time.monotonic()
    release(http, lockd.url, name, holder["lease_id"])
    patient.join(10)
    _, r, granted_at = results[-1]
    assert r.status_code == 200 and r.json()["owner"] == "patient", r
    assert granted_at - released_at < 1.0  # not stuck behind a departed waiter (TTL is 20 s)
    now = state(http, lockd.url, name)
    assert now["owner"] == "patient" and now["waiters"] == 0


def test_renew_without_ttl_keeps_the_lease_own_ttl(lockd, http, name):
    # Whole seconds (>= 1 s) so etcd, whose leases are whole seconds, can honour them.
    lease = acquire(http, lockd.url, name, 3_000).json()
    renewed = renew(http, lockd.url, name, lease["lease_id"], ttl_ms=2_000)
    assert renewed.status_code == 200, renewed.text
    kept = renew(http, lockd.url, name, lease["lease_id"])  # no ttl_ms: a keep-alive
    assert kept.status_code == 200, kept.text
    body = kept.json()
    assert body["fence"] == lease["fence"] and body["lease_id"] == lease["lease_id"]
    # The last TTL renewed with (2 s; etcd may round up to its next second), not the acquire's
    # 3 s nor any server default.
    assert 1_000 <= body["ttl_ms"] <= 2_999, body
    assert 0 < state(http, lockd.url, name)["ttl_ms"] <= 2_999


# --- client_id ------------------------------------------------------------------------------------


RUN_42 = "run-42-Xo4TqQ8pLmW2vZr9aB"  # 22+ characters of [A-Za-z0-9_-]: a per-attempt secret
RUN_43 = "run-43-Xo4TqQ8pLmW2vZr9aB"


def test_retried_acquire_with_same_client_id_returns_the_same_lease(lockd, http, name):
    first = acquire(http, lockd.url, name, 5_000, owner="job", client_id=RUN_42)
    assert first.status_code == 200
    again = acquire(http, lockd.url, name, 8_000, owner="job", client_id=RUN_42)
    assert again.status_code == 200
    assert again.json()["lease_id"] == first.json()["lease_id"]
    assert again.json()["fence"] == first.json()["fence"]
    assert again.json()["ttl_ms"] == 8_000
    assert_problem(acquire(http, lockd.url, name, client_id=RUN_43), 409, "held")
    assert_problem(acquire(http, lockd.url, name), 409, "held")

    # Still the same lease while others are queued: the retry must not wait on itself.
    results: list = []
    waiter = _start_waiter(lockd.url, name, results, 0, wait_ms=20_000, owner="next")
    wait_until(lambda: state(http, lockd.url, name)["waiters"] == 1, what="waiter queued")
    third = acquire(http, lockd.url, name, 5_000, client_id=RUN_42, wait_ms=1_000)
    assert third.status_code == 200 and third.json()["lease_id"] == first.json()["lease_id"]

    release(http, lockd.url, name, first.json()["lease_id"])
    waiter.join(10)
    assert results[0][1].status_code == 200
    release(http, lockd.url, name, results[0][1].json()["lease_id"])
    fresh = acquire(http, lockd.url, name, client_id=RUN_42).json()
    assert fresh["lease_id"] != first.json()["lease_id"]
    assert fresh["fence"] > results[0][1].json()["fence"]


# --- reading ----------------------------------------------------------------------------------


def test_get_shows_holder_fence_and_waiters(lockd, http, name):
    assert state(http, lockd.url, name) == {
        "lock": name, "held": False, "fence": 0, "owner": None, "ttl_ms": 0, "waiters": 0,
        "waiting_owners": [], "mode": None, "holders": []}
    lease = acquire(http, lockd.url, name, 30_000, owner="alice").json()
    now = state(http, lockd.url, name)
    assert now["held"] and now["owner"] == "alice" and now["fence"] == lease["fence"]
    assert now["mode"] == "exclusive" and [(h["owner"], h["mode"]) for h in now["holders"]] == [
        ("alice", "exclusive")]
    assert 0 < now["ttl_ms"] <= 30_000 and now["waiters"] == 0
    assert "lease_id" not in now and lease["lease_id"] not in json.dumps(now)
    results: list = []
    threads = _queue_waiters(http, lockd.url, name, 2, results, owner="bob")
    assert state(http, lockd.url, name)["waiters"] == 2
    release(http, lockd.url, name, lease["lease_id"])
    threads[0].join(10)
    now = state(http, lockd.url, name)
    assert now["owner"] == "bob" and now["waiters"] == 1 and now["fence"] > lease["fence"]
    release(http, lockd.url, name, results[0][1].json()["lease_id"])
    threads[1].join(10)
    after = state(http, lockd.url, name)
    assert after["waiters"] == 0 and after["fence"] == results[1][1].json()["fence"]
    release(http, lockd.url, name, results[1][1].json()["lease_id"])
    freed = state(http, lockd.url, name)
    assert freed["held"] is False and freed["owner"] is None and freed["ttl_ms"] == 0
    assert freed["fence"] == after["fence"]  # the last fence issued, even when free


def test_list_pages_through_a_prefix_with_a_cursor(lockd, http, name):
    names = [f"{name}/{c}" for c in "gcafedb"]
    leases = {n: acquire(http, lockd.url, n, 30_000, owner=n[-1]).json() for n in names}
    release(http, lockd.url, f"{name}/c", leases[f"{name}/c"]["lease_id"])
    acquire(http, lockd.url, f"{name}x/other")  # shares the string prefix but not the "/"
    results: list = []
    _queue_waiters(http, lockd.url, f"{name}/e", 1, results)

    seen, cursor, pages = [], None, 0
    while True:
        params = {"prefix": f"{name}/", "limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = http.get(f"{lockd.url}/v1/locks", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        pages += 1
        assert len(page["items"]) <= 3
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert [i["lock"] for i in seen] == sorted(names)
    by_name = {i["lock"]: i for i in seen}
    assert by_name[f"{name}/c"]["held"] is False and by_name[f"{name}/c"]["owner"] is None
    assert by_name[f"{name}/a"]["held"] and by_name[f"{name}/a"]["owner"] == "a"
    assert by_name[f"{name}/a"]["fence"] == leases[f"{name}/a"]["fence"]
    assert by_name[f"{name}/e"]["waiters"] == 1 and by_name[f"{name}/a"]["waiters"] == 0
    assert "lease_id" not in json.dumps(seen)

    everything = http.get(f"{lockd.url}/v1/locks", params={"prefix": name}).json()
    assert [i["lock"] for i in everything["items"]] == sorted(names) + [f"{name}x/other"]
    assert everything["next_cursor"] is None


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_is_a_4xx_problem_and_changes_nothing(lockd, http, name):
    lease = acquire(http, lockd.url, name, 60_000, owner="keeper").json()
    before = state(http, lockd.url, name)
    listing = http.get(f"{lockd.url}/v1/locks").json()
    url = f"{lockd.url}/v1/locks/{name}"
    too_big = json.dumps({"ttl_ms": 1000, "owner": "x" * 70_000})

    def chunked():
        yield b'{"ttl_ms": 1000, "owner": "'
        for _ in range(80):
            yield b"y" * 1024
        yield b'"}'

    cases = [
        # names outside the allowed set
        ("POST", f"{lockd.url}/v1/locks/a%20b/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/a*b/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/caf%C3%A9/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/{'n' * 256}/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks//acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("GET", f"{lockd.url}/v1/locks/a%00b", {}, 422),
        # dot and empty segments (percent-encoded, so httpx does not resolve them first)
        ("POST", f"{lockd.url}/v1/locks/a/%2E%2E/b/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/a/%2E/b/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/%2E%2E/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/a//b/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks/a/b//acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{lockd.url}/v1/locks//a/acquire", {"json": {"ttl_ms": 1000}}, 422),
        ("GET", f"{lockd.url}/v1/locks/a/%2E%2E/b", {}, 422),
        ("GET", f"{lockd.url}/v1/locks/a/%2E%2E/b/events", {}, 422),
        # client_id: a per-attempt secret of 22+ characters of [A-Za-z0-9_-]
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "client_id": "c1"}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "client_id": "x" * 21}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "client_id": "host.example.com/worker"}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "client_id": "é" * 22}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "client_id": "x" * 256}}, 422),
        # TTL and wait out of bounds or ill-typed
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 99}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 3_600_001}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": -5}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": "1000"}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000.5}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": True}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": None}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 10**30}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "wait_ms": -1}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "wait_ms": 300_001}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "owner": "o" * 256}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "owner": 7}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "wait": 5000}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "mode": "read"}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "mode": None}}, 422),
        ("POST", f"{url}/acquire", {"json": {"ttl_ms": 1000, "mode": "SHARED"}}, 422),
        # missing fields
        ("POST", f"{url}/acquire", {"json": {}}, 422),
        ("POST", f"{url}/acquire", {"content": b"", "headers": {"content-type": "application/json"}}, 422),
        ("POST", f"{url}/renew", {"json": {"ttl_ms": 1000}}, 422),
        ("POST", f"{url}/release", {"json": {}}, 422),
        ("POST", f"{url}/renew", {"json": {"lease_id": lease["lease_id"], "ttl_ms": 50}}, 422),
        # unknown leases
        ("POST", f"{url}/renew", {"json": {"lease_id": "not-a-lease"}}, 410),
        ("POST", f"{url}/release", {"json": {"lease_id": "not-a-lease"}}, 410),
        ("POST", f"{lockd.url}/v1/locks/{name}-other/release", {"json": {"lease_id": lease["lease_id"]}}, 410),
        # malformed JSON and non-JSON bodies
        ("POST", f"{url}/acquire", {"content": b'{"ttl_ms": ', "headers": {"content-type": "application/json"}}, 422),
        ("POST", f"{url}/acquire", {"content": b"ttl_ms=1000", "headers": {"content-type": "application/json"}}, 422),
        ("POST", f"{url}/acquire", {"content": b"\xff\xfe\x00", "headers": {"content-type": "application/json"}}, 422),
        ("POST", f"{url}/acquire", {"content": b"[1000]", "headers": {"content-type": "application/json"}}, 422),
        ("POST", f"{url}/acquire", {"content": b"null", "headers": {"content-type": "application/json"}}, 422),
        ("POST", f"{url}/acquire", {"content": b'{"ttl_ms": 1000}', "headers": {"content-type": "text/plain"}}, 422),
        ("POST", f"{url}/acquire", {"data": {"ttl_ms": "1000"}}, 422),
        # oversized bodies, announced or streamed
        ("POST", f"{url}/acquire", {"content": too_big, "headers": {"content-type": "application/json"}}, 413),
        ("POST", f"{url}/acquire", {"content": chunked(), "headers": {"content-type": "application/json"}}, 413),
        # paging parameters
        ("GET", f"{lockd.url}/v1/locks?limit=0", {}, 422),
        ("GET", f"{lockd.url}/v1/locks?limit=1001", {}, 422),
        ("GET", f"{lockd.url}/v1/locks?limit=ten", {}, 422),
        ("GET", f"{lockd.url}/v1/locks?limit=%C2%B2", {}, 422),  # '²' passes str.isdigit()
        ("GET", f"{lockd.url}/v1/locks?limit=%D9%A3", {}, 422),  # Arabic-Indic 3
        ("GET", f"{lockd.url}/v1/locks?cursor=%%%", {}, 422),
        ("GET", f"{lockd.url}/v1/locks?cursor=" + base64.urlsafe_b64encode(b"a b").decode(), {}, 422),
        ("GET", f"{lockd.url}/v1/locks?prefix=a%20b", {}, 422),
        # routes and methods
        ("GET", f"{lockd.url}/v1/nope", {}, 404),
        ("DELETE", f"{url}/acquire", {}, 405),
    ]
    codes = {410: "lease_lost", 413: "payload_too_large", 404: "not_found",
             405: "method_not_allowed", 422: "invalid_request"}
    for method, target, kwargs, status in cases:
        r = http.request(method, target, **kwargs)
        assert_problem(r, status, codes[status])
        assert lease["lease_id"] not in r.text

    def steady(got: dict) -> dict:
        return got | {"ttl_ms": 0, "holders": [h | {"ttl_ms": 0} for h in got["holders"]]}

    assert steady(state(http, lockd.url, name)) == steady(before)
    def without_ttl(page: dict) -> list[dict]:
        return [i | {"ttl_ms": 0} for i in page["items"]]

    assert without_ttl(http.get(f"{lockd.url}/v1/locks").json()) == without_ttl(listing)
    assert renew(http, lockd.url, name, lease["lease_id"]).json()["fence"] == lease["fence"]
    assert lockd.proc.proc.poll() is None
    assert "Traceback" not in lockd.log()


# --- tokens ---------------------------------------------------------------------------------------


def _reencode(token: str, **changes) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims.update(changes)
    raw = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{raw}.{signature}"


def test_tokens_verify_against_jwks_and_the_key_survives_restart(lockd, http, name):
    lease = acquire(http, lockd.url, name).json()
    jwks = http.get(f"{lockd.url}/v1/keys").json()
    verifier = Verifier(jwks)
    claims = verifier.verify(lease["token"])
    assert (claims.lock, claims.fence) == (name, lease["fence"])
    (kid,) = verifier.kids
    assert claims.kid == kid
    assert [p.name for p in lockd.key_dir.glob("*.pem")] == [f"{kid}.pem"]
    assert lockd.key_dir.joinpath(f"{kid}.pem").stat().st_mode & 0o077 == 0

    with pytest.raises(InvalidToken):
        verifier.verify(_reencode(lease["token"], fence=lease["fence"] + 1000))
    with pytest.raises(InvalidToken):
        verifier.verify(_reencode(lease["token"], lock="some/other/lock"))
    stranger = KeyRing.generate()
    with pytest.raises(UnknownKey):
        verifier.verify(stranger.sign(name, lease["fence"] + 1))
    forged = jwt.encode({"iss": "lockd", "lock": name, "fence": 10**9},
                        stranger._signing, algorithm="EdDSA", headers={"kid": kid})
    with pytest.raises(InvalidToken):
        verifier.verify(forged)

    renewed = renew(http, lockd.url, name, lease["lease_id"]).json()
    assert verifier.verify(renewed["token"]).fence == lease["fence"]
    assert lockd.stop() == 0
    lockd.restart()
    assert http.get(f"{lockd.url}/v1/keys").json() == jwks
    release(http, lockd.url, name, lease["lease_id"])
    later = acquire(http, lockd.url, name).json()
    assert Verifier(http.get(f"{lockd.url}/v1/keys").json()).verify(later["token"]).kid == kid
    assert verifier.verify(lease["token"]).fence == lease["fence"]


# --- lifecycle ------------------------------------------------------------------------------------


def test_healthz_and_sigterm_answers_waiters_and_exits_zero(lockd, http, name):
    assert http.get(f"{lockd.url}/healthz").json() == {"status": "ok", "server": "lockd"}
    acquire(http, lockd.url, name, 60_000)
    results: list = []
    waiter = _start_waiter(lockd.url, name, results, 0, wait_ms=120_000)
    wait_until(lambda: state(http, lockd.url, name)["waiters"] == 1, what="queued")
    stopped_at = time.monotonic()
    lockd.proc.signal(signal.SIGTERM)
    waiter.join(10)
    assert lockd.proc.proc.wait(10) == 0, lockd.log()
    assert time.monotonic() - stopped_at < 5
    _, r, _ = results[0]
    assert_problem(r, 503, "store_unavailable")
