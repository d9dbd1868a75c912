"""The etcd store URL: ``etcd://host:port,…[/prefix][?timeout=2.5][&cache=N][&ca=…&cert=…&key=…]``.

Endpoints, key prefix, call timeout, lease-cache size and the client TLS context, each parsed
once at construction; every malformed part raises ``ValueError`` naming it. See
docs/stores/etcd.md ("URL and TLS").
"""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlsplit

from lockd.common.tls import client_context
from lockd.server.store.etcd.cache import DEFAULT_SIZE

__all__ = ["DEFAULT_PORT", "DEFAULT_PREFIX", "DEFAULT_TIMEOUT_S", "cache_size", "etcd_tls",
           "parse_etcd_url"]

DEFAULT_PREFIX = "lockd"
DEFAULT_TIMEOUT_S = 2.5
DEFAULT_PORT = 2379

_TRUE = ("1", "true", "yes", "on")


def etcd_tls(url: str) -> ssl.SSLContext | None:
    """The client ``SSLContext`` the URL's ``ca``/``cert``/``key``/``tls`` ask for, or ``None``
    (plain http). Raises ``ValueError`` for a lone ``cert`` or ``key`` or an unreadable file."""
    query = parse_qs(urlsplit(url).query)
    ca, cert, key = (query.get(k, [None])[0] for k in ("ca", "cert", "key"))
    tls = query.get("tls", ["0"])[0].lower() in _TRUE
    if (cert is None) != (key is None):
        raise ValueError("etcd store URL: give both cert= and key=, or neither")
    if not (tls or ca or cert):
        return None
    try:
        context = client_context(ca or True, (cert, key) if cert and key else None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"etcd store URL: cannot use its TLS files: {exc}") from None
    return context if isinstance(context, ssl.SSLContext) else ssl.create_default_context()


def parse_etcd_url(url: str) -> tuple[list[str], str, float]:
    """``etcd://h:p,h:p/prefix?timeout=2.5`` → (base URLs, key prefix, timeout in seconds).

    Port defaults to 2379, prefix to ``lockd``. Base URLs are ``https://`` when the query asks
    for TLS (``ca``, ``cert``/``key`` or ``tls=1``; see ``etcd_tls``). Raises ``ValueError`` on
    a malformed URL.
    """
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.netloc:
        raise ValueError(f"not an etcd store URL (etcd://host:port,…): {url!r}")
    query = parse_qs(parts.query)
    secure = any(k in query for k in ("ca", "cert", "key")) or \
        query.get("tls", ["0"])[0].lower() in _TRUE
    scheme = "https" if secure else "http"
    endpoints = []
    for host in parts.netloc.split(","):
        host = host.strip()
        if not host:
            continue
        if ":" not in host.rsplit("]", 1)[-1]:
            host = f"{host}:{DEFAULT_PORT}"
        endpoints.append(f"{scheme}://{host}")
    if not endpoints:
        raise ValueError(f"etcd store URL names no endpoint: {url!r}")
    prefix = parts.path.strip("/") or DEFAULT_PREFIX
    timeout = DEFAULT_TIMEOUT_S
    if "timeout" in query:
        try:
            timeout = float(query["timeout"][0])
        except ValueError:
            raise ValueError(f"etcd store URL: bad timeout {query['timeout'][0]!r}") from None
        if not 0.1 <= timeout <= 60:
            raise ValueError("etcd store URL: timeout must be within 0.1..60 seconds")
    return endpoints, prefix, timeout


def cache_size(url: str) -> int:
    """The URL's ``cache`` (entries of the lease cache, 0..10,000,000; 0 disables it), default
    ``cache.DEFAULT_SIZE``. Raises ``ValueError`` for anything else."""
    values = parse_qs(urlsplit(url).query).get("cache")
    if not values:
        return DEFAULT_SIZE
    try:
        size = int(values[0])
    except ValueError:
        raise ValueError(f"etcd store URL: bad cache size {values[0]!r}") from None
    if not 0 <= size <= 10_000_000:
        raise ValueError("etcd store URL: cache must be within 0..10000000 entries")
    return size
