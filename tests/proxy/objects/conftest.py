"""Fixtures of the fenced-objects suites: a real ``resource-proxy serve --objects-dir DIR``
process on SQLite AND on PostgreSQL (``objects`` is parametrized over both databases), tokens
signed by a ``KeyRing`` the test owns. Tests use their own buckets/keys, so one process per
module and backend serves them all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from lockd.tokens import KeyRing
from tests.proxy.conftest import Database, make_database, proxy_argv, write_jwks
from tests.support import ServiceProcess, drop_database, free_port

# reports/2026/q4.pdf is written under lock reports/2026; models under one lock per object
POLICY = """
buckets:
  reports: "reports/{1}"
  models: {lock: "models/{key}"}
"""


@dataclass
class Objects:
    """A running proxy serving objects from ``root``."""

    url: str
    client: httpx.Client
    ring: KeyRing
    db: Database
    root: Path
    process: ServiceProcess

    @property
    def backend(self) -> str:
        return self.db.backend

    def auth(self, lock: str, fence: int, **headers: str) -> dict[str, str]:
        return {"Fencing-Token": self.ring.sign(lock, fence), **headers}

    def blobs(self) -> list[Path]:
        """Every file under the blob directory (complete blobs and unfinished uploads)."""
        return sorted(p for p in self.root.rglob("*") if p.is_file())


def bucket() -> str:
    """A fresh bucket (its default lock is its name)."""
    return f"b{uuid.uuid4().hex[:10]}"


def start_objects_proxy(backend: str, directory: Path, admin: str | None,
                        *extra: str) -> tuple[Objects, str | None]:
    db = make_database(backend, directory, admin)
    ring = KeyRing.generate()
    jwks = write_jwks(directory, ring)
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    root = directory / "objects"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ServiceProcess(
        proxy_argv(db.url, port, "--jwks-file", str(jwks), "--policy", str(policy),
                   "--objects-dir", str(root), *extra),
        ready_url=f"{url}/healthz", log_path=directory / "proxy.log")
    proc.start()
    return Objects(url, httpx.Client(base_url=url, timeout=30), ring, db, root, proc), admin


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def objects(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Objects]:
    """A proxy serving objects (max object 1 MiB) on each database."""
    backend = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"objects-{backend}")
    served, _ = start_objects_proxy(backend, directory, admin, "--max-object-bytes",
                                    str(1 << 20))
    try:
        yield served
        served.client.close()
        assert served.process.stop() == 0, served.process.log()
    finally:
        served.process.stop()
        if backend == "postgres":
            drop_database(served.db.dsn, admin)
