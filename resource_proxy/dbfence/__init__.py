"""Fencing inside PostgreSQL: the stored row decides the lock, for the proxy and for plain SQL.

Entry points (each takes a SQLAlchemy ``Engine`` on the protected database)::

    install(engine, policy=None, tables=None, exempt_roles=()) -> InstallReport
    check(engine, policy=None, tables=None) -> CheckReport
    uninstall(engine, drop_fences=False) -> InstallReport
    refusal(column) -> str | None         # a key type the database cannot bind (proxy start)

``policy`` is a ``resource_proxy.policy.Policy`` (default: table T under lock T), ``tables`` the
proxy's allow-list (default: every table of the current schema). Errors: ``DbFencingError``
(a ``ValueError`` with one line). The SQL objects and their contract are in ``sql`` (schema
``fencing``: ``fences``, ``claim``, ``try_claim``, the row triggers) and docs/db-fencing.md.
"""

from resource_proxy.dbfence.check import CheckReport, check
from resource_proxy.dbfence.install import InstallReport, install, uninstall
from resource_proxy.dbfence.keys import refusal
from resource_proxy.dbfence.plan import DbFencingError

__all__ = ["install", "uninstall", "check", "refusal", "InstallReport", "CheckReport",
           "DbFencingError"]
