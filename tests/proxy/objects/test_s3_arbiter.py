"""On S3 the proxy's database is the arbiter: the S3 server itself accepts two concurrent
writes to one key (the last one wins, whoever held the lock), while through the proxy two
concurrent writers succeed or fail by their fence alone, round after round."""

from __future__ import annotations

import threading
from functools import partial

import pytest

from tests.proxy.objects.conftest import Objects, bucket

ROUNDS = 8


def _together(*calls):
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_s3_accepts_both_the_proxy_decides_by_fence(objects: Objects):
    o = objects
    if o.s3 is None:
        pytest.skip("the S3 blob store's test")
    s3, key = o.s3.client, f"direct/{bucket()}"
    answers = _together(*[lambda body=body: s3.put_object(Bucket=o.s3_bucket, Key=key, Body=body)
                          for body in (b"fresh holder", b"stale holder")])
    assert [a["ResponseMetadata"]["HTTPStatusCode"] for a in answers] == [200, 200]
    assert s3.get_object(Bucket=o.s3_bucket, Key=key)["Body"].read() in (b"fresh holder",
                                                                        b"stale holder")
    s3.delete_object(Bucket=o.s3_bucket, Key=key)

    b = bucket()
    path = f"/v1/objects/{b}/shared.bin"

    def put(fence: int):
        return o.client.put(path, content=f"fence {fence}".encode(), headers=o.auth(b, fence))

    for round_ in range(ROUNDS):
        fresh, stale = 2 * round_ + 2, 2 * round_ + 1
        low, high = _together(partial(put, stale), partial(put, fresh))
        assert high.status_code in (200, 201), high.text
        assert low.status_code in (200, 201, 409), low.text
        if low.status_code == 409:
            assert (low.json()["presented"], low.json()["highest"]) == (stale, fresh)
        assert o.client.get(path).content == f"fence {fresh}".encode()
        late = put(stale)  # after the fresh one committed: always refused
        assert late.status_code == 409 and late.json()["code"] == "stale_token"
        assert o.client.get(path).content == f"fence {fresh}".encode()
    assert len(o.blobs()) == 1, "only the visible version's blob is left in the bucket"
