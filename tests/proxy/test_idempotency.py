"""``Idempotency-Key`` on writes and batches, and ``outcome_unknown`` vs ``database_unavailable``.

The first tests run on SQLite and PostgreSQL (``deployment``). The relay tests put a real TCP
relay (``harness.PgRelay``) between the proxy and PostgreSQL and cut the connection at a
chosen point: right after the COMMIT reached PostgreSQL (the write committed, the proxy never
hears: 502 ``outcome_unknown``, and the retry with the same key returns the original 201 with
one row in the table), or before anything is sent (503 ``database_unavailable``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from harness import PgRelay, drop_database, wait_for
from lockd.client import AsyncLockClient, LockClient
from lockd.client.errors import OutcomeUnknown, ServiceUnavailable
from lockd.client.fenced import AsyncFencedSession, FencedSession
from lockd.client.lease import AsyncLease, Lease
from lockd.tokens import KeyRing
from resource_proxy.idempotency import digest
from tests.proxy.conftest import Deployment, assert_problem, unique, write_jwks

# ``history`` has no policy entry, so every row of it is written under the ONE lock ``history``,
# whose highest fence is shared by every test of the module's deployment (per backend). Each test
# takes a base from this strictly increasing source (above any fence used before) and uses fences
# relative to it: base + 5 where it would have used 5.
_FENCES = itertools.count(time.time_ns() // 1000, 100)


def _base() -> int:
    """A base fence for lock ``history``; base + 0 .. base + 99 are above every earlier one."""
    return next(_FENCES)


def _key() -> str:
    return uuid.uuid4().hex


def _history(d: Deployment, writer: str) -> list[tuple]:
    return d.db.query("SELECT id, fence FROM history WHERE writer = ?", (writer,))


# -- on both stores ----------------------------------------------------------------------------

def test_a_retry_with_the_same_key_returns_the_original_answer(deployment: Deployment):
    d, writer, key, fence = deployment, unique("w"), _key(), _base() + 3
    headers = {**d.auth("history", fence), "Idempotency-Key": key}
    first = d.client.post("/v1/tables/history/rows", json={"fence": fence, "writer": writer},
                          headers=headers)
    assert first.status_code == 201, first.text
    assert "idempotency-replayed" not in first.headers
    again = d.client.post("/v1/tables/history/rows", json={"fence": fence, "writer": writer},
                          headers=headers)
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["idempotency-replayed"] == "true"
    assert again.headers["content-type"] == "application/json"
    assert _history(d, writer) == [(first.json()["id"], fence)], "one row, not two"


def test_keys_on_put_patch_delete_and_batch(deployment: Deployment):
    d, item = deployment, unique()
    auth = d.auth(f"items/{item}", 1)
    path = f"/v1/tables/items/rows/{item}"
    for method, body, status in (("PUT", {"v": "a", "n": 1}, 200), ("PATCH", {"n": 2}, 200)):
        headers = {**auth, "Idempotency-Key": _key()}
        first = d.client.request(method, path, json=body, headers=headers)
        assert first.status_code == status, first.text
        d.db.query("UPDATE items SET n = 99 WHERE id = ?", (item,))  # changed behind its back
        again = d.client.request(method, path, json=body, headers=headers)
        assert (again.status_code, again.json()) == (status, first.json())
        assert d.db.query("SELECT n FROM items WHERE id = ?", (item,)) == [(99,)], "not re-applied"
    headers = {**auth, "Idempotency-Key": _key()}
    assert d.client.delete(path, headers=headers).status_code == 204
    again = d.client.delete(path, headers=headers)
    assert again.status_code == 204 and again.headers["idempotency-replayed"] == "true"
    assert_problem(d.client.delete(path, headers=auth), 404, "not_found")

    # one lock governs the batch (the row's, items/<item>); the unfenced audit insert rides
    # along and has a serial id: a re-applied batch would add a second audit row
    marker = unique("audit")
    ops = {"ops": [{"op": "insert", "table": "audit", "row": {"v": marker}},
                   {"op": "upsert", "table": "items", "key": item, "row": {"v": "b"}}]}
    headers = {**auth, "Idempotency-Key": _key()}
    first = d.client.post("/v1/batch", json=ops, headers=headers)
    assert first.status_code == 200, first.text
    assert first.json()["lock"] == f"items/{item}"
    d.db.query("UPDATE items SET v = 'changed' WHERE id = ?", (item,))  # behind its back
    again = d.client.post("/v1/batch", json=ops, headers=headers)
    assert (again.status_code, again.json()) == (200, first.json())
    assert again.headers["idempotency-replayed"] == "true"
    assert d.db.query("SELECT id FROM audit WHERE v = ?", (marker,)) == \
        [(first.json()["results"][0]["row"]["id"],)], "one audit row, not two"
    assert d.db.query("SELECT v FROM items WHERE id = ?", (item,)) == [("changed",)], \
        "not re-applied"


def test_the_same_key_for_another_request_is_422_and_writes_nothing(deployment: Deployment):
    d, writer, key, fence = deployment, unique("w"), _key(), _base() + 1
    headers = {**d.auth("history", fence), "Idempotency-Key": key}
    body = {"fence": fence, "writer": writer}
    assert d.client.post("/v1/tables/history/rows", json=body, headers=headers).status_code == 201
    other, item = unique("w"), unique()
    for response in (
        d.client.post("/v1/tables/history/rows", json={"fence": fence, "writer": other},
                      headers=headers),
        d.client.put(f"/v1/tables/items/rows/{item}", json={"v": "x"},
                     headers={**d.auth(f"items/{item}", 1), "Idempotency-Key": key}),
        d.client.post("/v1/batch", json={"ops": [{"op": "insert", "table": "history",
                                                  "row": {"fence": fence, "writer": other}}]},
                      headers=headers),
    ):
        assert_problem(response, 422, "idempotency_key_reused")
    # the same request under another lock is no replay: the binding refuses that lock first
    # (a lock is part of the digest, so a replay never answers a token of another lock)
    foreign = d.client.post("/v1/tables/history/rows", json=body,
                            headers={**d.auth(unique("idem/"), fence), "Idempotency-Key": key})
    assert assert_problem(foreign, 403, "lock_not_allowed")["lock"] == "history"
    assert "idempotency-replayed" not in foreign.headers
    assert digest("POST", "/v1/tables/history/rows", "history", b"{}") != \
        digest("POST", "/v1/tables/history/rows", "other", b"{}")
    assert len(_history(d, writer)) == 1 and _history(d, other) == []
    assert d.db.query("SELECT count(*) FROM items WHERE id = ?", (item,)) == [(0,)]


@pytest.mark.parametrize("key", ["", "a b", "x" * 256, "tab\there"])
def test_malformed_keys_are_422(deployment: Deployment, key):
    d, writer, fence = deployment, unique("w"), _base() + 1
    r = d.client.post("/v1/tables/history/rows", json={"fence": fence, "writer": writer},
                      headers={**d.auth("history", fence), "Idempotency-Key": key})
    assert_problem(r, 422, "invalid_request")
    assert _history(d, writer) == []


def test_non_ascii_key_bytes_are_422(deployment: Deployment):
    d, writer, fence = deployment, unique("w"), _base() + 1
    r = d.client.post("/v1/tables/history/rows", json={"fence": fence, "writer": writer},
                      headers=[("Fencing-Token", d.token("history", fence)),
                               ("Idempotency-Key", "cl\u00e9".encode("latin-1"))])
    assert_problem(r, 422, "invalid_request")
    assert _history(d, writer) == []


def test_a_rejected_write_records_nothing_and_a_replay_outlives_a_newer_fence(deployment: Deployment):
    d, lock, writer, base = deployment, "history", unique("w"), _base()
    claimed = d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, base + 5))
    assert claimed.status_code == 200, claimed.text
    key = _key()
    body = {"fence": base + 4, "writer": writer}
    stale = d.client.post("/v1/tables/history/rows", json=body,
                          headers={**d.auth(lock, base + 4), "Idempotency-Key": key})
    assert_problem(stale, 409, "stale_token")
    fresh = d.client.post("/v1/tables/history/rows", json=body,
                          headers={**d.auth(lock, base + 6), "Idempotency-Key": key})
    assert fresh.status_code == 201, "the 409 was not recorded under the key"
    claimed = d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, base + 7))
    assert claimed.status_code == 200, claimed.text
    replay = d.client.post("/v1/tables/history/rows", json=body,
                           headers={**d.auth(lock, base + 6), "Idempotency-Key": key})
    assert replay.status_code == 201 and replay.json() == fresh.json(), \
        "the recorded answer, though fence base+7 has fenced base+6 off since"
    assert replay.headers["idempotency-replayed"] == "true"
    assert_problem(d.client.post("/v1/tables/history/rows", json=body,
                                 headers=d.auth(lock, base + 6)), 409, "stale_token")
    assert len(_history(d, writer)) == 1


def test_a_replay_answers_only_a_token_at_or_above_the_recorded_fence(deployment: Deployment):
    # fence base+2 wrote with the key; fence base+1, a stale holder that never wrote, retries
    # the same key and body: it is refused as any stale write is, not told "201, you wrote"
    d, lock, writer, base = deployment, "history", unique("w"), _base()
    key, body = _key(), {"fence": base + 2, "writer": writer}
    first = d.client.post("/v1/tables/history/rows", json=body,
                          headers={**d.auth(lock, base + 2), "Idempotency-Key": key})
    assert first.status_code == 201, first.text
    claimed = d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, base + 3))
    assert claimed.status_code == 200, claimed.text
    stale = d.client.post("/v1/tables/history/rows", json=body,
                          headers={**d.auth(lock, base + 1), "Idempotency-Key": key})
    problem = assert_problem(stale, 409, "stale_token")
    assert (problem["lock"], problem["presented"], problem["highest"]) == \
        (lock, base + 1, base + 3), "highest: the lock's highest, as in every stale_token"
    assert "idempotency-replayed" not in stale.headers
    for fence in (base + 2, base + 9):  # the recorded fence and any later one get the answer
        replay = d.client.post("/v1/tables/history/rows", json=body,
                               headers={**d.auth(lock, fence), "Idempotency-Key": key})
        assert (replay.status_code, replay.json()) == (201, first.json()), replay.text
        assert replay.headers["idempotency-replayed"] == "true"
    assert _history(d, writer) == [(first.json()["id"], base + 2)]


def test_a_batch_replay_checks_the_recorded_fence_of_every_lock(deployment: Deployment):
    # a multi-lock token: the batch records one fence per lock it touched; a replay must hold
    # each lock at or above its recorded fence, and the 409 lists every lock that is below
    d, a, b = deployment, unique("items/"), unique("items/")
    ops = {"ops": [{"op": "upsert", "table": "items", "key": a.split("/")[1], "row": {"v": "1"}},
                   {"op": "upsert", "table": "items", "key": b.split("/")[1], "row": {"v": "1"}}]}
    key = _key()
    first = d.client.post("/v1/batch", json=ops,
                          headers={"Fencing-Token": d.ring.sign_many({a: 5, b: 7}),
                                   "Idempotency-Key": key})
    assert first.status_code == 200, first.text
    stale = d.client.post("/v1/batch", json=ops,
                          headers={"Fencing-Token": d.ring.sign_many({a: 5, b: 6}),
                                   "Idempotency-Key": key})
    problem = assert_problem(stale, 409, "stale_token")
    assert (problem["lock"], problem["presented"], problem["highest"]) == (b, 6, 7)
    assert problem["stale"] == [{"lock": b, "presented": 6, "highest": 7}]
    assert problem["op_index"] == 0, "as for any stale batch"
    replay = d.client.post("/v1/batch", json=ops,
                           headers={"Fencing-Token": d.ring.sign_many({a: 8, b: 7}),
                                    "Idempotency-Key": key})
    assert (replay.status_code, replay.json()) == (200, first.json()), replay.text
    assert replay.headers["idempotency-replayed"] == "true"
    # a single-lock write's record: the same rule on a PUT
    item, key = unique(), _key()
    path = f"/v1/tables/items/rows/{item}"
    put = d.client.put(path, json={"v": "x"},
                       headers={**d.auth(f"items/{item}", 4), "Idempotency-Key": key})
    assert put.status_code == 200, put.text
    assert_problem(d.client.put(path, json={"v": "x"},
                                headers={**d.auth(f"items/{item}", 3), "Idempotency-Key": key}),
                   409, "stale_token")


def test_a_record_table_from_before_fences_were_recorded_is_upgraded_at_start(
        tmp_path, start_proxy, request):
    """A record table without the ``fences`` column gets it when a proxy starts (twice: the
    second start finds it); a record written before (no fences) still replays to its lock."""
    from tests.proxy.conftest import make_database

    for backend in ("sqlite", "postgres"):
        admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
        directory = tmp_path / backend
        directory.mkdir()
        db = make_database(backend, directory, admin)
        table = ("resource_proxy_idempotency" if backend == "sqlite"
                 else "resource_proxy.idempotency")
        legacy = (f"CREATE TABLE {table} (key TEXT PRIMARY KEY, digest TEXT NOT NULL, "
                  "status INTEGER, body TEXT, created_ms BIGINT NOT NULL)")
        if backend == "postgres":
            legacy = "CREATE SCHEMA resource_proxy; " + legacy
        db.script(legacy)
        key, body = _key(), b'{"v":"old"}'
        answer = '{"id":"a","v":"old","n":null}'
        db.query(f"INSERT INTO {table} (key, digest, status, body, created_ms) "
                 "VALUES (?, ?, 200, ?, ?)",
                 (key, digest("PUT", "/v1/tables/items/rows/a", "items", body), answer,
                  int(time.time() * 1000)))
        ring = KeyRing.generate()
        jwks = str(write_jwks(tmp_path, ring))
        try:
            for _ in range(2):
                url, proc = start_proxy(db.url, "--jwks-file", jwks)
                with httpx.Client(base_url=url) as client:
                    replay = client.put("/v1/tables/items/rows/a", content=body,
                                        headers={"Fencing-Token": ring.sign("items", 1),
                                                 "Idempotency-Key": key,
                                                 "Content-Type": "application/json"})
                    assert replay.status_code == 200, replay.text
                    assert replay.headers["idempotency-replayed"] == "true"
                    assert replay.text == answer
                assert proc.stop() == 0, proc.log()
            assert db.query(f"SELECT fences FROM {table} WHERE key = ?", (key,)) == [(None,)]
            assert db.query("SELECT count(*) FROM items") == [(0,)], "replayed, not written"
        finally:
            if backend == "postgres":
                drop_database(db.dsn, admin)


def test_concurrent_requests_with_one_key_write_once(deployment: Deployment):
    d, lock, fence = deployment, "history", _base() + 1
    writers = [unique("w") for _ in range(8)]
    answers: dict[str, list[httpx.Response]] = {w: [] for w in writers}

    def send(writer: str, key: str) -> None:
        with httpx.Client(base_url=d.url, timeout=30) as client:
            answers[writer].append(client.post(
                "/v1/tables/history/rows", json={"fence": fence, "writer": writer},
                headers={**d.auth(lock, fence), "Idempotency-Key": key}))

    keys = {}
    threads = []
    for writer in writers:
        keys[writer] = _key()
        threads += [threading.Thread(target=send, args=(writer, keys[writer])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for writer in writers:
        statuses = [r.status_code for r in answers[writer]]
        assert statuses == [201, 201, 201], [r.text for r in answers[writer]]
        assert len({r.text for r in answers[writer]}) == 1, "all three got the one answer"
        assert len(_history(d, writer)) == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_records_expire_after_the_configured_time_and_are_purged(backend, tmp_path, start_proxy,
                                                                  monkeypatch, request):
    from tests.proxy.conftest import make_database

    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    db = make_database(backend, tmp_path, admin)
    ring = KeyRing.generate()
    # 3 s: the purge that follows the rewrite must find `old`'s fresh record still live, even
    # when a loaded machine runs it a second or two late
    monkeypatch.setenv("PROXY_IDEMPOTENCY_TTL_MS", "3000")
    try:
        # no policy: every row of items is written under the one lock named ``items``
        url, proc = start_proxy(db.url, "--jwks-file", str(write_jwks(tmp_path, ring)))
        old, new = _key(), _key()
        headers = {"Fencing-Token": ring.sign("items", 1), "Idempotency-Key": old}
        records = ("SELECT key FROM resource_proxy_idempotency" if backend == "sqlite"
                   else "SELECT key FROM resource_proxy.idempotency")
        with httpx.Client(base_url=url) as client:
            assert client.put("/v1/tables/items/rows/a", json={"v": "1"},
                              headers=headers).status_code == 200
            assert client.put("/v1/tables/items/rows/b", json={"v": "1"},
                              headers={**headers, "Idempotency-Key": new}).status_code == 200
            assert_problem(client.put("/v1/tables/items/rows/a", json={"v": "2"}, headers=headers),
                           422, "idempotency_key_reused")
            assert sorted(db.query(records)) == sorted([(old,), (new,)])

            def after_expiry():  # refused as a reuse until the 3 s record expires
                r = client.put("/v1/tables/items/rows/a", json={"v": "2"}, headers=headers)
                assert r.status_code in (200, 422), r.text
                return r if r.status_code == 200 else None

            # the expired record of `old` is replaced in the write's own transaction ...
            later = wait_for(after_expiry, timeout=15, interval=0.1,
                             what="the 3 s idempotency record to expire")
            assert "idempotency-replayed" not in later.headers
            # ... and a purge (started by a keyed write, at most every half TTL) deletes the
            # expired `new`, keeping the fresh `old`; the writes under fresh keys start it
            def purged() -> bool:
                assert client.put("/v1/tables/items/rows/c", json={"v": "3"},
                                  headers={**headers, "Idempotency-Key": _key()}).status_code == 200
                keys = {key for (key,) in db.query(records)}
                return old in keys and new not in keys

            wait_for(purged, timeout=10, interval=0.2,
                     what="the expired record purged, the fresh one kept")
        assert db.query("SELECT v FROM items WHERE id = 'a'") == [("2",)]
        proc.stop()
    finally:
        if backend == "postgres":
            drop_database(db.dsn, admin)


# -- through a relay that cuts the connection to PostgreSQL -----------------------------------

@pytest.fixture
def relayed(pg_dsn, tmp_path, start_proxy, monkeypatch):
    """(proxy url, relay, key ring, dsn): a proxy whose connections to PostgreSQL pass the relay.

    No policy: history, its one table, is written under the one lock named ``history`` (the
    database is the test's own, so fence 1 is fresh)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE history (id bigserial PRIMARY KEY, fence bigint NOT NULL,"
                     " writer text NOT NULL)")
    parts = urlsplit(pg_dsn)
    relay = PgRelay(parts.port or 5432)
    ring = KeyRing.generate()
    monkeypatch.setenv("PROXY_DB_TIMEOUT_MS", "1000")
    monkeypatch.setenv("PROXY_POOL_SIZE", "2")
    via = f"postgresql://{parts.username}@127.0.0.1:{relay.port}{parts.path}?sslmode=disable"
    url, _ = start_proxy(via, "--jwks-file", str(write_jwks(tmp_path, ring)))
    yield url, relay, ring, pg_dsn
    relay.close()


def _rows(dsn: str, writer: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, fence FROM history WHERE writer = %s", (writer,)).fetchall()


def test_cut_after_commit_is_outcome_unknown_and_the_keyed_retry_returns_the_original_201(relayed):
    url, relay, ring, dsn = relayed
    writer, key = unique("w"), _key()
    headers = {"Fencing-Token": ring.sign("history", 1), "Idempotency-Key": key}
    body = {"fence": 1, "writer": writer}
    with httpx.Client(base_url=url, timeout=30) as client:
        relay.cut_after(b"COMMIT")
        cut = client.post("/v1/tables/history/rows", json=body, headers=headers)
        assert relay.cut_done.is_set()
        problem = assert_problem(cut, 502, "outcome_unknown")
        assert "may or may not have committed" in problem["detail"]
        assert "retry-after" not in cut.headers
        [(row_id, _)] = _rows(dsn, writer)  # it did commit: "nothing was committed" would be a lie
        retry = client.post("/v1/tables/history/rows", json=body, headers=headers)
        assert retry.status_code == 201, retry.text
        assert retry.json() == {"id": row_id, "fence": 1, "writer": writer}
        assert retry.headers["idempotency-replayed"] == "true"
    assert _rows(dsn, writer) == [(row_id, 1)], "exactly one row"


def test_cut_after_an_unkeyed_autocommit_write_is_outcome_unknown(relayed):
    url, relay, ring, dsn = relayed
    writer = unique("w")
    with httpx.Client(base_url=url, timeout=30) as client:
        relay.cut_after(b'INSERT INTO "history"')
        cut = client.post("/v1/tables/history/rows", json={"fence": 1, "writer": writer},
                          headers={"Fencing-Token": ring.sign("history", 1)})
    assert relay.cut_done.is_set()
    assert_problem(cut, 502, "outcome_unknown")
    assert len(_rows(dsn, writer)) == 1


def test_cut_before_anything_is_sent_is_database_unavailable(relayed):
    url, relay, ring, dsn = relayed
    writer, key = unique("w"), _key()
    headers = {"Fencing-Token": ring.sign("history", 1), "Idempotency-Key": key}
    body = {"fence": 1, "writer": writer}
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200  # pooled connections are up
        relay.refuse()
        started = time.monotonic()
        refused = client.post("/v1/tables/history/rows", json=body, headers=headers)
        assert time.monotonic() - started < 5
        problem = assert_problem(refused, 503, "database_unavailable")
        assert "nothing was committed" in problem["detail"]
        assert refused.headers["retry-after"] == "1"
        assert _rows(dsn, writer) == []
        relay.restore()
        retry = wait_for(lambda: (r := client.post("/v1/tables/history/rows", json=body,
                                                   headers=headers)).status_code != 503 and r,
                         timeout=20, interval=0.2, what="the database back")
        assert retry.status_code == 201 and "idempotency-replayed" not in retry.headers
    assert len(_rows(dsn, writer)) == 1


def _lease(lock: str, ring: KeyRing, cls=Lease, client=None) -> Lease:
    body = {"lock": lock, "lease_id": uuid.uuid4().hex + "AbCd", "fence": 1,
            "token": ring.sign(lock, 1), "ttl_ms": 3_600_000, "owner": "test"}
    return cls(client, body, sent_at=time.monotonic())


def test_fenced_session_retries_with_the_same_key_after_outcome_unknown(relayed):
    url, relay, ring, dsn = relayed
    writer = unique("w")
    with LockClient("http://127.0.0.1:9") as lockd:
        lease = _lease("history", ring, Lease, lockd)
        with FencedSession(url, lease) as db:
            db.claim()
            relay.cut_after(b"COMMIT")
            row = db.insert("history", {"fence": 1, "writer": writer})
    assert relay.cut_done.is_set(), "the first attempt was cut after its COMMIT"
    assert _rows(dsn, writer) == [(row["id"], 1)]


def test_async_fenced_session_retries_with_the_same_key_after_outcome_unknown(relayed):
    url, relay, ring, dsn = relayed
    writer = unique("w")

    async def run() -> dict:
        async with AsyncLockClient("http://127.0.0.1:9") as lockd:
            lease = _lease("history", ring, AsyncLease, lockd)
            async with AsyncFencedSession(url, lease) as db:
                await db.claim()
                relay.cut_after(b"COMMIT")
                return (await db.batch([{"op": "insert", "table": "history",
                                         "row": {"fence": 1, "writer": writer}}]))[0]["row"]

    row = asyncio.run(run())
    assert relay.cut_done.is_set()
    assert _rows(dsn, writer) == [(row["id"], 1)]


def test_fenced_session_errors_say_unavailable_or_unknown(relayed):
    url, relay, ring, dsn = relayed
    writer = unique("w")
    with LockClient("http://127.0.0.1:9") as lockd:
        lease = _lease("history", ring, Lease, lockd)
        with FencedSession(url, lease, retries=0) as db:
            db.claim()
            relay.cut_after(b"COMMIT")
            with pytest.raises(OutcomeUnknown) as unknown:
                db.insert("history", {"fence": 1, "writer": writer})
            assert unknown.value.status == 502 and not isinstance(unknown.value, ServiceUnavailable)
            relay.refuse()
            with pytest.raises(ServiceUnavailable) as unavailable:
                db.insert("history", {"fence": 1, "writer": writer + "x"})
            assert unavailable.value.code == "database_unavailable"
    assert len(_rows(dsn, writer)) == 1 and _rows(dsn, writer + "x") == []
