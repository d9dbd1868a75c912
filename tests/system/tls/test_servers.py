"""https and mTLS on both servers, with real certificates (``harness.certs``).

Server TLS: a client that trusts the test CA is served; plain http to the same port is not.
mTLS: a client without a certificate, or with one from another CA (same subject), is refused at
the TLS handshake (the server's alert is what the client reads), and one signed by the
configured CA is served. The proxy verifies lockd's certificate when it fetches the JWKS.
"""

from __future__ import annotations

import socket
import ssl
import time
from urllib.parse import urlsplit

import httpx
import pytest

from lockd import FencedSession, LockClient
from lockd.client.errors import ServiceUnavailable, TransportError

SERVERS = ["lockd", "proxy"]


def _start(servers, kind: str, *, mtls: bool):
    if kind == "lockd":
        return servers.lockd(mtls=mtls)
    lockd = servers.lockd()  # server TLS only: the proxy needs no client certificate for it
    return servers.proxy(lockd.url, mtls=mtls)


def _handshake(url: str, context: ssl.SSLContext) -> str:
    """Connect, handshake, send one request: ``"handshake refused"`` (the TLS handshake itself
    failed), ``"no answer"`` (handshake done, connection closed without an HTTP byte) or
    ``"served"`` (HTTP 200)."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=5) as raw:
        try:
            tls = context.wrap_socket(raw, server_hostname=host)  # does the handshake
        except ssl.SSLError:
            return "handshake refused"
        with tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            try:
                answer = tls.recv(64)
            except (ssl.SSLError, ConnectionError):
                answer = b""
    if not answer:
        return "no answer"
    return "served" if answer.startswith(b"HTTP/1.1 200") else f"other: {answer!r}"


def _context(pki, client=None, tls12: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if client is not None:
        ctx.load_cert_chain(*client.tuple)
    return ctx


@pytest.mark.parametrize("kind", SERVERS)
def test_server_tls_serves_https_and_not_plain_http(servers, pki, kind):
    server = _start(servers, kind, mtls=False)
    banner = "lockd listening on https://" if kind == "lockd" else \
        "resource-proxy listening on https://"
    assert banner in server.log()
    assert _handshake(server.url, _context(pki)) == "served"
    response = httpx.get(server.url + "/healthz", verify=servers.verify())
    assert response.status_code == 200 and response.url.scheme == "https"
    with pytest.raises(httpx.TransportError):  # the same port does not speak plain http
        httpx.get(server.url.replace("https:", "http:") + "/healthz", timeout=3)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(server.url + "/healthz",  # a client that checks, trusting another CA
                  verify=ssl.create_default_context(cafile=str(pki.other_ca)))


@pytest.mark.parametrize("kind", SERVERS)
def test_mtls_refuses_at_the_handshake_a_client_without_a_certificate_or_from_another_ca(
        servers, pki, kind):
    server = _start(servers, kind, mtls=True)
    # TLS 1.2: the client certificate is checked inside the handshake, so it fails there.
    assert _handshake(server.url, _context(pki, tls12=True)) == "handshake refused"
    assert _handshake(server.url, _context(pki, pki.stranger, tls12=True)) == "handshake refused"
    assert _handshake(server.url, _context(pki, pki.client, tls12=True)) == "served"
    # TLS 1.3: the server checks it after the client's last handshake message, and closes the
    # connection before reading any HTTP: the request gets no answer at all.
    assert _handshake(server.url, _context(pki)) == "no answer"
    assert _handshake(server.url, _context(pki, pki.stranger)) == "no answer"
    assert _handshake(server.url, _context(pki, pki.client)) == "served"
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/healthz", verify=servers.verify())
    ok = httpx.get(server.url + "/healthz", verify=servers.verify(pki.client))
    assert ok.status_code == 200


def test_clients_over_mtls_lock_and_write_through_a_proxy_that_verifies_lockd(
        servers, pki, name):
    name = "items"  # no policy: table items is written under the lock named items
    lockd = servers.lockd(mtls=True)
    proxy = servers.proxy(lockd.url, mtls=True, lockd_client=pki.client)
    with LockClient(lockd.url, verify=str(pki.ca), cert=pki.client.tuple) as client, \
            client.lock(name, ttl=5) as lease, \
            FencedSession(proxy.url, lease, verify=_context(pki, pki.client)) as db:
        assert lease.fence >= 1 and client.status(name).held
        # The proxy verifies the token against the JWKS it fetched from lockd over mTLS.
        db.insert("items", {"id": "a", "v": "over tls", "n": 1})
        assert db.get("items", "a")["v"] == "over tls"
    with pytest.raises(TransportError):  # no client certificate: refused at the handshake
        LockClient(lockd.url, verify=str(pki.ca)).status(name)


@pytest.mark.parametrize("how", ["untrusted lockd CA", "no client certificate for lockd"])
def test_proxy_trusts_no_key_from_a_lockd_it_cannot_verify(servers, pki, name, how):
    name = "items"  # no policy: table items is written under the lock named items
    lockd = servers.lockd(mtls=True)
    if how == "untrusted lockd CA":
        proxy = servers.proxy(lockd.url, lockd_client=pki.client, lockd_ca=pki.other_ca)
    else:
        proxy = servers.proxy(lockd.url)
    with LockClient(lockd.url, verify=str(pki.ca), cert=pki.client.tuple) as client, \
            client.lock(name, ttl=5) as lease, \
            FencedSession(proxy.url, lease, verify=str(pki.ca)) as db:
        with pytest.raises(ServiceUnavailable) as failed:  # the JWKS fetch failed: no key
            db.insert("items", {"id": "a", "v": "x", "n": 1})
    assert failed.value.problem["code"] == "lockd_unreachable"
    assert f"could not load the JWKS from {lockd.url}/v1/keys" in proxy.log()


@pytest.mark.parametrize("kind", SERVERS)
def test_status_page_and_metrics_over_https(servers, pki, kind):
    server = _start(servers, kind, mtls=True)
    verify = servers.verify(pki.client)
    page = httpx.get(server.url + "/", verify=verify)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    metrics = httpx.get(server.url + "/metrics", verify=verify)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    prefix = "lockd_" if kind == "lockd" else "resource_proxy_"
    assert prefix in metrics.text


@pytest.mark.parametrize("kind", SERVERS)
def test_sigterm_stops_an_https_server_promptly_despite_idle_keep_alive_clients(
        servers, pki, kind):
    """An idle pooled client never answers a TLS close_notify; the server must not sit out its
    whole graceful-shutdown timeout (10 s) waiting for it."""
    server = _start(servers, kind, mtls=False)
    with httpx.Client(verify=servers.verify()) as idle:
        assert idle.get(server.url + "/healthz").status_code == 200  # now pooled, idle
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 3.0
