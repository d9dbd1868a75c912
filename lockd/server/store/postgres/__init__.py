"""The PostgreSQL store: ``postgresql[+psycopg]://user:pass@host:port/db?…``.

``store`` (``PostgresStore``: the pool, the schema, error translation), ``locks`` (``modes``:
shared holders and mixed-mode sets), ``semaphores``, ``elections``; their statements in
``sql``, ``sql_modes``, ``sql_sem``, ``sql_elect``; ``listen`` (the LISTEN connection) and
``url`` (the store's own URL parameters). The design: docs/stores/postgres.md.
"""

from lockd.server.store.postgres.sql import CHANNEL
from lockd.server.store.postgres.store import PostgresStore
from lockd.server.store.postgres.url import libpq_url

__all__ = ["CHANNEL", "PostgresStore", "libpq_url"]
