"""Database roles around a running proxy, on a real PostgreSQL with real non-superuser roles:
``resource-proxy db install`` run by the role that owns the tables after a proxy (another role)
created the fence core; a proxy whose role may not claim says so at start and serves once
``db install --claim-role`` names it; and a claim held open by another connection cannot take
the proxy's pool: its fence statements give up after ``PROXY_LOCK_TIMEOUT_MS`` with 503
``lock_timeout``, while unrelated writes and ``/healthz`` are served.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from harness import free_port, sqlalchemy_url
from lockd.tokens import KeyRing
from tests.proxy.conftest import assert_problem, proxy_argv, write_jwks
from tests.proxy.test_db_command import _db, _run


def as_user(dsn: str, user: str) -> str:
    """``dsn`` (a ``postgresql://user@host/db`` URL) for another role (trust authentication)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest.fixture
def role(pg_dsn):
    """``role(prefix)``: a LOGIN role of this test's own (no rights); dropped at the end."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        _run(pg_dsn, f'CREATE ROLE "{name}" LOGIN')
        made.append(name)
        return name

    yield make
    for name in made:
        _run(pg_dsn, f'DROP OWNED BY "{name}"', f'DROP ROLE "{name}"')


def _put(client: httpx.Client, ring: KeyRing, key: int, fence: int, **headers: str):
    return client.put(f"/v1/tables/jobs/rows/{key}", json={"state": f"f{fence}"},
                      headers={"Fencing-Token": ring.sign(f"jobs/{key}", fence), **headers})


def test_the_tables_owner_installs_after_a_proxy_created_the_core(
        pg_dsn, tmp_path, start_proxy, role):
    owner = role("owner")
    _run(pg_dsn, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)",
         f'ALTER TABLE jobs OWNER TO "{owner}"')
    policy = tmp_path / "policy.yaml"
    policy.write_text('tables:\n  jobs: "jobs/{key}"\n')
    ring = KeyRing.generate()
    jwks = str(write_jwks(tmp_path, ring))
    url, proc = start_proxy(sqlalchemy_url(pg_dsn), "--jwks-file", jwks, "--policy", str(policy))
    with httpx.Client(base_url=url) as client:
        assert _put(client, ring, 1, 3).status_code == 200
    assert proc.stop() == 0

    done = _db("install", "--database-url", as_user(pg_dsn, owner), "--policy", str(policy))
    assert done.returncode == 0, done.stderr
    assert "jobs: lock 'jobs/{key}'" in done.stdout.splitlines()
    with pytest.raises(psycopg.Error, match='lock "jobs/2"') as refused:
        _run(as_user(pg_dsn, owner), "INSERT INTO jobs VALUES (2, 'unclaimed')")
    assert refused.value.sqlstate == "LF002"
    url, _ = start_proxy(sqlalchemy_url(pg_dsn), "--jwks-file", jwks, "--policy", str(policy))
    with httpx.Client(base_url=url) as client:
        assert _put(client, ring, 2, 1).status_code == 200, "the proxy passes the triggers"
        assert_problem(_put(client, ring, 1, 2), 409, "stale_token")


def test_a_proxy_whose_role_may_not_claim_says_so_until_it_is_named(
        pg_dsn, tmp_path, start_proxy, role):
    proxy_role = role("proxy")
    _run(pg_dsn, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)",
         f'GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO "{proxy_role}"',
         f'CREATE SCHEMA resource_proxy AUTHORIZATION "{proxy_role}"')
    assert _db("install", "--database-url", pg_dsn).returncode == 0
    ring = KeyRing.generate()
    jwks = str(write_jwks(tmp_path, ring))
    database = sqlalchemy_url(as_user(pg_dsn, proxy_role))
    refused = subprocess.run(proxy_argv(database, free_port(), "--jwks-file", jwks),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"role {proxy_role!r} may not execute fencing.try_claim(text,bigint): resource-proxy "
            f"db install --claim-role {proxy_role}") in refused.stdout + refused.stderr
    granted = _db("install", "--database-url", pg_dsn, "--claim-role", proxy_role)
    assert granted.returncode == 0, granted.stderr
    url, _ = start_proxy(database, "--jwks-file", jwks)
    with httpx.Client(base_url=url) as client:
        r = client.put("/v1/tables/jobs/rows/1", json={"state": "x"},
                       headers={"Fencing-Token": ring.sign("jobs", 1)})
        assert r.status_code == 200, r.text


def test_a_claim_held_open_times_out_its_lock_and_starves_nothing_else(
        pg_dsn, tmp_path, start_proxy, monkeypatch):
    _run(pg_dsn, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)")
    policy = tmp_path / "policy.yaml"
    policy.write_text('tables:\n  jobs: "jobs/{key}"\n')
    ring = KeyRing.generate()
    monkeypatch.setenv("PROXY_POOL_SIZE", "3")
    monkeypatch.setenv("PROXY_LOCK_TIMEOUT_MS", "500")
    url, _ = start_proxy(sqlalchemy_url(pg_dsn), "--jwks-file", str(write_jwks(tmp_path, ring)),
                         "--policy", str(policy))
    with psycopg.connect(pg_dsn) as holder, httpx.Client(base_url=url, timeout=30) as client:
        holder.execute("SELECT fencing.claim('jobs/1', 5)")  # held: the transaction stays open
        answers: list[httpx.Response] = []

        def blocked() -> None:
            with httpx.Client(base_url=url, timeout=30) as own:
                answers.append(_put(own, ring, 1, 5))

        writers = [threading.Thread(target=blocked) for _ in range(6)]  # twice the pool
        for writer in writers:
            writer.start()
        started = time.monotonic()
        health = client.get("/healthz")
        other = _put(client, ring, 2, 1)
        elapsed = time.monotonic() - started
        for writer in writers:
            writer.join(30)
        assert health.status_code == 200, health.text
        assert other.status_code == 200, other.text
        assert elapsed < 2.5, f"unrelated calls waited {elapsed:.2f} s for a connection"
        assert len(answers) == 6
        for answer in answers:
            body = assert_problem(answer, 503, "lock_timeout")
            assert answer.headers["retry-after"] == "1"
            assert "500 ms" in body["detail"] and "nothing was committed" in body["detail"]
        holder.rollback()
    with httpx.Client(base_url=url) as client:
        assert _put(client, ring, 1, 5).status_code == 200, "served once the claim ended"
