"""Shared (read/write) locks over HTTP, on every store: shared holders coexist, an exclusive one
excludes everyone, the wait queue is fair to writers and admits runs of readers together, and a
shared lease's token and fence say what it may do. Real ``lockd serve`` processes, real races."""

from __future__ import annotations

import threading
import time

import httpx

from lockd.tokens import Verifier
from tests.server.calls import acquire, assert_problem, release, renew, state, wait_until
from tests.server.test_multi_lock import acquire_many, release_many


def _in_thread(url: str, name: str, **fields) -> tuple[threading.Thread, list]:
    """An acquire waiting in a thread; ``out`` gets (response, monotonic time of the answer)."""
    out: list = []

    def run() -> None:
        with httpx.Client(timeout=60) as c:
            r = acquire(c, url, name, fields.pop("ttl_ms", 30_000), **fields)
            out.append((r, time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _claims(http: httpx.Client, url: str, token: str):
    return Verifier(http.get(f"{url}/v1/keys").json()).verify(token)


def test_shared_holders_coexist_and_an_exclusive_one_excludes_everyone(lockd, http, name):
    url = lockd.url
    r1 = acquire(http, url, name, mode="shared", owner="r1")
    r2 = acquire(http, url, name, mode="shared", owner="r2")
    assert r1.status_code == 200 and r2.status_code == 200, (r1.text, r2.text)
    one, two = r1.json(), r2.json()
    assert one["mode"] == two["mode"] == "shared"
    assert one["fence"] == two["fence"] == 0  # never written: the write epoch is 0
    assert one["lease_id"] != two["lease_id"]
    claims = _claims(http, url, one["token"])
    assert claims.mode_for(name) == "shared" and claims.fence == 0

    now = state(http, url, name)
    assert now["held"] and now["mode"] == "shared" and now["fence"] == 0
    assert sorted((h["owner"], h["mode"]) for h in now["holders"]) == [
        ("r1", "shared"), ("r2", "shared")]
    assert "lease_id" not in str(now["holders"])

    held = assert_problem(acquire(http, url, name, owner="w"), 409, "held")
    assert held["mode"] == "shared" and held["owner"] in ("r1", "r2")
    assert state(http, url, name)["fence"] == 0  # a refused exclusive raised nothing

    assert release(http, url, name, one["lease_id"]).status_code == 200
    assert_problem(acquire(http, url, name, owner="w"), 409, "held")  # r2 still holds
    assert [h["owner"] for h in state(http, url, name)["holders"]] == ["r2"]
    assert release(http, url, name, two["lease_id"]).status_code == 200

    writer = acquire(http, url, name, owner="w").json()
    assert writer["mode"] == "exclusive" and writer["fence"] >= 1  # the first write epoch
    assert _claims(http, url, writer["token"]).mode_for(name) == "exclusive"
    refused = assert_problem(acquire(http, url, name, mode="shared", owner="r3"), 409, "held")
    assert refused["mode"] == "exclusive" and refused["owner"] == "w"
    release(http, url, name, writer["lease_id"])

    reader = acquire(http, url, name, mode="shared", owner="r4").json()
    assert reader["fence"] == writer["fence"]  # carries the write epoch, raises nothing
    assert renew(http, url, name, reader["lease_id"]).json()["fence"] == writer["fence"]
    assert state(http, url, name)["fence"] == writer["fence"]
    release(http, url, name, reader["lease_id"])
    assert acquire(http, url, name, owner="w2").json()["fence"] > writer["fence"]


def test_a_writer_waiting_behind_readers_is_granted_before_a_later_reader(lockd, http, name):
    url = lockd.url
    reader = acquire(http, url, name, mode="shared", owner="r1").json()
    t_w, got_w = _in_thread(url, name, wait_ms=20_000, owner="writer")
    wait_until(lambda: state(http, url, name)["waiters"] == 1, what="writer queued")
    t_r, got_r = _in_thread(url, name, wait_ms=20_000, mode="shared", owner="r2")
    wait_until(lambda: state(http, url, name)["waiters"] == 2, what="later reader queued")
    assert state(http, url, name)["waiting_owners"] == ["writer", "r2"]
    # The lock is only read-held, yet the later reader waits (no writer starvation), and a
    # reader that does not wait is refused at once rather than barging ahead of the writer.
    time.sleep(0.2)  # proves: the later reader stays queued behind the writer (200 ms)
    assert not got_r
    assert_problem(acquire(http, url, name, mode="shared", owner="r3"), 409, "held")

    release(http, url, name, reader["lease_id"])
    t_w.join(10)
    (w, _), = got_w
    assert w.status_code == 200 and w.json()["mode"] == "exclusive", w.text
    now = state(http, url, name)  # the store's word: the writer holds it, the reader queues
    assert (now["mode"], now["owner"], now["waiting_owners"]) == ("exclusive", "writer", ["r2"])
    assert not got_r  # the writer holds it now
    release(http, url, name, w.json()["lease_id"])
    t_r.join(10)
    (r, _), = got_r
    assert r.status_code == 200 and r.json()["fence"] == w.json()["fence"], r.text
    release(http, url, name, r.json()["lease_id"])


def test_readers_queued_together_are_granted_together(lockd, http, name):
    url = lockd.url
    writer = acquire(http, url, name, owner="w1").json()
    readers = [_in_thread(url, name, wait_ms=20_000, mode="shared", owner=f"r{i}")
               for i in range(4)]
    wait_until(lambda: state(http, url, name)["waiters"] == 4, what="readers queued")
    t_w2, got_w2 = _in_thread(url, name, wait_ms=20_000, owner="w2")
    wait_until(lambda: state(http, url, name)["waiters"] == 5, what="second writer queued")

    release(http, url, name, writer["lease_id"])
    for thread, _ in readers:
        thread.join(10)
    leases = [out[0][0] for _, out in readers]
    assert all(r.status_code == 200 for r in leases), [r.text for r in leases]
    now = state(http, url, name)
    assert now["mode"] == "shared" and len(now["holders"]) == 4  # all at once
    assert now["waiting_owners"] == ["w2"] and not got_w2
    assert {r.json()["fence"] for r in leases} == {writer["fence"]}

    for r in leases[:3]:
        release(http, url, name, r.json()["lease_id"])
    now = state(http, url, name)  # the store's word: one reader holds, w2 queues
    assert (len(now["holders"]), now["waiting_owners"]) == (1, ["w2"]), now
    assert not got_w2  # one reader still holds
    release(http, url, name, leases[3].json()["lease_id"])
    t_w2.join(10)
    (w2, _), = got_w2
    assert w2.status_code == 200 and w2.json()["fence"] > writer["fence"], w2.text


def test_expiry_frees_one_shared_holder_without_disturbing_the_others(inproc_lockd, http, name):
    srv = inproc_lockd()
    url = srv.url
    short = acquire(http, url, name, 1_000, mode="shared", owner="short").json()
    long = acquire(http, url, name, 5_000, mode="shared", owner="long").json()
    srv.clock.advance(1.0)  # exactly at the short TTL: gone
    now = state(http, url, name)
    assert [(h["owner"], h["mode"]) for h in now["holders"]] == [("long", "shared")]
    assert now["held"] and now["mode"] == "shared" and now["owner"] == "long"
    assert_problem(renew(http, url, name, short["lease_id"]), 410, "lease_lost")
    assert renew(http, url, name, long["lease_id"], ttl_ms=5_000).status_code == 200
    assert_problem(acquire(http, url, name, owner="w"), 409, "held")
    srv.clock.advance(4.0)
    assert [h["owner"] for h in state(http, url, name)["holders"]] == ["long"]  # renewed
    srv.clock.advance(1.0)
    assert not state(http, url, name)["held"]
    assert acquire(http, url, name, owner="w").json()["fence"] >= 1


def test_a_set_mixes_modes_and_its_token_says_which_locks_are_shared(lockd, http, name):
    url = lockd.url
    a, b = f"{name}/a", f"{name}/b"
    r = acquire_many(http, url, [a, b], modes={a: "shared"}, owner="set")
    assert r.status_code == 200, r.text
    lease = r.json()
    assert lease["modes"] == {a: "shared", b: "exclusive"}
    assert [(i["lock"], i["mode"]) for i in lease["locks"]] == [(a, "shared"), (b, "exclusive")]
    fence_b = lease["locks"][1]["fence"]
    assert lease["locks"][0]["fence"] == 0 and fence_b >= 1  # a: never written; b: raised
    claims = _claims(http, url, lease["token"])
    assert claims.shared == frozenset({a}) and dict(claims.locks) == {a: 0, b: fence_b}

    other = acquire(http, url, a, mode="shared", owner="reader")
    assert other.status_code == 200, other.text
    assert assert_problem(acquire(http, url, b, mode="shared"), 409, "held")["mode"] == "exclusive"
    held = assert_problem(acquire_many(http, url, [a, b], owner="x"), 409, "held")
    assert {(h["lock"], h["mode"]) for h in held["held"]} == {(a, "shared"), (b, "exclusive")}
    release_many(http, url, lease["lease_id"])
    release(http, url, a, other.json()["lease_id"])
    assert not state(http, url, a)["held"] and not state(http, url, b)["held"]


def test_bad_modes_and_reserved_names_are_422_and_change_nothing(lockd, http, name):
    url = lockd.url
    reader = acquire(http, url, name, mode="shared", owner="r").json()
    before = state(http, url, name)
    cases = [
        (f"/v1/locks/{name}/acquire", {"ttl_ms": 1000, "mode": "write"}),
        (f"/v1/locks/{name}/acquire", {"ttl_ms": 1000, "mode": 1}),
        (f"/v1/locks/{name}/acquire", {"ttl_ms": 1000, "modes": {name: "shared"}}),
        ("/v1/locks/sem/x/0/acquire", {"ttl_ms": 1000}),
        ("/v1/locks/sem/x/0/acquire", {"ttl_ms": 1000, "mode": "shared"}),
        ("/v1/leases/acquire", {"ttl_ms": 1000, "locks": [name, "sem/x/0"]}),
        ("/v1/leases/acquire", {"ttl_ms": 1000, "locks": [name], "modes": {name: "read"}}),
        ("/v1/leases/acquire", {"ttl_ms": 1000, "locks": [name], "modes": {"other": "shared"}}),
        ("/v1/leases/acquire", {"ttl_ms": 1000, "locks": [name], "modes": [name]}),
        ("/v1/leases/acquire", {"ttl_ms": 1000, "locks": [name], "mode": "shared"}),
    ]
    for path, body in cases:
        r = http.post(url + path, json=body)
        problem = assert_problem(r, 422, "invalid_request")
        assert reader["lease_id"] not in r.text, problem
    assert http.get(f"{url}/v1/semaphores/x").json()["permits"] == []  # the slot's owner
    after = state(http, url, name)
    assert [h["owner"] for h in after["holders"]] == [h["owner"] for h in before["holders"]]
    assert after["fence"] == before["fence"] == 0 and after["waiters"] == 0
    assert "Traceback" not in lockd.log()


def _gauge(http: httpx.Client, url: str, series: str) -> float:
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    raise AssertionError(f"no series {series}")


def test_metrics_count_holders_per_mode_permits_and_waiters(lockd, http, name):
    url = lockd.url
    readers = [acquire(http, url, name, mode="shared", owner=f"r{i}").json() for i in range(2)]
    solo = acquire(http, url, f"{name}/solo").json()
    permit = http.post(f"{url}/v1/semaphores/{name}/acquire",
                       json={"limit": 1, "ttl_ms": 30_000}).json()
    t_w, got_w = _in_thread(url, name, wait_ms=20_000, owner="writer")
    waiting: list = []
    t_p = threading.Thread(target=lambda: waiting.append(httpx.post(
        f"{url}/v1/semaphores/{name}/acquire", timeout=30,
        json={"limit": 1, "ttl_ms": 30_000, "wait_ms": 20_000})), daemon=True)
    t_p.start()
    wait_until(lambda: _gauge(http, url, 'lockd_waiters{mode="permit"}') == 1
               and _gauge(http, url, 'lockd_waiters{mode="exclusive"}') == 1, what="waiters")
    assert _gauge(http, url, 'lockd_holders{mode="shared"}') == 2
    assert _gauge(http, url, 'lockd_holders{mode="exclusive"}') == 1
    assert _gauge(http, url, "lockd_permits_active") == 1
    assert _gauge(http, url, 'lockd_waiters{mode="shared"}') == 0
    for reader in readers:
        release(http, url, name, reader["lease_id"])
    http.post(f"{url}/v1/semaphores/{name}/release", json={"lease_id": permit["lease_id"]})
    t_w.join(10)
    t_p.join(10)
    assert got_w[0][0].status_code == 200 and waiting[0].status_code == 200
    assert _gauge(http, url, 'lockd_holders{mode="shared"}') == 0
    assert _gauge(http, url, 'lockd_holders{mode="exclusive"}') == 2  # solo and the writer
    assert _gauge(http, url, "lockd_permits_active") == 1
    assert _gauge(http, url, 'lockd_waiters{mode="permit"}') == 0
    release(http, url, f"{name}/solo", solo["lease_id"])
