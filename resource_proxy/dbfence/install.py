"""``install`` and ``uninstall``: put the fence triggers into a PostgreSQL database, or take them out.

``install`` is idempotent: every function and trigger it creates carries a COMMENT with a hash
of its definition, and an object whose hash and state already match is left alone, so a second
install with the same policy changes nothing in the catalog. With another policy it converges:
triggers and functions of tables no longer protected are removed, within its scope: every table
of the schema, or with ``tables`` those tables (and the partitions and inheritance children they
govern); a table outside the scope keeps its triggers (``left_alone`` names them). The claim
functions' EXECUTE converges to the owner and ``claim_roles`` (``grants``). The whole install
is one transaction (DDL is transactional in PostgreSQL), serialized by an advisory lock.

Ownership: everything in schema ``fencing`` belongs to whoever created the schema. A proxy that
creates it at start does so for the owner of its fenced tables when it may act as that role
(``ensure_core``'s ``owner``), so that ``install`` run by the tables' owner, the role that may
put triggers on them, can complete it; an install by a role that may not manage the schema is
refused in one line naming its owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

import resource_proxy.dbfence.sql as sql
from resource_proxy.dbfence.grants import close_claims
from resource_proxy.dbfence.plan import DbFencingError, Protected, governed, plan, relations
from resource_proxy.policy import Policy

__all__ = ["InstallReport", "ensure_core", "install", "uninstall"]

_ADVISORY_KEY = 0x4442_4645_4E43  # "DBFENC": one install/uninstall at a time


@dataclass(slots=True)
class InstallReport:
    """What ``install``/``uninstall`` did. ``changed``: the objects created, replaced or
    dropped (empty on a repeated install); ``tables``: ``{table: template}``; ``covers``:
    ``{table: [partitions and inheritance children governed by it]}``."""

    tables: dict[str, str] = field(default_factory=dict)
    covers: dict[str, list[str]] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)
    moved_fence_table: bool = False
    exempt_roles: list[str] = field(default_factory=list)
    claim_roles: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{t}: lock {tpl!r}" + (f" (also governs {', '.join(self.covers[t])})"
                                       if self.covers.get(t) else "")
               for t, tpl in self.tables.items()]
        if self.moved_fence_table:
            out.append("moved resource_proxy.fences to fencing.fences (every fence kept)")
        if self.exempt_roles:
            out.append(f"exempt roles: {', '.join(self.exempt_roles)}")
        if self.claim_roles:
            out.append(f"claim roles: {', '.join(self.claim_roles)}")
        if self.left_alone:
            out.append(f"left alone (outside --tables): {', '.join(self.left_alone)}")
        out.append(f"{len(self.changed)} object(s) changed" if self.changed else "no change")
        return out


def _ddl(conn: sa.Connection, text: str) -> None:
    """Run a statement without parameters (``%`` doubled: the driver still parses them)."""
    conn.exec_driver_sql(text.replace("%", "%%"))


def _comment(conn: sa.Connection, kind: str, target: str) -> str | None:
    if kind == "function":
        return conn.exec_driver_sql(
            "SELECT obj_description(to_regprocedure(%(t)s), 'pg_proc')", {"t": target}).scalar()
    raise AssertionError(kind)


def _ensure_function(conn: sa.Connection, signature: str, text: str, report: InstallReport) -> None:
    mark = sql.digest(text)
    if _comment(conn, "function", signature) == mark:
        return
    _ddl(conn, text)
    _ddl(conn, f"COMMENT ON FUNCTION {signature} IS {sql.literal(mark)}")
    report.changed.append(f"function {signature}")


def _triggers(conn: sa.Connection) -> dict[tuple[str, str], tuple[str, str, str | None, bool]]:
    """Our triggers in the current schema: (relation, name) -> (function, tgenabled, comment,
    is a partition clone)."""
    rows = conn.exec_driver_sql("""
        SELECT c.relname, t.tgname, t.tgfoid::regprocedure::text, t.tgenabled::text,
               obj_description(t.oid, 'pg_trigger'), t.tgparentid <> 0
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND t.tgname IN (%(a)s, %(b)s)""",
        {"a": sql.TRIGGER, "b": sql.TRUNCATE_TRIGGER}).all()
    return {(r[0], r[1]): (r[2], r[3], r[4], r[5]) for r in rows}


def _qualified(schema: str, name: str) -> str:
    return f"{sql.ident(schema)}.{sql.ident(name)}"


def _ensure_trigger(conn: sa.Connection, existing: dict, schema: str, relation: str, name: str,
                    statements: list[str], function: str, report: InstallReport) -> None:
    mark = sql.digest("\n".join(statements))
    target = _qualified(schema, relation)
    found = existing.get((relation, name))
    if found is not None:
        current_fn, enabled, comment, _clone = found
        if comment == mark and current_fn == function and enabled == "A":
            return
        if comment == mark and current_fn == function:
            _ddl(conn, f"ALTER TABLE {target} ENABLE ALWAYS TRIGGER {name}")
            report.changed.append(f"trigger {name} on {relation} enabled")
            return
        _ddl(conn, f"DROP TRIGGER {name} ON {target}")
    for statement in statements:
        _ddl(conn, statement)
    _ddl(conn, f"COMMENT ON TRIGGER {name} ON {target} IS {sql.literal(mark)}")
    report.changed.append(f"trigger {name} on {relation}")


# Asked of the catalog, not with to_regclass: a role without USAGE on the proxy's schema (the
# tables' owner running install after a proxy ran) may still learn whether the table is there.
_LEGACY = """SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'resource_proxy' AND c.relname = 'fences' AND c.relkind = 'r'"""


def _create_schema(conn: sa.Connection, owner: str | None, report: InstallReport) -> None:
    """Create schema ``fencing``, for ``owner`` when given and the current role may act as it
    (then the rest of the transaction runs as ``owner``: ``SET LOCAL ROLE``)."""
    me = conn.exec_driver_sql("SELECT current_user").scalar()
    if owner is None or owner == me or not conn.exec_driver_sql(
            "SELECT pg_has_role(current_user, %(o)s, 'MEMBER')", {"o": owner}).scalar():
        _ddl(conn, sql.SCHEMA_DDL[0])
        return
    _ddl(conn, f"{sql.SCHEMA_DDL[0]} AUTHORIZATION {sql.ident(owner)}")
    _ddl(conn, f"SET LOCAL ROLE {sql.ident(owner)}")
    report.changed.append(f"schema fencing (owned by {owner}, the owner of the fenced tables)")


def _ensure_fence_table(conn: sa.Connection, report: InstallReport, owner: str | None) -> None:
    if conn.exec_driver_sql("SELECT to_regnamespace('fencing')").scalar() is None:
        _create_schema(conn, owner, report)  # asked first: CREATE needs a right an unchanged one does not
    exists = conn.exec_driver_sql("SELECT to_regclass('fencing.fences')").scalar()
    legacy = conn.exec_driver_sql(_LEGACY).scalar()
    if exists is None and legacy is not None:
        _ddl(conn, "ALTER TABLE resource_proxy.fences SET SCHEMA fencing")
        report.moved_fence_table = True
        report.changed.append("table fencing.fences (moved from resource_proxy.fences)")
    elif exists is None:
        _ddl(conn, sql.SCHEMA_DDL[1])
        report.changed.append("table fencing.fences")
    for granted, grant in sql.GRANTS:
        if not conn.exec_driver_sql(granted).scalar():
            _ddl(conn, grant)
            report.changed.append(grant)


def ensure_core(conn: sa.Connection, report: InstallReport | None = None, *,
                owner: str | None = None) -> InstallReport:
    """Create what every fenced writer calls (schema ``fencing``, ``fencing.fences``, the claim
    and key functions, EXECUTE on the claim functions closed to PUBLIC), no trigger, inside the
    caller's transaction; ``resource_proxy.fences`` is moved there if only that one exists
    (every fence kept). ``owner``: the role to create the schema for, when it is created now
    (the proxy's fenced tables' owner). Idempotent: an unchanged object is left alone. Returns
    ``report`` (or a new one) with what changed. The proxy calls it at every start, several
    proxies at once: serialized with ``install`` by one advisory lock."""
    report = report if report is not None else InstallReport()
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": _ADVISORY_KEY})
    _ensure_fence_table(conn, report, owner)
    for signature, text in sql.BASE:
        _ensure_function(conn, signature, text, report)
    close_claims(conn, report.changed)
    conn.exec_driver_sql("RESET ROLE")
    return report


def _refuse_foreign_schema(conn: sa.Connection) -> None:
    """``DbFencingError`` if schema ``fencing`` belongs to a role the current one cannot act as
    (its functions could not be replaced, nor their EXECUTE granted)."""
    owner = conn.exec_driver_sql(
        "SELECT pg_get_userbyid(nspowner), pg_has_role(current_user, nspowner, 'MEMBER') "
        "FROM pg_namespace WHERE nspname = 'fencing'").first()
    if owner is not None and not owner[1]:
        me = conn.exec_driver_sql("SELECT current_user").scalar()
        raise DbFencingError(
            f"schema fencing belongs to role {owner[0]!r} (a proxy running as {owner[0]!r} "
            f"created it?): run db install as {owner[0]!r} or a superuser, or make {me!r} a "
            f"member of it (GRANT {sql.ident(owner[0])} TO {sql.ident(me)})")


def install(engine: sa.Engine, policy: Policy | None = None, tables: Sequence[str] | None = None,
            exempt_roles: Sequence[str] = (), claim_roles: Sequence[str] = ()) -> InstallReport:
    """Install database-side fencing for ``policy`` (default: table T under lock T) over
    ``tables`` (default: every table of the current schema but partitions and inheritance
    children, which their root/parent governs; given, the other tables' triggers are left
    alone). ``exempt_roles``: roles whose writes skip the check (migrations), by exact
    ``current_user``. ``claim_roles``: the roles that may execute the claim functions besides
    their owner (the proxy's role unless it owns them, ``fenced_transaction``'s writers).

    Raises ``DbFencingError`` (one line) before changing anything if the policy cannot be
    enforced by the database (see ``plan``), a named role does not exist, or schema
    ``fencing`` belongs to a role the current one cannot act as.
    """
    protected = plan(engine, policy, tables)
    roles = list(dict.fromkeys(exempt_roles))
    claimers = list(dict.fromkeys(claim_roles))
    report = InstallReport(exempt_roles=roles, claim_roles=claimers)
    with engine.begin() as conn:
        missing = [r for r in dict.fromkeys([*roles, *claimers]) if conn.exec_driver_sql(
            "SELECT 1 FROM pg_roles WHERE rolname = %(r)s", {"r": r}).first() is None]
        if missing:
            raise DbFencingError(f"role(s) {missing} do not exist")
        _refuse_foreign_schema(conn)
        ensure_core(conn, report)
        close_claims(conn, report.changed, claimers)
        _ensure_function(conn, "fencing.exempt()", sql.exempt_function(roles), report)
        _ensure_function(conn, *sql.TRUNCATE_GUARD, report)
        existing = _triggers(conn)
        if tables is not None:  # outside the tables named: not ours to change
            scope = governed(relations(conn), tables)
            outside = {k: v for k, v in existing.items() if k[0] not in scope}
            report.left_alone = sorted(r for (r, name), found in outside.items()
                                       if name == sql.TRIGGER and not found[3])
            existing = {k: v for k, v in existing.items() if k[0] in scope}
        wanted: set[tuple[str, str]] = set()
        functions = _used_by(outside.values()) if tables is not None else set()
        for item in protected:
            _install_table(conn, item, existing, wanted, functions, report)
        _remove_stale(conn, existing, wanted, functions, report)
    return report


def _install_table(conn: sa.Connection, item: Protected, existing: dict,
                   wanted: set[tuple[str, str]], functions: set[str],
                   report: InstallReport) -> None:
    report.tables[item.table] = item.template.text
    report.covers[item.table] = [*item.partitions, *item.children]
    if item.lock_function is not None:
        args = ",".join(c.cast for c in item.columns)
        _ensure_function(conn, f"fencing.{sql.ident(item.lock_function)}({args})",
                         item.lock_sql(), report)
        functions.add(item.lock_function)
    guard = f"fencing.{sql.ident(item.guard_function)}()"
    _ensure_function(conn, guard, item.guard_sql(), report)
    functions.add(item.guard_function)
    regproc = conn.exec_driver_sql("SELECT %(g)s::regprocedure::text", {"g": guard}).scalar()
    for relation in item.row_trigger_on:
        wanted.add((relation, sql.TRIGGER))
        _ensure_trigger(conn, existing, item.schema, relation, sql.TRIGGER,
                        sql.guard_trigger(_qualified(item.schema, relation), item.guard_function),
                        regproc, report)
    for partition in item.partitions:  # PostgreSQL's clones: only their state is ours to fix
        wanted.add((partition, sql.TRIGGER))
        found = existing.get((partition, sql.TRIGGER))
        if found is not None and found[1] != "A":
            _ddl(conn, f"ALTER TABLE {_qualified(item.schema, partition)} "
                                 f"ENABLE ALWAYS TRIGGER {sql.TRIGGER}")
            report.changed.append(f"trigger {sql.TRIGGER} on {partition} enabled")
    truncate = conn.exec_driver_sql(
        "SELECT 'fencing.guard_truncate()'::regprocedure::text").scalar()
    for relation in item.truncate_trigger_on:
        wanted.add((relation, sql.TRUNCATE_TRIGGER))
        _ensure_trigger(conn, existing, item.schema, relation, sql.TRUNCATE_TRIGGER,
                        sql.truncate_trigger(_qualified(item.schema, relation)), truncate, report)


def _used_by(triggers) -> set[str]:
    """The guard and lock-name functions that ``triggers`` (values of ``_triggers``) call."""
    used: set[str] = set()
    for function, *_ in triggers:
        name = function.removeprefix("fencing.").split("(")[0].strip('"')
        if name.startswith("guard_of_"):
            used |= {name, "lock_of_" + name.removeprefix("guard_of_")}
    return used


def _remove_stale(conn: sa.Connection, existing: dict, wanted: set[tuple[str, str]],
                  functions: set[str], report: InstallReport) -> None:
    schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
    for (relation, name), (_fn, _enabled, _comment, clone) in existing.items():
        if (relation, name) not in wanted and not clone:
            _ddl(conn, f"DROP TRIGGER IF EXISTS {name} ON {_qualified(schema, relation)}")
            report.changed.append(f"trigger {name} on {relation} removed")
    stale = conn.exec_driver_sql("""
        SELECT p.oid::regprocedure::text, p.proname FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'fencing' AND (p.proname LIKE 'lock\\_of\\_%%'
                                         OR p.proname LIKE 'guard\\_of\\_%%')""").all()
    for signature, name in stale:
        if name not in functions:
            _ddl(conn, f"DROP FUNCTION {signature}")
            report.changed.append(f"function {signature} removed")


def uninstall(engine: sa.Engine, *, drop_fences: bool = False) -> InstallReport:
    """Remove every fence trigger (any schema) and every function of schema ``fencing``.

    The fence table ``fencing.fences`` is kept unless ``drop_fences``: its highest fences are
    what refuses a stale holder, and a fence that went backwards (a table dropped and created
    empty) would let a holder whose lease was superseded write again, through the proxy or
    after a later install.
    """
    report = InstallReport()
    with engine.begin() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": _ADVISORY_KEY})
        rows = conn.exec_driver_sql("""
            SELECT t.tgname, t.tgrelid::regclass::text FROM pg_trigger t
            JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'fencing' AND t.tgparentid = 0 ORDER BY 2, 1""").all()
        for name, relation in rows:
            _ddl(conn, f"DROP TRIGGER {sql.ident(name)} ON {relation}")
            report.changed.append(f"trigger {name} on {relation} removed")
        functions = conn.exec_driver_sql("""
            SELECT p.oid::regprocedure::text FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencing'
            ORDER BY 1""").scalars().all()
        for signature in functions:
            _ddl(conn, f"DROP FUNCTION IF EXISTS {signature}")
            report.changed.append(f"function {signature} removed")
        if drop_fences:
            _ddl(conn, "DROP SCHEMA IF EXISTS fencing CASCADE")
            report.changed.append("schema fencing (and its fence table) removed")
    return report
