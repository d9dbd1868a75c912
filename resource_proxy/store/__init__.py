"""The protected database: ``prepare`` (once, at start) and the ``Store`` implementations.

``prepare`` uses SQLAlchemy (cold path): it creates the fence table if missing, reflects the
served tables and binds the policy to them (``policy.Binding``); on PostgreSQL it also says
whether the database's own fence triggers protect them (``dbstatus``). ``open_store`` returns
the store for the URL: ``sqlite:///path`` or ``postgresql://`` / ``postgresql+psycopg://``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa

from resource_proxy.dbfence.keys import refusal
from resource_proxy.fencing import SQLITE_TABLE, create_fence_table
from resource_proxy.idempotency import SQLITE_TABLE as IDEMPOTENCY_TABLE
from resource_proxy.objects.store import SQLITE_TABLE as OBJECTS_TABLE
from resource_proxy.policy import Binding, Policy, PolicyError
from resource_proxy.rows.dbstatus import DbFencingRequired, describe, listed, unprotected
from resource_proxy.rows.tables import Catalog, derived_tables, reflect
from resource_proxy.settings import Settings
from resource_proxy.store.base import Row, Store
from resource_proxy.store.postgres import PostgresStore, libpq_dsn
from resource_proxy.store.sqlite import SqliteStore

__all__ = ["Row", "Store", "PostgresStore", "SqliteStore", "prepare", "open_store", "sqlite_path",
           "engine_for"]

log = logging.getLogger("resource_proxy")


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL."""
    path = sa.engine.make_url(url).database
    if not path or path == ":memory:":
        raise ValueError("the proxy needs a SQLite file (other processes must see the same data)")
    return path


def engine_for(url: str) -> sa.Engine:
    """A SQLAlchemy engine (cold paths: start-up, ``resource-proxy db``) for a proxy URL."""
    if url.startswith("sqlite"):
        return sa.create_engine(f"sqlite:///{sqlite_path(url)}")
    return sa.create_engine(libpq_dsn(url).replace("postgresql://", "postgresql+psycopg://", 1),
                            pool_pre_ping=False)


def prepare(url: str, tables: Sequence[str] | None, policy: Policy, *,
            require_db_fencing: bool = False, announce: bool = True) -> Binding:
    """Create the fence table (idempotent), reflect the served tables, bind the policy (the
    ``Binding``: which lock governs each row; its ``catalog``: the tables). On PostgreSQL, say
    (``announce``: log one line) which fenced tables the database's fence triggers protect too.

    Raises ``sqlalchemy.exc.OperationalError`` if the database is unreachable, ``PolicyError``
    for a policy or allow-list the proxy cannot serve (a partition or inheritance child named,
    a template key the database cannot bind: ``dbfence.refusal``), ``DbFencingRequired`` when
    ``require_db_fencing`` and a fenced table is not protected in the database, ``ValueError``
    for an allow-listed table that does not exist.
    """
    engine = engine_for(url)
    try:
        if engine.dialect.name == "sqlite":
            if require_db_fencing:
                raise DbFencingRequired("--require-db-fencing: database-side fencing needs "
                                        "PostgreSQL")
            create_fence_table(engine)
            exclude = {SQLITE_TABLE, IDEMPOTENCY_TABLE, OBJECTS_TABLE}
            return policy.bind(reflect(engine, tables, exclude), sqlite=True)
        derived = derived_tables(engine)
        for name in dict.fromkeys([*(tables or ()), *policy.tables]):
            if name in derived:
                raise PolicyError(f"table {name!r} is {derived[name]}; the proxy does not serve "
                                  "it under a lock of its own")
        catalog = reflect(engine, tables, ())
        _refuse_keys(catalog, policy)
        binding = policy.bind(catalog)
        fenced = [name for name in catalog if not binding[name].unfenced]
        create_fence_table(engine, fenced)  # refused configurations leave the database untouched
        missing = unprotected(engine, policy, tables, fenced)
        if require_db_fencing and missing:
            raise DbFencingRequired("--require-db-fencing: not protected in the database: "
                                    f"{listed(missing)} (resource-proxy db install)")
        if announce:
            log.info("%s", describe(fenced, missing))
        return binding
    finally:
        engine.dispose()


def _refuse_keys(catalog: Catalog, policy: Policy) -> None:
    """``PolicyError`` naming the column and its type for a template placeholder whose key type
    the database stores differently than it was spelled (``dbfence.refusal``: timetz, "char",
    name, char(n), ...): the proxy and the database could put one row under two locks."""
    for name, entry in policy.tables.items():
        table = catalog.get(name)
        if table is None or entry.template is None:
            continue
        for var in entry.template.variables:
            for column in (table.primary_key if var == "key" else (var,)):
                if column in table.primary_key:
                    reason = refusal(table.columns[column])
                    if reason is not None:
                        raise PolicyError(f"table {name!r}: {reason}")


def open_store(settings: Settings, catalog: Catalog) -> Store:
    """The (not yet opened) store for ``settings.database_url``."""
    timeout = settings.db_timeout_ms / 1000
    if settings.is_sqlite:
        return SqliteStore(sqlite_path(settings.database_url), catalog, timeout_s=timeout)
    return PostgresStore(settings.database_url, catalog, pool_size=settings.pool_size,
                         timeout_s=timeout, lock_timeout_ms=settings.lock_timeout_ms)
