"""Blobs on any S3-compatible endpoint (``--objects-s3-url URL --objects-s3-bucket NAME``).

The library is aiobotocore (the ``s3`` extra: ``pip install 'lockd[s3]'``): asyncio-native (no
thread per request, streaming bodies both ways), the botocore request signing, retries,
endpoints and credential chain every S3-compatible server is tested against, and maintained in
step with botocore. Credentials come from botocore's usual chain (``AWS_ACCESS_KEY_ID``/
``AWS_SECRET_ACCESS_KEY``, profiles, instance roles); the region from ``AWS_DEFAULT_REGION``
(default ``us-east-1``).

What the proxy asks of the server is only what every S3-compatible one does reliably: write a
new key, read it (with a ``Range``), delete it, list keys by prefix. Never a conditional write:
the proxy's database decides which blob is the object (``objects.store``), so a server whose
compare-and-swap is broken, or which accepts two concurrent writes to one key, changes nothing.

Layout: ``{prefix}blobs/{name}`` (``prefix`` default ``lockd-objects/``). A body is sent in one
``PutObject`` when it fits in ``PART`` (8 MiB), else as a multipart upload of ``PART``-sized
parts, so at most 8 MiB of a body is buffered per request; a multipart upload that failed or
was abandoned is aborted (at once, or by the sweeper once older than the grace period). An
acknowledged PutObject / CompleteMultipartUpload is durable by S3's contract.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect

from resource_proxy.errors import BlobStoreUnavailable, PayloadTooLarge, ProxyError
from resource_proxy.objects.blobs import BlobMissing, Staged, Stored, is_blob_name, new_name

__all__ = ["S3Blobs", "PART"]

PART = 8 << 20


class S3Blobs:
    """Blobs as keys of ``bucket`` on the S3 endpoint ``url`` (the bucket is created if it is
    missing)."""

    def __init__(self, url: str, bucket: str, prefix: str = "lockd-objects/"):
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.rstrip("/") + "/" if prefix else ""
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def open(self) -> None:
        try:
            from aiobotocore.session import get_session
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - the s3 extra is not installed
            raise ValueError("an S3 endpoint needs aiobotocore: pip install 'lockd[s3]'") from exc
        session = get_session()
        self._client = await self._stack.enter_async_context(session.create_client(
            "s3", endpoint_url=self.url,
            region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3})))
        try:
            await self._client.head_bucket(Bucket=self.bucket)
        except self._client.exceptions.ClientError as exc:
            if _code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise
            await self._client.create_bucket(Bucket=self.bucket)

    async def close(self) -> None:
        await self._stack.aclose()

    def _key(self, name: str) -> str:
        if not is_blob_name(name):
            raise BlobMissing(name)
        return f"{self.prefix}blobs/{name}"

    async def put(self, chunks: AsyncIterator[bytes], limit: int) -> Stored:
        try:
            return await self._put(chunks, limit)
        except (ProxyError, BlobMissing, ClientDisconnect):
            raise
        except Exception as exc:  # botocore: the endpoint refused or did not answer
            raise BlobStoreUnavailable(f"the S3 endpoint failed: {type(exc).__name__}: "
                                       f"{str(exc)[:200]}; nothing was stored") from None

    async def stage(self, chunks: AsyncIterator[bytes], limit: int) -> Staged:
        """``put``: an S3 PUT (or a completed multipart upload) is durable when answered."""
        return Staged(await self.put(chunks, limit), None, self.delete)

    async def _put(self, chunks: AsyncIterator[bytes], limit: int) -> Stored:
        name = new_name()
        key = self._key(name)
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        upload: str | None = None
        parts: list[dict[str, Any]] = []
        done = False
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the object exceeds the largest this proxy stores "
                                          f"({limit} bytes)", limit=limit)
                digest.update(chunk)
                buffer += chunk
                while len(buffer) >= PART:
                    if upload is None:
                        upload = (await self._client.create_multipart_upload(
                            Bucket=self.bucket, Key=key))["UploadId"]
                    part, buffer = bytes(buffer[:PART]), buffer[PART:]
                    number = len(parts) + 1
                    answer = await self._client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number,
                        Body=part)
                    parts.append({"PartNumber": number, "ETag": answer["ETag"]})
            if upload is None:
                await self._client.put_object(Bucket=self.bucket, Key=key, Body=bytes(buffer))
            else:
                if buffer:
                    number = len(parts) + 1
                    answer = await self._client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number,
                        Body=bytes(buffer))
                    parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                await self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload,
                    MultipartUpload={"Parts": parts})
            done = True
        finally:
            if not done and upload is not None:
                with contextlib.suppress(Exception):
                    await self._client.abort_multipart_upload(Bucket=self.bucket, Key=key,
                                                              UploadId=upload)
        return Stored(name, size, digest.hexdigest())

    async def read(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        key = self._key(name)
        try:
            if end <= start:  # nothing to send: only say whether it is there
                await self._client.head_object(Bucket=self.bucket, Key=key)
                return
            answer = await self._client.get_object(Bucket=self.bucket, Key=key,
                                                   Range=f"bytes={start}-{end - 1}")
        except self._client.exceptions.ClientError as exc:
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                raise BlobMissing(name) from None
            raise BlobStoreUnavailable(f"the S3 endpoint failed: {_code(exc)}") from None
        except Exception as exc:  # unreachable, timed out
            raise BlobStoreUnavailable(f"the S3 endpoint failed: {type(exc).__name__}") from None
        body = answer["Body"]
        try:
            async for chunk in body.iter_chunks(256 * 1024):
                yield chunk
        finally:
            body.close()

    async def delete(self, name: str) -> None:
        with contextlib.suppress(BlobMissing):
            await self._client.delete_object(Bucket=self.bucket, Key=self._key(name))

    async def older_than(self, age_s: float) -> list[str]:
        cutoff = time.time() - age_s
        found: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}blobs/"):
            for item in page.get("Contents", ()):
                name = item["Key"].rsplit("/", 1)[-1]
                if is_blob_name(name) and item["LastModified"].timestamp() < cutoff:
                    found.append(name)
        uploads = await self._client.list_multipart_uploads(Bucket=self.bucket,
                                                            Prefix=f"{self.prefix}blobs/")
        for upload in uploads.get("Uploads", ()):
            if upload["Initiated"].timestamp() < cutoff:
                with contextlib.suppress(Exception):
                    await self._client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        return found


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
