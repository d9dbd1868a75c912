"""Expiry by lockd's clock (SQLite store), tested by moving a fake clock instead of sleeping.

The server is real (uvicorn on a real port, in a thread) and so is the store (a SQLite file);
only the wall clock that judges expiry is injected via ``create_app(settings, clock=...)``.
"""

from __future__ import annotations

import asyncio

from tests.server.calls import acquire, assert_problem, release, renew, state


def test_lease_ends_exactly_at_its_ttl_and_cannot_be_revived(inproc_lockd, http, name):
    srv = inproc_lockd()
    lease = acquire(http, srv.url, name, 60_000, owner="holder").json()

    srv.clock.advance(57.5)
    r = acquire(http, srv.url, name, 1_000, owner="other")
    body = assert_problem(r, 409, "held")
    assert (body["owner"], body["ttl_ms"], body["lock"]) == ("holder", 2_500, name)
    assert r.headers["retry-after"] == "3"  # ceil(2.5 s)

    srv.clock.advance(2.499)
    now = state(http, srv.url, name)
    assert now["held"] and now["ttl_ms"] == 1
    assert acquire(http, srv.url, name, 1_000).headers["retry-after"] == "1"

    srv.clock.advance(0.001)  # exactly at the TTL: gone
    assert state(http, srv.url, name) == {
        "lock": name, "held": False, "fence": lease["fence"], "owner": None, "ttl_ms": 0,
        "waiters": 0, "waiting_owners": [], "mode": None, "holders": []}
    assert_problem(renew(http, srv.url, name, lease["lease_id"]), 410, "lease_lost")
    assert_problem(release(http, srv.url, name, lease["lease_id"]), 410, "lease_lost")
    assert not state(http, srv.url, name)["held"]

    again = acquire(http, srv.url, name, 60_000).json()
    assert again["fence"] == lease["fence"] + 1 and again["lease_id"] != lease["lease_id"]


def test_renewal_keeps_a_lease_past_its_first_ttl(inproc_lockd, http, name):
    srv = inproc_lockd()
    lease = acquire(http, srv.url, name, 10_000).json()
    for _ in range(5):
        srv.clock.advance(9.0)
        r = renew(http, srv.url, name, lease["lease_id"], ttl_ms=10_000)
        assert r.status_code == 200, r.text
        assert (r.json()["fence"], r.json()["ttl_ms"]) == (lease["fence"], 10_000)
        assert r.json()["token"] == lease["token"]  # same grant, same token
    srv.clock.advance(9.999)
    assert state(http, srv.url, name)["held"]
    srv.clock.advance(0.001)
    assert not state(http, srv.url, name)["held"]
    assert_problem(renew(http, srv.url, name, lease["lease_id"]), 410, "lease_lost")


def test_renew_without_ttl_keeps_the_lease_own_ttl_and_bounds_come_from_settings(
        inproc_lockd, http, name):
    srv = inproc_lockd(min_ttl_ms=1_000, max_ttl_ms=60_000, max_wait_ms=2_000)
    lease = acquire(http, srv.url, name, 5_000).json()
    r = renew(http, srv.url, name, lease["lease_id"])
    assert r.status_code == 200 and r.json()["ttl_ms"] == 5_000  # the acquire's TTL
    srv.clock.advance(4.0)
    r = renew(http, srv.url, name, lease["lease_id"], ttl_ms=20_000)
    assert r.status_code == 200 and r.json()["ttl_ms"] == 20_000
    srv.clock.advance(10.0)
    r = renew(http, srv.url, name, lease["lease_id"])  # now the renewed TTL is its own
    assert r.status_code == 200 and r.json()["ttl_ms"] == 20_000
    assert r.json()["fence"] == lease["fence"]
    srv.clock.advance(19.999)
    assert state(http, srv.url, name)["ttl_ms"] == 1
    assert_problem(acquire(http, srv.url, f"{name}/b", 999), 422, "invalid_request")
    assert_problem(acquire(http, srv.url, f"{name}/b", 60_001), 422, "invalid_request")
    assert_problem(acquire(http, srv.url, f"{name}/b", 1_000, wait_ms=2_001), 422,
                   "invalid_request")
    assert acquire(http, srv.url, f"{name}/b", 60_000, wait_ms=2_000).status_code == 200


def test_client_id_does_not_revive_an_expired_lease(inproc_lockd, http, name):
    srv = inproc_lockd()
    first = acquire(http, srv.url, name, 1_000, client_id="job-7-Xo4TqQ8pLmW2vZr9aB").json()
    srv.clock.advance(1.0)
    second = acquire(http, srv.url, name, 1_000, client_id="job-7-Xo4TqQ8pLmW2vZr9aB").json()
    assert second["lease_id"] != first["lease_id"] and second["fence"] == first["fence"] + 1


def test_unexpected_failure_is_a_500_problem_without_a_trace(inproc_lockd, http, name, caplog):
    srv = inproc_lockd()
    service = srv.app.state.locks

    class Exploding:
        """A store whose ``get`` fails with an error no store should raise."""

        def __getattr__(self, attr):
            return getattr(real, attr)

        async def get(self, lock):
            raise RuntimeError("disk on fire: secret-detail")

    real = service.store
    service.store = Exploding()
    try:
        r = http.get(f"{srv.url}/v1/locks/{name}")
    finally:
        service.store = real
    body = assert_problem(r, 500, "internal")
    assert "secret-detail" not in r.text and "RuntimeError" not in r.text
    logged = [rec for rec in caplog.records if rec.name == "lockd.server.core.http" and rec.exc_info]
    assert logged and "disk on fire" in str(logged[0].exc_info[1])
    assert state(http, srv.url, name)["held"] is False
    assert body["title"] == "Internal error"


def test_store_that_stops_answering_is_503_and_healthz_says_so(inproc_lockd, http, name):
    srv = inproc_lockd()
    assert http.get(f"{srv.url}/healthz").json() == {"status": "ok", "server": "lockd"}
    store = srv.app.state.core.store
    asyncio.run_coroutine_threadsafe(store.close(), store._loop).result(10)
    assert_problem(http.get(f"{srv.url}/healthz"), 503, "store_unavailable")
    assert_problem(acquire(http, srv.url, name), 503, "store_unavailable")
    assert_problem(http.get(f"{srv.url}/v1/locks"), 503, "store_unavailable")
