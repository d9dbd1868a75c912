"""The ``sql`` workload's protected tables: fenced inside PostgreSQL, written with plain SQL.

Beside ``accounts`` (``chaos.db``), two tables whose rows belong to account locks::

    orders      (account, id)                          lock accounts/{account}
    order_lines (owner, account, order_id, line)       lock accounts/{owner}
                FOREIGN KEY (account, order_id) REFERENCES orders ON DELETE CASCADE

so deleting an order of account ``a`` deletes, by cascade, lines owned by other accounts: rows of
other locks, which the transaction must have claimed too. ``protect`` installs the database's
own fence triggers (``resource_proxy.dbfence.install``) on ``accounts``, ``orders``,
``order_lines`` and the near tables (``chaos.near``) with these templates; nothing else of the
chaos schema is protected (``history`` is written by triggers, ``counter``/``marks`` by the
proxy of the other workloads).

History (``chaos.db``'s table, stamped with the commit order at COMMIT): account updates as
``kind = 'account'`` (``chaos.db``'s trigger); every insert, update and delete of an order or a
line as one row per lock it touches, ``op`` = the transaction's ``chaos.op`` setting (the worker
sets it first, ``SET LOCAL``), ``worker`` = the account whose lock governs the row image:

==============  ====================================================================
``order_ins``   an order inserted (``worker`` = its account)
``order_del``   an order deleted
``line_ins``    a line inserted (``worker`` = its owner)
``line_upd``    a line updated (the NEW image's owner)
``line_out``    a line updated away from its owner (the OLD image's owner, when it changed)
``line_del``    a line deleted (directly or by the cascade)
==============  ====================================================================

and each change of ``fencing.fences`` as ``kind = 'fence'`` (``op`` = the lock, ``fence`` = the
highest), like the proxy's fence table in the other workloads.
"""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

from chaos.db import ResourceDB
from chaos.near import NEAR_SPACES, NEAR_TABLES
from resource_proxy.dbfence import install
from resource_proxy.policy import Policy, TablePolicy, Template

__all__ = ["SQL_TABLES", "SQL_POLICY", "create_sql_schema", "protect"]

SQL_POLICY = {"accounts": "accounts/{id}", "orders": "accounts/{account}",
              "order_lines": "accounts/{owner}",
              **dict(zip(NEAR_TABLES, NEAR_SPACES["sql"], strict=True))}
"""Table -> lock template: every row of the three tables belongs to one account lock; the
near tables' rows to ``accounts/{n}`` and ``accounts/{n}/x`` (``chaos.near``)."""
SQL_TABLES = tuple(SQL_POLICY)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (account integer NOT NULL, id text NOT NULL, op text,
    PRIMARY KEY (account, id));
CREATE TABLE IF NOT EXISTS order_lines (owner integer NOT NULL, account integer NOT NULL,
    order_id text NOT NULL, line integer NOT NULL, op text, fence bigint,
    PRIMARY KEY (owner, account, order_id, line),
    FOREIGN KEY (account, order_id) REFERENCES orders (account, id) ON DELETE CASCADE);
CREATE INDEX IF NOT EXISTS order_lines_order ON order_lines (account, order_id);

CREATE OR REPLACE FUNCTION chaos_log_sql() RETURNS trigger LANGUAGE plpgsql
    SET search_path = public AS $$
DECLARE
    who text := coalesce(current_setting('chaos.op', true), '');
BEGIN
    IF TG_TABLE_NAME = 'orders' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO history (kind, op, worker) VALUES ('order_ins', who, NEW.account::text);
        ELSE
            INSERT INTO history (kind, op, worker) VALUES ('order_del', who, OLD.account::text);
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO history (kind, op, worker, fence) VALUES ('line_ins', who, NEW.owner::text, NEW.fence);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO history (kind, op, worker, fence) VALUES ('line_upd', who, NEW.owner::text, NEW.fence);
        IF NEW.owner IS DISTINCT FROM OLD.owner THEN
            INSERT INTO history (kind, op, worker, fence) VALUES ('line_out', who, OLD.owner::text, NEW.fence);
        END IF;
    ELSE
        INSERT INTO history (kind, op, worker, fence) VALUES ('line_del', who, OLD.owner::text, OLD.fence);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_log_sql ON orders;
CREATE TRIGGER chaos_log_sql AFTER INSERT OR DELETE ON orders FOR EACH ROW
    EXECUTE FUNCTION chaos_log_sql();
DROP TRIGGER IF EXISTS chaos_log_sql ON order_lines;
CREATE TRIGGER chaos_log_sql AFTER INSERT OR UPDATE OR DELETE ON order_lines FOR EACH ROW
    EXECUTE FUNCTION chaos_log_sql();
"""




def create_sql_schema(db_url: str) -> None:
    """``orders``, ``order_lines`` and their history triggers (after ``chaos.db``'s schema)."""
    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(_SCHEMA)


def protect(db_url: str) -> list[str]:
    """Install the database's fence triggers on ``SQL_TABLES`` (``SQL_POLICY``) and log every
    change of ``fencing.fences`` into ``history``. Returns the install report's lines."""
    policy = Policy({t: TablePolicy(Template.parse(tpl, t)) for t, tpl in SQL_POLICY.items()})
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1),
                              poolclass=sa.pool.NullPool)
    try:
        report = install(engine, policy, list(SQL_TABLES))
    finally:
        engine.dispose()
    ResourceDB(db_url).watch_fences()  # the same watcher as the proxy's workloads
    return report.lines()
