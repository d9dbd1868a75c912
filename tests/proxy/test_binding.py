"""One row, one lock, through a real ``resource-proxy serve`` on SQLite AND PostgreSQL.

- For each key type, every spelling of a row's key and every lock a client might spell by hand:
  exactly one lock name writes the row (the proxy's), every other one gets 403 naming it, while
  the holder of the governing lock (fence 5) keeps writing throughout - the intruders present a
  HIGHER fence (10), so only the binding, not the fence, can stop them.
- Policies that would give a row several locks, and keys compared inexactly (SQLite NOCASE /
  RTRIM, a PostgreSQL nondeterministic collation, citext) under a key template, stop the start
  (exit 2, one line).
- Without a policy, table ``t`` is written under lock ``t`` and nothing else.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import pytest

from harness import ServiceProcess, create_database, drop_database, free_port
from lockd.tokens import KeyRing
from tests.proxy.conftest import Database, assert_problem, make_database, proxy_argv, write_jwks

SQLITE_KEYS = """
CREATE TABLE k_int (id INTEGER PRIMARY KEY, v TEXT);
CREATE TABLE k_big (id BIGINT PRIMARY KEY, v TEXT);
CREATE TABLE k_num (id NUMERIC(12,2) PRIMARY KEY, v TEXT);
CREATE TABLE k_text (id TEXT PRIMARY KEY, v TEXT);
CREATE TABLE k_uuid (id UUID PRIMARY KEY, v TEXT);
CREATE TABLE k_pair (a INTEGER, b TEXT, v TEXT, PRIMARY KEY (a, b));
CREATE TABLE k_ts (id TIMESTAMP PRIMARY KEY, v TEXT);
"""
PG_KEYS = """
CREATE TABLE k_int (id integer PRIMARY KEY, v text);
CREATE TABLE k_big (id bigint PRIMARY KEY, v text);
CREATE TABLE k_num (id numeric(12,2) PRIMARY KEY, v text);
CREATE TABLE k_text (id text PRIMARY KEY, v text);
CREATE TABLE k_uuid (id uuid PRIMARY KEY, v text);
CREATE TABLE k_pair (a integer, b text, v text, PRIMARY KEY (a, b));
CREATE TABLE k_ts (id timestamptz PRIMARY KEY, v text);
"""
TABLES = ("k_int", "k_big", "k_num", "k_text", "k_uuid", "k_pair", "k_ts")
POLICY = "tables:\n" + "".join(f"  {t}: '{t}/{{key}}'\n" for t in TABLES)

U = "6f9619ff-8b86-d011-b42d-00cf4fc964ff"
INTS = ["1", "01", "+1", "1.0", "1.00", "1e0"]


@dataclass
class Case:
    table: str
    governing: str  # the one lock that writes the row
    urls: list[str]  # spellings of the row's key in a URL (those the type accepts)
    locks: list[str]  # lock names a client could build by hand from spellings
    others: tuple[str, ...] = ()  # those of ``locks`` that are the lock of ANOTHER row


CASES = [
    Case("k_int", "k_int/1", ["1", "01", "+1"], [f"k_int/{s}" for s in INTS]),
    Case("k_big", "k_big/1", ["1", "01", "+1"], [f"k_big/{s}" for s in INTS]),
    Case("k_num", "k_num/1", INTS, [f"k_num/{s}" for s in INTS]),
    Case("k_text", "k_text/abc", ["abc"],
         ["k_text/abc", "k_text/ABC", "k_text/ abc", "k_text/abc ", "k_text/:20abc", "k_text/abc:20"],
         ("k_text/ABC", "k_text/:20abc", "k_text/abc:20")),
    Case("k_uuid", f"k_uuid/{U}", [U, U.upper(), U.replace("-", "")],
         [f"k_uuid/{U}", f"k_uuid/{U.upper()}", f"k_uuid/{U.replace('-', '')}"]),
    Case("k_pair", "k_pair/1/x", ["1,x", "01,x", "+1,x"],
         ["k_pair/1/x", "k_pair/01/x", "k_pair/1.0/x", "k_pair/+1/x", "k_pair/1,x", "k_pair/1/X"],
         ("k_pair/1/X",)),
    Case("k_ts", "k_ts/20240501T120000Z",
         ["2024-05-01T12:00:00Z", "2024-05-01T14:00:00+02:00", "2024-05-01T12:00:00.000+00:00"],
         ["k_ts/20240501T120000Z", "k_ts/2024-05-01T12:00:00Z", "k_ts/2024-05-01T14:00:00+02:00",
          "k_ts/2024-05-01T12:3A00:3A00Z", "k_ts/20240501T140000+0200"]),
]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def keyed(request, tmp_path_factory):
    """A proxy over the key-type tables, every table under ``T/{key}``."""
    backend = request.param
    directory = tmp_path_factory.mktemp(f"keys-{backend}")
    if backend == "sqlite":
        path = str(directory / "keys.db")
        db = Database("sqlite", f"sqlite:///{path}", path=path)
        db.script(SQLITE_KEYS)
        admin = None
    else:
        admin = request.getfixturevalue("pg_admin_dsn")
        dsn = create_database(admin, prefix="keys")
        db = Database("postgres", dsn.replace("postgresql://", "postgresql+psycopg://", 1), dsn=dsn)
        db.script(PG_KEYS)
    ring = KeyRing.generate()
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    proc = ServiceProcess(proxy_argv(db.url, port, "--jwks-file", str(write_jwks(directory, ring)),
                                     "--policy", str(policy)),
                          ready_url=f"http://127.0.0.1:{port}/healthz", log_path=directory / "p.log")
    proc.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client, ring, db
        assert proc.stop() == 0, proc.log()
    finally:
        proc.stop()
        if admin is not None:
            drop_database(db.dsn, admin)


@pytest.mark.parametrize("case", CASES, ids=[c.table for c in CASES])
def test_exactly_one_lock_writes_each_row_whatever_the_spelling(keyed, case: Case):
    client, ring, db = keyed
    row = lambda url: f"/v1/tables/{case.table}/rows/{quote(url, safe=',')}"  # noqa: E731
    holder = {"Fencing-Token": ring.sign(case.governing, 5)}
    assert client.get(f"/v1/tables/{case.table}/lock?key={quote(case.urls[-1], safe=',')}").json()[
        "lock"] == case.governing, "the proxy names the governing lock for any spelling"

    first = client.put(row(case.urls[0]), json={"v": "holder-0"}, headers=holder)
    assert first.status_code == 200, first.text
    for n, url in enumerate(case.urls):
        for lock in (lock for lock in case.locks if lock != case.governing):
            intruder = {"Fencing-Token": ring.sign(lock, 10)}
            for attempt in (client.put(row(url), json={"v": f"by {lock}"}, headers=intruder),
                            client.patch(row(url), json={"v": f"by {lock}"}, headers=intruder),
                            client.get(row(url), headers=intruder)):
                body = assert_problem(attempt, 403, "lock_not_allowed")
                assert body["lock"] == case.governing, body
            claim = client.post(f"/v1/fences/{quote(lock, safe='/:')}/claim", headers=intruder)
            if lock in case.others:  # a lock of another row may claim, and still not write this one
                assert claim.status_code == 200, claim.text
            else:  # a spelling that is no row's lock is refused (403), or not a lock name (422)
                assert claim.status_code in (403, 422), claim.text
        # the holder keeps writing the same row, whatever spelling it uses
        kept = client.put(row(url), json={"v": f"holder-{n}"}, headers=holder)
        assert kept.status_code == 200, kept.text
    rows = db.query(f"SELECT v FROM {case.table}")
    assert rows == [(f"holder-{len(case.urls) - 1}",)], "one row, written by the holder only"
    assert client.get(f"/v1/fences/{case.governing}").json()["highest"] == 5, \
        "no intruder (fence 10) ever raised the holder's fence"


def test_padded_text_is_another_row_under_another_lock(keyed):
    client, ring, db = keyed
    for key, lock in (("pad", "k_text/pad"), (" pad", "k_text/:20pad"), ("pad ", "k_text/pad:20")):
        assert client.get(f"/v1/tables/k_text/lock?key={quote(key)}").json()["lock"] == lock
        r = client.put(f"/v1/tables/k_text/rows/{quote(key)}", json={"v": key},
                       headers={"Fencing-Token": ring.sign(lock, 1)})
        assert r.status_code == 200, r.text
    assert sorted(db.query("SELECT id, v FROM k_text WHERE v IN (?, ?, ?)", ("pad", " pad", "pad "))) == [
        (" pad", " pad"), ("pad", "pad"), ("pad ", "pad ")]


# -- refusals at start ---------------------------------------------------------------------

def _run(argv: list[str]) -> tuple[int, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    admin = request.getfixturevalue("pg_admin_dsn") if request.param == "postgres" else None
    db = make_database(request.param, tmp_path, admin)
    yield db
    if admin is not None:
        drop_database(db.dsn, admin)


@pytest.mark.parametrize(("policy", "reason"), [
    ("tables: {pairs: 'pairs/{a}/*'}", "'*'"),
    ("tables: {items: ['items/{key}', 'item/{key}']}", "ONE template"),
    ("tables: {items: {locks: ['items/{key}']}}", "ONE template"),
    ("tables: {items: 'items/{v}'}", "neither {key} nor a primary-key column"),
])
def test_a_policy_that_allows_several_locks_per_row_refuses_to_start(database, tmp_path, policy,
                                                                       reason):
    path = tmp_path / "p.yaml"
    path.write_text(policy)
    jwks = str(write_jwks(tmp_path, KeyRing.generate()))
    status, out = _run(proxy_argv(database.url, free_port(), "--jwks-file", jwks, "--policy", str(path)))
    assert status == 2 and reason in out and len(out.splitlines()) == 1, out


INEXACT = {
    "sqlite": [("CREATE TABLE ci (id TEXT COLLATE NOCASE PRIMARY KEY, v TEXT)", "NOCASE"),
               ("CREATE TABLE ci (id TEXT PRIMARY KEY COLLATE RTRIM, v TEXT)", "RTRIM"),
               ("CREATE TABLE ci (id TEXT, v TEXT, PRIMARY KEY (id COLLATE NOCASE))", "NOCASE")],
    "postgres": [("CREATE COLLATION ci_icu (provider = icu, locale = 'und-u-ks-level2',"
                  " deterministic = false);"
                  " CREATE TABLE ci (id text COLLATE ci_icu PRIMARY KEY, v text)", "nondeterministic"),
                 ("CREATE EXTENSION IF NOT EXISTS citext; CREATE TABLE ci (id citext PRIMARY KEY, v text)",
                  "citext"),
                 ("CREATE TABLE ci (id char(5) PRIMARY KEY, v text)", "char(n)")],
}


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_a_key_compared_inexactly_cannot_be_bound_per_row(database, tmp_path, variant):
    ddl, reason = INEXACT[database.backend][variant]
    database.script(ddl)
    jwks = str(write_jwks(tmp_path, KeyRing.generate()))
    for template in ("ci/{key}", "ci/{id}"):
        path = tmp_path / "p.yaml"
        path.write_text(f"tables: {{ci: '{template}'}}")
        status, out = _run(proxy_argv(database.url, free_port(), "--jwks-file", jwks,
                                      "--tables", "ci", "--policy", str(path)))
        assert status == 2 and reason in out and len(out.splitlines()) == 1, out


def test_a_literal_lock_still_serves_an_inexact_key(tmp_path, start_proxy):
    db = tmp_path / "ci.db"
    Database("sqlite", "", path=str(db)).script("CREATE TABLE ci (id TEXT COLLATE NOCASE PRIMARY KEY, v TEXT)")
    ring = KeyRing.generate()
    url, _ = start_proxy(f"sqlite:///{db}", "--jwks-file", str(write_jwks(tmp_path, ring)))
    with httpx.Client(base_url=url) as client:
        assert client.put("/v1/tables/ci/rows/abc", json={"v": "1"},
                          headers={"Fencing-Token": ring.sign("ci", 1)}).status_code == 200
        upper = client.put("/v1/tables/ci/rows/ABC", json={"v": "2"},
                           headers={"Fencing-Token": ring.sign("ci/ABC", 9)})
        assert assert_problem(upper, 403, "lock_not_allowed")["lock"] == "ci"


# -- the default -----------------------------------------------------------------------------

def test_without_a_policy_table_t_is_written_under_lock_t_only(database, tmp_path, start_proxy):
    ring = KeyRing.generate()
    url, proc = start_proxy(database.url, "--jwks-file", str(write_jwks(tmp_path, ring)),
                            "--tables", "items,pairs")
    with httpx.Client(base_url=url) as client:
        for lock in ("x", "items/1", "items/", "pairs", "Items"):
            r = client.put("/v1/tables/items/rows/1", json={"v": "x"},
                           headers={"Fencing-Token": ring.sign(lock, 9)})
            body = assert_problem(r, 403, "lock_not_allowed")
            assert body["lock"] == "items" and body["token_lock"] == lock
            assert body["detail"] == f"table 'items' is written under lock 'items', not '{lock}'"
        ok = client.put("/v1/tables/items/rows/1", json={"v": "ok"},
                        headers={"Fencing-Token": ring.sign("items", 1)})
        assert ok.status_code == 200, ok.text
        assert client.get("/v1/tables/items/lock").json()["lock"] == "items"
        assert client.get("/v1/fences/x").json()["highest"] == 0
    assert database.query("SELECT id, v FROM items") == [("1", "ok")]
    assert "UNFENCED" not in proc.log()


def test_unfenced_is_said_at_start_and_on_the_status_page(tmp_path, start_proxy):
    db = tmp_path / "u.db"
    Database("sqlite", "", path=str(db)).script("CREATE TABLE notes (id INTEGER PRIMARY KEY, v TEXT)")
    policy = tmp_path / "p.yaml"
    policy.write_text("tables: {notes: {unfenced: true}}")
    url, proc = start_proxy(f"sqlite:///{db}", "--jwks-file",
                            str(write_jwks(tmp_path, KeyRing.generate())), "--policy", str(policy))
    assert "UNFENCED (written without a token): notes" in proc.log()
    assert httpx.post(f"{url}/v1/tables/notes/rows", json={"v": "x"}).status_code == 201
    page = httpx.get(url + "/").text
    assert "UNFENCED" in page and "/v1/tables" in page
    assert httpx.get(f"{url}/v1/tables").json()["items"] == [
        {"table": "notes", "lock": None, "unfenced": True}]


def test_postgres_rounding_on_store_is_part_of_the_canonical_key(pg_dsn, tmp_path, start_proxy):
    """numeric(12,2), timestamptz(0) and real keys: PostgreSQL rounds what it stores, so a key
    spelled with more digits IS the rounded row, and its lock is the rounded value's."""
    db = Database("postgres", pg_dsn, dsn=pg_dsn)
    db.script("CREATE TABLE r_num (id numeric(12,2) PRIMARY KEY, v text);"
              " CREATE TABLE r_ts (id timestamptz(0) PRIMARY KEY, v text);"
              " CREATE TABLE r_real (id real PRIMARY KEY, v text);")
    policy = tmp_path / "p.yaml"
    policy.write_text("tables: {r_num: 'r_num/{key}', r_ts: 'r_ts/{key}', r_real: 'r_real/{key}'}")
    ring = KeyRing.generate()
    url, _ = start_proxy(pg_dsn, "--jwks-file", str(write_jwks(tmp_path, ring)), "--policy", str(policy))
    cases = [("r_num", "1.001", "r_num/1", "1.00"), ("r_num", "-1.005", "r_num/-1.01", "-1.01"),
             ("r_ts", quote("2024-05-01T12:00:00.5+00:00"), "r_ts/20240501T120001Z", None),
             ("r_real", "1.00000001", "r_real/1", None)]
    with httpx.Client(base_url=url) as client:
        for table, key, lock, stored in cases:
            assert client.get(f"/v1/tables/{table}/lock?key={key}").json()["lock"] == lock
            spelled = f"{table}/{key}".replace("%3A", ":3A").replace("%2B", ":2B")
            refused = client.put(f"/v1/tables/{table}/rows/{key}", json={"v": "by spelling"},
                                 headers={"Fencing-Token": ring.sign(spelled, 9)})
            assert assert_problem(refused, 403, "lock_not_allowed")["lock"] == lock
            ok = client.put(f"/v1/tables/{table}/rows/{key}", json={"v": "by the row's lock"},
                            headers={"Fencing-Token": ring.sign(lock, 1)})
            assert ok.status_code == 200, ok.text
            if stored is not None:
                assert db.query(f"SELECT id::text, v FROM {table} WHERE id = ?::numeric",
                                (stored,)) == [(stored, "by the row's lock")]
    assert db.query("SELECT count(*) FROM r_ts") == [(1,)] and db.query("SELECT count(*) FROM r_real") == [(1,)]
