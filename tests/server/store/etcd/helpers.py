"""Helpers for the EtcdStore tests: open a store, acquire with defaults, fresh names and ids."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import uuid

import httpx

from lockd.server.store.etcd import EtcdStore, parse_etcd_url

__all__ = ["lease_id", "name", "opened", "acquire", "watching"]


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


async def watching(store: EtcdStore, url: str, timeout: float = 5.0) -> None:
    """Until ``store`` (opened on ``url``) hears deletes from its watch stream (avoids a race
    with the stream's startup): a probe key is put under the lock prefix straight into etcd and
    deleted, and that delete must reach a subscribed listener. The probe has no fence key, so it
    is no lock the store would ever list or report free."""
    endpoints, prefix, _ = parse_etcd_url(url)
    probe = f"watching-probe/{uuid.uuid4().hex}"
    key = base64.b64encode(f"{prefix}/locks/{probe}".encode()).decode()
    heard = asyncio.Event()
    store.subscribe(lambda lock: heard.set() if lock == probe else None)
    async with httpx.AsyncClient(timeout=timeout) as http:
        (await http.post(endpoints[0] + "/v3/kv/put", json={"key": key, "value": ""})
         ).raise_for_status()
        (await http.post(endpoints[0] + "/v3/kv/deleterange", json={"key": key})
         ).raise_for_status()
    await asyncio.wait_for(heard.wait(), timeout)
