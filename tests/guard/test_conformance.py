"""``lockctl conformance`` as a real process against real services and a real lockd: it passes
on the proxy's rows (the contract's own example) and its objects, on both example services (the SQLite one
across a real restart, ``--restart-cmd``) and so on the Redis functions; it fails on the
deliberately unfenced service, naming the failed checks."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import uuid

import httpx
import pytest

from harness import VENV_BIN, ServiceProcess, free_port, wait_for
from tests.guard.services import ExampleService

LOCKCTL = str(VENV_BIN / "lockctl")
CHECKS = ["current-holder", "superseded-holder", "shared-token", "other-lock", "forged-token",
          "refusal-persists"]


def conformance(lockd_url: str, target: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LOCKCTL, "--url", lockd_url, "conformance", target, *args],
                          capture_output=True, text=True, timeout=120)


def passed(r: subprocess.CompletedProcess, checks: list[str] = CHECKS) -> None:
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[1].rstrip(":") for line in lines[:-1]] == checks, r.stdout
    assert all(line.startswith("PASS") for line in lines[:-1]), r.stdout
    assert lines[-1] == f"conformance: all {len(checks)} checks passed"


@pytest.fixture
def proxy_on_table(shared_lockd, tmp_path):
    """A resource proxy over a SQLite database with table T (id, v), no policy: lock T."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    db = tmp_path / "res.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, v INTEGER)")
    port = free_port()
    proc = ServiceProcess(
        [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", f"sqlite:///{db}",
         "--lockd-url", shared_lockd.url, "--port", str(port)],
        ready_url=f"http://127.0.0.1:{port}/healthz", log_path=tmp_path / "proxy.log").start()
    yield f"http://127.0.0.1:{port}", table, db
    proc.stop()


def test_the_proxys_rows_pass_the_contracts_example(shared_lockd, proxy_on_table):
    url, table, db = proxy_on_table
    r = conformance(shared_lockd.url, url, "--lock", table,
                    "--write", f'PUT /v1/tables/{table}/rows/1 {{"v": 1}}',
                    "--read", f"GET /v1/tables/{table}/rows/1")
    passed(r, CHECKS[:1] + ["read-current", "superseded-holder", "read-superseded"] + CHECKS[2:])
    with sqlite3.connect(db) as conn:
        assert conn.execute(f"SELECT id, v FROM {table}").fetchall() == [(1, 1)]


def test_the_proxys_objects_pass(shared_lockd, tmp_path):
    """Fenced objects: bucket B, no policy, so every object of B is written under lock B."""
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    port = free_port()
    proc = ServiceProcess(
        [str(VENV_BIN / "resource-proxy"), "serve", "--database-url",
         f"sqlite:///{tmp_path / 'objects.db'}", "--objects-dir", str(tmp_path / "blobs"),
         "--lockd-url", shared_lockd.url, "--port", str(port)],
        ready_url=f"http://127.0.0.1:{port}/healthz", log_path=tmp_path / "proxy.log").start()
    try:
        url = f"http://127.0.0.1:{port}"
        r = conformance(shared_lockd.url, url, "--lock", bucket,
                        "--write", f'PUT /v1/objects/{bucket}/reports/daily.json {{"v": 1}}',
                        "--read", f"GET /v1/objects/{bucket}/reports/daily.json")
        passed(r, CHECKS[:1] + ["read-current", "superseded-holder", "read-superseded"]
               + CHECKS[2:])
        got = httpx.get(f"{url}/v1/objects/{bucket}/reports/daily.json")
        assert got.status_code == 200 and json.loads(got.content) == {"v": 1}
    finally:
        proc.stop()


def test_json_output(shared_lockd, proxy_on_table):
    url, table, _ = proxy_on_table
    r = subprocess.run([LOCKCTL, "--url", shared_lockd.url, "--json", "conformance", url,
                        "--lock", table, "--write", f'PUT /v1/tables/{table}/rows/2 {{"v": 2}}'],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] is True
    assert [c["check"] for c in doc["checks"]] == CHECKS and all(c["ok"] for c in doc["checks"])


def test_the_sqlite_example_passes_across_a_real_restart(shared_lockd, tmp_path):
    service = ExampleService(tmp_path, "orders_sqlite.py", "--lockd-url", shared_lockd.url,
                             "--db", str(tmp_path / "orders.db"))
    pidfile, log = tmp_path / "service.pid", tmp_path / "service.log"
    start = f"{shlex.join(service.argv)} >>{log} 2>&1 & echo $! > {pidfile}"
    restart = (f"kill $(cat {pidfile}); while kill -0 $(cat {pidfile}) 2>/dev/null; "
               f"do sleep 0.05; done; {start}")
    subprocess.run(start, shell=True, check=True)
    try:
        wait_for(lambda: _answers(service.url + "/healthz"), timeout=20, what="the example")
        first_pid = int(pidfile.read_text())
        r = conformance(shared_lockd.url, service.url, "--lock", "orders/7",
                        "--write", 'PUT /orders/7 {"item": "tea"}', "--restart-cmd", restart)
        passed(r)
        assert "after --restart-cmd" in r.stdout
        assert int(pidfile.read_text()) != first_pid  # a new process answered the last check
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGTERM)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_redis_example_passes(shared_lockd, redis_client, tmp_path):
    service = ExampleService(tmp_path, "cache_redis.py", "--lockd-url", shared_lockd.url,
                             "--prefix", redis_client.test_prefix).start()
    try:
        r = conformance(shared_lockd.url, service.url, "--lock", "cache/k",
                        "--write", 'PUT /cache/k {"value": 1}')
        passed(r)
        assert redis_client.get(redis_client.test_prefix + "k") == b"1"
    finally:
        service.stop()


def test_the_unfenced_service_fails_naming_the_checks(shared_lockd, tmp_path):
    service = ExampleService(tmp_path, "unfenced_service.py", "--lockd-url",
                             shared_lockd.url).start()
    try:
        r = conformance(shared_lockd.url, service.url, "--lock", "things/1",
                        "--write", 'PUT /things/1 {"x": 1}')
    finally:
        service.stop()
    assert r.returncode == 1, r.stdout
    assert "FAIL  superseded-holder: PUT /things/1 by fence" in r.stdout
    assert "200, want 409" in r.stdout
    assert r.stdout.splitlines()[-1].startswith(
        "conformance: FAILED superseded-holder, refusal-persists (2 of 6 checks)")
    assert "PASS  shared-token" in r.stdout and "PASS  forged-token" in r.stdout


def test_usage_errors_exit_2(shared_lockd):
    for write in ("PUT", "PUT /x {not json", "PUT x"):
        r = conformance(shared_lockd.url, "http://127.0.0.1:1", "--lock", "l", "--write", write)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_a_service_that_does_not_answer_fails_the_checks(shared_lockd):
    r = conformance(shared_lockd.url, f"http://127.0.0.1:{free_port()}", "--lock",
                    f"gone-{uuid.uuid4().hex[:6]}", "--write", "PUT /x {}")
    assert r.returncode == 1 and "FAIL  current-holder" in r.stdout and "no answer" in r.stdout


def test_a_failing_restart_command_fails_the_persistence_check(shared_lockd, proxy_on_table):
    url, table, _ = proxy_on_table
    r = conformance(shared_lockd.url, url, "--lock", table,
                    "--write", f'PUT /v1/tables/{table}/rows/3 {{"v": 3}}',
                    "--restart-cmd", "echo cannot restart >&2; exit 3")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "FAIL  refusal-persists: --restart-cmd exited 3: cannot restart" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("conformance: FAILED refusal-persists ")
