"""The objects contract on a real proxy, on SQLite and on PostgreSQL as its database: PUT
answers 201/200, GET the exact bytes, a superseded token 409 ``stale_token`` with nothing
visible and its blob deleted; ranges, conditional requests, HEAD, DELETE, listing, policy."""

from __future__ import annotations

import hashlib
import os

from tests.proxy.conftest import assert_problem
from tests.proxy.objects.conftest import Objects, bucket


def test_put_get_and_the_revived_holder(objects: Objects):
    o, b = objects, bucket()
    body = os.urandom(70_000)
    first = o.client.put(f"/v1/objects/{b}/out/part-0.bin", content=body,
                         headers=o.auth(b, 3, **{"Content-Type": "application/x-test"}))
    assert first.status_code == 201, first.text
    meta = first.json()
    assert (meta["version"], meta["size"], meta["fence"], meta["lock"]) == (1, len(body), 3, b)
    assert meta["sha256"] == hashlib.sha256(body).hexdigest()
    assert first.headers["etag"] == meta["etag"]
    got = o.client.get(f"/v1/objects/{b}/out/part-0.bin")
    assert got.status_code == 200 and got.content == body
    assert got.headers["content-type"] == "application/x-test"
    assert got.headers["etag"] == meta["etag"] and got.headers["last-modified"]
    assert int(got.headers["content-length"]) == len(body)

    newer = o.client.put(f"/v1/objects/{b}/out/part-0.bin", content=b"new", headers=o.auth(b, 4))
    assert newer.status_code == 200 and newer.json()["version"] == 2
    before = o.blobs()
    stale = o.client.put(f"/v1/objects/{b}/out/part-0.bin", content=b"stale", headers=o.auth(b, 3))
    problem = assert_problem(stale, 409, "stale_token")
    assert (problem["lock"], problem["presented"], problem["highest"]) == (b, 3, 4)
    assert o.client.get(f"/v1/objects/{b}/out/part-0.bin").content == b"new"
    assert o.blobs() == before, "the stale writer's blob is deleted"
    assert_problem(o.client.delete(f"/v1/objects/{b}/out/part-0.bin", headers=o.auth(b, 3)),
                   409, "stale_token")
    # the objects' fences are the rows' fences: one table, one rule
    assert o.client.get(f"/v1/fences/{b}").json() == {"lock": b, "highest": 4}
    # a claim of an object's lock, as of a row's: the revived holder of fence 4 is fenced off
    claimed = o.client.post(f"/v1/fences/{b}/claim", headers=o.auth(b, 9))
    assert claimed.status_code == 200 and claimed.json() == {"lock": b, "highest": 9}
    assert_problem(o.client.put(f"/v1/objects/{b}/out/part-0.bin", content=b"late",
                                headers=o.auth(b, 4)), 409, "stale_token")
    templated = o.client.post("/v1/fences/reports/2031/claim", headers=o.auth("reports/2031", 1))
    assert templated.status_code == 200, templated.text
    assert_problem(o.client.post("/v1/fences/models/claim", headers=o.auth("models", 1)), 403,
                   "lock_not_allowed")  # bucket models is under models/{key}: no object's lock


def test_a_claim_of_the_lock_fences_objects_off_too(objects: Objects):
    o, b = objects, bucket()
    assert o.client.put(f"/v1/objects/{b}/k", content=b"1", headers=o.auth(b, 1)).status_code == 201
    read = o.client.get(f"/v1/objects/{b}/k", headers=o.auth(b, 2))  # a fenced read raises it
    assert read.status_code == 200 and read.content == b"1"
    assert_problem(o.client.put(f"/v1/objects/{b}/k", content=b"x", headers=o.auth(b, 1)),
                   409, "stale_token")
    assert o.client.get(f"/v1/objects/{b}/k").content == b"1"


def test_token_rules(objects: Objects):
    o, b = objects, bucket()
    blobs = o.blobs()
    assert_problem(o.client.put(f"/v1/objects/{b}/k", content=b"x"), 428, "token_required")
    assert_problem(o.client.put(f"/v1/objects/{b}/k", content=b"x",
                                headers={"Fencing-Token": "nope"}), 401, "invalid_token")
    wrong = assert_problem(o.client.put(f"/v1/objects/{b}/k", content=b"x",
                                        headers=o.auth("other", 1)), 403, "lock_not_allowed")
    assert wrong["lock"] == b
    shared = {"Fencing-Token": o.ring.sign(b, 5, extra={"mode": "shared"})}
    assert_problem(o.client.put(f"/v1/objects/{b}/k", content=b"x", headers=shared), 403,
                   "shared_token")
    assert o.client.get(f"/v1/objects/{b}/k").status_code == 404
    assert o.blobs() == blobs, "a refused token stores nothing"
    assert o.client.get(f"/v1/fences/{b}").json()["highest"] == 0


def test_bucket_templates_govern_by_key_segments(objects: Objects):
    o = objects
    year = f"y{os.urandom(4).hex()}"
    ok = o.client.put(f"/v1/objects/reports/{year}/q4.pdf", content=b"pdf",
                      headers=o.auth(f"reports/{year}", 1))
    assert ok.status_code == 201 and ok.json()["lock"] == f"reports/{year}"
    refused = assert_problem(o.client.put(f"/v1/objects/reports/{year}/q4.pdf", content=b"x",
                                          headers=o.auth("reports", 9)), 403, "lock_not_allowed")
    assert refused["lock"] == f"reports/{year}"
    name = f"m{os.urandom(4).hex()}/w.bin"
    model = o.client.put(f"/v1/objects/models/{name}", content=b"w", headers=o.auth(f"models/{name}", 2))
    assert model.status_code == 201, model.text


def test_preconditions_and_idempotency(objects: Objects):
    o, b = objects, bucket()
    path = f"/v1/objects/{b}/cfg.json"
    created = o.client.put(path, content=b"{}", headers=o.auth(b, 1, **{"If-None-Match": "*"}))
    assert created.status_code == 201
    again = o.client.put(path, content=b"{}", headers=o.auth(b, 1, **{"If-None-Match": "*"}))
    assert_problem(again, 412, "precondition_failed")
    etag = created.headers["etag"]
    assert_problem(o.client.put(path, content=b"1", headers=o.auth(b, 1, **{"If-Match": '"x"'})),
                   412, "precondition_failed")
    moved = o.client.put(path, content=b"2", headers=o.auth(b, 1, **{"If-Match": etag}))
    assert moved.status_code == 200 and moved.json()["version"] == 2
    keyed = o.auth(b, 2, **{"Idempotency-Key": os.urandom(8).hex()})
    one = o.client.put(path, content=b"3", headers=keyed)
    blobs = o.blobs()
    two = o.client.put(path, content=b"3", headers=keyed)
    assert two.status_code == one.status_code == 200
    assert two.headers["idempotency-replayed"] == "true" and two.json() == one.json()
    assert o.blobs() == blobs, "a replay keeps no second blob"
    assert_problem(o.client.put(path, content=b"4", headers=keyed), 422, "idempotency_key_reused")
    assert o.client.get(path).content == b"3"


def test_ranges_conditional_get_head_delete(objects: Objects):
    o, b = objects, bucket()
    path = f"/v1/objects/{b}/r.bin"
    body = bytes(range(256)) * 4
    etag = o.client.put(path, content=body, headers=o.auth(b, 1)).headers["etag"]
    part = o.client.get(path, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == body[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(body)}"
    assert o.client.get(path, headers={"Range": "bytes=-5"}).content == body[-5:]
    assert o.client.get(path, headers={"Range": "bytes=1000-"}).content == body[1000:]
    assert_problem(o.client.get(path, headers={"Range": "bytes=5000-"}), 416,
                   "range_not_satisfiable")
    assert o.client.get(path, headers={"If-None-Match": etag}).status_code == 304
    last = o.client.get(path).headers["last-modified"]
    assert o.client.get(path, headers={"If-Modified-Since": last}).status_code == 304
    head = o.client.head(path)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(body) and head.headers["etag"] == etag
    assert_problem(o.client.delete(path, headers=o.auth(b, 1, **{"If-Match": '"other"'})), 412,
                   "precondition_failed")
    assert o.client.delete(path, headers=o.auth(b, 2)).status_code == 204
    assert_problem(o.client.get(path), 404, "not_found")
    assert_problem(o.client.delete(path, headers=o.auth(b, 2)), 404, "not_found")
    assert not [p for p in o.blobs() if etag.strip('"') in p], "its blob is deleted"


def test_listing(objects: Objects):
    o, b = objects, bucket()
    keys = ["a/1", "a/2", "a/3", "b/1", "é/x"]
    for key in keys:
        assert o.client.put(f"/v1/objects/{b}/{key}", content=key.encode(),
                            headers=o.auth(b, 1)).status_code == 201
    everything = o.client.get(f"/v1/objects/{b}").json()
    assert [i["key"] for i in everything["items"]] == keys and everything["next_after"] is None
    page = o.client.get(f"/v1/objects/{b}", params={"prefix": "a/", "limit": 2}).json()
    assert [i["key"] for i in page["items"]] == ["a/1", "a/2"] and page["next_after"] == "a/2"
    rest = o.client.get(f"/v1/objects/{b}", params={"prefix": "a/", "after": "a/2"}).json()
    assert [i["key"] for i in rest["items"]] == ["a/3"]
    assert_problem(o.client.get(f"/v1/objects/{b}", params={"limit": 0}), 422, "invalid_request")


def test_the_openapi_document_describes_the_object_calls(objects: Objects):
    doc = objects.client.get("/openapi.json").json()
    calls = {op["operationId"] for path, ops in doc["paths"].items()
             if path.startswith("/v1/objects/") for op in ops.values()}
    assert calls == {"putObject", "getObject", "deleteObject", "listObjects"}
    put = doc["paths"]["/v1/objects/{bucket}/{key}"]["put"]["responses"]
    assert {"200", "201", "409", "412", "413"} <= set(put)
