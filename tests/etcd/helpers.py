"""Helpers for the EtcdStore tests: open a store, acquire with defaults, fresh names and ids."""

from __future__ import annotations

import contextlib
import secrets
import uuid

from lockd.server.store.etcd import EtcdStore

__all__ = ["lease_id", "name", "opened", "acquire"]


def lease_id() -> str:
    return secrets.token_urlsafe(24)


def name(tag: str = "lock") -> str:
    return f"{tag}/{uuid.uuid4().hex[:10]}"


@contextlib.asynccontextmanager
async def opened(url: str, **kw):
    store = EtcdStore(url, **kw)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def acquire(store: EtcdStore, lock: str, ttl_ms: int = 5000, owner: str = "o",
                  client_id: str | None = None, lid: str | None = None):
    return await store.acquire(lock, lease_id=lid or lease_id(), ttl_ms=ttl_ms, owner=owner,
                               client_id=client_id)
