"""Fixtures of the clients suite: the Go toolchain (required under CI=true) and a real lockd and
resource proxy per module (the client suite's ``LockdServer``/``ProxyServer``: a SQLite store,
and table ``items`` written under lock ``items/{key}``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.client.conftest import LockdServer, ProxyServer
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
GO_MODULE = ROOT / "clients" / "go"


def go_env() -> dict[str, str]:
    """The environment of every ``go`` command: offline (the module has no dependencies; no
    proxy, no toolchain download) with a build cache that survives runs."""
    cache = os.environ.get("GOCACHE") or str(Path(tempfile.gettempdir()) / "lockd-go-cache")
    return {**os.environ, "GOPROXY": "off", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod",
            "GOCACHE": cache, "GOPATH": str(Path(tempfile.gettempdir()) / "lockd-gopath"),
            "CGO_ENABLED": "0"}


@pytest.fixture(scope="session")
def go() -> str:
    """The ``go`` binary (``make system-deps`` installs Debian's golang-go)."""
    path = shutil.which("go")
    require(None if path else "no 'go' on PATH (make system-deps installs golang-go)", "Go")
    return path


@pytest.fixture(scope="session")
def go_build(go: str, tmp_path_factory: pytest.TempPathFactory):
    """``build(package)``: the path of ``go build``'s binary of a package of clients/go."""
    out = tmp_path_factory.mktemp("gobin")
    built: dict[str, Path] = {}

    def build(package: str) -> Path:
        if package not in built:
            target = out / package.strip("./").replace("/", "-")
            subprocess.run([go, "build", "-o", str(target), package], cwd=GO_MODULE,
                           env=go_env(), check=True, timeout=300)
            built[package] = target
        return built[package]

    return build


@pytest.fixture(scope="module")
def servers():
    """(lockd, proxy): one lockd and one proxy for the module's tests, each its own lock names."""
    lockd = LockdServer(Path(tempfile.mkdtemp(prefix="lockd-clients-"))).start()
    proxy = ProxyServer(Path(tempfile.mkdtemp(prefix="proxy-clients-")), lockd.url)
    proxy.start()
    yield lockd, proxy
    proxy.stop()
    lockd.stop()
    shutil.rmtree(lockd.workdir, ignore_errors=True)
    shutil.rmtree(proxy.workdir, ignore_errors=True)
