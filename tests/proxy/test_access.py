"""``resource-proxy serve --access-file``: identities scoped to tables (403 ``forbidden_table``),
admins and plain API keys unscoped, a bad file refused at start (exit 2, one line)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import httpx
import pytest

from harness import free_port
from lockd.common.access import AccessFileError, parse_access
from lockd.tokens import KeyRing
from tests.proxy.conftest import (
    POLICY,
    SERVED,
    assert_problem,
    make_database,
    proxy_argv,
    unique,
    unique_id,
    write_jwks,
)

BILLING, REPORTS, OPS, PLAIN = "billing-key-1234", "reports-key-5678", "ops-key-abcdefgh", "plain-key-0000"

ACCESS = f"""
clients:
  - name: billing
    key: {BILLING}
    tables: [accounts, pairs]
  - name: reports
    key_sha256: {hashlib.sha256(REPORTS.encode()).hexdigest()}
    tables: [items]
admins:
  - name: ops
    key: {OPS}
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def scoped(request, tmp_path_factory):
    """A proxy with the access file ``ACCESS`` and one plain API key; yields (url, ring, db)."""
    from harness import ServiceProcess, drop_database

    backend = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"access-{backend}")
    db = make_database(backend, directory, admin)
    ring = KeyRing.generate()
    (directory / "policy.yaml").write_text(POLICY)
    (directory / "access.yaml").write_text(ACCESS)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = proxy_argv(db.url, port, "--jwks-file", str(write_jwks(directory, ring)), "--tables",
                      SERVED, "--policy", str(directory / "policy.yaml"))
    proc = ServiceProcess(argv, ready_url=f"{url}/healthz", log_path=directory / "proxy.log",
                          env={"PROXY_ACCESS_FILE": str(directory / "access.yaml"),
                               "PROXY_API_KEYS": PLAIN})
    proc.start()
    try:
        yield url, ring, db
        assert proc.stop() == 0, proc.log()
    finally:
        proc.stop()
        if backend == "postgres":
            drop_database(db.dsn, admin)


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"})


def test_a_scoped_identity_writes_only_its_tables(scoped):
    url, ring, db = scoped
    item, account = unique("i"), unique_id()
    with _client(url, BILLING) as billing:
        put = billing.put(f"/v1/tables/accounts/rows/{account}", json={"balance": 1},
                          headers={"Fencing-Token": ring.sign(f"accounts/{account}", 1)})
        assert put.status_code == 200, put.text
        refused = billing.put(f"/v1/tables/items/rows/{item}", json={"v": "x"},
                              headers={"Fencing-Token": ring.sign(f"items/{item}", 1)})
        problem = assert_problem(refused, 403, "forbidden_table")
        assert problem["table"] == "items" and problem["identity"] == "billing"
        assert BILLING not in refused.text
        # no token at all: still the table's refusal, before the token's
        assert_problem(billing.delete(f"/v1/tables/items/rows/{item}"), 403, "forbidden_table")
        batch = billing.post("/v1/batch", json={"ops": [
            {"op": "upsert", "table": "pairs", "key": [1, "a"], "row": {"v": "ok"}},
            {"op": "upsert", "table": "items", "key": item, "row": {"v": "no"}}]},
            headers={"Fencing-Token": ring.sign("pairs/1", 1)})
        assert assert_problem(batch, 403, "forbidden_table")["op_index"] == 1
        fenced_read = billing.get(f"/v1/tables/items/rows/{item}",
                                  headers={"Fencing-Token": ring.sign(f"items/{item}", 1)})
        assert_problem(fenced_read, 403, "forbidden_table")
        assert billing.get(f"/v1/tables/items/rows/{item}").status_code == 404  # plain read
        claim = billing.post(f"/v1/fences/items/{item}/claim",
                             headers={"Fencing-Token": ring.sign(f"items/{item}", 5)})
        assert_problem(claim, 403, "forbidden_table")
        claim_all = billing.post("/v1/fences/claim",
                                 headers={"Fencing-Token": ring.sign(f"items/{item}", 5)})
        assert_problem(claim_all, 403, "forbidden_table")
        assert not billing.get(f"/v1/fences/items/{item}").json()["highest"]  # nothing claimed
    assert db.query("SELECT count(*) FROM items WHERE id = ?", [item]) == [(0,)]
    assert db.query("SELECT count(*) FROM pairs WHERE a = 1 AND b = 'a'") == [(0,)]


def test_a_key_sha256_identity_admins_and_plain_keys(scoped):
    url, ring, _ = scoped
    item, account = unique("i"), unique_id()
    with _client(url, REPORTS) as reports:
        ok = reports.put(f"/v1/tables/items/rows/{item}", json={"v": "r"},
                         headers={"Fencing-Token": ring.sign(f"items/{item}", 1)})
        assert ok.status_code == 200, ok.text
        refused = reports.put(f"/v1/tables/accounts/rows/{account}", json={"balance": 1},
                              headers={"Fencing-Token": ring.sign(f"accounts/{account}", 1)})
        assert assert_problem(refused, 403, "forbidden_table")["identity"] == "reports"
    for key in (OPS, PLAIN):  # an admin and a PROXY_API_KEYS key: every table
        with _client(url, key) as anyone:
            put = anyone.put(f"/v1/tables/accounts/rows/{account}", json={"balance": 2},
                             headers={"Fencing-Token": ring.sign(f"accounts/{account}", 2)})
            assert put.status_code == 200, put.text
    with _client(url, "wrong-key-999") as stranger:
        assert_problem(stranger.get(f"/v1/tables/items/rows/{item}"), 401, "unauthorized")


BAD_FILES = [
    ("clients:\n  - {name: a, key: aaaaaaaa, tables: [t], color: red}\n", "unknown field 'color'"),
    ("clients:\n  - {name: a, key: aaaaaaaa, tables: []}\n", "tables must be a non-empty list"),
    ("clients:\n  - {name: a, key: aaaaaaaa}\n", "give at least one of tables, buckets"),
    ("clients:\n  - {name: a, key: aaaaaaaa, tables: [t]}\n"
     "  - {name: b, key: aaaaaaaa, tables: [u]}\n", "the same key as 'a'"),
    ("clients:\n  - {name: a, key: aaaaaaaa, tables: [t]}\n"
     "admins:\n  - {name: a, key: bbbbbbbb}\n", "the name 'a' is used twice"),
    ("admins:\n  - {name: a, key: bbbbbbbb, tables: [t]}\n", "unknown field 'tables'"),
    ("clients:\n  - {name: a, key: short, tables: [t]}\n", "at least 8 characters"),
    ("clients:\n  - {name: a, key_sha256: abc, tables: [t]}\n", "64 hex digits"),
    ("clients:\n  - {name: a, key: aaaaaaaa, subject: CN=a, tables: [t]}\n", "exactly one of"),
    ("users: []\n", "unknown field 'users'"),
    ("clients: [\n", "not valid YAML"),
    ("clients:\n  - {name: a, subject: CN=a, tables: [t]}\n", "need --tls-client-ca"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES, ids=[m for _, m in BAD_FILES])
def test_a_bad_access_file_is_refused_at_start(tmp_path: Path, text: str, message: str):
    access = tmp_path / "access.yaml"
    access.write_text(text)
    ring = KeyRing.generate()
    argv = proxy_argv(f"sqlite:///{tmp_path}/r.db", free_port(), "--jwks-file",
                      str(write_jwks(tmp_path, ring)), "--access-file", str(access))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert str(access) in proc.stderr and "Traceback" not in proc.stderr


def test_the_shared_parser_takes_each_servers_scope_field():
    doc = {"clients": [{"name": "a", "key": "aaaaaaaa", "prefixes": ["jobs/", ""]},
                       {"name": "b", "subject": "CN=b, O=Acme", "prefixes": ["b/"]}],
           "admins": [{"name": "root", "key": "rrrrrrrr"}]}
    parsed = parse_access(doc, source="x", scope_field="prefixes")
    a, b, root = parsed.identities
    assert a.scope == ("jobs/", "") and b.subject == "CN=b,O=Acme" and root.scope is None
    assert a.key_id == hashlib.sha256(b"aaaaaaaa").hexdigest()[:16]
    assert b.key_id.startswith("cert:") and parsed.subjects("client") == ["CN=b,O=Acme"]
    with pytest.raises(AccessFileError, match="unknown field"):
        parse_access(doc, source="x", scope_field="tables")  # prefixes is not the proxy's
