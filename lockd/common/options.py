"""Options both servers take and apply the same way: connection bounds and TLS.

Each server's ``serve`` parser calls these with its environment prefix (``LOCKD`` or ``PROXY``),
so flags, help texts and defaults cannot drift apart; the values land in each server's
``Settings`` fields of the same names (``request_timeout_ms``, ``tls_cert``, ...), which check
them with ``tls_problem``; the ``serve`` commands then check the TLS files
(``tls_files_problem``) and configure uvicorn (``lockd.common.serving.server``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lockd.common.tls import TLSConfigError, check_server_files

__all__ = ["add_bound_arguments", "add_tls_arguments", "tls_files_problem", "tls_problem"]


def add_bound_arguments(parser: argparse.ArgumentParser, env: str) -> None:
    """``--request-timeout-ms``, ``--max-connections``, ``--write-timeout-ms``: the connection
    bounds of ``lockd.common.serving.connections``."""
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
    """``--tls-cert``, ``--tls-key``, ``--tls-client-ca``; returns the group so a
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
