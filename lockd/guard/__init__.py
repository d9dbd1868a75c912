"""Fence your own service with lockd's tokens: ``FenceGuard`` verifies a request's token
(the proxy's key rules, the one write rule) and a fence store claims its fence atomically with
the service's own write (``MemoryFences``, ``SqliteFences``, ``PostgresFences``,
``lockd.guard.redis.RedisFences``). Framework glue: ``lockd.guard.web`` (a FastAPI dependency,
an ASGI middleware). docs/guard.md shows them; docs/fencing-protocol.md is the contract."""

from lockd.guard.errors import (
    GuardError,
    InvalidToken,
    KeysUnavailable,
    LockNotAllowed,
    SharedToken,
    StaleToken,
    TokenRequired,
)
from lockd.guard.guard import HEADER, FenceGuard
from lockd.guard.stores import MemoryFences, PostgresFences, SqliteFences

__all__ = ["HEADER", "FenceGuard", "GuardError", "InvalidToken", "KeysUnavailable",
           "LockNotAllowed", "SharedToken", "StaleToken", "TokenRequired", "MemoryFences",
           "PostgresFences", "SqliteFences"]
