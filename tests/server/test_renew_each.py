"""Renewals batched per client (``POST /v1/leases/renew-each``): the HTTP contract on every store.

Each test takes ``lockd`` (a real ``lockd serve`` parametrized over SQLite, PostgreSQL and etcd)
and lock names of its own.
"""

from __future__ import annotations

import secrets

import httpx

from tests.server.calls import acquire, assert_problem, release, renew, state, wait_until


def renew_each(http: httpx.Client, url: str, leases: list[dict]) -> httpx.Response:
    return http.post(f"{url}/v1/leases/renew-each", json={"leases": leases})


def grant(http: httpx.Client, url: str, lock: str, ttl_ms: int = 10_000) -> dict:
    r = acquire(http, url, lock, ttl_ms=ttl_ms, owner="batch")
    assert r.status_code == 200, r.text
    return r.json()


def test_each_lease_is_renewed_and_a_lost_one_is_answered_on_its_own(lockd, http, name):
    live = [grant(http, lockd.url, f"{name}/live{i}") for i in range(3)]
    released = grant(http, lockd.url, f"{name}/released")
    assert release(http, lockd.url, released["lock"], released["lease_id"]).status_code == 200
    expiring = grant(http, lockd.url, f"{name}/expired", ttl_ms=150)
    wait_until(lambda: not state(http, lockd.url, expiring["lock"])["held"], timeout=10,
               what="the short lease to expire")
    asked = [
        {"lock": live[0]["lock"], "lease_id": live[0]["lease_id"], "ttl_ms": 20_000},
        {"lock": released["lock"], "lease_id": released["lease_id"]},
        {"lock": live[1]["lock"], "lease_id": live[1]["lease_id"], "ttl_ms": 20_000},
        {"lock": expiring["lock"], "lease_id": expiring["lease_id"]},
        {"lock": f"{name}/unknown", "lease_id": secrets.token_urlsafe(24)},
        {"lock": live[2]["lock"], "lease_id": live[2]["lease_id"]},  # keeps its own TTL
    ]
    r = renew_each(http, lockd.url, asked)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [item["lock"] for item in results] == [item["lock"] for item in asked]
    assert [item["status"] for item in results] == [200, 410, 200, 410, 410, 200]
    for index, lease in ((0, live[0]), (2, live[1]), (5, live[2])):
        got = results[index]["lease"]
        # The single renew's answer: same lease, fence and token; the new TTL.
        assert got["lease_id"] == lease["lease_id"] and got["fence"] == lease["fence"]
        assert got["token"] == lease["token"] and got["owner"] == "batch"
        assert "problem" not in results[index] or results[index]["problem"] is None
    assert results[0]["lease"]["ttl_ms"] > 10_000 and results[2]["lease"]["ttl_ms"] > 10_000
    assert results[5]["lease"]["ttl_ms"] <= 10_000
    for index in (1, 3, 4):
        problem = results[index]["problem"]
        assert problem["status"] == 410 and problem["code"] == "lease_lost", problem
        assert results[index].get("lease") is None
    # The renewals took effect in the store: each live lock's TTL is past its first one.
    for lease in live[:2]:
        assert state(http, lockd.url, lease["lock"])["ttl_ms"] > 10_000
    assert not state(http, lockd.url, released["lock"])["held"]
    assert not state(http, lockd.url, expiring["lock"])["held"]


def test_a_malformed_item_refuses_the_whole_request_and_renews_nothing(lockd, http, name):
    lease = grant(http, lockd.url, f"{name}/a", ttl_ms=5_000)
    good = {"lock": lease["lock"], "lease_id": lease["lease_id"], "ttl_ms": 60_000}
    bad_items = [
        {"lock": "bad//name", "lease_id": lease["lease_id"]},       # not a lock name
        {"lock": lease["lock"], "lease_id": lease["lease_id"], "ttl_ms": 1},  # under min TTL
        {"lock": lease["lock"], "lease_id": lease["lease_id"], "ttl_ms": "60000"},  # not int
        {"lock": lease["lock"], "lease_id": ""},                   # empty lease id
        {"lock": lease["lock"], "lease_id": lease["lease_id"], "wait": 1},  # unknown field
    ]
    for bad in bad_items:
        problem = assert_problem(renew_each(http, lockd.url, [good, bad]), 422,
                                 "invalid_request")
        assert problem["detail"], problem
    assert_problem(renew_each(http, lockd.url, []), 422, "invalid_request")
    # 1,000 leases fit one request (over the default 64 KiB body limit); 1,001 do not.
    assert_problem(http.post(f"{lockd.url}/v1/leases/renew-each", json={"leases": [good] * 1001}),
                   422, "invalid_request")
    assert_problem(http.post(f"{lockd.url}/v1/leases/renew-each", content=b"{not json",
                             headers={"content-type": "application/json"}), 422,
                   "invalid_request")
    # Nothing was renewed: the lease still runs on its first 5 s TTL.
    assert state(http, lockd.url, lease["lock"])["ttl_ms"] <= 5_000
    # And the lease is still live and renewable.
    assert renew(http, lockd.url, lease["lock"], lease["lease_id"]).status_code == 200


def test_a_multi_lock_lease_is_refused_with_its_index(lockd, http, name):
    single = grant(http, lockd.url, f"{name}/single", ttl_ms=5_000)
    r = http.post(f"{lockd.url}/v1/leases/acquire", json={"locks": [f"{name}/m1", f"{name}/m2"],
                                                          "ttl_ms": 5_000})
    assert r.status_code == 200, r.text
    multi = r.json()
    problem = assert_problem(renew_each(http, lockd.url, [
        {"lock": single["lock"], "lease_id": single["lease_id"], "ttl_ms": 60_000},
        {"lock": f"{name}/m1", "lease_id": multi["lease_id"]}]), 422, "invalid_request")
    assert problem["index"] == 1 and problem["detail"].startswith("leases[1]: "), problem
    assert state(http, lockd.url, single["lock"])["ttl_ms"] <= 5_000
