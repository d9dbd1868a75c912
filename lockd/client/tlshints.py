"""Which TLS mistake a failed request shows, and what to say about it (the clients' messages).

``tls_mistake`` reads the transport error and, when the server closed a request without an
answer, asks the server once (``_tls_probe``: a TLS handshake, 0.5 s at most) what it speaks, so
an outage is not taken for a mistake. ``TLS_HELP`` holds each mistake's message, naming the
setting to fix in the Python client and in lockctl.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

import httpx

__all__ = ["TLS_HELP", "tls_mistake"]

TLS_HELP = {
    "unknown_ca": "{url}'s certificate is not signed by a CA this client trusts ({reason}): "
                  "give the CA's file (verify='ca.pem'; lockctl --ca or LOCKD_CA)",
    "client_cert": "{url} closed the TLS connection without answering: it asks for a client "
                   "certificate (mTLS) and this client sent none; give one (cert=('client.pem', "
                   "'client.key'); lockctl --cert and --key, or LOCKD_CERT and LOCKD_KEY)",
    "client_cert_refused": "{url} closed the TLS connection without answering: it did not "
                           "accept this client's certificate (cert=; lockctl --cert/--key): is "
                           "it signed by the CA the server trusts for clients, and still valid?",
    "plain_http": "{url} speaks https, not http: use an https:// URL (lockctl --url https://...)",
    "not_tls": "{url} does not speak TLS ({reason}): use an http:// URL, or start the server "
               "with --tls-cert and --tls-key",
}


def tls_mistake(exc: httpx.TransportError, url: str | None, has_cert: bool) -> str | None:
    """Which TLS mistake (a key of ``_TLS_HELP``) ``exc`` shows, if any."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "unknown_ca"
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        return "not_tls"
    if "CERTIFICATE_REQUIRED" in text or "certificate required" in text:
        return "client_cert"
    closed = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
    if not closed or url is None:
        return None
    probe = _tls_probe(url)  # the server closed without an answer: what does it speak?
    if url.startswith("https://") and probe == "mtls":
        return "client_cert_refused" if has_cert else "client_cert"
    if url.startswith("http://") and probe is not None:
        return "plain_http"
    return None


def _tls_probe(url: str) -> str | None:
    """What the server at ``scheme://host:port`` speaks, asked (0.5 s at most) only after it
    closed a request without an answer: ``"tls"`` (a TLS handshake and an HTTP answer),
    ``"mtls"`` (a handshake, then the connection refused without a client certificate), or
    ``None`` (no TLS, or no answer at all: an outage, not a mistake)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock, \
                context.wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(b"GET /healthz HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
            try:
                return "tls" if tls.recv(1) else "mtls"
            except ssl.SSLError as refused:
                return "mtls" if "CERTIFICATE_REQUIRED" in str(refused) else None
    except (OSError, ValueError):
        return None
