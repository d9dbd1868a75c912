"""The protected database: ``prepare`` (once, at start) and the ``Store`` implementations.

``prepare`` uses SQLAlchemy (cold path): it creates the fence table if missing, reflects the
served tables and binds the policy to them (``policy.Binding``). ``open_store`` returns the store for the URL:
``sqlite:///path`` or ``postgresql://`` / ``postgresql+psycopg://``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from resource_proxy.fencing import SQLITE_TABLE, create_fence_table
from resource_proxy.idempotency import SQLITE_TABLE as IDEMPOTENCY_TABLE
from resource_proxy.policy import Binding, Policy
from resource_proxy.settings import Settings
from resource_proxy.store.base import Row, Store
from resource_proxy.store.postgres import PostgresStore, libpq_dsn
from resource_proxy.store.sqlite import SqliteStore
from resource_proxy.tables import Catalog, reflect

__all__ = ["Row", "Store", "PostgresStore", "SqliteStore", "prepare", "open_store", "sqlite_path"]


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL."""
    path = sa.engine.make_url(url).database
    if not path or path == ":memory:":
        raise ValueError("the proxy needs a SQLite file (other processes must see the same data)")
    return path


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        return sa.create_engine(f"sqlite:///{sqlite_path(url)}")
    return sa.create_engine(libpq_dsn(url).replace("postgresql://", "postgresql+psycopg://", 1),
                            pool_pre_ping=False)


def prepare(url: str, tables: Sequence[str] | None, policy: Policy) -> Binding:
    """Create the fence table (idempotent), reflect the served tables, bind the policy (the
    ``Binding``: which lock governs each row; its ``catalog``: the tables).

    Raises ``sqlalchemy.exc.OperationalError`` if the database is unreachable, ``ValueError``
    (``PolicyError`` included) for an allow-list or policy that does not fit the database.
    """
    engine = _engine(url)
    try:
        create_fence_table(engine)
        exclude = {SQLITE_TABLE, IDEMPOTENCY_TABLE} if engine.dialect.name == "sqlite" else set()
        sqlite = engine.dialect.name == "sqlite"
        return policy.bind(reflect(engine, tables, exclude), sqlite=sqlite)
    finally:
        engine.dispose()


def open_store(settings: Settings, catalog: Catalog) -> Store:
    """The (not yet opened) store for ``settings.database_url``."""
    timeout = settings.db_timeout_ms / 1000
    if settings.is_sqlite:
        return SqliteStore(sqlite_path(settings.database_url), catalog, timeout_s=timeout)
    return PostgresStore(settings.database_url, catalog, pool_size=settings.pool_size, timeout_s=timeout)
