"""``FenceGuard``: decide whether a request's fencing token may write a resource of a lock.

::

    guard = FenceGuard("http://127.0.0.1:7070")        # lockd's keys, by the proxy's rules
    fence = guard.check(token, "orders/42")            # a verified write Fence, or a GuardError
    with fences.transaction(conn, fence):              # a fence store (lockd.guard.stores, .redis)
        conn.execute(...)                              # claimed atomically with this write

``check`` verifies (1) the token's signature against lockd's public keys, (2) that the token
holds ``lock`` (a token for another lock: ``LockNotAllowed``), (3) the mode: a write needs an
exclusive hold (``lockd.common.fencerule``, the one write rule: a shared token raises
``SharedToken``). It does not decide staleness: that is the fence store's atomic step, with
the write. Token age is not judged: lockd's tokens carry no expiry, a higher fence is what
makes a token useless (docs/fencing-protocol.md).

Keys: ``lockd_url`` (``GET {lockd_url}/v1/keys``) kept by ``lockd.common.keycache.KeyCache``,
the code the proxy and ``fenced_transaction`` use: fetched on first use, refetched on an
unknown ``kid`` (at most once per ``min_interval_s``, default 1 s) and once older than
``max_age_s`` (default 60 s), kept while lockd is unreachable (then an unknown key is
``KeysUnavailable``, 503). Or ``jwks``: a fixed key set (a JWKS mapping), never refetched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from lockd.common.fencerule import WRITE, Fence, Purpose, SharedHold, fence_for
from lockd.common.keycache import KeyCache
from lockd.common.keycache import KeysUnavailable as _KeysUnavailable
from lockd.guard.errors import (
    InvalidToken,
    KeysUnavailable,
    LockNotAllowed,
    SharedToken,
    TokenRequired,
)
from lockd.tokens import Claims, TokenError

__all__ = ["FenceGuard", "HEADER"]

HEADER = "Fencing-Token"
"""The request header that carries the token (the proxy's)."""
_FETCH_TIMEOUT_S = 10.0


class FenceGuard:
    """Verifies tokens for a service; thread-safe. Give ``lockd_url`` or ``jwks`` (not both).
    ``http``: an ``httpx.Client`` for the key fetch (TLS settings of your own; default: one of
    the guard's); ``min_interval_s``, ``max_age_s``: the key cache's rules (see the module)."""

    def __init__(self, lockd_url: str | None = None, *, jwks: Mapping[str, Any] | None = None,
                 http: httpx.Client | None = None, min_interval_s: float = 1.0,
                 max_age_s: float | None = 60.0):
        if (lockd_url is None) == (jwks is None):
            raise TypeError("FenceGuard needs lockd_url or jwks (exactly one)")
        if lockd_url is not None:
            url = lockd_url.rstrip("/") + "/v1/keys"
            self._http = http or httpx.Client(timeout=_FETCH_TIMEOUT_S)

            def load() -> Mapping[str, Any]:
                response = self._http.get(url)
                response.raise_for_status()
                return response.json()

            self.keys = KeyCache(load, min_interval_s=min_interval_s, max_age_s=max_age_s,
                                 source=url)
        else:
            fixed = dict(jwks or {})
            self.keys = KeyCache(lambda: fixed, min_interval_s=min_interval_s, max_age_s=None,
                                 source="the guard's fixed keys")

    def verify(self, token: str | None) -> Claims:
        """The verified claims of ``token``: ``TokenRequired`` (None or empty),
        ``InvalidToken``, ``KeysUnavailable``."""
        if not token:
            raise TokenRequired(f"a write needs a {HEADER} header")
        try:
            return self.keys.verify(token)
        except _KeysUnavailable as exc:
            raise KeysUnavailable(f"{exc}; retry when lockd answers") from None
        except TokenError as exc:
            raise InvalidToken(str(exc)) from None

    def check(self, token: str | None, lock: str, *, purpose: Purpose = WRITE) -> Fence:
        """The ``Fence`` ``token`` presents for ``lock`` and ``purpose`` (default ``WRITE``);
        raises ``TokenRequired``, ``InvalidToken``, ``KeysUnavailable``, ``LockNotAllowed``
        (the token does not hold ``lock``) or ``SharedToken`` (a shared hold, for a write).
        Claim the fence in a fence store, in the transaction of the write."""
        claims = self.verify(token)
        try:
            fence = fence_for(claims, lock, purpose)
        except SharedHold as exc:
            raise SharedToken(exc.lock) from None
        if fence is None:
            raise LockNotAllowed(lock)
        return fence
