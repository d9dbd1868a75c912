"""Fixtures of the TLS suite: a test PKI (``harness.certs``) and https server processes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from harness.certs import Pki, make_pki
from harness.tls_servers import TLSServers


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def servers(tmp_path: Path, pki: Pki):
    started = TLSServers(tmp_path, pki)
    yield started
    started.close()


@pytest.fixture
def name() -> str:
    return f"tls/{uuid.uuid4().hex[:12]}"
