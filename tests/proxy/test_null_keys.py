"""A key value is never NULL: 422 naming the column, on both databases, on every write path.

SQLite lets a non-INTEGER primary key column hold NULL (a legacy quirk its documentation
keeps); PostgreSQL does not. A NULL key has no lock name (a TEXT key would be written under
``tn/None``, the lock of the text key ``'None'``), so the proxy refuses it before any lock is
computed, whichever path carries it: a POST row, a PUT/PATCH row, a batch op's row or key.
On an INTEGER PRIMARY KEY (SQLite's rowid) or a serial, ``null`` does not ask for an assigned
key either: leave the column out for that.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from harness import ServiceProcess, drop_database, free_port
from lockd.tokens import KeyRing
from tests.proxy.conftest import Database, assert_problem, make_database, proxy_argv, write_jwks

SQLITE_TABLES = """
CREATE TABLE tn (id TEXT PRIMARY KEY, v TEXT);
CREATE TABLE ti (id INT PRIMARY KEY, v TEXT);
CREATE TABLE tu (id UUID PRIMARY KEY, v TEXT);
CREATE TABLE tc (a INT, b TEXT, v TEXT, PRIMARY KEY (a, b));
CREATE TABLE tr (id INTEGER PRIMARY KEY, v TEXT);
"""
PG_TABLES = """
CREATE TABLE tn (id text PRIMARY KEY, v text);
CREATE TABLE ti (id integer PRIMARY KEY, v text);
CREATE TABLE tu (id uuid PRIMARY KEY, v text);
CREATE TABLE tc (a integer, b text, v text, PRIMARY KEY (a, b));
CREATE TABLE tr (id bigserial PRIMARY KEY, v text);
"""
POLICY = """
tables:
  tn: "tn/{key}"
  ti: "ti/{key}"
  tu: "tu/{key}"
  tc: "tc/{a}/{b}"
  tr: "tr/{key}"
"""
TABLES = ("tn", "ti", "tu", "tr")
SOME_KEY = {"tn": "None", "ti": 7, "tu": "6f1e2c1e-0000-4000-8000-000000000001", "tr": 7}


@dataclass
class Served:
    client: httpx.Client
    ring: KeyRing
    db: Database

    def auth(self, lock: str) -> dict[str, str]:
        return {"Fencing-Token": self.ring.sign(lock, 1)}

    def empty(self) -> bool:
        return all(self.db.query(f"SELECT count(*) FROM {t}") == [(0,)]
                   for t in (*TABLES, "tc"))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(request, tmp_path_factory) -> Iterator[Served]:
    backend = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"nullkeys-{backend}")
    db = make_database(backend, directory, admin)
    db.script(SQLITE_TABLES if backend == "sqlite" else PG_TABLES)
    ring = KeyRing.generate()
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ServiceProcess(
        proxy_argv(db.url, port, "--jwks-file", str(write_jwks(directory, ring)),
                   "--tables", "tn,ti,tu,tc,tr", "--policy", str(policy)),
        ready_url=f"{url}/healthz", log_path=directory / "proxy.log")
    proc.start()
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield Served(client, ring, db)
        assert proc.stop() == 0, proc.log()
    finally:
        proc.stop()
        if backend == "postgres":
            drop_database(db.dsn, admin)


def _null_key(response: httpx.Response, column: str) -> None:
    problem = assert_problem(response, 422, "invalid_request")
    assert problem["column"] == column, problem
    assert "null" in problem["detail"], problem


@pytest.mark.parametrize("table", TABLES)
def test_a_null_key_in_a_posted_row_is_422_naming_the_column(served: Served, table):
    for lock in (f"{table}/None", f"{table}/null", f"{table}/{SOME_KEY[table]}"):
        _null_key(served.client.post(f"/v1/tables/{table}/rows", json={"id": None, "v": "x"},
                                     headers=served.auth(lock)), "id")
    assert served.empty()


def test_a_null_part_of_a_composite_key_is_422(served: Served):
    for row, column in (({"a": 1, "b": None}, "b"), ({"a": None, "b": "x"}, "a")):
        _null_key(served.client.post("/v1/tables/tc/rows", json={**row, "v": "x"},
                                     headers=served.auth("tc/1/None")), column)
    assert served.empty()


@pytest.mark.parametrize("table", TABLES)
def test_a_null_key_in_a_put_or_patch_row_is_422(served: Served, table):
    key = SOME_KEY[table]
    path, auth = f"/v1/tables/{table}/rows/{key}", served.auth(f"{table}/{key}")
    for method in ("PUT", "PATCH"):
        _null_key(served.client.request(method, path, json={"id": None, "v": "x"},
                                        headers=auth), "id")
    assert served.empty()


@pytest.mark.parametrize("table", TABLES)
def test_a_null_key_in_a_batch_op_is_422_with_its_index(served: Served, table):
    key = SOME_KEY[table]
    auth = served.auth(f"{table}/{key}")
    good = {"op": "upsert", "table": table, "key": key, "row": {"v": "ok"}}
    for bad in ({"op": "insert", "table": table, "row": {"id": None, "v": "x"}},
                {"op": "upsert", "table": table, "row": {"id": None, "v": "x"}},
                {"op": "upsert", "table": table, "key": [None], "row": {"v": "x"}},
                {"op": "upsert", "table": table, "key": {"id": None}, "row": {"v": "x"}},
                {"op": "update", "table": table, "key": [None], "row": {"v": "x"}},
                {"op": "delete", "table": table, "key": [None]}):
        response = served.client.post("/v1/batch", json={"ops": [good, bad]}, headers=auth)
        _null_key(response, "id")
        assert response.json()["op_index"] == 1, bad
    composite = {"op": "delete", "table": "tc", "key": {"a": 1, "b": None}}
    response = served.client.post("/v1/batch", json={"ops": [composite]},
                                  headers=served.auth("tc/1/None"))
    _null_key(response, "b")
    assert served.empty()


def test_url_keys_are_text_and_never_null(served: Served):
    # in a URL a key is text: "null" and "None" are the TEXT keys 'null' and 'None', each
    # under its own lock; for an integer or uuid key they are not a value of the type
    for text in ("null", "None"):
        written = served.client.put(f"/v1/tables/tn/rows/{text}", json={"v": "x"},
                                    headers=served.auth(f"tn/{text}"))
        assert written.status_code == 200, written.text
        assert written.json()["id"] == text
        assert served.client.get("/v1/tables/tn/lock", params={"key": text}).json()["lock"] == \
            f"tn/{text}"
        for table in ("ti", "tu"):
            problem = assert_problem(
                served.client.put(f"/v1/tables/{table}/rows/{text}", json={"v": "x"},
                                  headers=served.auth(f"{table}/{text}")), 422, "invalid_request")
            assert problem["column"] == "id"
    assert sorted(served.db.query("SELECT id FROM tn")) == [("None",), ("null",)]
    served.db.query("DELETE FROM tn")


def test_a_row_without_its_serial_key_still_gets_one(served: Served):
    # leaving the key out is how a row asks the database for its key (the template then needs
    # the key: 422 naming it, as before), so only an explicit null is refused
    response = served.client.post("/v1/tables/tr/rows", json={"v": "x"},
                                  headers=served.auth("tr/1"))
    assert_problem(response, 422, "invalid_request")
    assert "give the row's key" in response.json()["detail"]
    assert served.empty()
