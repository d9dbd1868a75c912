"""The Go client over https with mTLS against real lockd and proxy processes (the TLS suite's
PKI and servers): it acquires and writes with the CA and its certificate, and is refused
without either (clients/go/tls_test.go)."""

from __future__ import annotations

import subprocess

from harness.certs import make_pki
from harness.tls_servers import TLSServers
from tests.clients.conftest import GO_MODULE, go_env


def test_go_client_over_mtls(go, tmp_path):
    pki = make_pki(tmp_path / "pki")
    started = TLSServers(tmp_path, pki)
    try:
        lockd = started.lockd(mtls=True)
        proxy = started.proxy(lockd.url, mtls=True, lockd_client=pki.client)
        env = {**go_env(), "TLS_LOCKD_URL": lockd.url, "TLS_PROXY_URL": proxy.url,
               "TLS_CA": str(pki.ca), "TLS_CLIENT_CERT": str(pki.client.cert),
               "TLS_CLIENT_KEY": str(pki.client.key)}
        run = subprocess.run([go, "test", "-count=1", "-v", "-run", "^TestTLSAndMTLS$", "."],
                             cwd=GO_MODULE, env=env, capture_output=True, text=True, timeout=300)
    finally:
        started.close()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "--- PASS: TestTLSAndMTLS" in run.stdout, run.stdout
