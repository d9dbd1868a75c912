"""Whether each table the proxy fences is also fenced inside PostgreSQL (said at start).

The proxy's own check covers the writes that go through it; the row triggers of ``resource-proxy
db install`` (``dbfence``) cover every writer. At start the proxy says, in one line, which of its
fenced tables the database protects too, and ``--require-db-fencing`` refuses to start when one
is not (``DbFencingRequired``, the CLI's exit 2).

A table counts as protected when the database enforces the proxy's OWN template on it: the
guard (and lock-name) functions of ``dbfence``'s plan for this policy are installed unchanged
(the hash in their COMMENT matches), and the row trigger calling that guard is enabled ALWAYS on
the table and on every partition and inheritance child it governs. A trigger installed for
another policy is not protection: it would check other lock names than the proxy claims.
``resource-proxy db check`` gives the full picture (TRUNCATE triggers, who can bypass them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

import resource_proxy.dbfence.sql as sql
from resource_proxy.dbfence.plan import DbFencingError, Protected, plan
from resource_proxy.policy import Policy

__all__ = ["DbFencingRequired", "unprotected", "describe", "listed"]


class DbFencingRequired(ValueError):
    """``--require-db-fencing`` and a fenced table the database does not protect (one line)."""


_TRIGGERS = """
SELECT c.relname, t.tgfoid::regprocedure::text, t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND t.tgname = %(name)s"""

_COMMENT = "SELECT obj_description(to_regprocedure(%(s)s), 'pg_proc'), to_regprocedure(%(s)s)::text"


def _why(conn: sa.Connection, item: Protected, triggers: dict[str, tuple[str, str]]) -> str | None:
    """Why ``item`` is not protected as the plan wants it, or None."""
    functions = [(f"fencing.{sql.ident(item.guard_function)}()", item.guard_sql())]
    if item.lock_function is not None:
        args = ",".join(c.cast for c in item.columns)
        functions.append((f"fencing.{sql.ident(item.lock_function)}({args})", item.lock_sql()))
    guard = None
    for signature, text in functions:
        comment, regproc = conn.exec_driver_sql(_COMMENT, {"s": signature}).one()
        if regproc is None:
            return "no fence trigger"
        if comment != sql.digest(text):
            return "its fence trigger checks another lock template (run db install again)"
        guard = guard or regproc
    for relation in [*item.row_trigger_on, *item.partitions]:
        where = "" if relation == item.table else f" on {relation!r}"
        found = triggers.get(relation)
        if found is None:
            return f"no fence trigger{where}"
        if found[0] != guard:
            return f"the fence trigger{where} calls {found[0]} (run db install again)"
        if found[1] != "A":
            return f"the fence trigger{where} is not enabled ALWAYS"
    return None


def unprotected(engine: sa.Engine, policy: Policy, tables: Sequence[str] | None,
                fenced: Sequence[str]) -> dict[str, str]:
    """``{table: why}`` for each of ``fenced`` (the proxy's fenced tables, served with ``policy``
    over the allow-list ``tables``) that the database does not protect; empty if all are."""
    try:
        planned = {item.table: item for item in plan(engine, policy, tables)}
    except DbFencingError as exc:
        return {name: f"the database cannot enforce this policy: {exc}" for name in fenced}
    out: dict[str, str] = {}
    with engine.connect() as conn:
        triggers = {r[0]: (r[1], r[2])
                    for r in conn.exec_driver_sql(_TRIGGERS, {"name": sql.TRIGGER})}
        for name in fenced:
            item = planned.get(name)
            why = "no fence trigger" if item is None else _why(conn, item, triggers)
            if why is not None:
                out[name] = why
    return out


def listed(missing: dict[str, str]) -> str:
    """``a, b (why); c (why)``: the unprotected tables grouped by reason."""
    grouped: dict[str, list[str]] = {}
    for table, why in missing.items():
        grouped.setdefault(why, []).append(table)
    return "; ".join(f"{', '.join(tables)} ({why})" for why, tables in grouped.items())


def describe(fenced: Sequence[str], missing: dict[str, str]) -> str:
    """The start-up line: which fenced tables the database protects too, and which not."""
    covered = [t for t in fenced if t not in missing]
    parts = []
    if covered:
        parts.append(f"protected in the database too: {', '.join(covered)}")
    if missing:
        parts.append(f"NOT protected in the database (only writes through the proxy are "
                     f"fenced; resource-proxy db install): {listed(missing)}")
    return "database-side fencing: " + ("; ".join(parts) if parts else "no fenced table")
