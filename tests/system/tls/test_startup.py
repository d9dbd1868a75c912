"""Both servers refuse to start on unusable TLS files: one line on stderr, exit status 2, and
nothing listening. Checked before the store, the database or the socket is touched."""

from __future__ import annotations

import datetime as dt
import os
import subprocess

import pytest

from harness import VENV_BIN, free_port


def _serve(kind: str, tmp_path, cert, key, *extra: str) -> subprocess.CompletedProcess:
    port = str(free_port())
    if kind == "lockd":
        argv = [str(VENV_BIN / "lockd"), "serve", "--store", f"sqlite:///{tmp_path}/l.db",
                "--key-dir", str(tmp_path / "keys"), "--port", port]
    else:
        argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url",
                f"sqlite:///{tmp_path}/r.db", "--jwks-file", str(tmp_path / "none.json"),
                "--port", port]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _refused(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("kind", ["lockd", "resource-proxy"])
def test_refuses_a_key_file_readable_by_others(kind, pki, tmp_path):
    pair = pki.issue(f"open-{kind}", key_mode=0o644)
    line = _refused(_serve(kind, tmp_path, pair.cert, pair.key), "readable by others",
                    str(pair.key), "chmod 600")
    assert line.startswith(f"{kind}: ")
    os.chmod(pair.key, 0o640)  # group-readable is no better
    _refused(_serve(kind, tmp_path, pair.cert, pair.key), "readable by others")


@pytest.mark.parametrize("kind", ["lockd", "resource-proxy"])
def test_refuses_a_certificate_that_does_not_match_its_key(kind, pki, tmp_path):
    _refused(_serve(kind, tmp_path, pki.server.cert, pki.client.key), "does not match",
             str(pki.server.cert), str(pki.client.key))


@pytest.mark.parametrize("kind", ["lockd", "resource-proxy"])
def test_refuses_an_expired_certificate(kind, pki, tmp_path):
    now = dt.datetime.now(dt.UTC)
    old = pki.issue(f"expired-{kind}", not_before=now - dt.timedelta(days=30),
                    not_after=now - dt.timedelta(days=1))
    _refused(_serve(kind, tmp_path, old.cert, old.key), "expired", str(old.cert))


@pytest.mark.parametrize("kind", ["lockd", "resource-proxy"])
def test_refuses_a_client_ca_file_without_a_certificate(kind, pki, tmp_path):
    empty = tmp_path / "empty-ca.pem"
    empty.write_text("not a certificate\n")
    _refused(_serve(kind, tmp_path, pki.server.cert, pki.server.key, "--tls-client-ca",
                    str(empty)), "client CA", "no PEM certificate")


@pytest.mark.parametrize("kind, env, words", [
    ("lockd", {"LOCKD_CERT_CLIENTS": "CN=a"}, ("cert_clients", "tls_client_ca")),
    ("lockd", {"LOCKD_CERT_ADMINS": "not a subject"}, ("cert_admins", "RFC 4514")),
    ("resource-proxy", {"PROXY_CERT_CLIENTS": "CN=a"}, ("cert_clients", "tls_client_ca")),
])
def test_identity_settings_without_mtls_or_malformed_are_refused(kind, env, words, pki,
                                                                 tmp_path, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = _serve(kind, tmp_path, pki.server.cert, pki.server.key)
    assert result.returncode == 2, result.stderr
    for word in words:
        assert word in result.stderr


def test_proxy_refuses_lockd_tls_files_for_a_plain_http_lockd(pki, tmp_path):
    argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url",
            f"sqlite:///{tmp_path}/r.db", "--lockd-url", "http://127.0.0.1:1",
            "--lockd-ca", str(pki.ca), "--port", str(free_port())]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "https:// lockd_url" in result.stderr
