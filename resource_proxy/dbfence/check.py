"""``check``: is every protected table guarded in the database, and who can get around the guard?

The triggers refuse rows whose lock this transaction has not claimed; they cannot refuse a role
that can remove or outrun them. ``check`` lists, for the tables of the policy (and the
partitions and inheritance children they govern):

- ``missing``: a relation without the row trigger or the TRUNCATE trigger, or with the trigger
  of another template (the policy changed since install), or a fence schema not installed;
- ``later``: a BEFORE ROW trigger of the user's that fires after ours (trigger names sort in
  C order) and could change the row after it was checked;
- ``disabled``: a trigger not enabled ALWAYS (``D`` disabled; ``O``/``R`` would be skipped under
  one value of ``session_replication_role``);
- ``bypass``: roles that can get past the triggers: superusers; members of a table's owner role
  (ALTER TABLE ... DISABLE TRIGGER, DROP TRIGGER); roles with TRIGGER on a table (a BEFORE
  trigger sorting after ours can change the row after the check); roles that may write
  ``fencing.fences`` directly (a fence moved backwards lets a stale holder in again) or own
  the ``fencing`` functions (can replace them); roles granted SET on
  ``session_replication_role`` (harmless to ALWAYS triggers, listed because they also skip
  every ordinary trigger and foreign key); the exempt roles named at install;
- ``claimers``: every role that may execute a claim function (``grants``), and ``open_claims``
  those PUBLIC may execute (any role could raise a fence for good).

``ok`` (``db check`` exits 0) when nothing is missing, disabled or fires after the check, no
claim function is open to PUBLIC, and only superusers can bypass the triggers (they are listed:
no grant can stop them).

Trust model: the database trusts a writer's claims (``fencing.claim`` checks the fence against
the highest, not a token signature), and a writer that sets the transaction-local setting
``fencing.claims`` itself forges a claim. The triggers keep well-meaning writers with stale
fences out; grants are what keep other writers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

import resource_proxy.dbfence.sql as sql
from resource_proxy.dbfence.grants import claimers, open_claims
from resource_proxy.dbfence.plan import plan
from resource_proxy.policy import Policy

__all__ = ["CheckReport", "check"]


@dataclass(slots=True)
class CheckReport:
    """One line per finding; ``ok`` as the module says (``bypass`` always lists at least the
    superusers, which no trigger can stop; ``bypassers`` the other roles that can)."""

    missing: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    bypass: list[str] = field(default_factory=list)
    tables: dict[str, str] = field(default_factory=dict)
    later: list[str] = field(default_factory=list)
    claimers: list[str] = field(default_factory=list)
    open_claims: list[str] = field(default_factory=list)
    bypassers: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.disabled or self.later or self.open_claims
                    or self.bypassers)

    def lines(self) -> list[str]:
        out = [f"protected: {t} under lock {tpl!r}" for t, tpl in self.tables.items()]
        out += [f"MISSING: {line}" for line in self.missing]
        out += [f"DISABLED: {line}" for line in self.disabled]
        out += [f"AFTER THE CHECK: {line}" for line in self.later]
        out += [f"OPEN CLAIM: PUBLIC may execute {sig}: any role can raise a fence "
                "(resource-proxy db install revokes it)" for sig in self.open_claims]
        out += [f"can claim: {line}" for line in self.claimers]
        out += [f"can bypass: {line}" for line in self.bypass]
        return out


_TRIGGERS = """
SELECT c.relname, t.tgname, t.tgfoid::regprocedure::text, t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND t.tgname IN (%(a)s, %(b)s)"""

# BEFORE ROW INSERT/UPDATE triggers (tgtype bits: ROW 1, BEFORE 2, INSERT 4, UPDATE 16) that
# fire after ours (names in C order): they may change NEW after the fence check.
_LATER = """
SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relname = ANY(%(rels)s) AND NOT t.tgisinternal
  AND t.tgtype & 3 = 3 AND t.tgtype & 20 <> 0 AND t.tgenabled <> 'D'
  AND t.tgname COLLATE "C" > %(ours)s COLLATE "C" ORDER BY 1, 2"""

_ROLES = """
SELECT r.rolname, r.rolsuper,
       coalesce(has_parameter_privilege(r.oid, 'session_replication_role', 'SET'), false)
FROM pg_roles r WHERE r.rolname !~ '^pg_' ORDER BY r.rolname"""

_TABLE_RIGHTS = """
SELECT r.rolname, c.relname, pg_has_role(r.oid, c.relowner, 'MEMBER'),
       has_table_privilege(r.oid, c.oid, 'TRIGGER')
FROM pg_roles r CROSS JOIN pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relname = ANY(%(rels)s) AND r.rolname !~ '^pg_'
  AND NOT r.rolsuper ORDER BY 1, 2"""

_FENCE_RIGHTS = """
SELECT r.rolname,
       has_table_privilege(r.oid, 'fencing.fences', 'INSERT, UPDATE, DELETE, TRUNCATE'),
       EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname = 'fencing' AND pg_has_role(r.oid, p.proowner, 'MEMBER'))
FROM pg_roles r WHERE r.rolname !~ '^pg_' AND NOT r.rolsuper ORDER BY 1"""


def check(engine: sa.Engine, policy: Policy | None = None,
          tables: Sequence[str] | None = None) -> CheckReport:
    """Compare the database with the plan of ``policy`` over ``tables`` (as ``install`` takes
    them); read-only. Raises ``DbFencingError`` as ``install`` does for a policy the database
    cannot enforce."""
    protected = plan(engine, policy, tables)
    report = CheckReport(tables={p.table: p.template.text for p in protected})
    with engine.connect() as conn:
        installed = conn.exec_driver_sql(
            "SELECT to_regprocedure('fencing.claim(text,bigint)') IS NOT NULL").scalar()
        if not installed:
            report.missing.append("schema fencing is not installed (resource-proxy db install)")
        triggers = {(r[0], r[1]): (r[2], r[3]) for r in conn.exec_driver_sql(
            _TRIGGERS, {"a": sql.TRIGGER, "b": sql.TRUNCATE_TRIGGER})}
        relations: list[str] = []
        for item in protected:
            guard = f"fencing.{sql.ident(item.guard_function)}()"
            if installed and not _same_template(conn, guard, item.guard_sql()):
                report.missing.append(
                    f"table {item.table!r}: its installed trigger binds rows to other lock "
                    f"names than the policy's {item.template.text!r} (installed from another "
                    "policy: run resource-proxy db install with this policy)")
            wanted = [(r, sql.TRIGGER, guard) for r in [*item.row_trigger_on, *item.partitions]]
            wanted += [(r, sql.TRUNCATE_TRIGGER, "fencing.guard_truncate()")
                       for r in item.truncate_trigger_on]
            for relation, name, function in wanted:
                relations.append(relation)
                what = f"table {relation!r}" + (
                    f" (governed by {item.table!r})" if relation != item.table else "")
                found = triggers.get((relation, name))
                if found is None:
                    report.missing.append(f"{what} has no trigger {name}")
                    continue
                if _plain(found[0]) != _plain(function):
                    report.missing.append(f"{what}: trigger {name} calls {found[0]}, not "
                                          f"{function} (run install again)")
                if found[1] != "A":
                    state = {"D": "disabled", "O": "enabled only outside replica mode",
                             "R": "enabled only in replica mode"}.get(found[1], found[1])
                    report.disabled.append(f"{what}: trigger {name} is {state}")
        for relation, name in conn.exec_driver_sql(
                _LATER, {"rels": sorted(set(relations)), "ours": sql.TRIGGER}):
            report.later.append(f"table {relation!r}: trigger {name!r} (BEFORE ROW) fires after "
                                f"{sql.TRIGGER} and may change the row after the fence check")
        for line, role in _bypass(conn, sorted(set(relations)), installed):
            report.bypass.append(line)
            if role is not None:
                report.bypassers.add(role)
        if installed:
            report.open_claims = open_claims(conn)
            report.claimers = [f"{role} (superuser)" if superuser else role
                               for role, superuser in claimers(conn)]
    return report


def _same_template(conn: sa.Connection, guard: str, text: str) -> bool:
    """Whether the installed ``guard`` function is the one ``text`` defines (install's COMMENT
    digest); a missing function is reported by the trigger check, not here."""
    mark = conn.exec_driver_sql(
        "SELECT obj_description(to_regprocedure(%(g)s), 'pg_proc')", {"g": guard}).scalar()
    return mark is None or mark == sql.digest(text)


def _plain(signature: str) -> str:
    return signature.replace('"', "")


def _bypass(conn: sa.Connection, relations: list[str],
            installed: bool) -> list[tuple[str, str | None]]:
    """``(line, role)`` per way around the triggers; ``role`` None for a superuser."""
    out: list[tuple[str, str | None]] = []
    for role, superuser, replica in conn.exec_driver_sql(_ROLES):
        if superuser:
            out.append((f"{role}: superuser (can drop or disable any trigger)", None))
        elif replica:
            out.append((f"{role}: may SET session_replication_role (skips ordinary triggers "
                        "and foreign keys; the fence triggers are enabled ALWAYS)", role))
    owners: dict[str, list[str]] = {}
    triggers: dict[str, list[str]] = {}
    for role, relation, owner, trigger in conn.exec_driver_sql(_TABLE_RIGHTS, {"rels": relations}):
        if owner:
            owners.setdefault(role, []).append(relation)
        elif trigger:
            triggers.setdefault(role, []).append(relation)
    for role, rels in owners.items():
        out.append((f"{role}: owns (or is a member of the owner of) {', '.join(rels)} "
                    "(can disable or drop the triggers)", role))
    for role, rels in triggers.items():
        out.append((f"{role}: has TRIGGER on {', '.join(rels)} (a trigger of its own can "
                    "change a row after the check)", role))
    if installed:
        for role, writes, owns in conn.exec_driver_sql(_FENCE_RIGHTS):
            if owns:
                out.append((f"{role}: owns the fencing functions (can replace them)", role))
            elif writes:
                out.append((f"{role}: may write fencing.fences directly (can move a fence "
                            "back)", role))
        exempt = conn.exec_driver_sql(
            "SELECT pg_get_functiondef(to_regprocedure('fencing.exempt()'))").scalar() or ""
        for role, superuser in conn.exec_driver_sql(
                "SELECT rolname, rolsuper FROM pg_roles ORDER BY 1"):
            if sql.literal(role) in exempt:
                out.append((f"{role}: exempt from the fence check (named at install)",
                            None if superuser else role))
    return out
