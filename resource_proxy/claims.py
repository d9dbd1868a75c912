"""The fence core's own calls, shared by every resource kind: a token's verified claims, and
``POST /v1/fences/{lock}/claim``, ``POST /v1/fences/claim`` and ``GET /v1/fences/{lock}``.

A claim raises a lock's highest honoured fence to the token's, writing no data, so it is served
only for a lock that governs something this proxy serves: each resource kind (rows, objects)
registers a ``Governs`` check when the app starts, asked in order; a kind may also refuse the
caller (the rows' table scopes: 403 ``forbidden_table``). The fence rule is the one every write
follows (``fencing.held``/``held_all`` over ``lockd.common.fencerule``): a shared hold claims
for read, a multi-lock token claims any one of its locks here or all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lockd.common.fencerule import WRITE
from lockd.tokens import Claims
from resource_proxy.errors import LockNotAllowed, TokenRequired
from resource_proxy.fencing import held, held_all, validate_lock_name
from resource_proxy.jwks import KeySource
from resource_proxy.store.base import Store

__all__ = ["ClaimService", "Governs", "claims_of"]

Governs = Callable[[str, Claims], bool]
"""``(lock, claims) -> bool``: whether ``lock`` governs something of one resource kind; it may
raise a ``ProxyError`` to refuse the caller a lock it does govern."""


async def claims_of(keys: KeySource, token: str | None) -> Claims:
    """The verified claims of ``token``: one lock, or several for a multi-lock token
    (``TokenRequired`` without one, ``InvalidTokenError`` for a bad one)."""
    if not token:
        raise TokenRequired("send the lock's token in the Fencing-Token header")
    return await keys.verify(token.strip())


class ClaimService:
    """The claim calls over ``store`` (``Store.claim``/``claim_all``/``highest``); ``kinds``:
    the resource kinds' ``Governs`` checks (``add_kind``)."""

    def __init__(self, keys: KeySource, store: Store) -> None:
        self.keys = keys
        self.store = store
        self.kinds: list[Governs] = []

    def add_kind(self, governs: Governs) -> None:
        self.kinds.append(governs)

    def _governed(self, lock: str, claims: Claims) -> None:
        """403 ``lock_not_allowed`` unless some kind says ``lock`` governs what it serves."""
        if any(governs(lock, claims) for governs in self.kinds):
            return
        holds = ({"token_locks": sorted(claims.locks)} if claims.multi
                 else {"token_lock": claims.lock})
        raise LockNotAllowed(f"lock {lock!r} governs no row of any table this proxy serves "
                             "(GET /v1/tables/{table}/lock?key= names the lock of a row)",
                             lock=lock, **holds)

    async def claim(self, lock: str, token: str | None) -> dict[str, Any]:
        """Raise the highest fence of ``lock`` to the token's, writing no data. A multi-lock
        token may claim any one of its locks here (``claim_all`` claims them all). A token that
        holds ``lock`` shared makes a claim-for-read (409 ``stale_token`` if its epoch is below
        the highest, which rises to it otherwise, as for a write)."""
        validate_lock_name(lock)
        claims = await claims_of(self.keys, token)
        fence = held(claims, lock, None)  # what the hold allows: a shared one claims for read
        if fence is None:
            if claims.multi or claims.lock is None:
                raise LockNotAllowed(f"the multi-lock token does not hold lock {lock!r} (it "
                                     f"holds {sorted(claims.locks)})", lock=lock,
                                     token_locks=sorted(claims.locks))
            raise LockNotAllowed(f"the token is for lock {claims.lock!r}, not {lock!r}",
                                 lock=lock, token_lock=claims.lock)
        self._governed(lock, claims)
        return {"lock": lock, "highest": await self.store.claim(fence)}

    async def claim_all(self, token: str | None) -> dict[str, Any]:
        """``POST /v1/fences/claim``: raise the highest fence of EVERY lock of the token (one or
        several) to the token's, in one transaction, in lock-name order, writing no data.
        All or nothing: 403 if any lock governs nothing served, 403 ``shared_token`` if the
        token holds any lock shared (claim it alone for a claim-for-read), 409 ``stale_token``
        listing each stale lock (nothing raised)."""
        claims = await claims_of(self.keys, token)
        fences = held_all(claims, WRITE)
        for fence in fences:
            self._governed(fence.lock, claims)
        highest = await self.store.claim_all(fences)
        return {"locks": [{"lock": f.lock, "highest": h}
                          for f, h in zip(fences, highest, strict=True)]}

    async def fence(self, lock: str) -> dict[str, Any]:
        """``GET /v1/fences/{lock}``: the highest fence honoured for ``lock`` (0: none yet)."""
        validate_lock_name(lock)
        return {"lock": lock, "highest": await self.store.highest(lock)}
