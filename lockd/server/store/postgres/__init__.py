"""The PostgreSQL store: ``postgresql[+psycopg]://user:pass@host:port/db?…``.

Replicas that share one database are correct together: expiry by the database's clock, a
per-lock fence raised in the granting statement, releases announced by NOTIFY. One module per
concept: ``url`` (the URL's own parameters), ``sql`` (the exclusive leases' statements),
``sql_modes``/``modes`` (shared leases, mixed-mode lock sets, the schema upgrade),
``sql_sem``/``semaphores`` and ``sql_elect``/``elections`` (statements / store methods),
``listen`` (the LISTEN connection) and ``store`` (``PostgresStore``: the pool and the ``Store``
protocol). The design: docs/stores/postgres.md.
"""

from lockd.server.store.postgres.sql import CHANNEL
from lockd.server.store.postgres.store import PostgresStore
from lockd.server.store.postgres.url import libpq_url

__all__ = ["CHANNEL", "PostgresStore", "libpq_url"]
