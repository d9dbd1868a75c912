"""The proxy on a database with ``resource-proxy db install`` done: its writes pass the fence
triggers, plain SQL without a claim does not, and the start-up says which tables are protected.

Also the start-up refusals that keep the proxy and the database agreeing on one lock per row:
``--require-db-fencing``, key types the database cannot bind, partitions and inheritance
children; and the fences of an older proxy's ``resource_proxy.fences`` kept in ``fencing.fences``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import psycopg
import pytest

from harness import VENV_BIN, free_port
from lockd.tokens import KeyRing
from tests.proxy.conftest import (
    PG_SCHEMA,
    POLICY,
    SERVED,
    assert_problem,
    proxy_argv,
    unique_id,
    write_jwks,
)


def _install(dsn: str, *args: str) -> None:
    done = subprocess.run([str(VENV_BIN / "resource-proxy"), "db", "install", "--database-url",
                           dsn, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _serve(dsn: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """A start that must fail: its exit status and output."""
    jwks = write_jwks(tmp_path, KeyRing.generate())
    return subprocess.run(proxy_argv(dsn, free_port(), "--jwks-file", str(jwks), *args),
                          capture_output=True, text=True, timeout=60)


def _sql(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_every_proxy_write_passes_the_triggers_and_plain_sql_does_not(
        pg_dsn, tmp_path, policy_file, start_proxy):
    _sql(pg_dsn, PG_SCHEMA)
    _install(pg_dsn, "--policy", str(policy_file), "--tables", SERVED)
    ring = KeyRing.generate()
    url, proc = start_proxy(pg_dsn, "--jwks-file", str(write_jwks(tmp_path, ring)),
                            "--policy", str(policy_file), "--tables", SERVED,
                            "--require-db-fencing")
    assert ("database-side fencing: protected in the database too: accounts, items, pairs, "
            "kinds, history, children") in proc.log()
    a, b, k = unique_id(), unique_id(), unique_id()

    def auth(lock: str, fence: int) -> dict[str, str]:
        return {"Fencing-Token": ring.sign(lock, fence)}

    with httpx.Client(base_url=url) as c:
        item = f"/v1/tables/items/rows/{k}"
        assert c.post("/v1/tables/items/rows", json={"id": str(k), "v": "a"},
                      headers=auth(f"items/{k}", 1)).status_code == 201
        assert c.put(item, json={"v": "b"}, headers=auth(f"items/{k}", 1)).status_code == 200
        assert c.patch(item, json={"n": 3}, headers=auth(f"items/{k}", 2)).json()["n"] == 3
        assert c.get(item, headers=auth(f"items/{k}", 2)).json()["v"] == "b"  # fenced read
        stale = assert_problem(c.patch(item, json={"n": 4}, headers=auth(f"items/{k}", 1)),
                               409, "stale_token")
        assert stale["highest"] == 2
        keyed = {**auth(f"items/{k}", 3), "Idempotency-Key": f"k{k}"}
        assert c.put(item, json={"v": "once"}, headers=keyed).status_code == 200
        assert c.put(item, json={"v": "once"}, headers=keyed).status_code == 200  # the replay
        assert c.delete(item, headers=auth(f"items/{k}", 3)).status_code == 204

        # a batch of one lock (two rows), a literal-lock table, and a claim
        r = c.post("/v1/batch", headers=auth(f"pairs/{k}", 1), json={"ops": [
            {"op": "insert", "table": "pairs", "row": {"a": k, "b": "x", "v": "1"}},
            {"op": "insert", "table": "pairs", "row": {"a": k, "b": "y", "v": "2"}}]})
        assert r.status_code == 200, r.text
        assert c.post("/v1/tables/history/rows", json={"fence": 1, "writer": "w"},
                      headers=auth("history", 1)).status_code == 201
        assert c.post(f"/v1/fences/accounts/{a}/claim", headers=auth(f"accounts/{a}", 1)
                      ).status_code == 200

        # a multi-lock batch, blind (no claim first) and with an Idempotency-Key
        for key in (a, b):
            assert c.put(f"/v1/tables/accounts/rows/{key}", json={"balance": 50},
                         headers=auth(f"accounts/{key}", 2)).status_code == 200
        multi = {"Fencing-Token": ring.sign_many({f"accounts/{a}": 3, f"accounts/{b}": 3})}
        transfer = {"ops": [
            {"op": "update", "table": "accounts", "key": a, "row": {"balance": 20}},
            {"op": "update", "table": "accounts", "key": b, "row": {"balance": 80}}]}
        assert c.post("/v1/batch", headers=multi, json=transfer).status_code == 200
        keyed = {**multi, "Idempotency-Key": f"t{k}"}
        assert c.post("/v1/batch", headers=keyed, json=transfer).status_code == 200
        assert c.post("/v1/fences/claim", headers=multi).status_code == 200
        unfenced = c.post("/v1/tables/audit/rows", json={"v": "free"})
        assert unfenced.status_code == 201, "an unfenced table has no trigger"

    assert _sql(pg_dsn, "SELECT id, balance, last_fence FROM accounts ORDER BY id") == sorted(
        [(a, 20, 3), (b, 80, 3)])
    assert _sql(pg_dsn, "SELECT highest FROM fencing.fences WHERE lock = %s", (f"items/{k}",)
                ) == [(3,)], "the proxy's fences are the database's"

    # Plain SQL: refused without a claim (the lock named), a stale claim refused, a current passes.
    with pytest.raises(psycopg.Error, match=f'lock "accounts/{a}"') as refused:
        _sql(pg_dsn, "UPDATE accounts SET balance = 0 WHERE id = %s", (a,))
    assert refused.value.sqlstate == "LF002"
    with psycopg.connect(pg_dsn) as conn:
        with pytest.raises(psycopg.Error, match="highest is 3") as behind:
            conn.execute("SELECT fencing.claim(%s, 2)", (f"accounts/{a}",))
        assert behind.value.sqlstate == "LF001"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT fencing.claim(%s, 3)", (f"accounts/{a}",))
        conn.execute("UPDATE accounts SET balance = 21 WHERE id = %s", (a,))
    assert _sql(pg_dsn, "SELECT balance FROM accounts WHERE id = %s", (a,)) == [(21,)]


def test_the_start_says_what_is_unprotected_and_can_require_it(
        pg_dsn, tmp_path, policy_file, start_proxy):
    _sql(pg_dsn, PG_SCHEMA)
    jwks = str(write_jwks(tmp_path, KeyRing.generate()))
    args = ("--policy", str(policy_file), "--tables", SERVED)
    _, proc = start_proxy(pg_dsn, "--jwks-file", jwks, *args)
    assert ("database-side fencing: NOT protected in the database (only writes through the proxy "
            "are fenced; resource-proxy db install): accounts, items, pairs, kinds, history, "
            "children (no fence trigger)") in proc.log()
    assert proc.stop() == 0

    refused = _serve(pg_dsn, tmp_path, *args, "--require-db-fencing")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert line == ("resource-proxy: --require-db-fencing: not protected in the database: "
                    "accounts, items, pairs, kinds, history, children (no fence trigger) "
                    "(resource-proxy db install)"), "one line; an unfenced table needs no trigger"

    # Installed for another template, a table does not count as protected.
    other = tmp_path / "other.yaml"
    other.write_text(POLICY.replace('items: "items/{key}"', 'items: "items"'))
    _install(pg_dsn, "--policy", str(other), "--tables", SERVED)
    missing = _serve(pg_dsn, tmp_path, *args, "--require-db-fencing")
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert missing.stderr.strip() == (
        "resource-proxy: --require-db-fencing: not protected in the database: items (its fence "
        "trigger checks another lock template (run db install again)) (resource-proxy db "
        "install)")
    _install(pg_dsn, *args)
    _, proc = start_proxy(pg_dsn, "--jwks-file", jwks, *args, "--require-db-fencing")
    assert "NOT protected" not in proc.log()


def test_key_types_the_database_cannot_bind_refuse_the_start(pg_dsn, tmp_path, start_proxy):
    _sql(pg_dsn, "CREATE TABLE slots (at timetz PRIMARY KEY, v text);"
                 "CREATE TABLE codes (c \"char\" PRIMARY KEY, v text)")
    policy = tmp_path / "p.yaml"
    for table, phrase in (("slots", "key column 'at' (time with time zone) cannot be bound"),
                          ("codes", "key column 'c' (\"char\") cannot be bound")):
        policy.write_text(f'tables:\n  {table}: "{table}/{{key}}"\n')
        refused = _serve(pg_dsn, tmp_path, "--policy", str(policy), "--tables", table)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and phrase in refused.stderr, refused.stderr
    policy.write_text('tables:\n  slots: "slots"\n')  # a literal lock needs no key text
    jwks = str(write_jwks(tmp_path, KeyRing.generate()))
    url, _ = start_proxy(pg_dsn, "--jwks-file", jwks, "--policy", str(policy), "--tables", "slots")
    assert httpx.get(f"{url}/healthz").status_code == 200


def test_partitions_and_inheritance_children_are_served_through_their_root(
        pg_dsn, tmp_path, start_proxy):
    _sql(pg_dsn, "CREATE TABLE meas (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);"
                 "CREATE TABLE meas_lo PARTITION OF meas FOR VALUES FROM (0) TO (100);"
                 "CREATE TABLE parent (id int PRIMARY KEY, v text);"
                 "CREATE TABLE child (extra text) INHERITS (parent)")
    ring = KeyRing.generate()
    url, _ = start_proxy(pg_dsn, "--jwks-file", str(write_jwks(tmp_path, ring)))
    with httpx.Client(base_url=url) as c:
        served = {t["table"] for t in c.get("/v1/tables").json()["items"]}
        assert served == {"meas", "parent"}, served
        assert c.put("/v1/tables/meas/rows/5", json={"v": "x"},
                     headers={"Fencing-Token": ring.sign("meas", 1)}).status_code == 200
        assert_problem(c.put("/v1/tables/meas_lo/rows/5", json={"v": "y"},
                             headers={"Fencing-Token": ring.sign("meas_lo", 1)}), 404, "not_found")
    assert _sql(pg_dsn, "SELECT v FROM meas_lo") == [("x",)]

    partition = _serve(pg_dsn, tmp_path, "--tables", "meas,meas_lo")
    assert partition.returncode == 2, partition.stdout + partition.stderr
    assert partition.stderr.strip() == (
        "resource-proxy: table 'meas_lo' is a partition of 'meas': write its rows through "
        "'meas', whose lock template governs every partition; the proxy does not serve it under "
        "a lock of its own")
    policy = tmp_path / "p.yaml"
    policy.write_text('tables:\n  child: "child/{key}"\n')
    child = _serve(pg_dsn, tmp_path, "--policy", str(policy))
    assert child.returncode == 2 and len(child.stderr.splitlines()) == 1, child.stderr
    assert "an inheritance child of 'parent': write its rows through 'parent'" in child.stderr


def test_fences_of_an_older_proxy_are_kept(pg_dsn, tmp_path, start_proxy):
    _sql(pg_dsn, "CREATE TABLE items (id text PRIMARY KEY, v text);"
                 "CREATE SCHEMA resource_proxy;"
                 "CREATE TABLE resource_proxy.fences (lock text PRIMARY KEY, highest bigint NOT NULL);"
                 "INSERT INTO resource_proxy.fences VALUES ('items', 7), ('other', 2)")
    ring = KeyRing.generate()
    jwks = str(write_jwks(tmp_path, ring))
    url, proc = start_proxy(pg_dsn, "--jwks-file", jwks)
    assert _sql(pg_dsn, "SELECT lock, highest FROM fencing.fences ORDER BY 1") == [
        ("items", 7), ("other", 2)]
    assert _sql(pg_dsn, "SELECT to_regclass('resource_proxy.fences')") == [(None,)]
    stale = httpx.put(f"{url}/v1/tables/items/rows/a", json={"v": "x"},
                      headers={"Fencing-Token": ring.sign("items", 6)})
    assert assert_problem(stale, 409, "stale_token")["highest"] == 7
    assert proc.stop() == 0

    # An older proxy made its table again and raised a fence there: merged, the higher wins.
    _sql(pg_dsn, "CREATE TABLE resource_proxy.fences (lock text PRIMARY KEY, highest bigint NOT NULL);"
                 "INSERT INTO resource_proxy.fences VALUES ('items', 9), ('other', 1), ('new', 4)")
    url, proc = start_proxy(pg_dsn, "--jwks-file", jwks)
    assert _sql(pg_dsn, "SELECT lock, highest FROM fencing.fences ORDER BY 1") == [
        ("items", 9), ("new", 4), ("other", 2)]
    assert "its 3 fence(s) were merged into fencing.fences" in proc.log()
    assert _sql(pg_dsn, "SELECT to_regclass('resource_proxy.fences')") == [(None,)]


def test_a_cascade_into_rows_of_another_lock_is_a_conflict_naming_it(pg_dsn, tmp_path,
                                                                      start_proxy):
    _sql(pg_dsn, "CREATE TABLE acct (id int PRIMARY KEY);"
                 "CREATE TABLE line (id int PRIMARY KEY, acct int REFERENCES acct ON DELETE CASCADE)")
    policy = tmp_path / "p.yaml"
    policy.write_text('tables:\n  acct: "acct/{key}"\n  line: "line/{key}"\n')
    _install(pg_dsn, "--policy", str(policy))
    ring = KeyRing.generate()
    url, _ = start_proxy(pg_dsn, "--jwks-file", str(write_jwks(tmp_path, ring)),
                         "--policy", str(policy))
    with httpx.Client(base_url=url) as c:
        assert c.put("/v1/tables/acct/rows/1", json={},
                     headers={"Fencing-Token": ring.sign("acct/1", 1)}).status_code == 200
        assert c.put("/v1/tables/line/rows/10", json={"acct": 1},
                     headers={"Fencing-Token": ring.sign("line/10", 1)}).status_code == 200
        refused = assert_problem(c.delete("/v1/tables/acct/rows/1", headers={
            "Fencing-Token": ring.sign("acct/1", 1)}), 409, "conflict")
    assert 'lock "line/10"' in refused["detail"], refused
    assert _sql(pg_dsn, "SELECT count(*) FROM line") == [(1,)], "nothing was deleted"
