"""Shared (read-lock) tokens at the proxy, on PostgreSQL and SQLite: a token that holds a lock
shared may do fenced reads and claims-for-read (allowed iff its fence is at least the highest
honoured; the highest rises to its read epoch, as for a write) and may not write under that
lock: every write path answers 403 ``shared_token`` naming the lock, and nothing is written or
raised.

Tokens are signed by the deployment's ``KeyRing`` the way lockd signs a shared lease
(``mode: "shared"``; a multi-lock token lists its shared locks in ``shared``). Rows are seeded
straight into the database, so no fence is raised before the test's own calls.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harness import drop_database
from lockd.tokens import KeyRing
from tests.proxy.conftest import (
    Deployment,
    assert_problem,
    make_database,
    unique,
    write_jwks,
)


def _shared(d: Deployment, lock: str, fence: int) -> dict[str, str]:
    return {"Fencing-Token": d.ring.sign(lock, fence, extra={"mode": "shared"})}


def _multi(d: Deployment, fences: dict[str, int], shared: list[str]) -> dict[str, str]:
    return {"Fencing-Token": d.ring.sign_many(fences, extra={"shared": shared})}


def _highest(d: Deployment, lock: str) -> int:
    return d.client.get(f"/v1/fences/{lock}").json()["highest"]


def _item(d: Deployment, v: str = "seed") -> tuple[str, str]:
    """A fresh ``items`` row (seeded directly, nothing fenced); its key and its lock."""
    key = unique("k")
    d.db.query("INSERT INTO items (id, v, n) VALUES (?, ?, 0)", (key, v))
    return key, f"items/{key}"


def _rows(d: Deployment, key: str) -> list[tuple]:
    return d.db.query("SELECT v, n FROM items WHERE id = ?", (key,))


def test_every_write_path_under_a_shared_token_is_403_and_changes_nothing(deployment: Deployment):
    d = deployment
    key, lock = _item(d)
    writer = d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 5),
                            json={"v": "written"})
    assert writer.status_code == 200, writer.text
    fresh = unique("k")
    for fence in (5, 9, 0):  # at, above and below the highest: a shared token never writes
        token = _shared(d, lock, fence)
        calls = [
            d.client.put(f"/v1/tables/items/rows/{key}", headers=token, json={"v": "put"}),
            d.client.patch(f"/v1/tables/items/rows/{key}", headers=token, json={"v": "patch"}),
            d.client.delete(f"/v1/tables/items/rows/{key}", headers=token),
            d.client.put(f"/v1/tables/items/rows/{key}", json={"v": "keyed"},
                         headers={**token, "Idempotency-Key": unique("idem")}),
            d.client.post("/v1/batch", headers=token, json={"ops": [
                {"op": "update", "table": "items", "key": key, "row": {"v": "batch"}}]}),
            d.client.post("/v1/batch", json={"ops": [
                {"op": "update", "table": "items", "key": key, "row": {"v": "batch"}}]},
                headers={**token, "Idempotency-Key": unique("idem")}),
            d.client.post("/v1/fences/claim", headers=token),
        ]
        for r in calls:
            body = assert_problem(r, 403, "shared_token")
            assert body["lock"] == lock, body
            assert lock in body["detail"] and "shared" in body["detail"]
        # an insert under a shared token of the new row's lock
        insert = d.client.post("/v1/tables/items/rows", headers=_shared(d, f"items/{fresh}", fence),
                               json={"id": fresh, "v": "insert"})
        assert assert_problem(insert, 403, "shared_token")["lock"] == f"items/{fresh}"
    assert _rows(d, key) == [("written", 0)]
    assert _rows(d, fresh) == []
    assert _highest(d, lock) == 5 and _highest(d, f"items/{fresh}") == 0
    # the exclusive holder still writes at its fence: the refusals raised nothing
    assert d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 5),
                          json={"n": 1}).status_code == 200


def test_a_fenced_read_under_a_shared_token_raises_the_highest_to_its_epoch(
        deployment: Deployment):
    d = deployment
    key, lock = _item(d, "v1")
    # never fenced: a shared lease's epoch 0 reads (and a fenced list too)
    r = d.client.get(f"/v1/tables/items/rows/{key}", headers=_shared(d, lock, 0))
    assert r.status_code == 200 and r.json()["v"] == "v1", r.text
    assert _highest(d, lock) == 0
    assert d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 4),
                          json={"v": "v4"}).status_code == 200
    for fence in (4, 7):  # at or above the highest: allowed, and the highest rises to it
        r = d.client.get(f"/v1/tables/items/rows/{key}", headers=_shared(d, lock, fence))
        assert r.status_code == 200 and r.json()["v"] == "v4", r.text
        listed = d.client.get("/v1/tables/items/rows", params={"id": key},
                              headers=_shared(d, lock, fence))
        assert listed.status_code == 200 and [i["v"] for i in listed.json()["items"]] == ["v4"]
        assert _highest(d, lock) == fence
    # an exclusive writer below the read epoch is fenced off: nothing written
    body = assert_problem(d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 5),
                                         json={"v": "v5"}), 409, "stale_token")
    assert (body["lock"], body["presented"], body["highest"]) == (lock, 5, 7)
    assert _rows(d, key) == [("v4", 0)]
    # the next exclusive epoch writes; a reader whose epoch predates that write is stale
    assert d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 8),
                          json={"v": "v8"}).status_code == 200
    for call in (lambda t: d.client.get(f"/v1/tables/items/rows/{key}", headers=t),
                 lambda t: d.client.get("/v1/tables/items/rows", params={"id": key}, headers=t)):
        body = assert_problem(call(_shared(d, lock, 7)), 409, "stale_token")
        assert (body["lock"], body["presented"], body["highest"]) == (lock, 7, 8)
    assert _highest(d, lock) == 8
    # a shared token of another lock reads nothing fenced
    assert_problem(d.client.get(f"/v1/tables/items/rows/{key}",
                                headers=_shared(d, f"items/{unique('k')}", 9)),
                   403, "lock_not_allowed")


def test_a_claim_with_a_shared_token_is_a_claim_for_read(deployment: Deployment):
    d = deployment
    key, lock = _item(d)
    r = d.client.post(f"/v1/fences/{lock}/claim", headers=_shared(d, lock, 0))
    assert r.status_code == 200 and r.json() == {"lock": lock, "highest": 0}, r.text
    assert d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 3)).json() == {
        "lock": lock, "highest": 3}
    for fence in (3, 8):  # the highest rises to the read epoch
        r = d.client.post(f"/v1/fences/{lock}/claim", headers=_shared(d, lock, fence))
        assert r.status_code == 200 and r.json() == {"lock": lock, "highest": fence}, r.text
    assert _highest(d, lock) == 8
    body = assert_problem(d.client.post(f"/v1/fences/{lock}/claim", headers=_shared(d, lock, 2)),
                          409, "stale_token")
    assert (body["lock"], body["presented"], body["highest"]) == (lock, 2, 8)
    assert _highest(d, lock) == 8
    # a lock that governs no served row is refused as for any claim
    assert_problem(d.client.post("/v1/fences/nowhere/claim", headers=_shared(d, "nowhere", 1)),
                   403, "lock_not_allowed")


@pytest.mark.parametrize("how", ["read", "list", "claim"])
def test_a_reader_at_a_newer_epoch_fences_off_the_lapsed_writer(deployment: Deployment, how):
    """Writer E holds the lock at fence 4 and writes; its lease lapses and lockd grants the
    lock shared at a new epoch (5). The reader's first fenced call raises the highest to 5,
    so E's next write is refused and the reader never sees it."""
    d = deployment
    key, lock = _item(d)
    assert d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 4),
                          json={"v": "by E"}).status_code == 200
    reader = _shared(d, lock, 5)
    if how == "read":
        r = d.client.get(f"/v1/tables/items/rows/{key}", headers=reader)
    elif how == "list":
        r = d.client.get("/v1/tables/items/rows", params={"id": key}, headers=reader)
    else:
        r = d.client.post(f"/v1/fences/{lock}/claim", headers=reader)
    assert r.status_code == 200, r.text
    late = d.client.patch(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 4),
                          json={"v": "E after the lapse"})
    body = assert_problem(late, 409, "stale_token")
    assert (body["lock"], body["presented"], body["highest"]) == (lock, 4, 5)
    assert _rows(d, key) == [("by E", 0)]
    assert d.client.get(f"/v1/tables/items/rows/{key}", headers=reader).json()["v"] == "by E"


def test_a_multi_lock_token_writes_its_exclusive_locks_only(deployment: Deployment):
    d = deployment
    a, la = _item(d)
    b, lb = _item(d)
    token = _multi(d, {la: 2, lb: 6}, shared=[lb])  # writes a, reads b
    ok = d.client.post("/v1/batch", headers=token, json={"ops": [
        {"op": "update", "table": "items", "key": a, "row": {"v": "a2"}}]})
    assert ok.status_code == 200, ok.text
    both = d.client.post("/v1/batch", headers=token, json={"ops": [
        {"op": "update", "table": "items", "key": a, "row": {"v": "a3"}},
        {"op": "update", "table": "items", "key": b, "row": {"v": "b3"}}]})
    body = assert_problem(both, 403, "shared_token")
    assert body["lock"] == lb and body["op_index"] == 1
    assert_problem(d.client.patch(f"/v1/tables/items/rows/{b}", headers=token, json={"v": "x"}),
                   403, "shared_token")
    assert_problem(d.client.post("/v1/fences/claim", headers=token), 403, "shared_token")
    assert _rows(d, a) == [("a2", 0)] and _rows(d, b) == [("seed", 0)]
    assert (_highest(d, la), _highest(d, lb)) == (2, 0)
    # its shared lock reads and claims-for-read (raising to its epoch); its exclusive lock
    # claims and raises
    read = d.client.get(f"/v1/tables/items/rows/{b}", headers=token)
    assert read.status_code == 200 and read.json()["v"] == "seed", read.text
    assert d.client.post(f"/v1/fences/{lb}/claim", headers=token).json() == {"lock": lb,
                                                                             "highest": 6}
    assert d.client.post(f"/v1/fences/{la}/claim", headers=token).json() == {"lock": la,
                                                                             "highest": 2}
    assert (_highest(d, la), _highest(d, lb)) == (2, 6)


def test_a_read_under_a_shared_token_sees_every_write_committed_before_it(deployment: Deployment):
    """Readers and a writer in turn: every allowed read returns the newest committed write,
    and a reader whose epoch is below a committed write's fence is refused."""
    d = deployment
    key, lock = _item(d, "0")
    for fence in range(1, 6):
        epoch_before = fence - 1
        w = d.client.put(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, fence),
                         json={"v": str(fence), "n": fence})
        assert w.status_code == 200, w.text
        assert_problem(d.client.get(f"/v1/tables/items/rows/{key}",
                                    headers=_shared(d, lock, epoch_before)), 409, "stale_token")
        r = d.client.get(f"/v1/tables/items/rows/{key}", headers=_shared(d, lock, fence))
        assert r.status_code == 200 and r.json()["n"] == fence, r.text


@pytest.fixture
def semaphore_proxy(tmp_path: Path, start_proxy, pg_admin_dsn: str):
    """A proxy on PostgreSQL whose ``items`` rows are governed by semaphore slots:
    ``sem/workers/{key}`` (row ``2`` by the holder of slot 2 of semaphore ``workers``)."""
    db = make_database("postgres", tmp_path, pg_admin_dsn)
    ring = KeyRing.generate()
    policy = tmp_path / "sem-policy.yaml"
    policy.write_text('tables:\n  items: "sem/workers/{key}"\n')
    url, _ = start_proxy(db.url, "--jwks-file", str(write_jwks(tmp_path, ring)),
                         "--tables", "items", "--policy", str(policy))
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client, ring, db
    finally:
        drop_database(db.dsn, pg_admin_dsn)


def test_a_policy_template_names_semaphore_slots(semaphore_proxy):
    """A permit's token (lock ``sem/{name}/{slot}``, the permit's fence) writes the rows its
    slot governs, like any lock's; a lapsed permit whose slot was re-granted is stale."""
    client, ring, db = semaphore_proxy

    def put(slot: int, key: int, fence: int, v: str) -> httpx.Response:
        return client.put(f"/v1/tables/items/rows/{key}", json={"v": v},
                          headers={"Fencing-Token": ring.sign(f"sem/workers/{slot}", fence)})

    lock = client.get("/v1/tables/items/lock", params={"key": "2"}).json()
    assert lock["lock"] == "sem/workers/2" and lock["template"] == "sem/workers/{key}"
    assert put(2, 2, 7, "first holder").status_code == 200
    refused = assert_problem(put(1, 2, 9, "other slot"), 403, "lock_not_allowed")
    assert refused["lock"] == "sem/workers/2"
    assert put(2, 2, 11, "slot re-granted").status_code == 200
    stale = assert_problem(put(2, 2, 7, "lapsed permit"), 409, "stale_token")
    assert (stale["lock"], stale["presented"], stale["highest"]) == ("sem/workers/2", 7, 11)
    assert db.query("SELECT v FROM items WHERE id = '2'") == [("slot re-granted",)]
    assert client.get("/v1/fences/sem/workers/2").json() == {"lock": "sem/workers/2",
                                                             "highest": 11}


def test_the_activity_view_and_metrics_show_a_shared_tokens_epoch_and_refusal(
        deployment: Deployment):
    d = deployment
    key, lock = _item(d)
    assert d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 2)).status_code == 200
    assert d.client.post(f"/v1/fences/{lock}/claim", headers=_shared(d, lock, 9)).status_code == 200
    assert d.client.get(f"/v1/tables/items/rows/{key}", headers=_shared(d, lock, 9)).status_code == 200
    assert_problem(d.client.patch(f"/v1/tables/items/rows/{key}", headers=_shared(d, lock, 9),
                                  json={"v": "x"}), 403, "shared_token")
    activity = d.client.get("/v1/activity").json()
    # the status page's fence of the lock is the highest honoured: the reader's epoch
    assert [f["highest"] for f in activity["fences"] if f["lock"] == lock] == [9]
    refused = [r for r in activity["rejections"] if r["lock"] == lock]
    assert [(r["code"], r["status"], r["call"]) for r in refused] == [("shared_token", 403,
                                                                       "update")]
    counted = [line for line in d.client.get("/metrics").text.splitlines()
               if line.startswith('resource_proxy_writes_total{op="update",outcome="forbidden"}')]
    assert len(counted) == 1 and float(counted[0].split()[-1]) >= 1, counted
