"""Multi-lock leases (``POST /v1/leases/acquire|renew|release``): the HTTP contract on every store.

Each test takes ``lockd`` (a real ``lockd serve`` parametrized over SQLite, PostgreSQL and etcd)
and lock names of its own.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from lockd.tokens import Verifier
from tests.server.calls import acquire, assert_problem, release, renew, state, wait_until


def acquire_many(http: httpx.Client, url: str, locks: list[str], ttl_ms: int = 10_000,
                 **fields) -> httpx.Response:
    return http.post(f"{url}/v1/leases/acquire", json={"locks": locks, "ttl_ms": ttl_ms, **fields})


def renew_many(http: httpx.Client, url: str, lease_id: str, **fields) -> httpx.Response:
    return http.post(f"{url}/v1/leases/renew", json={"lease_id": lease_id, **fields})


def release_many(http: httpx.Client, url: str, lease_id: str) -> httpx.Response:
    return http.post(f"{url}/v1/leases/release", json={"lease_id": lease_id})


def fences(body: dict) -> dict[str, int]:
    return {item["lock"]: item["fence"] for item in body["locks"]}


def test_grant_shows_every_lock_held_renews_and_releases_the_set(lockd, http, name):
    a, b = f"{name}/a", f"{name}/b"
    r = acquire_many(http, lockd.url, [b, a], owner="mover")
    assert r.status_code == 200, r.text
    lease = r.json()
    assert set(lease) == {"lease_id", "locks", "modes", "token", "ttl_ms", "owner"}
    assert lease["modes"] == {a: "exclusive", b: "exclusive"}
    assert [item["lock"] for item in lease["locks"]] == [a, b]  # name order
    assert lease["owner"] == "mover" and lease["ttl_ms"] >= 10_000
    got = fences(lease)
    claims = Verifier(http.get(f"{lockd.url}/v1/keys").json()).verify(lease["token"])
    assert claims.multi and dict(claims.locks) == got

    for lock in (a, b):
        s = state(http, lockd.url, lock)
        assert s["held"] and s["owner"] == "mover" and s["fence"] == got[lock], s
        assert 0 < s["ttl_ms"] <= lease["ttl_ms"]
        held = assert_problem(acquire(http, lockd.url, lock, owner="single"), 409, "held")
        assert held["owner"] == "mover"
        # The single-lock endpoints refuse to end or extend part of the set.
        assert_problem(renew(http, lockd.url, lock, lease["lease_id"]), 422, "invalid_request")
        assert_problem(release(http, lockd.url, lock, lease["lease_id"]), 422, "invalid_request")
    assert state(http, lockd.url, a)["held"]

    r = renew_many(http, lockd.url, lease["lease_id"], ttl_ms=20_000)
    assert r.status_code == 200, r.text
    assert fences(r.json()) == got and r.json()["ttl_ms"] >= 20_000
    assert state(http, lockd.url, b)["ttl_ms"] > 10_000
    r = renew_many(http, lockd.url, lease["lease_id"])  # keeps its own (new) TTL
    assert r.status_code == 200 and r.json()["ttl_ms"] >= 20_000, r.text

    r = release_many(http, lockd.url, lease["lease_id"])
    assert r.status_code == 200 and r.json() == {"released": True}, r.text
    for lock in (a, b):
        s = state(http, lockd.url, lock)
        assert not s["held"] and s["fence"] == got[lock]
    assert_problem(renew_many(http, lockd.url, lease["lease_id"]), 410, "lease_lost")
    assert_problem(release_many(http, lockd.url, lease["lease_id"]), 410, "lease_lost")
    assert_problem(release_many(http, lockd.url, "no-such-lease"), 410, "lease_lost")


def test_a_set_with_one_held_lock_grants_nothing_and_raises_no_fence(lockd, http, name):
    a, b, c = f"{name}/a", f"{name}/b", f"{name}/c"
    single = acquire(http, lockd.url, b, owner="holder-b").json()
    r = acquire_many(http, lockd.url, [a, b, c], owner="mover")
    body = assert_problem(r, 409, "held")
    assert body["held"] == [{"lock": b, "owner": "holder-b", "ttl_ms": body["held"][0]["ttl_ms"],
                             "mode": "exclusive"}]
    assert b in body["detail"] and "holder-b" in body["detail"]
    assert int(r.headers["Retry-After"]) >= 1
    for lock in (a, c):
        s = state(http, lockd.url, lock)
        assert not s["held"] and s["fence"] == 0, s  # nothing written, no fence issued
    assert state(http, lockd.url, b)["fence"] == single["fence"]

    # Two held locks: both named, with their holders.
    other = acquire(http, lockd.url, c, owner="holder-c").json()
    body = assert_problem(acquire_many(http, lockd.url, [c, a, b]), 409, "held")
    assert [(h["lock"], h["owner"]) for h in body["held"]] == [(b, "holder-b"), (c, "holder-c")]

    release(http, lockd.url, b, single["lease_id"])
    release(http, lockd.url, c, other["lease_id"])
    granted = fences(acquire_many(http, lockd.url, [a, b, c]).json())
    assert granted == {a: 1, b: single["fence"] + 1, c: other["fence"] + 1} or (
        # etcd: fences are store revisions; only their order per lock is promised
        granted[b] > single["fence"] and granted[c] > other["fence"] and granted[a] >= 1)


def test_fences_increase_per_lock_across_single_and_multi_grants_and_expiry(lockd, http, name):
    a, b = f"{name}/a", f"{name}/b"
    seen: dict[str, list[int]] = {a: [], b: []}
    first = acquire(http, lockd.url, a).json()
    seen[a].append(first["fence"])
    release(http, lockd.url, a, first["lease_id"])
    multi = acquire_many(http, lockd.url, [a, b], ttl_ms=1000).json()
    for lock, fence in fences(multi).items():
        seen[lock].append(fence)
    # Let the set expire (etcd rounds a lease up to its 2 s minimum).
    wait_until(lambda: not state(http, lockd.url, a)["held"], timeout=8, what="set expired")
    assert not state(http, lockd.url, b)["held"]
    assert_problem(renew_many(http, lockd.url, multi["lease_id"]), 410, "lease_lost")
    after = acquire(http, lockd.url, b).json()
    seen[b].append(after["fence"])
    again = acquire_many(http, lockd.url, [a, b], ttl_ms=5000)
    assert_problem(again, 409, "held")  # b is held by the single lease
    release(http, lockd.url, b, after["lease_id"])
    again = acquire_many(http, lockd.url, [a, b]).json()
    for lock, fence in fences(again).items():
        seen[lock].append(fence)
    for lock, history in seen.items():
        assert history == sorted(history) and len(set(history)) == len(history), (lock, history)
        assert state(http, lockd.url, lock)["fence"] == history[-1]


@pytest.mark.parametrize("body", [
    {"locks": [], "ttl_ms": 5000},
    {"locks": ["x/1", "x/1"], "ttl_ms": 5000},
    {"locks": [f"x/{i}" for i in range(65)], "ttl_ms": 5000},
    {"locks": ["x/1", "bad name"], "ttl_ms": 5000},
    {"locks": ["x/1", "a/../b"], "ttl_ms": 5000},
    {"locks": ["x/1"], "ttl_ms": 1},
    {"locks": ["x/1"]},
    {"locks": "x/1", "ttl_ms": 5000},
    {"locks": ["x/1"], "ttl_ms": 5000, "wait": 10},
    {"locks": ["x/1"], "ttl_ms": "5000"},
    {"locks": ["x/1", *(f"x/{i:02d}" + "y" * 150 for i in range(63))], "ttl_ms": 5000},  # token
])
def test_bad_multi_acquire_is_422_and_changes_nothing(lockd, http, name, body):
    body = {**body, "locks": [f"{name}/{n}" if isinstance(n, str) else n
                              for n in body["locks"]]} if isinstance(body.get("locks"), list) \
        else body
    assert_problem(http.post(f"{lockd.url}/v1/leases/acquire", json=body), 422, "invalid_request")
    assert not state(http, lockd.url, f"{name}/x/1")["held"]
    assert state(http, lockd.url, f"{name}/x/1")["fence"] == 0


def test_bad_renew_and_release_bodies_are_422(lockd, http):
    for path in ("renew", "release"):
        assert_problem(http.post(f"{lockd.url}/v1/leases/{path}", json={}), 422,
                       "invalid_request")
        assert_problem(http.post(f"{lockd.url}/v1/leases/{path}", content=b"{"), 422,
                       "invalid_request")
    assert_problem(http.post(f"{lockd.url}/v1/leases/renew",
                             json={"lease_id": "m.x", "ttl_ms": 1}), 422, "invalid_request")


def test_a_waiting_set_queues_on_every_lock_and_is_granted_on_release(lockd, http, name):
    a, b = f"{name}/a", f"{name}/b"
    holder = acquire(http, lockd.url, a, owner="holder").json()
    results: list = []

    def wait_for_set() -> None:
        with httpx.Client(timeout=30) as c:
            results.append(acquire_many(c, lockd.url, [a, b], wait_ms=15_000, owner="mover"))

    thread = threading.Thread(target=wait_for_set, daemon=True)
    thread.start()
    wait_until(lambda: state(http, lockd.url, b)["waiters"] == 1, what="set queued on b")
    assert state(http, lockd.url, a)["waiters"] == 1
    assert not state(http, lockd.url, b)["held"]  # nothing held while waiting
    # b is free, but the queued set comes first: no barging.
    assert_problem(acquire(http, lockd.url, b, owner="latecomer"), 409, "held")
    released = time.monotonic()
    release(http, lockd.url, a, holder["lease_id"])
    thread.join(20)
    (r,) = results
    assert r.status_code == 200, r.text
    assert time.monotonic() - released < 2.0  # woken by the release, not the TTL (10 s)
    assert fences(r.json())[a] > holder["fence"]
    assert state(http, lockd.url, b)["owner"] == "mover"


def test_retried_acquire_with_the_same_client_id_gets_the_same_lease(lockd, http, name):
    a, b = f"{name}/a", f"{name}/b"
    cid = "c" * 22
    first = acquire_many(http, lockd.url, [a, b], client_id=cid).json()
    again = acquire_many(http, lockd.url, [b, a], client_id=cid)
    assert again.status_code == 200, again.text
    assert again.json()["lease_id"] == first["lease_id"] and fences(again.json()) == fences(first)
    # Another client_id, or a different set, is refused.
    assert_problem(acquire_many(http, lockd.url, [a, b], client_id="d" * 22), 409, "held")
    assert_problem(acquire_many(http, lockd.url, [a], client_id=cid), 409, "held")
    # A single-lock acquire with that client_id does not get a lock of the set either.
    assert_problem(acquire(http, lockd.url, a, client_id=cid), 409, "held")


def test_64_locks_in_one_grant_and_force_release_of_one_ends_only_that_lock(
        store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": "admin-key-0123456789"})
    locks = [f"{name}/k{i:02d}" for i in range(64)]
    r = acquire_many(http, lockd.url, locks)
    assert r.status_code == 200, r.text
    lease = r.json()
    assert [item["lock"] for item in lease["locks"]] == locks
    # An operator force-releases one lock of the set: only that lock is freed.
    forced = http.post(f"{lockd.url}/v1/locks/{locks[5]}/force-release",
                       headers={"Authorization": "Bearer admin-key-0123456789"})
    assert forced.status_code == 200, forced.text
    assert not state(http, lockd.url, locks[5])["held"]
    assert state(http, lockd.url, locks[6])["held"]
    assert_problem(renew_many(http, lockd.url, lease["lease_id"]), 410, "lease_lost")
    assert state(http, lockd.url, locks[0])["held"]
    assert_problem(release_many(http, lockd.url, lease["lease_id"]), 410, "lease_lost")
    assert not any(state(http, lockd.url, lock)["held"] for lock in (locks[0], locks[63]))
