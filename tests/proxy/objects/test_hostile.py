"""Keys that would leave the bucket and bodies above the bound: 4xx problems, nothing written
anywhere (not outside the objects directory, not inside it either), on both databases."""

from __future__ import annotations

import http.client
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.proxy.conftest import assert_problem
from tests.proxy.objects.conftest import Objects, bucket

ESCAPES = [
    "..%2F..%2Fetc%2Fpasswd",  # dot segments, encoded slashes
    "%2e%2e/x",
    "a/%2E/b",
    "a/../../b",
    "%2Fetc%2Fpasswd",  # an absolute path: empty first segment
    "a//b",
    "a/",
    "a%5C..%5C..%5Cwin.ini",  # backslashes
    "a%00b",  # NUL
    "a%0Ab",  # a control character
    "a%7Fb",
    "%ff%fe",  # not UTF-8
    "x" * 256,  # a segment too long
    "/".join(["abcdefgh"] * 114),  # 1025 bytes
]


def _tree(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if skip not in p.parents and p != skip}


def _raw(o: Objects, method: str, target: str, headers: dict[str, str], body: bytes) -> int:
    """Send ``target`` exactly as given (no client-side normalization of dot segments)."""
    parts = urlsplit(o.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("key", ESCAPES, ids=range(len(ESCAPES)))
def test_a_key_that_would_leave_the_bucket_is_refused(objects: Objects, key: str):
    o, b = objects, bucket()
    outside = _tree(o.root.parent, o.root)
    blobs = o.blobs()
    status = _raw(o, "PUT", f"/v1/objects/{b}/{key}", o.auth(b, 1), b"escape")
    assert status in (400, 403, 404, 422), status
    assert o.blobs() == blobs and _tree(o.root.parent, o.root) == outside
    assert o.client.get(f"/v1/fences/{b}").json()["highest"] == 0, "refused before the fence"


def test_problem_documents_for_bad_names(objects: Objects):
    o, b = objects, bucket()
    assert_problem(o.client.put(f"/v1/objects/{b}/a%2F..%2Fb", content=b"x", headers=o.auth(b, 1)),
                   422, "invalid_request")
    assert_problem(o.client.put("/v1/objects/%2e%2e/x", content=b"x", headers=o.auth("x", 1)),
                   422, "invalid_request")
    assert_problem(o.client.get(f"/v1/objects/{b}/a%00"), 422, "invalid_request")
    assert_problem(o.client.get("/v1/objects/-bad/x"), 422, "invalid_request")


def test_an_oversized_body_is_413_and_leaves_nothing(objects: Objects):
    o, b = objects, bucket()
    blobs = o.blobs()
    big = os.urandom((1 << 20) + 1)
    assert_problem(o.client.put(f"/v1/objects/{b}/big", content=big, headers=o.auth(b, 1)),
                   413, "payload_too_large")

    def chunks():  # no Content-Length: the bound is found while streaming
        for start in range(0, len(big), 65536):
            yield big[start:start + 65536]

    assert_problem(o.client.put(f"/v1/objects/{b}/big", content=chunks(), headers=o.auth(b, 1)),
                   413, "payload_too_large")
    assert o.blobs() == blobs, "the partial upload is removed"
    assert o.client.get(f"/v1/objects/{b}/big").status_code == 404
    exact = o.client.put(f"/v1/objects/{b}/big", content=big[:-1], headers=o.auth(b, 1))
    assert exact.status_code == 201 and exact.json()["size"] == 1 << 20


def test_a_symlink_planted_in_the_directory_is_never_followed(objects: Objects, tmp_path: Path):
    o, b = objects, bucket()
    if o.s3 is not None:
        pytest.skip("a directory's concern: S3 keys are not paths")
    target = tmp_path / "outside"
    target.mkdir()
    (o.root / "tmp" / "link").symlink_to(target)
    try:
        r = o.client.put(f"/v1/objects/{b}/link", content=b"inside", headers=o.auth(b, 1))
        assert r.status_code == 201
        assert list(target.iterdir()) == []
        assert o.client.get(f"/v1/objects/{b}/link").content == b"inside"
    finally:
        (o.root / "tmp" / "link").unlink()


def test_a_failing_blob_directory_is_503_with_nothing_visible(objects: Objects):
    o, b = objects, bucket()
    if o.s3 is not None:
        pytest.skip("a directory's failure")
    tmp = o.root / "tmp"
    tmp.rename(o.root / "tmp-moved")
    tmp.write_text("not a directory: every new upload fails (as on a full or broken disk)")
    try:
        r = o.client.put(f"/v1/objects/{b}/k", content=b"x" * 5000, headers=o.auth(b, 1))
        problem = assert_problem(r, 503, "blob_store_unavailable")
        assert r.headers["retry-after"] == "1" and "nothing was stored" in problem["detail"]
    finally:
        tmp.unlink()
        (o.root / "tmp-moved").rename(tmp)
    assert o.client.get(f"/v1/objects/{b}/k").status_code == 404
    assert o.client.put(f"/v1/objects/{b}/k", content=b"ok", headers=o.auth(b, 1)).status_code == 201
