"""The orphan sweeper: a blob left by a crash between the blob and the commit (planted here
exactly as such a crash leaves it: complete under ``blobs/``, or half-written under ``tmp/``;
on S3 a key under ``blobs/``) is deleted once older than the grace period; a blob a pointer
names, an object kept inline (no blob), and (directory) an orphan younger than the grace,
stay."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

from harness import wait_for
from tests.proxy.objects.conftest import (
    COMBINATIONS,
    Objects,
    bucket,
    start_objects_proxy,
    stop_objects_proxy,
)


def _plant(root: Path, where: str, age_s: float) -> Path:
    name = secrets.token_hex(16)
    path = root / "tmp" / name if where == "tmp" else root / "blobs" / name[:2] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"orphan")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def _directory(o: Objects, b: str) -> None:
    [kept] = [Path(p) for p in o.blobs()]
    old = time.time() - 3600
    os.utime(kept, (old, old))  # old, but a pointer names it
    orphans = [_plant(o.root, "blobs", 3600), _plant(o.root, "tmp", 3600)]
    young = _plant(o.root, "blobs", 0)
    wait_for(lambda: not any(p.exists() for p in orphans), timeout=10, what="the sweep")
    assert kept.exists() and young.exists()


def _s3(o: Objects, b: str) -> None:
    assert o.s3 is not None
    [kept] = o.blobs()
    orphan = f"lockd-objects/blobs/{secrets.token_hex(16)}"
    o.s3.client.put_object(Bucket=o.s3_bucket, Key=orphan, Body=b"orphan")
    wait_for(lambda: orphan not in o.blobs(), timeout=15, what="the sweep")
    assert o.blobs() == [kept]


@pytest.mark.parametrize(("backend", "blobs"), COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_orphans_are_swept_and_referenced_blobs_kept(backend: str, blobs: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest):
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    s3 = request.getfixturevalue("s3_server") if blobs == "s3" else None
    grace = "1500" if s3 is not None else "5000"  # S3 keys cannot be back-dated: wait it out
    o = start_objects_proxy(backend, tmp_path, admin, "--objects-grace-ms", grace,
                            "--objects-sweep-interval-ms", "200", s3=s3, inline_max=None)
    try:
        b = bucket()
        kept = b"kept" * 5000  # over the inline threshold: a blob
        assert o.client.put(f"/v1/objects/{b}/kept", content=kept,
                            headers=o.auth(b, 1)).status_code == 201
        # a body kept inline has no blob: the sweeper neither sees nor touches it
        assert o.client.put(f"/v1/objects/{b}/inline", content=b"inline",
                            headers=o.auth(b, 1)).status_code == 201
        (_s3 if s3 is not None else _directory)(o, b)
        assert o.client.get(f"/v1/objects/{b}/kept").content == kept
        assert o.client.get(f"/v1/objects/{b}/inline").content == b"inline"
    finally:
        stop_objects_proxy(o, admin)
