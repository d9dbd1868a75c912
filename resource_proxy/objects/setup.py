"""Start-up of the objects slice: the blob backend, the pointer table, the sweeper's loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from resource_proxy.objects.blobs import BlobStore, DirectoryBlobs
from resource_proxy.objects.service import ObjectService
from resource_proxy.objects.store import Pointers

__all__ = ["start_objects", "sweep_forever"]

log = logging.getLogger("resource_proxy.objects")


def blob_store(settings: Any) -> BlobStore:
    """The backend ``settings`` name: ``objects_dir`` (a directory) or ``objects_s3_url`` (an
    S3-compatible endpoint, ``objects.s3``)."""
    if settings.objects_s3_url is not None:
        from resource_proxy.objects.s3 import S3Blobs  # aiobotocore: the optional s3 extra

        return S3Blobs(settings.objects_s3_url, settings.objects_s3_bucket,
                       settings.objects_s3_prefix)
    return DirectoryBlobs(settings.objects_dir)


async def start_objects(settings: Any, policy: Any, keys: Any, store: Any) -> ObjectService:
    """The object service on the opened row ``store``: blob backend ready, pointer table
    created if missing. Raises ``OSError``/``ValueError`` for an unusable directory."""
    blobs = blob_store(settings)
    await blobs.open()
    pointers = Pointers(store, postgres=not settings.is_sqlite)
    await pointers.create()
    log.info("serving fenced objects from %s", settings.objects_dir or
             f"{settings.objects_s3_url} bucket {settings.objects_s3_bucket}")
    return ObjectService(keys, pointers, blobs, policy.buckets,
                         max_object_bytes=settings.max_object_bytes,
                         idempotency_ttl_ms=settings.idempotency_ttl_ms,
                         grace_s=settings.objects_grace_ms / 1000,
                         inline_max=settings.objects_inline_max)


async def sweep_forever(service: ObjectService, interval_s: float) -> None:
    """``service.sweep()`` now and every ``interval_s`` until cancelled (a failed sweep is
    logged and tried again at the next interval)."""
    while True:
        try:
            await service.sweep()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database or the directory was unavailable: next time
            log.warning("sweeper: %s", exc)
        await asyncio.sleep(interval_s)
