"""Where the proxy gets the public keys that verify fencing tokens: a file or lockd's JWKS.

``KeySource.verify(token)`` verifies offline against the current key set. On a token signed by a
``kid`` the set does not have (lockd rotated its key, or the proxy started before lockd), it
reloads the set once and tries again; reloads are rate limited to one per ``min_interval_s`` and
shared by concurrent requests, so a flood of tokens with invented ``kid`` values cannot turn
into a flood of requests to lockd. A reload that fails keeps the old set (tokens then fail with
``InvalidTokenError``, 401: the proxy never honours a token it could not verify).

The set is also refreshed when it is older than ``max_age_s`` (default 60 s, the
``Cache-Control: max-age=60`` lockd serves its JWKS with; ``PROXY_JWKS_MAX_AGE_MS``): the first
token verified after that waits for the refetch. So a key lockd retired (``lockd keys retire``)
stops verifying within ``max_age_s`` plus lockd's ``key_reload_ms``, cached tokens included
(the cache is cleared when the set changes). While lockd cannot be reached the proxy keeps the
set it has rather than refuse every token, and retries every ``min_interval_s`` in the
background (no request waits for a lockd that does not answer).

Verified tokens are cached by their exact text (LRU, at most 4096; cleared when the key set
changes): a holder sends the same token with every write, and an Ed25519 check (~0.1 ms of CPU
here) costs more than the rest of the request's Python work, so a new lease's token is verified
once, on its first write. Caching by text is safe: a token's claims are a function of its bytes
(the signature covers header and claims; a changed byte is another key in the cache), lockd's
tokens carry no expiry for the proxy to re-check (the fence check in the database decides
staleness, on every write), and a key set change (rotation) clears the cache. LRU, not
clear-when-full: a flood of new tokens evicts the oldest, never the hot ones all at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from lockd.common.tls import client_context
from lockd.tokens import Claims, TokenError, UnknownKey, Verifier
from resource_proxy.errors import InvalidTokenError, LockdUnreachable

__all__ = ["KeySource", "file_loader", "lockd_loader", "lockd_verify"]

log = logging.getLogger("resource_proxy.jwks")

Loader = Callable[[], Awaitable[dict[str, Any]]]
_CACHE_MAX = 4096


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


class KeySource:
    """Verifies tokens against a JWKS that ``loader`` provides, reloading on unknown keys.

    ``min_interval_s``: least time between two reloads (default 1 s). ``max_age_s``: the set
    is refetched before a verification once it is this old (default 60 s; None: never, only on
    an unknown ``kid``). ``clock``: monotonic
    seconds, injectable for tests. ``source``: where the keys come from (a URL or a file),
    named in the warning of a failed load and in the 503 while no load has succeeded since.
    ``available`` is False after a failed load (until one succeeds), None before any.
    """

    def __init__(self, loader: Loader, *, min_interval_s: float = 1.0,
                 max_age_s: float | None = 60.0,
                 clock: Callable[[], float] = time.monotonic, source: str = "the JWKS"):
        self._loader = loader
        self._max_age = max_age_s
        self.source = source
        self.available: bool | None = None
        self.last_error = ""
        self._min_interval = min_interval_s
        self._clock = clock
        self._verifier = Verifier({"keys": []})
        self._last_load: float | None = None
        self._lock = asyncio.Lock()
        self._cache: OrderedDict[str, Claims] = OrderedDict()
        self._background: asyncio.Task[bool] | None = None
        self.loads = 0

    @property
    def kids(self) -> frozenset[str]:
        return self._verifier.kids

    async def reload(self, *, force: bool = False) -> bool:
        """Load the key set unless one was loaded less than ``min_interval_s`` ago.

        Returns whether a load was attempted; never raises (a failure is logged).
        """
        async with self._lock:
            now = self._clock()
            if not force and self._last_load is not None and now - self._last_load < self._min_interval:
                return False
            self._last_load = now
            self.loads += 1
            try:
                jwks = await self._loader()
            except (OSError, ValueError, httpx.HTTPError) as exc:
                self.available, self.last_error = False, str(exc) or type(exc).__name__
                log.warning("could not load the JWKS from %s: %s (tokens signed by keys not "
                            "loaded get 503 lockd_unreachable until it answers)",
                            self.source, self.last_error)
                return True
            self.available = True
            verifier = Verifier(jwks)
            if verifier.kids != self._verifier.kids:
                log.info("JWKS loaded: %d key(s)", len(verifier.kids))
                self._cache.clear()
            self._verifier = verifier
            return True

    def peek(self, token: str) -> Claims | None:
        """The claims of ``token`` if it was verified already (cache only; never verifies)."""
        return self._cache.get(token)

    def _stale(self) -> bool:
        """Whether the set is due for a refetch: older than ``max_age_s``, or (after a failed
        load) older than ``min_interval_s``."""
        if self._max_age is None or self._last_load is None:
            return False
        age = self._clock() - self._last_load
        return age >= (self._min_interval if self.available is False else self._max_age)

    def _reload_in_background(self) -> None:
        if self._background is None or self._background.done():
            self._background = asyncio.create_task(self.reload())

    async def verify(self, token: str) -> Claims:
        """The claims of a genuine token; ``InvalidTokenError`` (401) otherwise."""
        if self._stale():
            if self.available is False:  # lockd is down: retry without holding requests up
                self._reload_in_background()
            else:  # a retired key must stop verifying, cached tokens too: wait for the set
                await self.reload()
        claims = self._cache.get(token)
        if claims is not None:
            self._cache.move_to_end(token)
            return claims
        try:
            try:
                claims = self._verifier.verify(token)
            except UnknownKey:
                await self.reload()  # may be skipped (rate limit) or done by a concurrent call
                try:
                    claims = self._verifier.verify(token)
                except UnknownKey:
                    if self.available is False:
                        raise LockdUnreachable(
                            f"lockd unreachable: the token's key is unknown and the keys could "
                            f"not be fetched from {self.source} ({self.last_error}); retry "
                            f"when lockd answers", jwks_url=self.source) from None
                    raise
        except TokenError as exc:
            raise InvalidTokenError(str(exc)) from None
        self._cache[token] = claims
        if len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)  # the least recently used
        return claims
