"""Small bodies kept inline in the pointer row (``--objects-inline-max``, default 16 KiB), on a
real proxy with each database and blob store: at and under the threshold no blob is written,
one byte over it is a blob; GET, HEAD, Range, conditional GET, ETag, digest and listing answer
as for a blob-backed object; replacing an inline object by a blob one and back deletes what
it should; a stale token's inline PUT changes nothing; a pointer table made before the body
column gains it at start."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator

import pytest

from tests.proxy.conftest import assert_problem
from tests.proxy.objects.conftest import (
    COMBINATIONS,
    Objects,
    bucket,
    start_objects_proxy,
    stop_objects_proxy,
)

LIMIT = 16 * 1024  # the proxy's default threshold (no flag given)


@pytest.fixture(scope="module", params=COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def inline(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Objects]:
    """A proxy with the default inline threshold, for each database and blob store."""
    backend, blobs = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    s3 = request.getfixturevalue("s3_server") if blobs == "s3" else None
    directory = tmp_path_factory.mktemp(f"inline-{backend}-{blobs}")
    served = start_objects_proxy(backend, directory, admin, "--max-object-bytes", str(1 << 20),
                                 s3=s3, inline_max=None)
    try:
        yield served
    finally:
        stop_objects_proxy(served, admin)
        shutil.rmtree(directory, ignore_errors=True)


def _pieces(body: bytes, size: int = 1000) -> Iterator[bytes]:
    """The body as a chunked upload (no Content-Length)."""
    for start in range(0, len(body), size):
        yield body[start:start + size]


def test_the_threshold_decides_where_a_body_goes(inline: Objects):
    o, b = inline, bucket()
    blobs = o.blobs()
    at = os.urandom(LIMIT)
    made = o.client.put(f"/v1/objects/{b}/at", content=at, headers=o.auth(b, 1))
    assert made.status_code == 201 and made.json()["size"] == LIMIT
    chunked = os.urandom(LIMIT - 1)
    made = o.client.put(f"/v1/objects/{b}/chunked", content=_pieces(chunked), headers=o.auth(b, 1))
    assert made.status_code == 201 and made.json()["sha256"] == hashlib.sha256(chunked).hexdigest()
    assert o.blobs() == blobs, "bodies at or under the threshold are kept inline: no blob"
    over = os.urandom(LIMIT + 1)
    assert o.client.put(f"/v1/objects/{b}/over", content=over,
                        headers=o.auth(b, 1)).status_code == 201
    assert len(o.blobs()) == len(blobs) + 1, "one byte over the threshold is a blob"
    big = os.urandom(3 * LIMIT + 7)  # chunked and over: what was read first goes to the blob too
    made = o.client.put(f"/v1/objects/{b}/big", content=_pieces(big), headers=o.auth(b, 1))
    assert made.status_code == 201 and made.json()["sha256"] == hashlib.sha256(big).hexdigest()
    assert len(o.blobs()) == len(blobs) + 2
    for key, body in (("at", at), ("chunked", chunked), ("over", over), ("big", big)):
        assert o.client.get(f"/v1/objects/{b}/{key}").content == body, key
    assert o.client.put(f"/v1/objects/{b}/empty", content=b"",
                        headers=o.auth(b, 1)).status_code == 201
    empty = o.client.get(f"/v1/objects/{b}/empty")
    assert empty.status_code == 200 and empty.content == b""
    assert empty.headers["content-length"] == "0"


def test_reads_of_an_inline_object_answer_as_a_blob_backed_one(inline: Objects):
    o, b = inline, bucket()
    path = f"/v1/objects/{b}/r.bin"
    body = bytes(range(256)) * 4
    put = o.client.put(path, content=body, headers=o.auth(b, 1, **{"Content-Type": "text/x-a"}))
    meta = put.json()
    etag = put.headers["etag"]
    assert etag == meta["etag"] and len(etag.strip('"')) == 32  # a generated name, as a blob's
    assert meta["sha256"] == hashlib.sha256(body).hexdigest() and meta["size"] == len(body)
    got = o.client.get(path)
    assert got.status_code == 200 and got.content == body
    assert (got.headers["etag"], got.headers["content-type"]) == (etag, "text/x-a")
    assert got.headers["content-length"] == str(len(body)) and got.headers["last-modified"]
    assert (got.headers["x-object-version"], got.headers["x-object-fence"]) == ("1", "1")
    part = o.client.get(path, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == body[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(body)}"
    assert part.headers["content-length"] == "10"
    assert o.client.get(path, headers={"Range": "bytes=-5"}).content == body[-5:]
    assert o.client.get(path, headers={"Range": "bytes=1000-"}).content == body[1000:]
    assert_problem(o.client.get(path, headers={"Range": "bytes=5000-"}), 416,
                   "range_not_satisfiable")
    stale_if_range = o.client.get(path, headers={"Range": "bytes=0-3", "If-Range": '"old"'})
    assert stale_if_range.status_code == 200 and stale_if_range.content == body
    assert o.client.get(path, headers={"If-None-Match": etag}).status_code == 304
    last = got.headers["last-modified"]
    assert o.client.get(path, headers={"If-Modified-Since": last}).status_code == 304
    head = o.client.head(path)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(body)) and head.headers["etag"] == etag
    fenced = o.client.get(path, headers=o.auth(b, 1))  # a fenced read as for a blob
    assert fenced.status_code == 200 and fenced.content == body
    listed = o.client.get(f"/v1/objects/{b}").json()["items"]
    assert listed == [meta], "the listing shows the PUT's pointer, no body"


def test_replacing_inline_by_blob_and_back_and_deleting(inline: Objects):
    o, b = inline, bucket()
    path = f"/v1/objects/{b}/swap"
    blobs = o.blobs()
    assert o.client.put(path, content=b"small", headers=o.auth(b, 1)).status_code == 201
    large = os.urandom(LIMIT * 2)
    replaced = o.client.put(path, content=large, headers=o.auth(b, 1))
    assert replaced.status_code == 200 and replaced.json()["version"] == 2
    [blob] = [p for p in o.blobs() if p not in blobs]
    assert replaced.headers["etag"].strip('"') in blob
    assert o.client.get(path).content == large
    back = o.client.put(path, content=b"small again", headers=o.auth(b, 2))
    assert back.status_code == 200 and back.json()["version"] == 3
    assert o.blobs() == blobs, "the replaced blob is deleted"
    assert o.client.get(path).content == b"small again"
    assert o.client.get(path, headers={"Range": "bytes=6-"}).content == b"again"
    # a precondition on the inline version, then a keyed replay that keeps nothing twice
    etag = back.headers["etag"]
    assert_problem(o.client.put(path, content=b"x", headers=o.auth(b, 2, **{"If-Match": '"x"'})),
                   412, "precondition_failed")
    keyed = o.auth(b, 2, **{"If-Match": etag, "Idempotency-Key": os.urandom(8).hex()})
    one = o.client.put(path, content=b"keyed", headers=keyed)
    two = o.client.put(path, content=b"keyed", headers=keyed)
    assert one.status_code == two.status_code == 200 and two.json() == one.json()
    assert two.headers["idempotency-replayed"] == "true" and one.json()["version"] == 4
    assert o.client.delete(path, headers=o.auth(b, 2)).status_code == 204
    assert_problem(o.client.get(path), 404, "not_found")
    assert o.client.head(path).status_code == 404
    assert o.blobs() == blobs
    # deleting a blob-backed object still deletes its blob
    assert o.client.put(path, content=large, headers=o.auth(b, 2)).status_code == 201
    assert len(o.blobs()) == len(blobs) + 1
    assert o.client.delete(path, headers=o.auth(b, 2)).status_code == 204
    assert o.blobs() == blobs


def test_a_stale_inline_put_changes_nothing(inline: Objects):
    o, b = inline, bucket()
    small, large = f"/v1/objects/{b}/small", f"/v1/objects/{b}/large"
    first = o.client.put(small, content=b"v1", headers=o.auth(b, 5)).json()
    body = os.urandom(LIMIT + 100)
    second = o.client.put(large, content=body, headers=o.auth(b, 5)).json()
    blobs = o.blobs()
    for path in (small, large):  # over an inline object and over a blob-backed one
        problem = assert_problem(o.client.put(path, content=b"stale", headers=o.auth(b, 4)),
                                 409, "stale_token")
        assert (problem["presented"], problem["highest"]) == (4, 5)
    assert o.client.get(small).content == b"v1" and o.client.get(large).content == body
    assert o.client.head(small).headers["etag"] == first["etag"]
    assert o.client.head(large).headers["etag"] == second["etag"]
    assert o.client.get(f"/v1/objects/{b}").json()["items"] == [second, first]
    assert o.blobs() == blobs, "nothing stored, nothing deleted"
    assert o.client.get(f"/v1/fences/{b}").json()["highest"] == 5
    assert_problem(o.client.delete(small, headers=o.auth(b, 4)), 409, "stale_token")
    assert o.client.get(small).content == b"v1"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_pointer_table_without_the_body_column_gains_it(backend: str, tmp_path,
                                                          request: pytest.FixtureRequest):
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    o = start_objects_proxy(backend, tmp_path, admin, inline_max=None)
    try:
        b = bucket()
        old = os.urandom(LIMIT + 1)
        assert o.client.put(f"/v1/objects/{b}/old", content=old,
                            headers=o.auth(b, 1)).status_code == 201
        assert o.process.stop() == 0
        table = "resource_proxy.objects" if backend == "postgres" else "resource_proxy_objects"
        o.db.script(f"ALTER TABLE {table} DROP COLUMN body")  # as the earlier proxy made it
        o.process.start()
        assert o.client.get(f"/v1/objects/{b}/old").content == old
        assert o.client.put(f"/v1/objects/{b}/new", content=b"inline",
                            headers=o.auth(b, 1)).status_code == 201
        assert o.client.get(f"/v1/objects/{b}/new").content == b"inline"
        assert len(o.blobs()) == 1
    finally:
        stop_objects_proxy(o, admin)
