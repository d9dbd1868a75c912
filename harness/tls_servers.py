"""https ``lockd serve`` / ``resource-proxy serve`` processes for the TLS tests (and the https
status-page test in tests/system/ops): ``TLSServers(tmp, pki)`` starts them, ``close()`` stops them.

Readiness is polled over https with the test CA (and the client certificate under mTLS), so a
server that came up without TLS, or with the wrong certificate, never counts as started.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.certs import Pair, Pki
from harness.processes import VENV_BIN, ServiceProcess, free_port
from lockd.common.tls import client_context

__all__ = ["TLSProcess", "TLSServer", "TLSServers"]


class TLSProcess(ServiceProcess):
    """A ``ServiceProcess`` whose readiness check speaks TLS (``http_options`` for httpx)."""

    def __init__(self, argv: list[str], *, ready_url: str, http_options: dict[str, Any],
                 **kw: Any):
        super().__init__(argv, ready_url=ready_url, http_options=http_options, **kw)


@dataclass
class TLSServer:
    url: str
    proc: TLSProcess
    mtls: bool

    def log(self) -> str:
        return self.proc.log()

    def stop(self) -> int | None:
        return self.proc.stop()


class TLSServers:
    """Starts https servers with ``pki``'s server certificate; ``mtls=True`` adds
    ``--tls-client-ca pki.ca``."""

    def __init__(self, tmp: Path, pki: Pki):
        self.tmp, self.pki = tmp, pki
        self.started: list[TLSServer] = []

    def verify(self, client: Pair | None = None) -> Any:
        """httpx ``verify=`` trusting the test CA, presenting ``client`` if given."""
        return client_context(self.pki.ca, client.tuple if client else None)

    def _tls_args(self, mtls: bool) -> list[str]:
        args = ["--tls-cert", str(self.pki.server.cert), "--tls-key", str(self.pki.server.key)]
        return args + (["--tls-client-ca", str(self.pki.ca)] if mtls else [])

    def _start(self, kind: str, argv: list[str], port: int, mtls: bool,
               env: dict[str, str] | None) -> TLSServer:
        url = f"https://127.0.0.1:{port}"
        proc = TLSProcess(argv, ready_url=url + "/healthz", env=env,
                          log_path=self.tmp / f"{kind}-{port}.log",
                          http_options={"verify": self.verify(self.pki.client if mtls else None)})
        server = TLSServer(url, proc, mtls)
        self.started.append(server)
        proc.start()
        return server

    def lockd(self, *, mtls: bool = False, env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()) -> TLSServer:
        port = free_port()
        argv = [str(VENV_BIN / "lockd"), "serve", "--store",
                f"sqlite:///{self.tmp}/lockd-{port}.db", "--port", str(port),
                "--key-dir", str(self.tmp / "keys"), *self._tls_args(mtls), *args]
        return self._start("lockd", argv, port, mtls, env)

    def proxy(self, lockd_url: str, *, mtls: bool = False, lockd_client: Pair | None = None,
              lockd_ca: Path | None = None, env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()) -> TLSServer:
        """A proxy over an ``items`` table; fetches the JWKS from ``lockd_url`` trusting
        ``lockd_ca`` (default the test CA), presenting ``lockd_client`` if given."""
        port = free_port()
        db = self.tmp / f"resource-{port}.db"
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE items (id TEXT PRIMARY KEY, v TEXT, n INTEGER)")
        argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", f"sqlite:///{db}",
                "--lockd-url", lockd_url, "--tables", "items", "--port", str(port),
                *self._tls_args(mtls), *args]
        if lockd_url.startswith("https:"):
            argv += ["--lockd-ca", str(lockd_ca or self.pki.ca)]
        if lockd_client is not None:
            argv += ["--lockd-cert", str(lockd_client.cert), "--lockd-key", str(lockd_client.key)]
        return self._start("proxy", argv, port, mtls, env)

    def close(self) -> None:
        for server in self.started:
            server.stop()
