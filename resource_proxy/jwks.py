"""Where the proxy gets the public keys that verify fencing tokens: a file or lockd's JWKS.

``KeySource`` is ``lockd.common.keycache.AsyncKeyCache`` (the rules every verifier of lockd's
tokens keeps: fetched at start, refetched on an unknown ``kid`` at most once per
``min_interval_s``, and once older than ``max_age_s``, ``PROXY_JWKS_MAX_AGE_MS``; kept while
lockd is unreachable; verified tokens cached by their text) with the proxy's errors: 401
``invalid_token`` for a token that does not verify, 503 ``lockd_unreachable`` for one whose key
is unknown while the keys cannot be fetched. A ``--jwks-file`` is re-read by the same rules.

So a key lockd retired (``lockd keys retire``) stops verifying within ``max_age_s`` plus lockd's
``key_reload_ms``, cached tokens included, and a flood of tokens with invented ``kid`` values
cannot turn into a flood of requests to lockd. Caching verified tokens by text is safe: a
token's claims are a function of its bytes, lockd's tokens carry no expiry for the proxy to
re-check (the fence check in the database decides staleness on every write), and a key set
change clears the cache; an Ed25519 check (~0.1 ms of CPU here) costs more than the rest of a
request's Python work.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from lockd.common.keycache import AsyncKeyCache, KeysUnavailable
from lockd.common.tls import client_context
from lockd.tokens import Claims, TokenError
from resource_proxy.errors import InvalidTokenError, LockdUnreachable

__all__ = ["KeySource", "file_loader", "lockd_loader", "lockd_verify"]

log = logging.getLogger("resource_proxy.jwks")

Loader = Callable[[], Awaitable[dict[str, Any]]]


def file_loader(path: str | Path) -> Loader:
    """Read a JWKS document from ``path`` (re-read on every reload)."""

    async def load() -> dict[str, Any]:
        return json.loads(await asyncio.to_thread(Path(path).read_text))

    return load


def lockd_verify(settings: Any) -> ssl.SSLContext | bool:
    """httpx's ``verify=`` for fetching lockd's JWKS: an https ``lockd_url`` is verified against
    ``lockd_ca`` (default: the system's CAs), presenting ``lockd_cert``/``lockd_key`` if given
    (lockd with ``--tls-client-ca``). Raises ``OSError``/``ssl.SSLError`` for unusable files."""
    cert = (settings.lockd_cert, settings.lockd_key) if settings.lockd_cert else None
    return client_context(settings.lockd_ca or True, cert)


def lockd_loader(lockd_url: str, client: httpx.AsyncClient) -> Loader:
    """Fetch ``{lockd_url}/v1/keys`` with ``client`` (give it ``verify=lockd_verify(...)`` for
    an https lockd: a server that fails verification yields no keys, never trusted ones)."""
    url = lockd_url.rstrip("/") + "/v1/keys"

    async def load() -> dict[str, Any]:
        response = await client.get(url)
        response.raise_for_status()
        return response.json()

    return load


class KeySource(AsyncKeyCache):
    """``AsyncKeyCache`` over ``loader`` with the proxy's errors. ``min_interval_s`` (default
    1 s), ``max_age_s`` (default 60 s; None: only on an unknown ``kid``), ``clock``, ``source``
    (a URL or a file, named in the warning of a failed load and in the 503) as there."""

    def __init__(self, loader: Loader, **rules: Any):
        super().__init__(loader, logger=log, **rules)

    async def verify(self, token: str) -> Claims:  # type: ignore[override]
        """The claims of a genuine token; ``InvalidTokenError`` (401) otherwise,
        ``LockdUnreachable`` (503) when its key is unknown while lockd cannot be reached."""
        try:
            return await super().verify(token)
        except KeysUnavailable as exc:
            raise LockdUnreachable(f"lockd unreachable: {exc}; retry when lockd answers",
                                   jwks_url=self.source) from None
        except TokenError as exc:
            raise InvalidTokenError(str(exc)) from None
