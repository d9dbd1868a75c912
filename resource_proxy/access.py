"""Which tables each client identity may write or read fenced: ``serve --access-file FILE``.

The file is read by lockd's parser (``lockd.common.access``) with ``tables:`` as the clients'
scope field: the tables the identity may write, claim and read with a token (``"*"``: every
table); ``admins:`` may touch every table. Its keys and subjects authenticate like API keys
(``RequestMiddleware`` gets the file as its ``identities``); ``PROXY_API_KEYS`` stay unscoped
identities (a key listed in both is scoped: the file names it). Subjects need mTLS
(``--tls-client-ca``; the CLI refuses them without). Reads without a token stay open to every
authenticated caller: they fence nothing.

``AccessMiddleware`` (inside ``RequestMiddleware``, which authenticated the request and left its
identity in ``scope[IDENTITY]``) puts that identity in a context variable for the request;
``check_table`` (called by ``rows.service.RowService`` before anything is written or fenced) raises
``ForbiddenTable`` naming the table and the identity's name when the table is outside it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from lockd.common.access import AccessFile, Identity, load_access
from lockd.common.middleware import IDENTITY
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
    return load_access(path, scope_field="tables", check_item=_table_item, all_item=ALL_TABLES)


def allows(identity: Identity | None, table: str) -> bool:
    """Whether ``identity`` (None, or ``scope`` None: unscoped) may write or fenced-read
    ``table``."""
    return identity is None or identity.scope is None or table in identity.scope


def check_table(table: str, verb: str = "write") -> None:
    """``ForbiddenTable`` unless the request's identity may ``verb`` ``table``."""
    identity = _CALLER.get()
    if not allows(identity, table):
        assert identity is not None
        raise ForbiddenTable(f"identity {identity.name!r} may not {verb} table {table!r} "
                             f"(its tables: {', '.join(identity.scope or ())})",
                             table=table, identity=identity.name)


def caller() -> Identity | None:
    """The request's identity (None: no access file or no identity)."""
    return _CALLER.get()


class AccessMiddleware:
    """Sets the request's identity (``scope[IDENTITY]``) for ``check_table``."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        token = _CALLER.set(scope.get(IDENTITY) if scope["type"] == "http" else None)
        try:
            await self.app(scope, receive, send)
        finally:
            _CALLER.reset(token)
