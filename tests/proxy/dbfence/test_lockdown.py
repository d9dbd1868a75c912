"""Who may claim, and under whose search path the checks run, on a real PostgreSQL with real
roles: ``install`` revokes EXECUTE on every claim function from PUBLIC and grants it to the roles
it names (the owner keeps it); every fencing function pins ``search_path``, so a role with a
schema of its own cannot change what a trigger computes; ``check`` lists who can claim and who
can bypass the triggers."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from resource_proxy.dbfence import DbFencingError, check, install
from resource_proxy.policy import Policy, TablePolicy, Template
from tests.proxy.dbfence.test_triggers import refused

HUGE = 2**63 - 1
CLAIMS = [
    f"SELECT fencing.claim('acc/1', {HUGE})",
    f"SELECT fencing.try_claim('acc/1', {HUGE})",
    f"SELECT fencing.claim_read('acc/1', {HUGE})",
    f"SELECT fencing.try_claim_read('acc/1', {HUGE})",
    f"SELECT * FROM fencing.try_claim_many(ARRAY['acc/1'], ARRAY[{HUGE}::bigint])",
    f"SELECT * FROM fencing.try_claim_many(ARRAY['acc/1'], ARRAY[{HUGE}::bigint], "
    "ARRAY['read'])",
]
POLICY = Policy({"acc": TablePolicy(Template.parse("acc/{id}", "acc")),
                 "lit": TablePolicy(Template.parse("lit", "lit"))})


@pytest.fixture
def role(db):
    """``role(prefix)``: a LOGIN role of this test's own with no rights; dropped at the end."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        db.run(f'CREATE ROLE "{name}" LOGIN')
        made.append(name)
        return name

    yield make
    for name in made:
        db.run(f'DROP OWNED BY "{name}"', f'DROP ROLE "{name}"')


@pytest.fixture
def acc(db):
    db.run("CREATE TABLE acc (id bigint PRIMARY KEY, v text)", "CREATE TABLE lit (id int PRIMARY KEY)")
    return db


def _as(db, role: str, autocommit: bool = False) -> psycopg.Connection:
    return psycopg.connect(db.dsn, user=role, autocommit=autocommit)


def test_a_login_role_without_a_grant_cannot_claim(acc, role):
    install(acc.engine, POLICY)
    nobody = role("nobody")
    with _as(acc, nobody, autocommit=True) as conn:
        for statement in CLAIMS:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement)
    assert acc.one("SELECT count(*) FROM fencing.fences") == (0,)


def test_named_claim_roles_and_the_owner_claim_and_install_converges(acc, role):
    app, other = role("app"), role("other")
    acc.run(f'GRANT SELECT, INSERT, UPDATE ON acc TO "{app}", "{other}"')
    report = install(acc.engine, POLICY, claim_roles=[app])
    assert f"claim roles: {app}" in report.lines()
    with _as(acc, app) as conn:
        conn.execute("SELECT fencing.claim('acc/1', 1)")
        conn.execute("INSERT INTO acc VALUES (1, 'app')")
        conn.commit()
    with _as(acc, other) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT fencing.claim('acc/2', 1)")
    with acc.connect() as conn:  # the owner (here the installing superuser) keeps it
        conn.execute("SELECT fencing.claim('acc/1', 2)")
        conn.rollback()
    assert install(acc.engine, POLICY, claim_roles=[app]).changed == []
    again = install(acc.engine, POLICY, claim_roles=[other])
    assert any(line.startswith("revoke") and app in line for line in again.changed), again.changed
    with _as(acc, app) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT fencing.try_claim('acc/1', 3)")
    with _as(acc, other) as conn:
        assert conn.execute("SELECT fencing.try_claim('acc/1', 3)").fetchone() == (3,)
    with pytest.raises(DbFencingError, match="do not exist"):
        install(acc.engine, POLICY, claim_roles=["no_such_role_x"])


def test_every_fencing_function_pins_its_search_path(acc):
    install(acc.engine, POLICY, exempt_roles=["postgres"])
    with acc.connect(autocommit=True) as conn:
        rows = conn.execute("SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc p "
                            "WHERE p.pronamespace = 'fencing'::regnamespace").fetchall()
    unpinned = [sig for sig, config in rows
                if "search_path=pg_catalog, pg_temp" not in (config or [])]
    assert len(rows) > 15 and unpinned == []


@pytest.mark.parametrize(("table", "statement"), [
    ("acc", "INSERT INTO acc VALUES (5, 'x')"),
    ("lit", "INSERT INTO lit VALUES (5)"),
])
def test_a_role_shadowing_a_function_cannot_write_without_a_claim(acc, role, table, statement):
    install(acc.engine, POLICY)
    shadow = role("shadow")
    acc.run(f'CREATE SCHEMA "{shadow}" AUTHORIZATION "{shadow}"',
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON acc, lit TO "{shadow}"')
    with _as(acc, shadow) as conn:
        conn.execute(f'CREATE FUNCTION "{shadow}".strpos(text, text) RETURNS int '
                     "LANGUAGE sql AS $$ SELECT 1 $$")
        conn.commit()
        conn.execute(f'SET search_path = "{shadow}", pg_catalog, public')
        assert conn.execute("SELECT strpos('a', 'b')").fetchone() == (1,)  # shadowed here
        error = refused(conn, statement)
        assert error.sqlstate == "LF002" and f'lock "{table if table == "lit" else "acc/5"}"' \
            in str(error)
    assert acc.one(f"SELECT count(*) FROM {table}") == (0,)


def test_check_lists_who_can_claim_and_fails_when_a_role_can_bypass(acc, role):
    app = role("app")
    install(acc.engine, POLICY, claim_roles=[app])
    report = check(acc.engine, POLICY)
    assert report.ok, report.lines()
    assert f"can claim: {app}" in report.lines()
    assert "can claim: postgres (superuser)" in report.lines()
    assert any(line.startswith("can bypass: postgres: superuser") for line in report.lines())
    acc.run(f'GRANT TRIGGER ON acc TO "{app}"')
    report = check(acc.engine, POLICY)
    assert not report.ok
    assert f"can bypass: {app}: has TRIGGER on acc (a trigger of its own can change a row " \
           "after the check)" in report.lines()
    acc.run(f'REVOKE TRIGGER ON acc FROM "{app}"',
            "GRANT EXECUTE ON FUNCTION fencing.claim_read(text,bigint) TO PUBLIC")
    report = check(acc.engine, POLICY)
    assert not report.ok
    assert ("OPEN CLAIM: PUBLIC may execute fencing.claim_read(text,bigint): any role can "
            "raise a fence (resource-proxy db install revokes it)") in report.lines()
