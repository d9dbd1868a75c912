"""Who may claim: EXECUTE on the claim functions (``sql.CLAIM_FUNCTIONS``) for the roles install
names and for the functions' owner, never for PUBLIC.

The database checks no token signature: a role that may call ``fencing.claim`` can raise any
lock's fence for good (every legitimate holder is then stale) or hold a claim open. So the
claim functions are closed to PUBLIC when they are created (by ``install`` or by a proxy's
start), ``install`` grants them to its ``claim_roles`` and revokes them from every other role
granted them before, and ``check`` lists every role that can claim.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

import resource_proxy.dbfence.sql as sql

__all__ = ["close_claims", "claimers", "open_claims", "not_granted"]

_ACL = """
SELECT a.grantee, pg_get_userbyid(a.grantee), a.grantee = p.proowner,
       pg_has_role(current_user, p.proowner, 'MEMBER')
FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.oid = to_regprocedure(%(s)s) AND a.privilege_type = 'EXECUTE'"""

_CLAIMERS = """
SELECT r.rolname, r.rolsuper FROM pg_roles r
WHERE r.rolname !~ '^pg_' AND EXISTS (
    SELECT 1 FROM unnest(%(sigs)s::text[]) AS s(sig)
    WHERE to_regprocedure(s.sig) IS NOT NULL
      AND has_function_privilege(r.oid, to_regprocedure(s.sig), 'EXECUTE'))
ORDER BY 1"""


def _ddl(conn: sa.Connection, text: str) -> None:
    conn.exec_driver_sql(text.replace("%", "%%"))


def close_claims(conn: sa.Connection, changed: list[str],
                 roles: Sequence[str] | None = None) -> None:
    """Revoke EXECUTE on every claim function from PUBLIC (where the current role may manage
    the function: a member of its owner); with ``roles`` (``install``) also grant it to each of
    them and revoke it from every other role granted it explicitly. Appends what it did to
    ``changed``; nothing when all is as wanted (no catalog row is rewritten)."""
    for signature in sql.CLAIM_FUNCTIONS:
        acl = conn.exec_driver_sql(_ACL, {"s": signature}).all()
        if not acl or not acl[0][3]:
            continue  # missing, or another role's to manage
        for grantee, name, is_owner, _ in acl:
            if grantee == 0:
                _ddl(conn, f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
                changed.append(f"revoke EXECUTE on {signature} from PUBLIC")
            elif roles is not None and not is_owner and name not in roles:
                _ddl(conn, f"REVOKE EXECUTE ON FUNCTION {signature} FROM {sql.ident(name)}")
                changed.append(f"revoke EXECUTE on {signature} from {name}")
        for role in roles or ():
            if not conn.exec_driver_sql(
                    "SELECT has_function_privilege(%(r)s, %(s)s, 'EXECUTE')",
                    {"r": role, "s": signature}).scalar():
                _ddl(conn, f"GRANT EXECUTE ON FUNCTION {signature} TO {sql.ident(role)}")
                changed.append(f"grant EXECUTE on {signature} to {role}")


def claimers(conn: sa.Connection) -> list[tuple[str, bool]]:
    """``(role, is superuser)`` of every role that may execute some claim function."""
    return [(r[0], r[1]) for r in conn.exec_driver_sql(_CLAIMERS, {"sigs": sql.CLAIM_FUNCTIONS})]


def open_claims(conn: sa.Connection) -> list[str]:
    """The claim functions PUBLIC may execute (any role can raise a fence)."""
    return [signature for signature in sql.CLAIM_FUNCTIONS
            if any(row[0] == 0 for row in conn.exec_driver_sql(_ACL, {"s": signature}))]


def not_granted(conn: sa.Connection, signatures: Sequence[str]) -> str | None:
    """The first of ``signatures`` the current role may not execute, or None."""
    for signature in signatures:
        if not conn.exec_driver_sql("SELECT has_function_privilege(%(s)s, 'EXECUTE')",
                                    {"s": signature}).scalar():
            return signature
    return None
