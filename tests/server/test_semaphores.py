"""Counting semaphores over HTTP, on every store: permits with unique slots and strictly
increasing fences, never more than ``limit`` live under 32 concurrent clients nor when holders
are killed (SIGKILL) or frozen (SIGSTOP), FIFO waiters woken by release or expiry, limit
mismatches, and bad input answered 4xx with nothing changed. Real ``lockd serve`` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from harness import TIMING_SLACK
from lockd.tokens import Verifier
from tests.jitter import hold_sync
from tests.server.calls import assert_problem, wait_until

HOLDER = str(Path(__file__).with_name("sem_holder_proc.py"))


def sem_acquire(http: httpx.Client, url: str, name: str, limit: int, ttl_ms: int = 10_000,
                **fields) -> httpx.Response:
    return http.post(f"{url}/v1/semaphores/{name}/acquire",
                     json={"limit": limit, "ttl_ms": ttl_ms, **fields})


def sem_renew(http: httpx.Client, url: str, name: str, lease_id: str, **fields) -> httpx.Response:
    return http.post(f"{url}/v1/semaphores/{name}/renew", json={"lease_id": lease_id, **fields})


def sem_release(http: httpx.Client, url: str, name: str, lease_id: str) -> httpx.Response:
    return http.post(f"{url}/v1/semaphores/{name}/release", json={"lease_id": lease_id})


def sem_state(http: httpx.Client, url: str, name: str) -> dict:
    r = http.get(f"{url}/v1/semaphores/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def _in_thread(url: str, name: str, limit: int, **fields) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        with httpx.Client(timeout=60) as c:
            out.append((sem_acquire(c, url, name, limit, **fields), time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_permits_have_unique_slots_increasing_fences_and_slot_tokens(lockd, http, name):
    url = lockd.url
    permits = [sem_acquire(http, url, name, 3, owner=f"p{i}") for i in range(3)]
    assert all(r.status_code == 200 for r in permits), [r.text for r in permits]
    bodies = [r.json() for r in permits]
    assert [(b["slot"], b["limit"]) for b in bodies] == [(0, 3), (1, 3), (2, 3)]
    fences = [b["fence"] for b in bodies]
    assert 1 <= fences[0] < fences[1] < fences[2]  # strictly increasing per semaphore
    assert [b["lock"] for b in bodies] == [f"sem/{name}/{i}" for i in range(3)]
    assert all(b["semaphore"] == name and b["owner"] == f"p{i}" for i, b in enumerate(bodies))
    claims = Verifier(http.get(f"{url}/v1/keys").json()).verify(bodies[1]["token"])
    assert claims.lock == f"sem/{name}/1" and claims.fence == fences[1] and claims.mode_for(
        claims.lock) == "exclusive"

    full = sem_acquire(http, url, name, 3, owner="late")
    problem = assert_problem(full, 409, "held")
    assert problem["limit"] == 3 and sorted(problem["owners"]) == ["p0", "p1", "p2"]
    assert 0 < problem["ttl_ms"] <= 10_000 and int(full.headers["Retry-After"]) >= 1

    now = sem_state(http, url, name)
    assert now["limit"] == 3 and now["fence"] == fences[2] and now["waiters"] == 0
    assert [(p["owner"], p["slot"], p["fence"]) for p in now["permits"]] == [
        ("p0", 0, fences[0]), ("p1", 1, fences[1]), ("p2", 2, fences[2])]
    assert not any(b["lease_id"] in json.dumps(now) for b in bodies)

    renewed = sem_renew(http, url, name, bodies[1]["lease_id"], ttl_ms=20_000).json()
    assert (renewed["slot"], renewed["fence"], renewed["token"]) == (1, fences[1],
                                                                     bodies[1]["token"])
    assert renewed["ttl_ms"] > 10_000
    assert sem_release(http, url, name, bodies[1]["lease_id"]).json() == {"released": True}
    assert_problem(sem_release(http, url, name, bodies[1]["lease_id"]), 410, "lease_lost")
    assert_problem(sem_renew(http, url, name, bodies[1]["lease_id"]), 410, "lease_lost")
    again = sem_acquire(http, url, name, 3, owner="p3").json()
    assert again["slot"] == 1 and again["fence"] > fences[2]  # the freed slot, a higher fence


def test_a_limit_other_than_the_live_permits_is_limit_mismatch(lockd, http, name):
    url = lockd.url
    first = sem_acquire(http, url, name, 2).json()
    problem = assert_problem(sem_acquire(http, url, name, 5), 409, "limit_mismatch")
    assert problem["limit"] == 2
    assert [p["slot"] for p in sem_state(http, url, name)["permits"]] == [0]
    sem_release(http, url, name, first["lease_id"])
    retaken = sem_acquire(http, url, name, 5)  # no permit live: the new limit holds
    assert retaken.status_code == 200 and retaken.json()["limit"] == 5, retaken.text
    assert retaken.json()["fence"] > first["fence"]
    assert sem_state(http, url, name)["limit"] == 5


def test_waiters_are_served_in_order_when_permits_are_released(lockd, http, name):
    url = lockd.url
    held = [sem_acquire(http, url, name, 2, 60_000, owner=f"h{i}").json() for i in range(2)]
    t1, got1 = _in_thread(url, name, 2, wait_ms=20_000, owner="w1")
    wait_until(lambda: sem_state(http, url, name)["waiters"] == 1, what="w1 queued")
    t2, got2 = _in_thread(url, name, 2, wait_ms=20_000, owner="w2")
    wait_until(lambda: sem_state(http, url, name)["waiters"] == 2, what="w2 queued")
    assert sem_state(http, url, name)["waiting_owners"] == ["w1", "w2"]
    assert_problem(sem_acquire(http, url, name, 2, owner="no-wait"), 409, "held")  # no barging

    released = time.monotonic()
    sem_release(http, url, name, held[0]["lease_id"])
    t1.join(10)
    (r1, at1), = got1
    assert r1.status_code == 200 and r1.json()["slot"] == held[0]["slot"], r1.text
    assert at1 - released < 2.0 * TIMING_SLACK  # woken by the release, not a TTL
    # the store's word: w1 took the freed slot, w2 still queues behind the other holder
    now = sem_state(http, url, name)
    assert (len(now["permits"]), now["waiting_owners"]) == (2, ["w2"]), now
    assert not got2
    sem_release(http, url, name, held[1]["lease_id"])
    t2.join(10)
    (r2, _), = got2
    assert r2.status_code == 200 and r2.json()["fence"] > r1.json()["fence"], r2.text


def test_an_expired_permit_frees_its_slot_for_a_waiter(inproc_lockd, http, name):
    srv = inproc_lockd()
    url = srv.url
    gone = sem_acquire(http, url, name, 1, 1_000, owner="gone").json()
    t, got = _in_thread(url, name, 1, wait_ms=20_000, owner="next")
    wait_until(lambda: sem_state(http, url, name)["waiters"] == 1, what="waiter queued")
    srv.clock.advance(1.0)  # the permit's TTL has run out by lockd's clock
    # the expired permit is no longer listed (the waiter may hold the slot already)
    assert all(p["owner"] != "gone" for p in sem_state(http, url, name)["permits"])
    t.join(10)  # the waiter retries at the permit's TTL (1 s on its own timer)
    (r, _), = got
    assert r.status_code == 200 and r.json()["slot"] == 0, r.text
    assert r.json()["fence"] > gone["fence"]
    assert_problem(sem_renew(http, url, name, gone["lease_id"]), 410, "lease_lost")


def test_never_more_than_limit_permits_under_32_concurrent_clients(lockd, http, name):
    url, limit, rounds = lockd.url, 4, 6
    guard = threading.Lock()
    inside: dict[int, str] = {}  # slot -> client, while it holds the permit
    peak, problems, fences = [0], [], []

    def client(index: int) -> None:
        with httpx.Client(timeout=60) as c:
            for _ in range(rounds):
                r = sem_acquire(c, url, name, limit, 10_000, wait_ms=30_000, owner=f"c{index}")
                if r.status_code != 200:
                    problems.append(r.text)
                    return
                permit = r.json()
                with guard:
                    if permit["slot"] in inside or not 0 <= permit["slot"] < limit:
                        problems.append(f"slot {permit['slot']} given twice")
                    inside[permit["slot"]] = f"c{index}"
                    peak[0] = max(peak[0], len(inside))
                    fences.append(permit["fence"])
                hold_sync(None, 0.003)
                with guard:
                    del inside[permit["slot"]]
                r = sem_release(c, url, name, permit["lease_id"])
                if r.status_code != 200:
                    problems.append(r.text)

    watching = [True]
    seen: list[int] = []

    def watch() -> None:
        with httpx.Client(timeout=30) as c:
            while watching[0]:
                permits = sem_state(c, url, name)["permits"]
                seen.append(len(permits))
                if len({p["slot"] for p in permits}) != len(permits):
                    problems.append(f"duplicate slots {permits}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(32)]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    watching[0] = False
    watcher.join(10)
    assert not problems, problems[:5]
    assert len(fences) == 32 * rounds and len(set(fences)) == len(fences)  # one fence a grant
    assert peak[0] <= limit and max(seen) <= limit
    assert peak[0] > 1  # the permits really were held concurrently
    final = sem_state(http, url, name)
    assert final["permits"] == [] and final["fence"] == max(fences) and final["waiters"] == 0


def _holder(url: str, name: str, limit: int, ttl_ms: int, tag: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, HOLDER, url, name, str(limit), str(ttl_ms), tag],
                            stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, "holder process said nothing"
    return json.loads(line)


def test_killed_and_frozen_holders_lose_their_permits_and_never_exceed_the_limit(lockd, http,
                                                                                  name):
    url, limit, ttl = lockd.url, 2, 1_500
    procs = [_holder(url, name, limit, ttl, tag) for tag in ("a", "b")]
    try:
        held = [_line(p) for p in procs]
        assert sorted(h["slot"] for h in held) == [0, 1]
        over: list = []
        watching = [True]

        def watch() -> None:
            with httpx.Client(timeout=30) as c:
                while watching[0]:
                    if len(sem_state(c, url, name)["permits"]) > limit:
                        over.append(time.monotonic())
                    hold_sync(None, 0.01)  # sampling interval

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        time.sleep(ttl / 1000)  # proves: both renew, nobody else gets in for one TTL
        assert_problem(sem_acquire(http, url, name, limit), 409, "held")

        os.kill(procs[0].pid, signal.SIGKILL)  # a crash: its permit lapses at its TTL
        t1, got1 = _in_thread(url, name, limit, ttl_ms=30_000, wait_ms=20_000, owner="after-kill")
        t1.join(15)
        (r1, _), = got1
        assert r1.status_code == 200, r1.text
        assert r1.json()["slot"] == held[0]["slot"] and r1.json()["fence"] > held[1]["fence"]

        os.kill(procs[1].pid, signal.SIGSTOP)  # frozen past its TTL: its permit lapses too
        t2, got2 = _in_thread(url, name, limit, ttl_ms=30_000, wait_ms=20_000,
                              owner="after-stop")
        t2.join(15)
        (r2, _), = got2
        assert r2.status_code == 200 and r2.json()["slot"] == held[1]["slot"], r2.text
        assert r2.json()["fence"] > r1.json()["fence"]
        os.kill(procs[1].pid, signal.SIGCONT)
        assert _line(procs[1]) == {"lost": 410}  # its next renewal learns it lost the permit
        watching[0] = False
        watcher.join(10)
        assert not over
        assert sorted(p["owner"] for p in sem_state(http, url, name)["permits"]) == [
            "after-kill", "after-stop"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_bad_semaphore_input_is_a_4xx_problem_and_changes_nothing(lockd, http, name):
    url = lockd.url
    permit = sem_acquire(http, url, name, 2, owner="keeper").json()
    before = sem_state(http, url, name)
    base = f"{url}/v1/semaphores/{name}"
    long_name = "n" * 248  # a lock name, but sem/{name}/{limit-1} would not fit 255
    cases = [
        (f"{base}/acquire", {"limit": 0, "ttl_ms": 1000}, 422),
        (f"{base}/acquire", {"limit": 10_001, "ttl_ms": 1000}, 422),
        (f"{base}/acquire", {"limit": -1, "ttl_ms": 1000}, 422),
        (f"{base}/acquire", {"limit": "2", "ttl_ms": 1000}, 422),
        (f"{base}/acquire", {"limit": 2.0, "ttl_ms": 1000}, 422),
        (f"{base}/acquire", {"ttl_ms": 1000}, 422),
        (f"{base}/acquire", {"limit": 2}, 422),
        (f"{base}/acquire", {"limit": 2, "ttl_ms": 1}, 422),
        (f"{base}/acquire", {"limit": 2, "ttl_ms": 1000, "wait_ms": -5}, 422),
        (f"{base}/acquire", {"limit": 2, "ttl_ms": 1000, "mode": "shared"}, 422),
        (f"{base}/acquire", {"limit": 2, "ttl_ms": 1000, "client_id": "short"}, 422),
        (f"{url}/v1/semaphores/a%20b/acquire", {"limit": 2, "ttl_ms": 1000}, 422),
        (f"{url}/v1/semaphores/a/%2E%2E/b/acquire", {"limit": 2, "ttl_ms": 1000}, 422),
        (f"{url}/v1/semaphores/{long_name}/acquire", {"limit": 10_000, "ttl_ms": 1000}, 422),
        (f"{base}/renew", {"lease_id": permit["lease_id"], "ttl_ms": 1}, 422),
        (f"{base}/renew", {}, 422),
        (f"{base}/release", {"lease_id": ""}, 422),
        (f"{base}/renew", {"lease_id": "not-a-permit"}, 410),
        (f"{base}/release", {"lease_id": "not-a-permit"}, 410),
        (f"{url}/v1/semaphores/{name}-other/release", {"lease_id": permit["lease_id"]}, 410),
    ]
    codes = {410: "lease_lost", 422: "invalid_request"}
    for target, body, status in cases:
        r = http.post(target, json=body)
        assert_problem(r, status, codes[status])
        assert permit["lease_id"] not in r.text
    r = http.post(f"{base}/acquire", content=b'{"limit": ', headers={
        "content-type": "application/json"})
    assert_problem(r, 422, "invalid_request")
    assert_problem(http.get(f"{url}/v1/semaphores/a%20b"), 422, "invalid_request")
    after = sem_state(http, url, name)
    steady = [(p["owner"], p["slot"], p["fence"]) for p in after["permits"]]
    assert steady == [(p["owner"], p["slot"], p["fence"]) for p in before["permits"]]
    assert after["fence"] == before["fence"] and after["limit"] == 2
    assert sem_state(http, url, long_name[:200])["limit"] == 0
    assert sem_renew(http, url, name, permit["lease_id"]).status_code == 200
    assert "Traceback" not in lockd.log()


def test_a_scoped_key_uses_only_semaphores_under_its_prefixes(lockd_factory, tmp_path, http):
    from tests.server.test_access import KEY_A, KEY_OPS, _auth, _forbidden, _serve

    url = _serve(lockd_factory, tmp_path, f"sqlite:///{tmp_path}/scoped.db").url
    mine = http.post(f"{url}/v1/semaphores/a/pool/acquire", headers=_auth(KEY_A),
                     json={"limit": 2, "ttl_ms": 30_000})
    assert mine.status_code == 200 and mine.json()["lock"] == "sem/a/pool/0", mine.text
    theirs = http.post(f"{url}/v1/semaphores/b/pool/acquire", headers=_auth(KEY_OPS),
                       json={"limit": 2, "ttl_ms": 30_000}).json()
    lease = {"lease_id": theirs["lease_id"]}
    for method, path, body in [
            ("POST", "/v1/semaphores/b/pool/acquire", {"limit": 2, "ttl_ms": 30_000}),
            ("POST", "/v1/semaphores/b/pool/renew", lease),
            ("POST", "/v1/semaphores/b/pool/release", lease),
            ("GET", "/v1/semaphores/b/pool", None),
            ("POST", "/v1/semaphores/sem/a/pool/acquire", {"limit": 2, "ttl_ms": 30_000})]:
        r = http.request(method, url + path, headers=_auth(KEY_A), json=body)
        _forbidden(r, path.split("/", 3)[3].rsplit("/", 1)[0] if method == "POST"
                   else "b/pool", "team-a")
    admin_view = http.get(f"{url}/v1/semaphores/b/pool", headers=_auth(KEY_OPS)).json()
    assert [p["fence"] for p in admin_view["permits"]] == [theirs["fence"]]  # nothing changed
    assert http.post(f"{url}/v1/semaphores/a/pool/release", headers=_auth(KEY_A),
                     json={"lease_id": mine.json()["lease_id"]}).status_code == 200
