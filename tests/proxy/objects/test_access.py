"""``--access-file`` scopes buckets as it scopes tables: a client may write, claim and read
fenced the objects of the buckets its ``buckets:`` lists (``"*"``: every one), and none when it
leaves the field out, so a client scoped to tables writes no object (403 ``forbidden_bucket``,
nothing written); admins and plain API keys are unscoped."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from harness import ServiceProcess, drop_database, free_port
from lockd.common.access import AccessFileError
from lockd.tokens import KeyRing
from resource_proxy.access import load_table_access
from tests.proxy.conftest import assert_problem, make_database, proxy_argv, write_jwks
from tests.proxy.objects.conftest import POLICY

TABLER, WRITER, EVERY, OPS, PLAIN = ("tabler-key-0001", "writer-key-0002", "every-key-0003",
                                     "ops-key-00000004", "plain-key-0005")
MINE, OTHER = f"mine{uuid.uuid4().hex[:8]}", f"other{uuid.uuid4().hex[:8]}"

ACCESS = f"""
clients:
  - name: tabler
    key: {TABLER}
    tables: [items]
  - name: writer
    key: {WRITER}
    buckets: [{MINE}, reports]
  - name: every
    key: {EVERY}
    tables: ["*"]
    buckets: ["*"]
admins:
  - name: ops
    key: {OPS}
"""


@dataclass
class Scoped:
    url: str
    ring: KeyRing
    root: object

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {key}"})

    def auth(self, lock: str, fence: int) -> dict[str, str]:
        return {"Fencing-Token": self.ring.sign(lock, fence)}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def scoped(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Scoped]:
    backend = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"objects-access-{backend}")
    db = make_database(backend, directory, admin)
    ring = KeyRing.generate()
    (directory / "policy.yaml").write_text(POLICY)
    (directory / "access.yaml").write_text(ACCESS)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = proxy_argv(db.url, port, "--jwks-file", str(write_jwks(directory, ring)),
                      "--policy", str(directory / "policy.yaml"),
                      "--objects-dir", str(directory / "objects"),
                      "--access-file", str(directory / "access.yaml"))
    proc = ServiceProcess(argv, ready_url=f"{url}/healthz", log_path=directory / "proxy.log",
                          env={"PROXY_API_KEYS": PLAIN})
    proc.start()
    try:
        yield Scoped(url, ring, directory / "objects")
        assert proc.stop() == 0, proc.log()
    finally:
        proc.stop()
        if backend == "postgres":
            drop_database(db.dsn, admin)
        shutil.rmtree(directory, ignore_errors=True)


def _put(client: httpx.Client, s: Scoped, bucket: str, key: str, fence: int) -> httpx.Response:
    return client.put(f"/v1/objects/{bucket}/{key}", content=b"body",
                      headers=s.auth(bucket, fence))


def test_a_client_scoped_to_tables_writes_no_object_and_claims_no_objects_lock(scoped):
    with scoped.client(TABLER) as tabler, scoped.client(OPS) as ops:
        refused = assert_problem(_put(tabler, scoped, MINE, "t/1", 1), 403, "forbidden_bucket")
        assert (refused["bucket"], refused["identity"]) == (MINE, "tabler")
        assert ops.get(f"/v1/objects/{MINE}/t/1").status_code == 404  # nothing written
        assert_problem(tabler.delete(f"/v1/objects/{MINE}/t/1", headers=scoped.auth(MINE, 2)),
                       403, "forbidden_bucket")
        assert_problem(tabler.post(f"/v1/fences/{MINE}/claim", headers=scoped.auth(MINE, 3)),
                       403, "forbidden_bucket")
        assert ops.get(f"/v1/fences/{MINE}").json()["highest"] == 0  # no fence raised
        assert _put(ops, scoped, MINE, "t/1", 4).status_code == 201
        # a fenced read is scoped like a write; a read without a token fences nothing
        assert_problem(tabler.get(f"/v1/objects/{MINE}/t/1", headers=scoped.auth(MINE, 4)),
                       403, "forbidden_bucket")
        assert tabler.get(f"/v1/objects/{MINE}/t/1").content == b"body"


def test_a_client_scoped_to_buckets_writes_those_only_and_no_table(scoped):
    with scoped.client(WRITER) as writer:
        assert _put(writer, scoped, MINE, "w/1", 10).status_code == 201
        assert_problem(_put(writer, scoped, OTHER, "w/1", 10), 403, "forbidden_bucket")
        assert writer.post(f"/v1/fences/{MINE}/claim",
                           headers=scoped.auth(MINE, 11)).status_code == 200
        # a template's lock: reports/2026 governs bucket reports' objects under 2026/
        assert writer.put("/v1/objects/reports/2026/q4.pdf", content=b"x",
                          headers=scoped.auth("reports/2026", 1)).status_code in (200, 201)
        assert writer.post("/v1/fences/reports/2026/claim",
                           headers=scoped.auth("reports/2026", 2)).status_code == 200
        assert_problem(writer.put("/v1/tables/items/rows/w1", json={"v": "x"},
                                  headers=scoped.auth("items", 1)), 403, "forbidden_table")


@pytest.mark.parametrize("key", [EVERY, OPS, PLAIN], ids=["every", "admin", "plain-key"])
def test_every_bucket_for_a_star_an_admin_and_a_plain_key(scoped, key):
    bucket = f"any{uuid.uuid4().hex[:8]}"
    with scoped.client(key) as client:
        assert _put(client, scoped, bucket, "k", 1).status_code == 201
        assert client.post(f"/v1/fences/{bucket}/claim",
                           headers=scoped.auth(bucket, 2)).status_code == 200


def test_a_client_needs_a_scope_field_and_buckets_must_list_names(tmp_path):
    path = tmp_path / "access.yaml"
    path.write_text("clients:\n  - name: none\n    key: none-key-0001\n")
    with pytest.raises(AccessFileError, match="give at least one of tables, buckets"):
        load_table_access(path)
    path.write_text("clients:\n  - name: empty\n    key: empty-key-001\n    buckets: []\n")
    with pytest.raises(AccessFileError, match="buckets must be a non-empty list"):
        load_table_access(path)
    path.write_text("clients:\n  - name: b\n    key: bucket-key-01\n    buckets: [x]\n")
    (identity,) = load_table_access(path).identities
    assert identity.scope == () and identity.scope_of("buckets") == ("x",)
