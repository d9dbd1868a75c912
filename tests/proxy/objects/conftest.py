"""Fixtures of the fenced-objects suites: a real ``resource-proxy serve`` serving objects, with
SQLite AND PostgreSQL as its database and a directory (``--objects-dir``) AND an S3-compatible
server (moto in server mode on a free loopback port, ``--objects-s3-url``) as its blob store:
``objects`` is parametrized over the four. Tokens are signed by a ``KeyRing`` the test owns;
tests use their own buckets/keys, so one process per module and combination serves them all.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import VENV_BIN, ServiceProcess, drop_database, free_port
from harness.servers import blob_deletes_settled
from lockd.tokens import KeyRing
from tests.conftest import require
from tests.proxy.conftest import Database, make_database, proxy_argv, write_jwks

# reports/2026/q4.pdf is written under lock reports/2026; models under one lock per object
POLICY = """
buckets:
  reports: "reports/{1}"
  models: {lock: "models/{key}"}
"""
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
          "AWS_DEFAULT_REGION": "us-east-1"}
COMBINATIONS = [("sqlite", "dir"), ("postgres", "dir"), ("sqlite", "s3"), ("postgres", "s3")]


@dataclass
class S3Server:
    """A moto S3 server (``moto_server``) on loopback, and a plain botocore client of it."""

    url: str
    process: ServiceProcess
    client: Any = field(default=None)

    def keys(self, bucket: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    binary = VENV_BIN / "moto_server"
    require(None if binary.exists() else "moto_server is not installed (pip install "
            "'moto[server]')", "moto (the S3-compatible test server)")
    import botocore.session

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ServiceProcess([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                          ready_url=f"{url}/moto-api/",
                          log_path=tmp_path_factory.mktemp("moto") / "moto.log")
    proc.start()
    session = botocore.session.get_session()
    client = session.create_client("s3", endpoint_url=url, region_name="us-east-1",
                                   aws_access_key_id="test", aws_secret_access_key="test")
    try:
        yield S3Server(url, proc, client)
    finally:
        proc.stop()


@dataclass
class Objects:
    """A running proxy serving objects from ``root`` (a directory) or an S3 bucket."""

    url: str
    client: httpx.Client
    ring: KeyRing
    db: Database
    root: Path
    process: ServiceProcess
    s3: S3Server | None = None
    s3_bucket: str = ""

    @property
    def backend(self) -> str:
        return self.db.backend

    def auth(self, lock: str, fence: int, **headers: str) -> dict[str, str]:
        return {"Fencing-Token": self.ring.sign(lock, fence), **headers}

    def blobs(self) -> list[str]:
        """Every blob the store holds: files under the directory (complete blobs and
        unfinished uploads), or keys of the S3 bucket; once the proxy has finished deleting
        the blobs of the versions it replaced (it does after answering)."""
        blob_deletes_settled(self.url)
        return self.stored()

    def stored(self) -> list[str]:
        """``blobs()`` as they are right now (deletes may be under way)."""
        if self.s3 is not None:
            return self.s3.keys(self.s3_bucket)
        return sorted(str(p) for p in self.root.rglob("*") if p.is_file())


def bucket() -> str:
    """A fresh bucket (its default lock is its name)."""
    return f"b{uuid.uuid4().hex[:10]}"


def start_objects_proxy(backend: str, directory: Path, admin: str | None, *extra: str,
                        s3: S3Server | None = None, inline_max: int | None = 0) -> Objects:
    """A proxy serving objects; ``inline_max`` its ``--objects-inline-max`` (default 0: every
    body a blob, which these suites inspect; None: the proxy's default)."""
    db = make_database(backend, directory, admin)
    if inline_max is not None:
        extra = ("--objects-inline-max", str(inline_max), *extra)
    ring = KeyRing.generate()
    jwks = write_jwks(directory, ring)
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    root = directory / "objects"
    s3_bucket = f"proxy-{uuid.uuid4().hex[:12]}"
    store = (["--objects-s3-url", s3.url, "--objects-s3-bucket", s3_bucket] if s3 is not None
             else ["--objects-dir", str(root)])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ServiceProcess(
        proxy_argv(db.url, port, "--jwks-file", str(jwks), "--policy", str(policy), *store,
                   *extra),
        ready_url=f"{url}/healthz", log_path=directory / "proxy.log",
        **({"env": S3_ENV} if s3 is not None else {}))
    proc.start()
    return Objects(url, httpx.Client(base_url=url, timeout=30), ring, db, root, proc, s3,
                   s3_bucket)


def stop_objects_proxy(served: Objects, admin: str | None) -> None:
    served.client.close()
    try:
        assert served.process.stop() == 0, served.process.log()
    finally:
        served.process.stop()
        if served.backend == "postgres":
            drop_database(served.db.dsn, admin)


@pytest.fixture(scope="module", params=COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def objects(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Objects]:
    """A proxy serving objects (max object 1 MiB, every body a blob) for each database and
    blob store."""
    backend, blobs = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    s3 = request.getfixturevalue("s3_server") if blobs == "s3" else None
    directory = tmp_path_factory.mktemp(f"objects-{backend}-{blobs}")
    served = start_objects_proxy(backend, directory, admin, "--max-object-bytes", str(1 << 20),
                                 s3=s3)
    try:
        yield served
    finally:
        stop_objects_proxy(served, admin)
        shutil.rmtree(directory, ignore_errors=True)
