"""The blob of a replaced (or deleted) object is deleted AFTER the answer, not before it.

In process, on a real SQLite file and a real objects directory: the blob store's ``delete`` is
held at a gate. A PUT that replaces a blob-backed object and a DELETE are answered while their
old blob's delete waits (it still exists; ``/metrics`` counts it pending); once the gate opens
the blob goes and the count returns to 0. A blob store whose delete fails leaves a committed
write answered as committed (the blob is the sweeper's)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx

from lockd.tokens import KeyRing
from resource_proxy.app import create_app
from resource_proxy.settings import Settings
from tests.proxy.conftest import write_jwks

_PENDING = "resource_proxy_object_blob_deletes_pending "


def _app(tmp: Path, ring: KeyRing):
    settings = Settings(database_url=f"sqlite:///{tmp / 'proxy.db'}",
                        jwks_file=write_jwks(tmp, ring), objects_dir=tmp / "objects",
                        objects_inline_max=0)
    return create_app(settings)


def _blob(root: Path, etag: str) -> Path:
    name = etag.strip('"')
    return root / "blobs" / name[:2] / name


async def _pending(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return float(next(x for x in text.splitlines() if x.startswith(_PENDING))[len(_PENDING):])


async def _scenario(tmp: Path, ring: KeyRing) -> None:
    app = _app(tmp, ring)
    root = tmp / "objects"
    async with app.router.lifespan_context(app):
        service = app.state.objects
        gate = asyncio.Event()
        real_delete = service.blobs.delete

        async def gated(name: str) -> None:
            await gate.wait()
            await real_delete(name)

        service.blobs.delete = gated
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            auth = {"Fencing-Token": ring.sign("b", 1)}
            first = await client.put("/v1/objects/b/k", content=os.urandom(3000), headers=auth)
            assert first.status_code == 201
            old = _blob(root, first.headers["etag"])
            assert old.exists()
            # answered while the replaced blob's delete is held: before, the PUT waited for it
            second = await asyncio.wait_for(
                client.put("/v1/objects/b/k", content=b"v2" * 2000, headers=auth), 10)
            assert second.status_code == 200
            assert old.exists() and await _pending(client) == 1
            gone = await asyncio.wait_for(client.delete("/v1/objects/b/k", headers=auth), 10)
            assert gone.status_code == 204
            newer = _blob(root, second.headers["etag"])
            assert newer.exists() and await _pending(client) == 2
            gate.set()
            await asyncio.wait_for(service.settle(), 10)
            assert not old.exists() and not newer.exists()
            assert await _pending(client) == 0

            async def failing(name: str) -> None:
                raise OSError(5, "Input/output error")

            service.blobs.delete = failing
            third = await client.put("/v1/objects/b/k", content=b"v3" * 2000, headers=auth)
            fourth = await client.put("/v1/objects/b/k", content=b"v4" * 2000, headers=auth)
            assert (third.status_code, fourth.status_code) == (201, 200), fourth.text
            await asyncio.wait_for(service.settle(), 10)
            assert _blob(root, third.headers["etag"]).exists(), "left to the sweeper"
            assert (await client.get("/v1/objects/b/k")).content == b"v4" * 2000


def test_replaced_blobs_are_deleted_after_the_answer(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path, KeyRing.generate()))
