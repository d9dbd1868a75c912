"""Which tables and buckets each client identity may write or read fenced: ``serve
--access-file FILE``.

The file is read by lockd's parser (``lockd.common.access``) with ``tables:`` and ``buckets:``
as the clients' scope fields: the tables, and the buckets whose objects, the identity may write,
claim and read with a token (``"*"``: every one). A client gives at least one of the two; one it
leaves out scopes it to nothing of that kind (a client of tables writes no object).
``admins:`` may touch everything. Its keys and subjects authenticate like API keys
(``RequestMiddleware`` gets the file as its ``identities``); ``PROXY_API_KEYS`` stay unscoped
identities (a key listed in both is scoped: the file names it). Subjects need mTLS
(``--tls-client-ca``; the CLI refuses them without). Reads without a token stay open to every
authenticated caller: they fence nothing.

``AccessMiddleware`` (inside ``RequestMiddleware``, which authenticated the request and left its
identity in ``scope[IDENTITY]``) puts that identity in a context variable for the request;
``check_table`` (called by ``rows.service.RowService`` before anything is written or fenced) raises
``ForbiddenTable`` naming the table and the identity's name when the table is outside it;
``check_bucket`` (called by ``objects.service.ObjectService``) does the same for a bucket
(``ForbiddenBucket``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from lockd.common.access import AccessFile, Identity, load_access
from lockd.common.middleware import IDENTITY
from resource_proxy.errors import ForbiddenBucket, ForbiddenTable

__all__ = ["ALL_TABLES", "BUCKETS", "AccessMiddleware", "allows", "allows_bucket", "check_bucket",
           "check_table", "load_table_access"]

ALL_TABLES = "*"
BUCKETS = "buckets"
"""The access file's scope field of the buckets."""
_CALLER: ContextVar[Identity | None] = ContextVar("resource_proxy.caller", default=None)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def _table_item(value: str) -> str | None:
    if not value.strip():
        return "a table name cannot be empty (\"*\" means every table)"
    return None


def _bucket_item(value: str) -> str | None:
    if not value.strip():
        return "a bucket name cannot be empty (\"*\" means every bucket)"
    return None


def load_table_access(path: str | Path) -> AccessFile:
    """The identities of the access file at ``path`` (``AccessFileError``: one line)."""
    return load_access(path, scope_field="tables", check_item=_table_item, all_item=ALL_TABLES,
                       more_scopes={BUCKETS: _bucket_item})


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


def allows_bucket(identity: Identity | None, bucket: str) -> bool:
    """Whether ``identity`` (None: no access file) may write or fenced-read ``bucket``'s
    objects."""
    if identity is None:
        return True
    buckets = identity.scope_of(BUCKETS)
    return buckets is None or bucket in buckets


def check_bucket(bucket: str, verb: str = "write") -> None:
    """``ForbiddenBucket`` unless the request's identity may ``verb`` objects of ``bucket``."""
    identity = _CALLER.get()
    if not allows_bucket(identity, bucket):
        assert identity is not None
        raise ForbiddenBucket(f"identity {identity.name!r} may not {verb} objects of bucket "
                              f"{bucket!r} (its buckets: "
                              f"{', '.join(identity.scope_of(BUCKETS) or ()) or 'none'})",
                              bucket=bucket, identity=identity.name)


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
