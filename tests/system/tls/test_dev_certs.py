"""``lockd dev certs DIR`` makes a CA, a server and a client certificate that work as printed:
lockd serves https with mTLS from them and both clients get through with them."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from harness import VENV_BIN, free_port
from harness.tls_servers import TLSProcess
from lockd import LockClient
from lockd.common.tls import client_context


def _lockd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "lockd"), *args], capture_output=True, text=True,
                          timeout=60)


def test_dev_certs_serve_mtls_as_printed(tmp_path: Path):
    certs = tmp_path / "certs"
    made = _lockd("dev", "certs", str(certs))
    assert made.returncode == 0, made.stderr
    assert f"--tls-client-ca {certs}/ca.pem" in made.stdout
    for name in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE(os.stat(certs / name).st_mode) == 0o600
    again = _lockd("dev", "certs", str(certs))  # never overwrites
    assert again.returncode == 2 and "exists" in again.stderr

    port = free_port()
    url = f"https://127.0.0.1:{port}"
    ca, cert, key = certs / "ca.pem", certs / "client.pem", certs / "client.key"
    with TLSProcess([str(VENV_BIN / "lockd"), "serve", "--store", f"sqlite:///{tmp_path}/l.db",
                     "--port", str(port), "--key-dir", str(tmp_path / "keys"),
                     "--tls-cert", str(certs / "server.pem"), "--tls-key",
                     str(certs / "server.key"), "--tls-client-ca", str(ca)],
                    ready_url=url + "/healthz", log_path=tmp_path / "lockd.log",
                    http_options={"verify": client_context(ca, (str(cert), str(key)))}):
        with LockClient(url, verify=str(ca), cert=(str(cert), str(key))) as client:
            with client.lock("dev/certs", ttl=5) as lease:
                assert lease.fence >= 1
        status = subprocess.run([str(VENV_BIN / "lockctl"), "--url", url, "--ca", str(ca),
                                 "--cert", str(cert), "--key", str(key), "status", "dev/certs"],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
