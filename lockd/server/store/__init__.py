"""Store backends behind one URL: ``open_store(url, clock=...)`` picks the implementation.

=============================================  =========================================
URL                                            store
=============================================  =========================================
``sqlite:///relative/path.db``                 ``SqliteStore`` (embedded default, one node)
``sqlite:////absolute/path.db``                the same, absolute path
``sqlite:///:memory:``                         ``SqliteStore`` in memory (tests, demos)
``postgresql://…``, ``postgresql+psycopg://…``   ``PostgresStore`` (replicas share it)
``etcd://host:port[,host:port…]``              ``EtcdStore`` (a Raft cluster)
=============================================  =========================================

Backends other than SQLite are imported lazily, so a SQLite-only lockd never loads psycopg.
Each backend's design: docs/stores/ (``postgres.md``, ``etcd.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import import_module
from urllib.parse import unquote, urlsplit

from lockd.server.store.base import Store

__all__ = [
    "SCHEMES",
    "Store",
    "check_store_url",
    "is_sqlite_url",
    "open_store",
    "redact_url",
    "sqlite_path",
]

SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "etcd")
"""The URL schemes ``open_store`` accepts."""


def _scheme(url: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            f"store URL {redact_url(str(url))!r} has no scheme; expected one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(
            f"unsupported store URL scheme {scheme!r} in {redact_url(url)!r}; expected one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    return scheme


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///…`` URL (``":memory:"`` for an in-memory database).

    ``sqlite:///lockd.db`` is relative to the working directory, ``sqlite:////var/lib/x.db``
    absolute (SQLAlchemy's convention). Raises ``ValueError`` for a URL with a host or no path.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise ValueError(f"not a sqlite URL: {redact_url(url)!r}")
    if parts.netloc:
        raise ValueError(f"sqlite URL must have no host (use sqlite:///path): {url!r}")
    path = unquote(parts.path)
    if path.startswith("/"):
        path = path[1:]
    if not path:
        raise ValueError(f"sqlite URL has no path (use e.g. sqlite:///./lockd.db): {url!r}")
    return path


def check_store_url(url: str) -> str:
    """Return ``url`` if ``open_store`` would accept its form; raise ``ValueError`` otherwise."""
    if _scheme(url) == "sqlite":
        sqlite_path(url)
    return url


def is_sqlite_url(url: str) -> bool:
    """Whether ``url`` names the embedded SQLite store (single-process: no ``--workers``)."""
    return _scheme(url) == "sqlite"


def open_store(url: str, *, clock: Callable[[], float]) -> Store:
    """A new, not yet opened ``Store`` for ``url`` (call ``await store.open()``).

    ``clock`` (wall seconds) judges expiry for SQLite only; PostgreSQL and etcd use their own
    clocks. Raises ``ValueError`` for an unknown scheme (naming the accepted ones) or a backend
    that is not installed.
    """
    scheme = _scheme(url)
    if scheme == "sqlite":
        from lockd.server.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), clock=clock)
    if scheme in ("postgresql", "postgresql+psycopg"):
        cls = _backend("lockd.server.store.postgres", "PostgresStore", url)
        return cls(url)
    cls = _backend("lockd.server.store.etcd", "EtcdStore", url)
    return cls(url)


def _backend(module: str, name: str, url: str) -> type:
    try:
        return getattr(import_module(module), name)
    except ModuleNotFoundError as exc:
        missing = "" if exc.name == module else f" (missing module {exc.name!r})"
        raise ValueError(
            f"store {redact_url(url)!r} needs {module}.{name}, which this lockd cannot load"
            + missing
        ) from exc


_USERINFO = re.compile(r"(?P<head>://[^/@:,?#]*):(?P<password>[^/@?#]*)@")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (userinfo and ``?password=``), for logs."""
    url = _USERINFO.sub(r"\g<head>:***@", url)
    return _QUERY_PASSWORD.sub(r"\g<head>***", url)
