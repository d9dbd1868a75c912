"""API keys, for both servers (named, scoped identities: ``lockd.common.access``).

``KeySet`` holds SHA-256 digests of the configured keys. ``KeySet.matches`` hashes the presented
key and compares it with EVERY configured digest with ``hmac.compare_digest`` (no early exit),
so neither the answer time nor the key length tells an attacker how close a guess was; the
identity of a key (``KeySet.identify``) is 16 hex digits of its digest, the same on every
replica, never the key. Keys come from a comma/whitespace separated setting and/or a file with
one key per line (``#`` starts a comment); see ``load_keys``. Key comparison is security code:
one copy, shared by lockd's server and ``resource_proxy`` (it imports neither).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["KeySet", "bearer_key", "load_keys", "parse_bearer"]

Scope = MutableMapping[str, Any]


def load_keys(inline: Iterable[str] | str | None, file: str | Path | None) -> list[str]:
    """Keys from ``inline`` (strings, or one string split on commas/whitespace) plus ``file``
    (one key per line; blank lines and ``#`` comments ignored). Raises ``OSError`` if the file
    cannot be read, ``ValueError`` for a key shorter than 8 characters."""
    keys: list[str] = []
    if isinstance(inline, str):
        inline = [inline]
    for item in inline or ():
        keys += [k for k in re.split(r"[\s,]+", item) if k]
    if file:
        for line in Path(file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    for key in keys:
        if len(key) < 8:
            raise ValueError("API keys must be at least 8 characters long")
    return keys


class KeySet:
    """A set of secret keys, checked in constant time (see the module docstring)."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str] = ()):
        self._digests = tuple({hashlib.sha256(k.encode()).digest() for k in keys})

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:  # never the keys
        return f"KeySet({len(self._digests)} key(s))"

    def matches(self, presented: str | bytes | None) -> bool:
        """Whether ``presented`` is one of the keys; compares against all of them."""
        return self.identify(presented) is not None

    def identify(self, presented: str | bytes | None) -> str | None:
        """A stable identity of ``presented`` if it is one of the keys (16 hex digits of its
        SHA-256: the same on every replica, not the key), else ``None``. Constant time."""
        if presented is None:
            return None
        if isinstance(presented, str):
            presented = presented.encode("utf-8", "surrogateescape")
        digest = hashlib.sha256(presented).digest()
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(known, digest)
        return digest.hex()[:16] if found else None


def bearer_key(scope: Scope) -> bytes | None:
    """The credential of ``Authorization: Bearer <key>``; ``None`` if absent or not Bearer."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return parse_bearer(value)
    return None


def parse_bearer(value: bytes | None) -> bytes | None:
    """The credential of an ``Authorization`` header value ``Bearer <key>``; ``None`` if absent
    or not Bearer."""
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(b" ")
    if scheme.lower() == b"bearer" and credential.strip():
        return credential.strip()
    return None
