"""``install`` (idempotent, converging, keeping every fence), ``check`` and ``uninstall`` on a
fresh PostgreSQL database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from resource_proxy.dbfence import DbFencingError, check, install, uninstall
from resource_proxy.policy import Policy, TablePolicy
from tests.proxy.dbfence.conftest import policy
from tests.proxy.dbfence.test_triggers import refused

CATALOG = """
SELECT 'proc', p.oid::bigint, p.oid::regprocedure::text, md5(p.prosrc),
       coalesce(array_to_string(p.proconfig, ','), ''), p.xmin::text
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencing'
UNION ALL
SELECT 'trigger', t.oid::bigint, t.tgrelid::regclass::text || '.' || t.tgname,
       t.tgfoid::regprocedure::text, t.tgenabled::text, t.xmin::text
FROM pg_trigger t WHERE t.tgname LIKE 'zz_fencing%%'
UNION ALL
SELECT 'class', c.oid::bigint, c.oid::regclass::text, c.relkind::text,
       coalesce(array_to_string(c.relacl, ','), ''), c.xmin::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'fencing'
UNION ALL
SELECT 'comment', d.objoid::bigint, d.classoid::regclass::text, d.description, '', d.xmin::text
FROM pg_description d WHERE d.description LIKE 'dbfence:%%'
ORDER BY 1, 3"""


def snapshot(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(CATALOG)]


@pytest.fixture
def schema(db):
    db.run("CREATE TABLE acc (id bigint PRIMARY KEY, v text)",
           "CREATE TABLE pairs (a int, b text, PRIMARY KEY (a, b))",
           "CREATE TABLE ledger (id int PRIMARY KEY)",
           "CREATE TABLE meas (id int PRIMARY KEY) PARTITION BY RANGE (id)",
           "CREATE TABLE meas_lo PARTITION OF meas FOR VALUES FROM (0) TO (100)",
           "CREATE TABLE parent (id int PRIMARY KEY)", "CREATE TABLE child () INHERITS (parent)")
    return db


POLICY = {"acc": "acc/{id}", "pairs": "pairs/{key}", "meas": "m/{id}", "parent": "p/{id}"}


def test_a_second_install_changes_nothing(schema):
    first = install(schema.engine, policy(POLICY), exempt_roles=["postgres"])
    assert first.changed
    before = snapshot(schema.engine)
    assert any(row[0] == "trigger" for row in before)
    second = install(schema.engine, policy(POLICY), exempt_roles=["postgres"])
    assert second.changed == [] and second.lines()[-1] == "no change"
    assert snapshot(schema.engine) == before  # same oids, same row versions (xmin)


def test_install_converges_to_another_policy(schema):
    install(schema.engine, policy(POLICY))
    others = ["pairs", "ledger", "meas", "parent"]
    converged = Policy({**policy({"acc": "acc"}).tables,
                        **{t: TablePolicy(unfenced=True) for t in others}})
    report = install(schema.engine, converged, tables=["acc", *others])
    assert any("removed" in line for line in report.changed)
    with schema.engine.connect() as conn:
        guarded = conn.exec_driver_sql(
            "SELECT DISTINCT tgrelid::regclass::text FROM pg_trigger "
            "WHERE tgname LIKE 'zz_fencing%%' ORDER BY 1").scalars().all()
        functions = conn.exec_driver_sql(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'fencing'::regnamespace "
            "AND proname ~ '^(lock|guard)_of_' ORDER BY 1").scalars().all()
    assert guarded == ["acc"] and functions == ["guard_of_acc"]
    with schema.connect() as conn:
        conn.execute("SELECT fencing.claim('acc', 1)")
        conn.execute("INSERT INTO acc VALUES (1, 'x')")  # the literal lock now
        conn.execute("INSERT INTO ledger VALUES (1)")    # no longer protected
        conn.commit()


def test_the_proxys_fence_table_is_moved_with_every_fence(schema):
    # what a proxy of the version before the fencing schema created at start
    schema.run("CREATE SCHEMA resource_proxy",
               "CREATE TABLE resource_proxy.fences (lock text PRIMARY KEY, highest bigint NOT NULL)")
    schema.run("INSERT INTO resource_proxy.fences VALUES ('acc/1', 41), ('ledger', 7)")
    report = install(schema.engine, policy(POLICY))
    assert report.moved_fence_table
    assert schema.one("SELECT to_regclass('resource_proxy.fences')") == (None,)
    with schema.connect() as conn:
        assert conn.execute("SELECT lock, highest FROM fencing.fences ORDER BY 1").fetchall() == [
            ("acc/1", 41), ("ledger", 7)]
        assert refused(conn, "SELECT fencing.claim('acc/1', 40)").sqlstate == "LF001"
    assert not install(schema.engine, policy(POLICY)).moved_fence_table


def test_uninstall_removes_everything_but_the_fences(schema):
    install(schema.engine, policy(POLICY))
    with schema.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/1', 9)")
        conn.execute("INSERT INTO acc VALUES (1, 'x')")
        conn.commit()
    report = uninstall(schema.engine)
    assert report.changed
    assert schema.one("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_fencing%%'") == (0,)
    assert schema.one("SELECT count(*) FROM pg_proc WHERE pronamespace = 'fencing'::regnamespace"
                      ) == (0,)
    assert schema.one("SELECT highest FROM fencing.fences WHERE lock = 'acc/1'") == (9,)
    schema.run("UPDATE acc SET v = 'plain'")  # no trigger any more
    install(schema.engine, policy(POLICY))  # and back: the fence is still 9
    with schema.connect() as conn:
        assert refused(conn, "SELECT fencing.claim('acc/1', 8)").sqlstate == "LF001"
    uninstall(schema.engine, drop_fences=True)
    assert schema.one("SELECT to_regnamespace('fencing')") == (None,)


def test_check_reports_missing_and_disabled_triggers_and_who_can_bypass(schema):
    before = check(schema.engine, policy(POLICY))
    assert not before.ok and any("not installed" in line for line in before.missing)
    install(schema.engine, policy(POLICY))
    report = check(schema.engine, policy(POLICY))
    assert report.ok, report.lines()
    assert any("superuser" in line for line in report.bypass)
    schema.run("ALTER TABLE meas_lo DISABLE TRIGGER zz_fencing_guard",
               "ALTER TABLE acc ENABLE TRIGGER zz_fencing_guard",  # origin only: replica skips
               "CREATE TABLE child2 () INHERITS (parent)",
               "DROP ROLE IF EXISTS dbfence_trig", "CREATE ROLE dbfence_trig",
               "GRANT TRIGGER ON acc TO dbfence_trig",
               "GRANT UPDATE ON fencing.fences TO dbfence_trig")
    try:
        report = check(schema.engine, policy(POLICY))
        text = "\n".join(report.lines())
        assert not report.ok
        assert "table 'meas_lo' (governed by 'meas'): trigger zz_fencing_guard is disabled" in text
        assert "table 'acc': trigger zz_fencing_guard is enabled only outside replica" in text
        assert "table 'child2' (governed by 'parent') has no trigger zz_fencing_guard" in text
        assert "dbfence_trig: has TRIGGER on acc" in text
        assert "dbfence_trig: may write fencing.fences" in text
        assert check(schema.engine, policy({**POLICY, "acc": "acc"})).missing  # other template
        install(schema.engine, policy(POLICY))
        again = check(schema.engine, policy(POLICY))
        assert not again.missing and not again.disabled and not again.later
        assert not again.ok and again.bypassers == {"dbfence_trig"}  # a role can bypass
        schema.run("REVOKE TRIGGER ON acc FROM dbfence_trig",
                   "REVOKE UPDATE ON fencing.fences FROM dbfence_trig")
        assert check(schema.engine, policy(POLICY)).ok
    finally:
        schema.run("DROP OWNED BY dbfence_trig", "DROP ROLE dbfence_trig")


def test_check_reports_a_before_trigger_that_fires_after_the_fence_check(schema):
    install(schema.engine, policy(POLICY))
    schema.run("CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS "
               "$$ BEGIN NEW.id := NEW.id + 1; RETURN NEW; END $$",
               "CREATE TRIGGER zzz_bump BEFORE INSERT ON acc FOR EACH ROW EXECUTE FUNCTION bump()",
               "CREATE TRIGGER aaa_fine BEFORE INSERT ON acc FOR EACH ROW EXECUTE FUNCTION bump()")
    report = check(schema.engine, policy(POLICY))
    assert not report.ok
    assert report.later == ["table 'acc': trigger 'zzz_bump' (BEFORE ROW) fires after "
                            "zz_fencing_guard and may change the row after the fence check"]


def test_a_generated_key_column_is_refused(db):
    db.run("CREATE TABLE g (a int NOT NULL, b int GENERATED ALWAYS AS (a * 2) STORED,"
           " PRIMARY KEY (b))")
    with pytest.raises(DbFencingError, match="generated column"):
        install(db.engine, policy({"g": "g/{b}"}))


def test_a_child_of_an_unfenced_parent_is_a_table_of_its_own(db):
    db.run("CREATE TABLE parent (id int PRIMARY KEY)", "CREATE TABLE child () INHERITS (parent)")
    report = install(db.engine, Policy({"parent": TablePolicy(unfenced=True)}))
    assert list(report.tables) == ["child"]


def test_upsert_needs_the_lock_of_the_row_it_updates(schema):
    install(schema.engine, policy(POLICY))
    with schema.connect() as conn:
        conn.execute("SELECT fencing.claim('acc/1', 1)")
        conn.execute("INSERT INTO acc VALUES (1, 'a') ON CONFLICT (id) DO UPDATE SET v = 'b'")
        conn.execute("INSERT INTO acc VALUES (1, 'a') ON CONFLICT (id) DO UPDATE SET v = 'b'")
        conn.commit()
        error = refused(conn, "INSERT INTO acc VALUES (1, 'c') ON CONFLICT (id) DO UPDATE SET v = 'c'")
        assert 'lock "acc/1"' in str(error)


def test_install_for_some_tables_keeps_the_triggers_of_the_others(schema):
    install(schema.engine, policy(POLICY))
    before = snapshot(schema.engine)
    report = install(schema.engine, policy(POLICY), tables=["acc"])
    assert report.changed == [] and snapshot(schema.engine) == before
    assert "left alone (outside --tables): child, ledger, meas, pairs, parent" in report.lines()
    with schema.connect() as conn:
        assert 'lock "ledger"' in str(refused(conn, "INSERT INTO ledger VALUES (1)"))
        assert 'lock "p/3"' in str(refused(conn, "INSERT INTO child VALUES (3)"))
    # a table named gets the new template; the others keep theirs
    install(schema.engine, policy({**POLICY, "acc": "acc"}), tables=["acc"])
    with schema.connect() as conn:
        conn.execute("SELECT fencing.claim('acc', 1)")
        conn.execute("INSERT INTO acc VALUES (1, 'x')")
        conn.commit()
        assert 'lock "pairs/1/a"' in str(refused(conn, "INSERT INTO pairs VALUES (1, 'a')"))
