"""Start lockd and the fencing proxy for the demo, as real server processes on free ports.

``LocalServices`` is what ``make demo`` uses: both servers are the installed console scripts
(``lockd serve``, ``resource-proxy serve``), their databases SQLite files in the demo's temporary
directory unless ``store_url``/``database_url`` say otherwise (e.g. PostgreSQL). The demo table is
created before the proxy starts, because the proxy reflects its tables at start-up. With
``tls`` (``lockd.demo.certs``) both serve https and require client certificates (mTLS), and the
proxy fetches lockd's keys over mTLS.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from lockd.common.tls import client_context
from lockd.demo.certs import DemoTLS
from lockd.demo.procs import ChildSet, executable
from lockd.demo.table import TABLE, create_table

__all__ = ["Endpoints", "LocalServices", "ServiceStartError", "free_port", "wait_healthy"]


class ServiceStartError(RuntimeError):
    """A server did not become healthy; the message carries the tail of its log."""


@dataclass(frozen=True)
class Endpoints:
    """Where the demo finds the two services, and a one-line description for the header."""

    lockd_url: str
    proxy_url: str
    description: str = ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(url: str) -> str:
    """A database URL for printing: ``sqlite`` for a file in the temp dir, else without password."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url.split("@")[-1]
    if parsed.get_backend_name() == "sqlite":
        return "sqlite"
    return parsed.render_as_string(hide_password=True)


def wait_healthy(url: str, timeout: float = 20.0, proc: subprocess.Popen | None = None,
                 log: Path | None = None, verify: Any = True) -> None:
    """Poll ``url`` until it answers 200; raise ``ServiceStartError`` after ``timeout`` seconds
    or as soon as ``proc`` exits. ``verify``: httpx's, for an https ``url``."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0, verify=verify) as http:
        while True:
            if proc is not None and proc.poll() is not None:
                raise ServiceStartError(f"{url}: server exited with {proc.returncode}"
                                        + _tail(log))
            with contextlib.suppress(httpx.HTTPError):
                if http.get(url).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ServiceStartError(f"{url} not healthy after {timeout:g}s" + _tail(log))
            time.sleep(0.05)


def _tail(log: Path | None, lines: int = 15) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return "\n  " + "\n  ".join(text) if text else ""


class LocalServices:
    """lockd + resource-proxy as child processes of the demo, bound to 127.0.0.1.

    ``workdir`` holds their SQLite files, lockd's key directory and their logs. ``start()``
    returns the ``Endpoints``; stopping is the ``ChildSet``'s job (the demo stops everything it
    started in one place). Raises ``ServiceStartError`` if a server does not come up within
    ``timeout`` seconds.
    """

    def __init__(self, workdir: Path, children: ChildSet, *, store_url: str | None = None,
                 database_url: str | None = None, timeout: float = 20.0,
                 tls: DemoTLS | None = None):
        self.tls = tls
        self.workdir = workdir
        self.children = children
        self.store_url = store_url or f"sqlite:///{workdir / 'lockd.db'}"
        self.database_url = database_url or f"sqlite:///{workdir / 'resources.db'}"
        self.timeout = timeout

    def _serve(self, name: str, argv: Callable[[int], list[str]]) -> str:
        """Start ``argv(port)`` on a free port (retried on a port race); return its base URL."""
        log = self.workdir / f"{name}.log"
        for _attempt in range(3):
            port = free_port()
            with open(log, "ab") as out:
                proc = self.children.spawn(argv(port), cwd=self.workdir, stdout=out,
                                           stderr=subprocess.STDOUT)
            url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
            try:
                wait_healthy(url + "/healthz", self.timeout, proc, log, verify=self.verify())
                return url
            except ServiceStartError:
                if proc.poll() is None or "in use" not in _tail(log, 5):
                    raise
        raise ServiceStartError(f"{name}: no free port after 3 attempts" + _tail(log))

    def verify(self) -> Any:
        """httpx's ``verify=`` for these services: the demo CA and client certificate with
        TLS, else ``True``."""
        return client_context(self.tls.ca, self.tls.client) if self.tls else True

    def _tls_args(self) -> list[str]:
        """Both servers: https with the demo's server certificate, client certificates from
        the demo CA required (mTLS)."""
        if self.tls is None:
            return []
        return ["--tls-cert", str(self.tls.server_cert), "--tls-key", str(self.tls.server_key),
                "--tls-client-ca", str(self.tls.ca)]

    def start(self) -> Endpoints:
        create_table(self.database_url)
        lockd, proxy = executable("lockd"), executable("resource-proxy")
        lockd_url = self._serve("lockd", lambda port: [
            lockd, "serve", "--store", self.store_url, "--key-dir", str(self.workdir / "keys"),
            "--host", "127.0.0.1", "--port", str(port), *self._tls_args()])
        to_lockd = [] if self.tls is None else [
            "--lockd-ca", str(self.tls.ca), "--lockd-cert", str(self.tls.client_cert),
            "--lockd-key", str(self.tls.client_key)]
        proxy_url = self._serve("resource-proxy", lambda port: [
            proxy, "serve", "--database-url", self.database_url, "--lockd-url", lockd_url,
            "--tables", TABLE, "--objects-dir", str(self.workdir / "objects"),
            "--host", "127.0.0.1", "--port", str(port), *self._tls_args(),
            *to_lockd])
        over = ", over mTLS" if self.tls else ""
        return Endpoints(lockd_url, proxy_url,
                         f"lockd {lockd_url} (store {_describe(self.store_url)}), "
                         f"resource-proxy {proxy_url} (tables in {_describe(self.database_url)})"
                         + over)
