"""The ASGI TLS extension in every request scope of uvicorn's HTTP protocol (mTLS identities).

``tls_http_protocol(base)`` subclasses a uvicorn HTTP protocol class: the connection's client
certificate is read once, when the connection is made, and every request's scope gets
``scope["extensions"]["tls"]`` (``client_cert_name``: the RFC 4514 subject, or ``None``), which
``lockd.common.tls.CertRoles`` maps to roles.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tls_http_protocol"]


def _tls_extension(transport: Any) -> dict[str, Any]:
    """The ASGI TLS extension of a connection (``client_cert_name``: RFC 4514, or ``None``)."""
    from cryptography import x509

    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return {}
    name = None
    der = ssl_object.getpeercert(binary_form=True)
    if der:
        name = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    version = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}.get(ssl_object.version() or "")
    return {"server_cert": None, "client_cert_chain": [], "client_cert_name": name,
            "client_cert_error": None, "tls_version": version,
            "cipher_suite": None}


def tls_http_protocol(base: type | None = None) -> type:
    """``base`` (default: uvicorn's httptools HTTP protocol; the servers pass their bounded one,
    ``lockd.common.serving.connections.bounded_protocol``) with the ASGI TLS extension in every scope (see
    ``lockd.common.tls``). The client certificate is read once per connection. On shutdown, idle
    connections are aborted rather than closed with a TLS close_notify exchange, so SIGTERM
    stops an https server as promptly as a plain one."""
    if base is None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base

    class TLSHttpProtocol(base):  # type: ignore[valid-type,misc]
        _tls: dict[str, Any] = {}

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._tls = _tls_extension(transport)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._tls:
                self.scope["extensions"] = {**(self.scope.get("extensions") or {}),  # type: ignore[typeddict-unknown-key]
                                            "tls": self._tls}

        def shutdown(self) -> None:
            # An idle keep-alive connection is dropped at once: a TLS close waits for the
            # client's close_notify, which an idle pooled client never sends, and the server's
            # graceful shutdown would sit out its whole timeout on it. A request in flight
            # still finishes first (uvicorn's own handling).
            if self.cycle is None or self.cycle.response_complete:
                self.transport.abort()
            else:
                super().shutdown()

    return TLSHttpProtocol
