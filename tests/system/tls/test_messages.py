"""Each TLS mistake gets its own message naming the setting to fix, in the Python client
(``verify=``, ``cert=``, the URL's scheme) and in lockctl (``--ca``, ``--cert``/``--key``,
``--url https://``), instead of "cannot reach lockd ... is it running?"."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness import VENV_BIN, ServiceProcess, free_port, run_program
from lockd import LockClient
from lockd.client.errors import TransportError


def _lockctl(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKD_")}
    return run_program([str(VENV_BIN / "lockctl"), *args], text=True, timeout=60, env=env)


def _error(url: str, **kw) -> TransportError:
    with LockClient(url, **kw) as client, pytest.raises(TransportError) as caught:
        client.status("tls/x")
    return caught.value


def test_an_unknown_ca_names_verify_and_ca(servers):
    lockd = servers.lockd()
    error = _error(lockd.url)  # the system's CAs: not the test CA
    assert error.tls == "unknown_ca" and "verify='ca.pem'" in str(error)
    done = _lockctl("--url", lockd.url, "status", "tls/x")
    assert done.returncode == 69
    assert "signed by a CA lockctl does not trust: pass that CA's file with --ca" in done.stderr


def test_a_missing_client_certificate_names_cert_and_key(servers, pki):
    lockd = servers.lockd(mtls=True)
    error = _error(lockd.url, verify=str(pki.ca))
    assert error.tls == "client_cert" and "cert=('client.pem', 'client.key')" in str(error)
    done = _lockctl("--url", lockd.url, "--ca", str(pki.ca), "status", "tls/x")
    assert done.returncode == 69
    assert "asks for a client certificate (mTLS) and none was given: pass --cert and --key" \
        in done.stderr


def test_http_to_an_https_server_names_the_scheme(servers):
    lockd = servers.lockd()
    plain = lockd.url.replace("https://", "http://")
    error = _error(plain)
    assert error.tls == "plain_http" and "use an https:// URL" in str(error)
    done = _lockctl("--url", plain, "status", "tls/x")
    assert f"speaks https, not http: use --url {lockd.url}" in done.stderr


def test_https_to_an_http_server_names_the_scheme(tmp_path):
    port = free_port()
    with ServiceProcess([str(VENV_BIN / "lockd"), "serve", "--store",
                         f"sqlite:///{tmp_path}/l.db", "--port", str(port),
                         "--key-dir", str(tmp_path / "keys")],
                        ready_url=f"http://127.0.0.1:{port}/healthz",
                        log_path=tmp_path / "lockd.log"):
        error = _error(f"https://127.0.0.1:{port}")
        assert error.tls == "not_tls" and "use an http:// URL" in str(error)
        done = _lockctl("--url", f"https://127.0.0.1:{port}", "status", "tls/x")
        assert f"does not speak TLS: use --url http://127.0.0.1:{port}" in done.stderr


def test_an_outage_is_not_taken_for_a_tls_mistake():
    """Nothing listens: the plain "cannot reach" message, no TLS advice."""
    error = _error(f"https://127.0.0.1:{free_port()}", connect_timeout=0.2)
    assert error.tls is None and "cannot reach" in str(error)
