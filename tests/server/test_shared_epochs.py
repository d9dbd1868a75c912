"""Epochs of shared grants: a reader after a writer that did not release cleanly is a new epoch.

An exclusive holder E at fence n lapses (its lease expired, or an operator force-released it)
and may still be writing, paused somewhere. The first shared grant after that raises the lock's
fence once, to n+1, so that a reader's fenced read (or claim) at n+1 shuts E out of every
resource; readers arriving together share that one epoch; the next exclusive grant gets n+2.
After a clean release (the writer said it is done) a shared grant carries the current fence,
unraised. On every store (SQLite's expiry moved by the injectable clock; PostgreSQL and etcd
wait for their own clock).
"""

from __future__ import annotations

import threading

import pytest

from harness import wait_for
from tests.server.calls import acquire, release, renew, state
from tests.server.election_calls import call, campaign

ADMIN_KEY = "admin-key-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _raised(before: int, after: int, store_url: str) -> bool:
    """``after`` is the next epoch after ``before`` (etcd's fences are revisions: any higher)."""
    return after > before if store_url.startswith("etcd") else after == before + 1


def _epochs_after_a_lapse(http, url: str, name: str, writer_fence: int, store_url: str) -> None:
    """The rest of the scenario, once the writer at ``writer_fence`` lapsed."""
    r1 = _ok(acquire(http, url, name, mode="shared", owner="r1"))
    assert _raised(writer_fence, r1["fence"], store_url), (writer_fence, r1)
    assert state(http, url, name)["fence"] == r1["fence"]
    r2 = _ok(acquire(http, url, name, mode="shared", owner="r2"))
    assert r2["fence"] == r1["fence"]  # readers together: one epoch
    _ok(release(http, url, name, r1["lease_id"]))
    _ok(release(http, url, name, r2["lease_id"]))
    w = _ok(acquire(http, url, name, owner="w"))
    assert _raised(r1["fence"], w["fence"], store_url), (r1, w)
    _ok(release(http, url, name, w["lease_id"]))  # a clean release: no new epoch
    r3 = _ok(acquire(http, url, name, mode="shared", owner="r3"))
    assert r3["fence"] == w["fence"] == state(http, url, name)["fence"]
    _ok(release(http, url, name, r3["lease_id"]))
    r4 = _ok(acquire(http, url, name, mode="shared", owner="r4"))  # nor after a reader
    assert r4["fence"] == w["fence"]


def test_a_reader_after_an_expired_writer_starts_a_new_epoch_sqlite(inproc_lockd, http, name):
    srv = inproc_lockd()
    url = srv.url
    e = _ok(acquire(http, url, name, 1_000, owner="e"))
    srv.clock.advance(1.0)  # exactly at its TTL: gone, unreleased
    assert not state(http, url, name)["held"]
    _epochs_after_a_lapse(http, url, name, e["fence"], "sqlite")
    assert renew(http, url, name, e["lease_id"]).status_code == 410


def test_a_reader_after_an_expired_writer_starts_a_new_epoch(lockd, http, name):
    if lockd.store_url.startswith("sqlite"):
        pytest.skip("SQLite's expiry is lockd's clock: the injectable-clock test covers it")
    url = lockd.url
    e = _ok(acquire(http, url, name, 1_000, owner="e"))
    wait_for(lambda: not state(http, url, name)["held"], timeout=10, what="the lease to lapse")
    _epochs_after_a_lapse(http, url, name, e["fence"], lockd.store_url)


def test_a_reader_after_a_force_released_writer_starts_a_new_epoch(
        store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url = lockd.url
    e = _ok(acquire(http, url, name, owner="e"))
    forced = _ok(http.post(f"{url}/v1/locks/{name}/force-release", headers=ADMIN))
    assert forced["fence"] == e["fence"]
    _epochs_after_a_lapse(http, url, name, e["fence"], store_url)


def test_readers_arriving_together_after_a_lapse_share_one_epoch(
        store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url = lockd.url
    e = _ok(acquire(http, url, name, owner="e"))
    _ok(http.post(f"{url}/v1/locks/{name}/force-release", headers=ADMIN))
    start = threading.Barrier(8)
    fences: list[int] = []

    def reader(i: int) -> None:
        start.wait()
        fences.append(_ok(acquire(http, url, name, mode="shared", owner=f"r{i}"))["fence"])

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(fences) == 8 and len(set(fences)) == 1, fences
    assert _raised(e["fence"], fences[0], store_url) and state(http, url, name)["fence"] == fences[0]


def test_a_multi_lock_shared_grant_follows_the_rule_per_lock(store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url = lockd.url
    lapsed, clean = f"{name}/lapsed", f"{name}/clean"
    e = _ok(acquire(http, url, lapsed, owner="e"))
    _ok(http.post(f"{url}/v1/locks/{lapsed}/force-release", headers=ADMIN))
    w = _ok(acquire(http, url, clean, owner="w"))
    _ok(release(http, url, clean, w["lease_id"]))
    lease = _ok(http.post(f"{url}/v1/leases/acquire", json={
        "ttl_ms": 10_000, "locks": [lapsed, clean], "modes": {lapsed: "shared", clean: "shared"}}))
    fences = {item["lock"]: item["fence"] for item in lease["locks"]}
    assert _raised(e["fence"], fences[lapsed], store_url), (e, lease)
    assert fences[clean] == w["fence"]
    one = _ok(acquire(http, url, lapsed, mode="shared"))
    assert one["fence"] == fences[lapsed]
    # A set's exclusive lock released with the set is a clean release; force-released, not.
    _ok(http.post(f"{url}/v1/leases/release", json={"lease_id": lease["lease_id"]}))
    _ok(release(http, url, lapsed, one["lease_id"]))
    both = _ok(http.post(f"{url}/v1/leases/acquire", json={"ttl_ms": 10_000,
                                                          "locks": [lapsed, clean]}))
    written = {item["lock"]: item["fence"] for item in both["locks"]}
    _ok(http.post(f"{url}/v1/locks/{clean}/force-release", headers=ADMIN))
    assert http.post(f"{url}/v1/leases/release",
                     json={"lease_id": both["lease_id"]}).status_code == 410
    assert _ok(acquire(http, url, lapsed, mode="shared"))["fence"] == written[lapsed]
    assert _raised(written[clean], _ok(acquire(http, url, clean, mode="shared"))["fence"],
                   store_url)


def test_a_leader_that_resigns_ends_cleanly_one_force_released_does_not(
        store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url = lockd.url
    a = _ok(campaign(http, url, name, owner="A"))
    _ok(call(http, url, name, "resign", lease_id=a["lease_id"]))
    r = _ok(acquire(http, url, name, mode="shared"))
    assert r["fence"] == a["fence"]
    _ok(release(http, url, name, r["lease_id"]))
    b = _ok(campaign(http, url, name, owner="B"))
    _ok(http.post(f"{url}/v1/locks/{name}/force-release", headers=ADMIN))
    assert _raised(b["fence"], _ok(acquire(http, url, name, mode="shared"))["fence"], store_url)
