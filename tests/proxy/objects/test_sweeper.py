"""The orphan sweeper: a blob left by a crash between the blob and the commit (planted here
exactly as such a crash leaves it: complete under ``blobs/``, or half-written under ``tmp/``)
is deleted once older than the grace period; a referenced blob and a young orphan stay."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path

import pytest

from tests.proxy.objects.conftest import bucket, start_objects_proxy
from tests.support import drop_database, wait_for


def _plant(root: Path, where: str, age_s: float) -> Path:
    name = secrets.token_hex(16)
    path = root / "tmp" / name if where == "tmp" else root / "blobs" / name[:2] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"orphan")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_orphans_are_swept_and_referenced_blobs_kept(backend: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest):
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    o, _ = start_objects_proxy(backend, tmp_path, admin, "--objects-grace-ms", "5000",
                               "--objects-sweep-interval-ms", "200")
    try:
        b = bucket()
        assert o.client.put(f"/v1/objects/{b}/kept", content=b"kept",
                            headers=o.auth(b, 1)).status_code == 201
        [kept] = o.blobs()
        old = time.time() - 3600
        os.utime(kept, (old, old))  # old, but a pointer names it
        orphans = [_plant(o.root, "blobs", 3600), _plant(o.root, "tmp", 3600)]
        young = _plant(o.root, "blobs", 0)
        wait_for(lambda: not any(p.exists() for p in orphans), timeout=10, what="the sweep")
        assert kept.exists() and young.exists()
        assert o.client.get(f"/v1/objects/{b}/kept").content == b"kept"
        o.client.close()
        assert o.process.stop() == 0, o.process.log()
    finally:
        o.process.stop()
        if backend == "postgres":
            drop_database(o.db.dsn, admin)
    shutil.rmtree(o.root, ignore_errors=True)
