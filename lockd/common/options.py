"""Options both servers take and apply the same way: connection bounds and TLS.

Each server's ``serve`` parser calls these with its environment prefix (``LOCKD`` or ``PROXY``),
so flags, help texts and defaults cannot drift apart; the values land in each server's
``Settings`` fields of the same names (``request_timeout_ms``, ``tls_cert``, ...), which check
them with ``tls_problem``; the ``serve`` commands then check the TLS files
(``tls_files_problem``) and configure uvicorn (``uvicorn_tls_options``, ``install_http_protocol``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lockd.common.connections import ConnectionBounds, bounded_protocol, descriptor_warning
from lockd.common.tls import TLSConfigError, check_server_files, server_context, tls_http_protocol

__all__ = ["add_bound_arguments", "add_tls_arguments", "install_http_protocol", "tls_files_problem",
           "tls_problem", "uvicorn_tls_options"]


def add_bound_arguments(parser: argparse.ArgumentParser, env: str) -> None:
    """``--request-timeout-ms``, ``--max-connections``, ``--write-timeout-ms`` (issue 15)."""
    group = parser.add_argument_group("connection bounds")
    group.add_argument("--request-timeout-ms", type=int,
                       help=f"a request must arrive whole within this (env "
                            f"{env}_REQUEST_TIMEOUT_MS; default 10000)")
    group.add_argument("--max-connections", type=int,
                       help=f"open connections beyond this get 503 (env {env}_MAX_CONNECTIONS; "
                            "default 1000)")
    group.add_argument("--write-timeout-ms", type=int,
                       help=f"drop a client that reads nothing for this long (env "
                            f"{env}_WRITE_TIMEOUT_MS; default 10000)")


def add_tls_arguments(parser: argparse.ArgumentParser, env: str) -> argparse._ArgumentGroup:
    """``--tls-cert``, ``--tls-key``, ``--tls-client-ca`` (issue 19); returns the group so a
    server can add its own TLS options to it."""
    group = parser.add_argument_group("TLS (opt-in; https only when given)")
    group.add_argument("--tls-cert", help=f"server certificate chain, PEM (env {env}_TLS_CERT)")
    group.add_argument("--tls-key", help=f"its private key, PEM, mode 600 (env {env}_TLS_KEY)")
    group.add_argument("--tls-client-ca", help="require client certificates signed by this CA "
                                               f"(mTLS; env {env}_TLS_CLIENT_CA)")
    return group


def tls_problem(cert: Path | None, key: Path | None, client_ca: Path | None,
                subjects: bool) -> str | None:
    """Why a server's TLS settings do not go together (``None`` when they do). ``subjects``:
    whether certificate subjects stand for identities (they need mTLS to be seen)."""
    if (cert is None) != (key is None):
        return "give both tls_cert (--tls-cert) and tls_key (--tls-key), or neither"
    if client_ca is not None and cert is None:
        return "tls_client_ca (--tls-client-ca) needs --tls-cert and --tls-key"
    if subjects and client_ca is None:
        return ("certificate subjects (cert_clients/cert_admins) need tls_client_ca "
                "(--tls-client-ca): without mTLS no client certificate is seen")
    return None


def tls_files_problem(settings: Any) -> str | None:
    """Why the server's TLS files cannot be used (``lockd.common.tls.check_server_files``: key
    mode, key/certificate mismatch, validity), ``None`` when they can or TLS is off."""
    if settings.tls_cert is None:
        return None
    try:
        check_server_files(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    except TLSConfigError as exc:
        return str(exc)
    return None


def uvicorn_tls_options(settings: Any) -> dict[str, Any]:
    """``uvicorn.Config`` options for TLS: our own context (TLS >= 1.2, mTLS with a client CA);
    none without ``tls_cert``."""
    if settings.tls_cert is None:
        return {}
    context = server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    return {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key),
            "ssl_context_factory": lambda config, default: context}


def install_http_protocol(config: Any, settings: Any) -> str | None:
    """Give ``config`` (a ``uvicorn.Config``) the servers' HTTP protocol: uvicorn's httptools
    protocol bounded by the settings' connection bounds (``lockd.common.connections``), with the
    ASGI TLS extension on top when TLS is on. Returns a warning when ``max_connections`` does not
    fit under the process's descriptor limit (``None`` otherwise)."""
    protocol = bounded_protocol(ConnectionBounds(
        settings.request_timeout_ms / 1000, settings.max_connections,
        settings.write_timeout_ms / 1000))
    config.http = tls_http_protocol(protocol) if settings.tls_cert is not None else protocol
    return descriptor_warning(settings.max_connections)
