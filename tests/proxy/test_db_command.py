"""``resource-proxy db install|check|uninstall`` as a process, on a fresh PostgreSQL database."""

from __future__ import annotations

import os
import subprocess
import uuid

import psycopg
import pytest

from harness import VENV_BIN


def _db(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "resource-proxy"), "db", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def _run(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _catalog(dsn: str) -> list[tuple]:
    """Every catalog row install writes (functions, triggers, comments) with its xmin."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("""
            SELECT 'f', p.oid::regprocedure::text, p.xmin::text FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencing'
            UNION ALL SELECT 't', t.tgname || ' ' || t.tgrelid::regclass::text, t.xmin::text
            FROM pg_trigger t WHERE t.tgname LIKE 'zz_fencing%'
            UNION ALL SELECT 'c', d.objoid::text, d.xmin::text FROM pg_description d
            ORDER BY 1, 2""").fetchall()


def test_install_check_uninstall_through_the_cli(pg_dsn, tmp_path):
    _run(pg_dsn, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)",
         "CREATE TABLE ledger (id bigint PRIMARY KEY, v text)")
    policy = tmp_path / "policy.yaml"
    policy.write_text('tables:\n  jobs: "jobs/{key}"\n')

    first = _db("install", "--database-url", pg_dsn, "--policy", str(policy))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert "jobs: lock 'jobs/{key}'" in lines and "ledger: lock 'ledger'" in lines
    assert lines[-1].endswith("object(s) changed"), lines
    before = _catalog(pg_dsn)

    # the same configuration from the serve command's environment variables: nothing changes
    again = _db("install", env={"PROXY_DATABASE_URL": pg_dsn, "PROXY_POLICY": str(policy)})
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "no change"
    assert _catalog(pg_dsn) == before, "a second install rewrites no catalog row"

    ok = _db("check", "--database-url", pg_dsn, "--policy", str(policy))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "protected: jobs under lock 'jobs/{key}'" in ok.stdout.splitlines()
    assert "MISSING" not in ok.stdout

    # A table created after install is unprotected: check names it and exits 1.
    _run(pg_dsn, "CREATE TABLE late (id bigint PRIMARY KEY)")
    found = _db("check", "--database-url", pg_dsn, "--policy", str(policy))
    assert found.returncode == 1, found.stdout
    assert "MISSING: table 'late' has no trigger zz_fencing_guard" in found.stdout.splitlines()
    only = _db("check", "--database-url", pg_dsn, "--policy", str(policy), "--tables", "jobs")
    assert only.returncode == 0, "--tables limits the check to the allow-list"

    # The triggers refuse a plain write without a claim (the lock named), then uninstall.
    with pytest.raises(psycopg.Error, match='lock "jobs/1"') as refused:
        _run(pg_dsn, "INSERT INTO jobs VALUES (1, 'queued')")
    assert refused.value.sqlstate == "LF002"
    gone = _db("uninstall", "--database-url", pg_dsn)
    assert gone.returncode == 0, gone.stderr
    assert "trigger zz_fencing_guard on jobs removed" in gone.stdout.splitlines()
    _run(pg_dsn, "INSERT INTO jobs VALUES (1, 'queued')")  # unfenced again
    after = _db("check", "--database-url", pg_dsn, "--policy", str(policy))
    assert after.returncode == 1
    assert "MISSING: schema fencing is not installed (resource-proxy db install)" in after.stdout
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass('fencing.fences')").fetchone() == ("fencing.fences",), \
            "uninstall keeps the fence table (a stale holder's fence is not forgotten)"


def test_a_policy_the_database_cannot_enforce_is_one_line_exit_2(pg_dsn, tmp_path):
    _run(pg_dsn, "CREATE TABLE slots (at timetz PRIMARY KEY, v text)",
         "CREATE TABLE meas (id int, v text) PARTITION BY RANGE (id)",
         "CREATE TABLE meas_lo PARTITION OF meas FOR VALUES FROM (0) TO (100)")
    policy = tmp_path / "policy.yaml"
    policy.write_text('tables:\n  slots: "slots/{key}"\n')
    refused = _db("install", "--database-url", pg_dsn, "--policy", str(policy))
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "'at' (time with time zone) cannot be bound to a lock" in refused.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('fencing')").fetchone() == (None,), \
            "a refused install changes nothing"

    partition = _db("install", "--database-url", pg_dsn, "--tables", "meas_lo",
                    env={"PROXY_POLICY": ""})
    assert partition.returncode == 2 and "partition of 'meas'" in partition.stderr
    checked = _db("check", "--database-url", pg_dsn, "--policy", str(policy))
    assert checked.returncode == 2 and len(checked.stderr.splitlines()) == 1

    assert _db("install", env={"PROXY_DATABASE_URL": ""}).returncode == 2
    sqlite = _db("install", "--database-url", f"sqlite:///{tmp_path / 'r.db'}")
    assert sqlite.returncode == 2 and "needs PostgreSQL" in sqlite.stderr


def test_check_exits_1_while_a_role_other_than_a_superuser_can_bypass(pg_dsn):
    role = f"bypass_{uuid.uuid4().hex[:8]}"
    _run(pg_dsn, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)",
         f'CREATE ROLE "{role}"', f'GRANT TRIGGER ON jobs TO "{role}"')
    try:
        assert _db("install", "--database-url", pg_dsn, "--claim-role", role).returncode == 0
        found = _db("check", "--database-url", pg_dsn)
        assert found.returncode == 1, found.stdout
        lines = found.stdout.splitlines()
        assert f"can bypass: {role}: has TRIGGER on jobs (a trigger of its own can change a " \
               "row after the check)" in lines
        assert f"can claim: {role}" in lines and "can claim: postgres (superuser)" in lines
        _run(pg_dsn, f'REVOKE TRIGGER ON jobs FROM "{role}"')
        ok = _db("check", "--database-url", pg_dsn)
        assert ok.returncode == 0, ok.stdout
        assert "can bypass: postgres: superuser (can drop or disable any trigger)" in \
            ok.stdout.splitlines(), "superusers are listed; no grant can stop them"
    finally:
        _run(pg_dsn, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"')


def test_check_exits_1_when_the_installed_template_is_not_the_policys(pg_dsn, tmp_path):
    """The triggers were installed from one policy; check is given another: the rows would be
    bound to other lock names than the proxy's, so check says so and exits 1 (as documented)."""
    _run(pg_dsn, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)")
    installed, other = tmp_path / "installed.yaml", tmp_path / "other.yaml"
    installed.write_text('tables:\n  jobs: "jobs/{key}"\n')
    other.write_text('tables:\n  jobs: "work/{key}"\n')
    assert _db("install", "--database-url", pg_dsn, "--policy", str(installed)).returncode == 0
    assert _db("check", "--database-url", pg_dsn, "--policy", str(installed)).returncode == 0
    found = _db("check", "--database-url", pg_dsn, "--policy", str(other))
    assert found.returncode == 1, found.stdout
    assert ("MISSING: table 'jobs': its installed trigger binds rows to other lock names than "
            "the policy's 'work/{key}'") in found.stdout
