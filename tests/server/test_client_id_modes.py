"""A ``client_id`` retry gets back only the lease it asked for: the same kind, mode and locks.

The token's mode comes from the store's record of the lease. A retry that asks for another mode
(or, for a campaign, a lease no campaign granted) is answered 409 ``client_id_conflict`` and
changes nothing: answering with the other lease would hand a reader's lease to a writer's route
(an election signing it as exclusive), or a writer's lease to a reader. On every store.
"""

from __future__ import annotations

from tests.server.calls import acquire, assert_problem, release, state
from tests.server.election_calls import campaign, claims, election

CID = "retry-client-0123456789"
ADMIN_KEY = "admin-key-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _acquire_many(http, url, locks, **fields):
    return http.post(f"{url}/v1/leases/acquire", json={"ttl_ms": 10_000, "locks": locks,
                                                       **fields})


def _conflict(r, lock: str | None = None) -> dict:
    body = assert_problem(r, 409, "client_id_conflict")
    assert "client_id" in body["detail"], body
    if lock is not None:
        assert body["lock"] == lock, body
    assert "token" not in body and "lease_id" not in body, body
    return body


def test_a_campaign_never_turns_a_shared_lease_into_a_leaders_token(lockd, http, name):
    url = lockd.url
    reader1 = _ok(acquire(http, url, name, mode="shared", client_id=CID, owner="r1"))
    reader2 = _ok(acquire(http, url, name, mode="shared", owner="r2"))
    r = campaign(http, url, name, owner="r1", client_id=CID, value="leader")
    _conflict(r, name)
    assert election(http, url, name)["leader"] is None
    now = state(http, url, name)
    assert now["mode"] == "shared" and sorted(h["owner"] for h in now["holders"]) == ["r1", "r2"]
    assert now["fence"] == reader1["fence"] == reader2["fence"]
    # The reader's own lease is untouched and still renews as shared.
    renewed = _ok(http.post(f"{url}/v1/locks/{name}/renew",
                            json={"lease_id": reader1["lease_id"]}))
    assert renewed["mode"] == "shared" and claims(renewed["token"]).get("mode") == "shared"


def test_an_exclusive_retry_does_not_get_the_clients_shared_lease(lockd, http, name):
    url = lockd.url
    reader = _ok(acquire(http, url, name, mode="shared", client_id=CID, owner="r"))
    _conflict(acquire(http, url, name, client_id=CID), name)
    _conflict(acquire(http, url, name, client_id=CID, wait_ms=300), name)
    again = _ok(acquire(http, url, name, mode="shared", client_id=CID))
    assert again["lease_id"] == reader["lease_id"] and again["mode"] == "shared"
    assert claims(again["token"]).get("mode") == "shared"


def test_a_shared_retry_does_not_get_the_clients_exclusive_lease(lockd, http, name):
    url = lockd.url
    writer = _ok(acquire(http, url, name, client_id=CID, owner="w"))
    _conflict(acquire(http, url, name, mode="shared", client_id=CID), name)
    again = _ok(acquire(http, url, name, client_id=CID))
    assert again["lease_id"] == writer["lease_id"] and again["mode"] == "exclusive"
    assert [(h["owner"], h["mode"]) for h in state(http, url, name)["holders"]] == [
        ("w", "exclusive")]


def test_a_campaign_retry_gets_only_a_leadership(lockd, http, name):
    url = lockd.url
    lock = _ok(acquire(http, url, name, client_id=CID, owner="plain"))
    _conflict(campaign(http, url, name, owner="plain", client_id=CID, value="v"), name)
    assert election(http, url, name)["value"] == "" and election(http, url, name)["seq"] == 0
    _ok(release(http, url, name, lock["lease_id"]))
    leader = _ok(campaign(http, url, name, owner="A", client_id=CID, value="v1"))
    again = _ok(campaign(http, url, name, owner="A", client_id=CID, value="v1"))
    assert (again["lease_id"], again["fence"]) == (leader["lease_id"], leader["fence"])
    assert claims(again["token"]).get("mode") is None  # an exclusive token
    assert election(http, url, name)["seq"] == 1  # one term, one "leader" entry


def test_a_multi_lock_retry_with_other_modes_is_refused(lockd, http, name):
    url = lockd.url
    a, b = f"{name}/a", f"{name}/b"
    first = _ok(_acquire_many(http, url, [a, b], client_id=CID, modes={a: "shared"}))
    _conflict(_acquire_many(http, url, [a, b], client_id=CID))
    _conflict(_acquire_many(http, url, [a, b], client_id=CID, modes={b: "shared"}))
    again = _ok(_acquire_many(http, url, [a, b], client_id=CID, modes={a: "shared"}))
    assert again["lease_id"] == first["lease_id"] and again["modes"] == {a: "shared",
                                                                         b: "exclusive"}
    http.post(f"{url}/v1/leases/release", json={"lease_id": first["lease_id"]})
    excl = _ok(_acquire_many(http, url, [a, b], client_id=CID))
    _conflict(_acquire_many(http, url, [a, b], client_id=CID, modes={a: "shared"}))
    assert _ok(_acquire_many(http, url, [a, b], client_id=CID))["lease_id"] == excl["lease_id"]


def test_a_single_lock_retry_never_gets_a_multi_lock_lease(lockd, http, name):
    """A set's lease is not a single lock's: the single-lock acquire with the same client_id is
    a new lease (shared beside the set's shared hold), never the set's lease id."""
    url = lockd.url
    lease = _ok(_acquire_many(http, url, [name], client_id=CID, modes={name: "shared"}))
    single = _ok(acquire(http, url, name, mode="shared", client_id=CID))
    assert single["lease_id"] != lease["lease_id"] and not single["lease_id"].startswith("m.")
    assert sorted(h["mode"] for h in state(http, url, name)["holders"]) == ["shared", "shared"]


def test_a_multi_lock_retry_of_only_shared_locks_returns_the_live_lease(lockd, http, name):
    """A set of shared locks never refuses its own earlier grant, so the retry must be found
    before granting: the same client_id sent twice holds one lease, not two."""
    url = lockd.url
    locks = [f"{name}/a", f"{name}/b"]
    modes = {lock: "shared" for lock in locks}
    first = _ok(_acquire_many(http, url, locks, modes=modes, client_id=CID))
    again = _ok(_acquire_many(http, url, locks, modes=modes, client_id=CID))
    assert again["lease_id"] == first["lease_id"]
    for lock in locks:
        assert [h["owner"] for h in state(http, url, lock)["holders"]] == [""]


def test_a_shared_set_partly_force_released_is_not_answered_to_its_retry(
        store_url, lockd_factory, http, name):
    """The retry of a set whose lock an admin force-released gets a new lease (or 409), never
    a 503 from looking for a lease that can no longer be renewed."""
    url = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY}).url
    locks = [f"{name}/a", f"{name}/b"]
    modes = {lock: "shared" for lock in locks}
    first = _ok(_acquire_many(http, url, locks, modes=modes, client_id=CID))
    forced = http.post(f"{url}/v1/locks/{locks[0]}/force-release", headers=ADMIN)
    assert forced.status_code == 200, forced.text
    again = _acquire_many(http, url, locks, modes=modes, client_id=CID)
    assert again.status_code in (200, 409), again.text
    if again.status_code == 200:
        assert again.json()["lease_id"] != first["lease_id"]
