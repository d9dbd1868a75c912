"""lockd's public keys as a verifier of tokens keeps them: the one set of rules for fetching,
caching and refetching a JWKS, with a blocking (``KeyCache``) and an asyncio (``AsyncKeyCache``)
fetch. The proxy (``resource_proxy.jwks``) and ``fenced_transaction`` use it.

- The set is fetched on first use; a token naming a key (``kid``) the set lacks makes it
  refetch (lockd rotated), at most once per ``min_interval_s``, shared by concurrent callers.
- Once older than ``max_age_s`` (lockd's ``Cache-Control: max-age``) the set is refetched
  before the next verification, so a retired key stops verifying, cached tokens included.
- A fetch that fails keeps the set it has (``available`` False); the next attempts run in the
  background, so no caller waits for a source that does not answer. A token whose key is
  unknown meanwhile raises ``KeysUnavailable`` (it may be genuine), not ``UnknownKey``.
- Verified tokens are cached by their exact text (LRU, ``cache_max``; cleared when the set
  changes): a token's claims are a function of its bytes.

Errors: ``lockd.tokens.TokenError`` (invalid, unknown key) and ``KeysUnavailable``; each user
maps them to its own. docs/keys.md says why the rules are these.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lockd.tokens import Claims, UnknownKey, Verifier

__all__ = ["KeysUnavailable", "KeyCache", "AsyncKeyCache", "Loader", "AsyncLoader"]

log = logging.getLogger("lockd.keys")

Loader = Callable[[], Mapping[str, Any]]
AsyncLoader = Callable[[], Awaitable[Mapping[str, Any]]]


class KeysUnavailable(Exception):
    """A token's key is not in the set and the set could not be fetched from ``source``
    (``reason``): the token may be genuine; retry once the source answers."""

    def __init__(self, source: str, reason: str):
        super().__init__(f"the token's key is unknown and the keys could not be fetched from "
                         f"{source} ({reason})")
        self.source = source
        self.reason = reason


class _Rules:
    """The state and rules both fetch flavours share; no I/O. ``min_interval_s``: least time
    between two loads (default 1 s); ``max_age_s``: the set is refetched once this old (default
    60 s; None: only on an unknown ``kid``); ``clock``: monotonic seconds (tests inject one);
    ``source``: where the keys come from, named in errors and logs; ``cache_max``: verified
    tokens kept; ``logger``: where loads are logged. ``available``: None before any load, then
    whether the last one succeeded."""

    def __init__(self, *, min_interval_s: float = 1.0, max_age_s: float | None = 60.0,
                 clock: Callable[[], float] = time.monotonic, source: str = "the JWKS",
                 cache_max: int = 4096, logger: logging.Logger = log):
        self.source = source
        self._log = logger
        self.available: bool | None = None
        self.last_error = ""
        self.loads = 0
        self._min_interval = min_interval_s
        self._max_age = max_age_s
        self._clock = clock
        self._cache_max = cache_max
        self._verifier = Verifier({"keys": []})
        self._last_load: float | None = None
        self._cache: OrderedDict[str, Claims] = OrderedDict()
        self._cache_lock = threading.Lock()

    @property
    def kids(self) -> frozenset[str]:
        return self._verifier.kids

    def peek(self, token: str) -> Claims | None:
        """The claims of ``token`` if it was verified already (cache only; never verifies)."""
        return self._cache.get(token)

    def _begin_load(self, force: bool) -> bool:
        """Whether a load may start now (``min_interval_s`` since the last one, or ``force``);
        if so it counts as started."""
        now = self._clock()
        if not force and self._last_load is not None and now - self._last_load < self._min_interval:
            return False
        self._last_load = now
        self.loads += 1
        return True

    def _loaded(self, jwks: Any) -> None:
        self.available = True
        verifier = Verifier(jwks if isinstance(jwks, Mapping) else {})
        if verifier.kids != self._verifier.kids:
            self._log.info("JWKS loaded from %s: %d key(s)", self.source, len(verifier.kids))
            with self._cache_lock:
                self._cache.clear()
        self._verifier = verifier

    def _failed(self, exc: BaseException) -> None:
        self.available, self.last_error = False, str(exc) or type(exc).__name__
        self._log.warning("could not load the JWKS from %s: %s (tokens signed by keys not "
                          "loaded are refused as unverifiable until it answers)", self.source,
                          self.last_error)

    def _due(self) -> bool:
        """Whether the set is due for a refetch: older than ``max_age_s``, or (after a failed
        load) older than ``min_interval_s``."""
        if self._max_age is None or self._last_load is None:
            return False
        age = self._clock() - self._last_load
        return age >= (self._min_interval if self.available is False else self._max_age)

    def _cached(self, token: str) -> Claims | None:
        with self._cache_lock:
            claims = self._cache.get(token)
            if claims is not None:
                self._cache.move_to_end(token)
            return claims

    def _remember(self, token: str, claims: Claims) -> Claims:
        with self._cache_lock:
            self._cache[token] = claims
            if len(self._cache) > self._cache_max:
                self._cache.popitem(last=False)  # the least recently used
        return claims

    def _unknown(self, exc: UnknownKey) -> KeysUnavailable | UnknownKey:
        """What an unknown key means after the refetch: the source is down, or the key is."""
        if self.available is False:
            return KeysUnavailable(self.source, self.last_error)
        return exc


class KeyCache(_Rules):
    """The rules with a blocking ``loader`` (returns a JWKS mapping, raises when it cannot).
    Thread-safe. ``verify(token, loader=...)`` may pass the loader of the call (an HTTP client
    of its own); background retries use the last one given."""

    def __init__(self, loader: Loader, **rules: Any):
        super().__init__(**rules)
        self._loader = loader
        self._load_lock = threading.Lock()
        self._background: threading.Thread | None = None

    def reload(self, *, force: bool = False, loader: Loader | None = None) -> bool:
        """Load the set unless one was loaded less than ``min_interval_s`` ago; returns whether
        a load was attempted; never raises (a failure is logged and kept in ``last_error``)."""
        if loader is not None:
            self._loader = loader
        with self._load_lock:
            if not self._begin_load(force):
                return False
            try:
                jwks = self._loader()
            except Exception as exc:  # noqa: BLE001 - any failure of the fetch keeps the set
                self._failed(exc)
            else:
                self._loaded(jwks)
            return True

    def _reload_in_background(self) -> None:
        if self._background is None or not self._background.is_alive():
            self._background = threading.Thread(target=self.reload, daemon=True,
                                                name="lockd-keys-reload")
            self._background.start()

    def verify(self, token: str, *, loader: Loader | None = None) -> Claims:
        """The claims of a genuine token: ``TokenError`` if it is not, ``KeysUnavailable`` if
        its key is unknown while the set cannot be fetched."""
        if loader is not None:
            self._loader = loader
        if self._last_load is None:
            self.reload()
        elif self._due():
            if self.available is False:  # the source is down: retry without holding callers
                self._reload_in_background()
            else:  # a retired key must stop verifying, cached tokens too: wait for the set
                self.reload()
        claims = self._cached(token)
        if claims is not None:
            return claims
        try:
            claims = self._verifier.verify(token)
        except UnknownKey:
            self.reload()  # may be skipped (rate limit) or done by a concurrent call
            try:
                claims = self._verifier.verify(token)
            except UnknownKey as exc:
                raise self._unknown(exc) from None
        return self._remember(token, claims)


class AsyncKeyCache(_Rules):
    """The rules with an asyncio ``loader``; concurrent calls share one load."""

    def __init__(self, loader: AsyncLoader, **rules: Any):
        super().__init__(**rules)
        self._loader = loader
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._background: asyncio.Task[bool] | None = None

    def _load_lock(self) -> asyncio.Lock:
        """One lock per event loop (an ``asyncio.Lock`` waits on the loop it first waited on)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def reload(self, *, force: bool = False, loader: AsyncLoader | None = None) -> bool:
        """``KeyCache.reload``, awaited."""
        if loader is not None:
            self._loader = loader
        async with self._load_lock():
            if not self._begin_load(force):
                return False
            try:
                jwks = await self._loader()
            except Exception as exc:  # noqa: BLE001 - any failure of the fetch keeps the set
                self._failed(exc)
            else:
                self._loaded(jwks)
            return True

    def _reload_in_background(self) -> None:
        if self._background is None or self._background.done():
            self._background = asyncio.get_running_loop().create_task(self.reload())

    async def verify(self, token: str, *, loader: AsyncLoader | None = None) -> Claims:
        """``KeyCache.verify``, awaited."""
        if loader is not None:
            self._loader = loader
        if self._last_load is None:
            await self.reload()
        elif self._due():
            if self.available is False:
                self._reload_in_background()
            else:
                await self.reload()
        claims = self._cached(token)
        if claims is not None:
            return claims
        try:
            claims = self._verifier.verify(token)
        except UnknownKey:
            await self.reload()
            try:
                claims = self._verifier.verify(token)
            except UnknownKey as exc:
                raise self._unknown(exc) from None
        return self._remember(token, claims)
