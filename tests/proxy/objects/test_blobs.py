"""The two blob stores on their own: a body streamed in many chunks (S3: a multipart upload of
three parts) comes back whole and by range, a body past the limit leaves nothing, a deleted blob
reads as missing, and ``older_than`` names only the blobs past the age given."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from resource_proxy.errors import PayloadTooLarge
from resource_proxy.objects.blobs import BlobMissing, DirectoryBlobs
from tests.proxy.objects.conftest import S3_ENV, S3Server

BODY = os.urandom(17 * (1 << 20) + 123)  # three S3 parts of 8 MiB; 18 directory buffers


async def _chunks(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


async def _read(store, name: str, start: int, end: int) -> bytes:
    return b"".join([c async for c in store.read(name, start, end)])


async def _exercise(store, listed) -> None:
    await store.open()
    try:
        stored = await store.put(_chunks(BODY), len(BODY))
        assert (stored.size, stored.sha256) == (len(BODY), hashlib.sha256(BODY).hexdigest())
        assert await _read(store, stored.name, 0, len(BODY)) == BODY
        assert await _read(store, stored.name, 9_000_000, 9_000_100) == BODY[9_000_000:9_000_100]
        before = listed()
        with pytest.raises(PayloadTooLarge):
            await store.put(_chunks(BODY), len(BODY) - 1)
        assert listed() == before, "a refused body leaves nothing"
        assert await store.older_than(3600) == []
        assert stored.name in await store.older_than(-1)
        await store.delete(stored.name)
        with pytest.raises(BlobMissing):
            await _read(store, stored.name, 0, 10)
        await store.delete(stored.name)  # gone already: no error
    finally:
        await store.close()


def test_directory_blobs(tmp_path: Path):
    store = DirectoryBlobs(tmp_path / "objects")
    asyncio.run(_exercise(store, lambda: sorted(p for p in (tmp_path / "objects").rglob("*")
                                                if p.is_file())))


def test_s3_blobs(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch):
    from resource_proxy.objects.s3 import S3Blobs

    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    bucket = f"blobs-{uuid.uuid4().hex[:12]}"
    store = S3Blobs(s3_server.url, bucket)

    def listed() -> list[str]:
        uploads = s3_server.client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return s3_server.keys(bucket) + [u["UploadId"] for u in uploads]

    asyncio.run(_exercise(store, listed))


def test_directory_blobs_of_many_small_pieces(tmp_path: Path):
    """A batch of more pieces than one ``writev`` takes (1,024), some empty, is written whole
    and in order; an empty body is an empty blob."""
    body = os.urandom(700_000)

    async def run() -> None:
        store = DirectoryBlobs(tmp_path / "objects")
        await store.open()
        pieces = [body[i:i + 97] for i in range(0, len(body), 97)]
        stored = await store.put(_pieces([*pieces[:3000], b"", *pieces[3000:]]), len(body))
        assert (stored.size, stored.sha256) == (len(body), hashlib.sha256(body).hexdigest())
        assert await _read(store, stored.name, 0, len(body)) == body
        empty = await store.put(_pieces([]), 10)  # nothing written: the file is still made
        assert store.path_of(empty.name).stat().st_size == 0 and empty.size == 0

    asyncio.run(run())


async def _pieces(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
