"""``resource-proxy serve`` as a process: defaults, start-up errors, the fence table, signals."""

from __future__ import annotations

import sqlite3
import subprocess

import httpx
import psycopg
import pytest

from harness import ServiceProcess, drop_database, free_port, wait_for
from lockd.tokens import KeyRing
from tests.proxy.conftest import (
    PG_SCHEMA,
    SQLITE_SCHEMA,
    assert_problem,
    make_database,
    proxy_argv,
    write_jwks,
)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    admin = request.getfixturevalue("pg_admin_dsn") if request.param == "postgres" else None
    db = make_database(request.param, tmp_path, admin)
    yield db
    if admin is not None:
        drop_database(db.dsn, admin)


def test_default_serves_every_table_but_its_own_and_creates_the_fence_table_idempotently(
        database, tmp_path, start_proxy):
    ring = KeyRing.generate()
    jwks = str(write_jwks(tmp_path, ring))
    url, first = start_proxy(database.url, "--jwks-file", jwks)
    own = "resource_proxy_fences" if database.backend == "sqlite" else "fencing.fences"
    with httpx.Client(base_url=url) as client:
        secret = client.put("/v1/tables/secrets/rows/1", json={"v": "x"},
                            headers={"Fencing-Token": ring.sign("secrets", 3)})
        assert secret.status_code == 200, "without --tables every table is served"
        assert_problem(client.get(f"/v1/tables/{own}/rows"), 404, "not_found")
        assert_problem(client.get("/v1/tables/fences/rows"), 404, "not_found")
    assert "resource-proxy listening on http://127.0.0.1:" in first.log()
    assert first.stop() == 0, "SIGTERM stops the proxy cleanly"

    # A second start on the same database finds the fence table and keeps its fences.
    url, _ = start_proxy(database.url, "--jwks-file", jwks)
    assert httpx.get(f"{url}/v1/fences/secrets").json() == {"lock": "secrets", "highest": 3}
    assert database.query(f"SELECT lock, highest FROM {own}") == [("secrets", 3)]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, env=env)


def test_bad_configuration_refuses_to_start(tmp_path):
    db = tmp_path / "r.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(SQLITE_SCHEMA)
    jwks = str(write_jwks(tmp_path, KeyRing.generate()))
    url = f"sqlite:///{db}"
    port = free_port()

    neither = _run(*proxy_argv(url, port))
    assert neither.returncode == 2 and neither.stderr == (
        "resource-proxy: settings: give exactly one of lockd_url (--lockd-url) or jwks_file "
        "(--jwks-file)\n")  # the validator's words, without pydantic's "Value error, "
    bad_url = _run(*proxy_argv("mysql://x/y", port, "--jwks-file", jwks))
    assert bad_url.returncode == 2 and "database_url" in bad_url.stderr
    for inline in ("-1", str((1 << 20) + 1)):  # an object's body kept in a row: 0 to 1 MiB
        refused = _run(*proxy_argv(url, port, "--jwks-file", jwks, "--objects-dir",
                                   str(tmp_path / "o"), "--objects-inline-max", inline))
        assert refused.returncode == 2 and "objects_inline_max" in refused.stderr, inline

    policy = tmp_path / "p.yaml"
    policy.write_text("tables: {items: {fence_column: 3}}\n")
    assert _run(*proxy_argv(url, port, "--jwks-file", jwks, "--policy", str(policy))).returncode == 2
    policy.write_text("tables: {items: {fence_column: v}}\n")  # a text column cannot hold fences
    started = _run(*proxy_argv(url, port, "--jwks-file", jwks, "--policy", str(policy)))
    assert started.returncode == 2 and "fence_column" in started.stderr  # found after reflection

    missing = _run(*proxy_argv(url, port, "--jwks-file", jwks, "--tables", "items,nope"))
    assert missing.returncode == 1 and "nope" in missing.stdout + missing.stderr
    no_keys = tmp_path / "empty.json"
    no_keys.write_text('{"keys": []}')
    assert _run(*proxy_argv(url, port, "--jwks-file", str(no_keys))).returncode == 1


def test_two_proxies_starting_at_once_on_a_fresh_postgres_database(pg_dsn, tmp_path):
    """The fence schema and table are created under an advisory lock: no start-up race."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(PG_SCHEMA)
    jwks = str(write_jwks(tmp_path, KeyRing.generate()))
    procs = []
    for _ in range(3):
        port = free_port()
        procs.append(ServiceProcess(proxy_argv(pg_dsn, port, "--jwks-file", jwks),
                                    ready_url=f"http://127.0.0.1:{port}/healthz",
                                    log_path=tmp_path / f"p{port}.log"))
    try:
        for proc in procs:  # Popen all first, so they prepare the database concurrently
            proc.proc = subprocess.Popen(proc.argv, env=proc.env, stdout=open(proc.log_path, "ab"),
                                         stderr=subprocess.STDOUT, start_new_session=True)
        for proc in procs:
            wait_for(lambda p=proc: _ready(p), timeout=30, what="proxy ready")
    finally:
        for proc in procs:
            assert proc.stop() == 0, proc.log()


def _ready(proc) -> bool:
    assert proc.proc.poll() is None, proc.log()
    try:
        return httpx.get(proc.ready_url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_table_created_after_start_is_404_saying_how_to_serve_it(tmp_path, start_proxy):
    """The 404 says tables are reflected at start and that a restart adds one."""
    import httpx

    from lockd.tokens import KeyRing
    from tests.proxy.conftest import assert_problem, make_database, write_jwks

    ring = KeyRing.generate()
    db = make_database("sqlite", tmp_path, None)
    url, _ = start_proxy(db.url, "--jwks-file", str(write_jwks(tmp_path, ring)))
    db.script("CREATE TABLE late (id integer PRIMARY KEY, v text)")
    answer = httpx.post(f"{url}/v1/tables/late/rows", json={"id": 1, "v": "x"},
                        headers={"Fencing-Token": ring.sign("late", 1)})
    problem = assert_problem(answer, 404, "not_found")
    assert problem["detail"] == (
        "no table 'late' is served by this proxy: tables are reflected when it starts (restart "
        "it after creating one) and must be in --tables / PROXY_TABLES if that is set; "
        "GET /v1/tables lists them")
    assert db.query("SELECT count(*) FROM late") == [(0,)]
    nowhere = assert_problem(httpx.get(f"{url}/nowhere"), 404, "not_found")
    assert nowhere["detail"] == "no such route; /docs (or GET /openapi.json) describes the API"
    docs = httpx.get(f"{url}/docs")  # Swagger UI, its assets from the proxy itself
    assert docs.status_code == 200 and "/docs/swagger-ui-bundle.js" in docs.text
    assert "cdn" not in docs.text.lower()
