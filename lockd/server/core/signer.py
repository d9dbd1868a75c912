"""The one signer of lockd's tokens: every primitive's grant becomes a token here, in the mode
of the STORE's record of the lease, and only for a lock the granting primitive owns in the one
namespace (``lockd.common.namespace``). Tokens are cached per grant, so every answer about one
grant carries one token text, until a key rotation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lockd.common import namespace
from lockd.common.namespace import LOCK, Primitive
from lockd.server.errors import LockdError
from lockd.server.store.values import EXCLUSIVE, SHARED
from lockd.tokens import KeyRing

__all__ = ["Signer", "check_mint"]

_CACHE_SIZE = 10_000


def check_mint(primitive: Primitive, lock: str) -> None:
    """Before signing: ``LockdError`` (500, no token made) unless ``primitive`` owns ``lock``
    (``namespace.mints``). Every route checked the name already, so only a store that granted
    a name it should not have gets here; the token is the last door."""
    if not namespace.mints(primitive, lock):
        raise LockdError(f"refusing to sign a {primitive.kind} token for lock {lock!r}: the name"
                         " belongs to another primitive")


class Signer:
    """Signs with ``keyring``'s current key. After a rotation every grant and renewal is signed
    anew, so live leases move to the new key as they renew (and the old key can be retired once
    ``max_ttl_ms`` has passed: ``lockd.server.keydir``)."""

    def __init__(self, keyring: KeyRing) -> None:
        self.keyring = keyring
        self._tokens: dict[tuple[Any, ...], str] = {}
        self._kid = keyring.kid  # the signer of the cached tokens

    def _cached(self, key: tuple[Any, ...]) -> str | None:
        kid = self.keyring.kid
        if kid != self._kid:
            self._tokens.clear()
            self._kid = kid
        return self._tokens.get(key)

    def _keep(self, key: tuple[Any, ...], token: str) -> str:
        if len(self._tokens) >= _CACHE_SIZE:
            del self._tokens[next(iter(self._tokens))]
        self._tokens[key] = token
        return token

    def token(self, lock: str, fence: int, mode: str = EXCLUSIVE,
              primitive: Primitive = LOCK) -> str:
        """The token of ``primitive``'s grant of ``lock`` at ``fence`` in ``mode`` (a SHARED
        token says so in its ``mode`` claim). Raises ``LockdError`` (``check_mint``)."""
        check_mint(primitive, lock)
        key: tuple[Any, ...] = (lock, fence) if mode == EXCLUSIVE else (lock, fence, mode)
        token = self._cached(key)
        if token is None:
            token = self._keep(key, self.keyring.sign(lock, fence) if mode == EXCLUSIVE
                               else self.keyring.sign(lock, fence, extra={"mode": mode}))
        return token

    def set_token(self, lease_id: str, fences: Mapping[str, int],
                  modes: Mapping[str, str]) -> str:
        """The one token of a multi-lock lease (``fences``, ``modes``: name -> fence / mode; a
        lease's fences never change, so one token per lease); its shared locks are listed in
        claim ``shared``. Raises ``LockdError`` (``check_mint``, for every lock)."""
        key = (lease_id, -1)
        token = self._cached(key)
        if token is None:
            for name in fences:
                check_mint(LOCK, name)
            shared = [name for name in fences if modes.get(name) == SHARED]
            token = self._keep(key, self.keyring.sign_many(
                dict(fences), extra={"shared": shared} if shared else None))
        return token
