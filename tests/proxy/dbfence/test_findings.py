"""The ways one stored row could be written under two lock names, closed in the database: key
types PostgreSQL stores differently from their spelling, a partition's own name, an inheritance
parent's name. (Cascades into another lock's rows: test_triggers.)"""

from __future__ import annotations

import psycopg
import pytest

from resource_proxy.canonical import key_part
from resource_proxy.dbfence import DbFencingError, install, refusal
from resource_proxy.rows.tables import reflect
from resource_proxy.rows.values import coerce
from tests.proxy.dbfence.conftest import policy
from tests.proxy.dbfence.test_triggers import refused


def test_time_offsets_name_the_stored_row(db):
    """``13:00:00`` and ``13:00:00+02:00`` are one stored ``time`` row, so one lock."""
    db.run("CREATE TABLE ttime (t time PRIMARY KEY, v text)")
    install(db.engine, policy({"ttime": "ttime/{t}"}))
    column = reflect(db.engine, ["ttime"], ())["ttime"].columns["t"]
    names = {key_part(column, coerce(column, s)) for s in ("13:00:00", "13:00:00+02:00")}
    assert names == {"13:3A00:3A00"}
    with db.connect() as conn:
        conn.execute("SELECT fencing.claim('ttime/13:3A00:3A00:2B02:3A00', 1)")
        error = refused(conn, "INSERT INTO ttime VALUES ('13:00:00+02:00', 'x')")
        assert 'lock "ttime/13:3A00:3A00"' in str(error)
        conn.execute("SELECT fencing.claim('ttime/13:3A00:3A00', 1)")
        conn.execute("INSERT INTO ttime VALUES ('13:00:00+02:00', 'x')")
        conn.commit()


@pytest.mark.parametrize(("sqltype", "shown"), [
    ("timetz", "time with time zone"), ('"char"', '"char"'), ("name", "name"),
    ("char(3)", "character")])
def test_keys_the_database_cannot_bind_are_refused_in_one_line(db, sqltype, shown):
    db.run(f"CREATE TABLE tk (k {sqltype} PRIMARY KEY)")
    column = reflect(db.engine, ["tk"], ())["tk"].columns["k"]
    line = refusal(column)
    assert line is not None and "\n" not in line
    assert f"'k' ({shown})" in line
    with pytest.raises(DbFencingError) as caught:
        install(db.engine, policy({"tk": "tk/{k}"}))
    assert "'tk'" in str(caught.value) and shown in str(caught.value)
    assert db.one("SELECT to_regnamespace('fencing')") == (None,)  # nothing installed
    install(db.engine, policy({"tk": "tk"}))  # a literal lock needs no key text


def test_char_truncation_would_alias_two_spellings(db):
    """Why ``"char"`` is refused: ``'ab'`` and ``'a'`` are one stored row."""
    db.run('CREATE TABLE tchar (k "char" PRIMARY KEY)', "INSERT INTO tchar VALUES ('ab')")
    with db.connect() as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO tchar VALUES ('a')")


@pytest.fixture
def partitioned(db):
    db.run("CREATE TABLE meas (id int, v text, PRIMARY KEY (id)) PARTITION BY RANGE (id)",
           "CREATE TABLE meas_lo PARTITION OF meas FOR VALUES FROM (0) TO (100)",
           "CREATE TABLE meas_mid PARTITION OF meas FOR VALUES FROM (100) TO (200)"
           " PARTITION BY RANGE (id)",
           "CREATE TABLE meas_mid_a PARTITION OF meas_mid FOR VALUES FROM (100) TO (150)")
    install(db.engine, policy({"meas": "meas/{id}"}))
    return db


def test_a_partition_is_governed_by_the_roots_template(partitioned):
    with partitioned.connect() as conn:
        conn.execute("SELECT fencing.claim('meas/5', 1)")
        error = refused(conn, "INSERT INTO meas VALUES (5, 'x'), (120, 'y')")
        assert 'lock "meas/120"' in str(error) and "through meas_mid_a" in str(error)
    with partitioned.connect() as conn:
        conn.execute("SELECT fencing.claim('meas/5', 1), fencing.claim('meas/120', 1)")
        conn.execute("INSERT INTO meas VALUES (5, 'x'), (120, 'y')")
        conn.commit()
        for via, key in [("meas_lo", 5), ("meas_mid", 120), ("meas_mid_a", 120)]:
            conn.execute(f"SELECT fencing.claim('{via}', 1)")
            error = refused(conn, f"DELETE FROM {via} WHERE id = {key}")
            assert f'lock "meas/{key}"' in str(error) and f"through {via}" in str(error)
        assert conn.execute("SELECT count(*) FROM meas").fetchone() == (2,)


def test_a_partition_attached_later_is_covered(partitioned):
    partitioned.run("CREATE TABLE meas_hi (id int PRIMARY KEY, v text)",
                    "ALTER TABLE meas ATTACH PARTITION meas_hi FOR VALUES FROM (200) TO (300)")
    with partitioned.connect() as conn:
        conn.execute("SET session_replication_role = replica")
        assert 'lock "meas/250"' in str(refused(conn, "INSERT INTO meas_hi VALUES (250, 'x')"))


def test_a_policy_naming_a_partition_is_refused(partitioned):
    for entry in ({"meas": "meas/{id}", "meas_lo": "meas_lo"}, {"meas_mid_a": "m/{id}"}):
        with pytest.raises(DbFencingError, match="is a partition of 'meas'"):
            install(partitioned.engine, policy(entry))
    with pytest.raises(DbFencingError, match="is a partition of 'meas'"):
        install(partitioned.engine, policy({}), tables=["meas_lo"])


def test_inheritance_children_are_governed_by_the_parents_template(db):
    db.run("CREATE TABLE parent (id int PRIMARY KEY, v text)",
           "CREATE TABLE child (extra int) INHERITS (parent)",
           "CREATE TABLE grandchild () INHERITS (child)")
    report = install(db.engine, policy({"parent": "parent/{id}"}))
    assert report.covers["parent"] == ["child", "grandchild"]
    with db.connect() as conn:
        conn.execute("SELECT fencing.claim('child', 1)")  # the child's default lock: not it
        assert 'lock "parent/7"' in str(refused(conn, "INSERT INTO child VALUES (7, 'c', 1)"))
        conn.execute("SELECT fencing.claim('parent/7', 1), fencing.claim('parent/8', 1)")
        conn.execute("INSERT INTO child VALUES (7, 'c', 1)")
        conn.execute("INSERT INTO grandchild VALUES (8, 'g', 2)")
        conn.commit()
        for statement in ("UPDATE parent SET v = 'p' WHERE id = 7", "DELETE FROM parent",
                          "DELETE FROM child WHERE id = 8"):
            error = refused(conn, statement)
            assert error.sqlstate == "LF002" and "through" in str(error)
        conn.execute("SELECT fencing.claim('parent/7', 1)")
        conn.execute("UPDATE parent SET v = 'p' WHERE id = 7")
        conn.commit()
        assert conn.execute("SELECT v FROM child WHERE id = 7").fetchone() == ("p",)


def test_a_child_named_on_its_own_or_of_two_protected_parents_is_refused(db):
    db.run("CREATE TABLE parent (id int PRIMARY KEY)", "CREATE TABLE other (id int PRIMARY KEY)",
           "CREATE TABLE child () INHERITS (parent)")
    with pytest.raises(DbFencingError, match="inherits from 'parent'"):
        install(db.engine, policy({}), tables=["parent", "child"])
    db.run("CREATE TABLE both_ () INHERITS (parent, other)")
    with pytest.raises(DbFencingError, match="inherits from both"):
        install(db.engine, policy({}))
