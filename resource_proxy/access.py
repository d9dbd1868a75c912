"""Which tables each client identity may write or read fenced: ``serve --access-file FILE``.

The file has the shape of lockd's (``lockd.common.access``) with ``tables:`` as the clients'
scope field: the tables the identity may write, claim and read with a token (``"*"``: every
table); ``admins:`` may touch every table. Its keys and subjects authenticate like API keys
(they are added to the proxy's ``api_keys`` and certificate clients); ``PROXY_API_KEYS`` stay
unscoped identities (a key listed in both is scoped: the file names it). Subjects need mTLS
(``--tls-client-ca``; the CLI refuses them without). Reads without a token stay open to every authenticated caller: they fence
nothing.

``AccessMiddleware`` (inside ``RequestMiddleware``, which authenticated the request and left its
``key_id`` in the scope) puts the caller's scope in a context variable for the request;
``check_table`` (called by ``ProxyService`` before anything is written or fenced) raises
``ForbiddenTable`` naming the table and the identity's name when the table is outside it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from lockd.common.access import AccessFile, Identity, load_access
from lockd.common.middleware import KEY_ID
from resource_proxy.errors import ForbiddenTable

__all__ = ["ALL_TABLES", "AccessMiddleware", "allows", "check_table", "load_table_access"]

ALL_TABLES = "*"
_CALLER: ContextVar[Identity | None] = ContextVar("resource_proxy.caller", default=None)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def _table_item(value: str) -> str | None:
    if not value.strip():
        return "a table name cannot be empty (\"*\" means every table)"
    return None


def load_table_access(path: str | Path) -> AccessFile:
    """The identities of the access file at ``path`` (``AccessFileError``: one line)."""
    return load_access(path, scope_field="tables", check_item=_table_item)


def allows(identity: Identity | None, table: str) -> bool:
    """Whether ``identity`` (None: unscoped) may write or fenced-read ``table``."""
    if identity is None or identity.scope is None:
        return True
    return ALL_TABLES in identity.scope or table in identity.scope


def check_table(table: str, verb: str = "write") -> None:
    """``ForbiddenTable`` unless the request's identity may ``verb`` ``table``."""
    identity = _CALLER.get()
    if not allows(identity, table):
        assert identity is not None
        raise ForbiddenTable(f"identity {identity.name!r} may not {verb} table {table!r} "
                             f"(its tables: {', '.join(identity.scope or ())})",
                             table=table, identity=identity.name)


def caller() -> Identity | None:
    """The request's scoped identity (None: unscoped or no access file)."""
    return _CALLER.get()


class AccessMiddleware:
    """Sets the request's identity (by ``scope[KEY_ID]``) for ``check_table``."""

    def __init__(self, app: ASGIApp, *, access: AccessFile):
        self.app = app
        self._by_key_id = access.by_key_id()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        identity = self._by_key_id.get(scope.get(KEY_ID, "")) if scope["type"] == "http" else None
        token = _CALLER.set(identity)
        try:
            await self.app(scope, receive, send)
        finally:
            _CALLER.reset(token)
