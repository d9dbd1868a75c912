"""``lockd serve``: LOCKD_* variables, flags over variables, clear failures on bad settings."""

from __future__ import annotations

import subprocess

from harness import ServiceProcess, free_port
from tests.server.calls import acquire
from tests.server.conftest import LOCKD


def test_environment_configures_lockd_and_flags_override_it(tmp_path, http):
    port = free_port()
    env = {"LOCKD_STORE": f"sqlite:///{tmp_path}/env.db", "LOCKD_PORT": str(free_port()),
           "LOCKD_KEY_DIR": str(tmp_path / "env-keys"), "LOCKD_MAX_TTL_MS": "2000"}
    with ServiceProcess([LOCKD, "serve", "--port", str(port)], env=env, cwd=tmp_path,
                        ready_url=f"http://127.0.0.1:{port}/healthz",
                        log_path=tmp_path / "env.log") as proc:
        url = f"http://127.0.0.1:{port}"
        assert acquire(http, url, "env/a", 2_000).status_code == 200
        assert acquire(http, url, "env/b", 2_001).status_code == 422  # LOCKD_MAX_TTL_MS
        assert (tmp_path / "env.db").exists() and list((tmp_path / "env-keys").glob("*.pem"))
        assert f"lockd listening on http://127.0.0.1:{port} (store sqlite:///{tmp_path}/env.db)" \
            in proc.log()
    assert proc.proc.returncode == 0


def test_defaults_use_sqlite_and_keys_in_the_working_directory(tmp_path, http):
    port = free_port()
    with ServiceProcess([LOCKD, "serve", "--port", str(port)], cwd=tmp_path,
                        ready_url=f"http://127.0.0.1:{port}/healthz",
                        log_path=tmp_path / "d.log") as proc:
        assert acquire(http, f"http://127.0.0.1:{port}", "d/a").status_code == 200
        assert "(store sqlite:///./lockd.db)" in proc.log()
    assert (tmp_path / "lockd.db").exists() and (tmp_path / "lockd-keys").is_dir()


def test_invalid_settings_exit_2_with_a_message(tmp_path):
    cases = [
        (["--store", "mysql://db/x"], {}, "unsupported store URL scheme 'mysql'"),
        (["--port", "70000"], {}, "port"),
        ([], {"LOCKD_MIN_TTL_MS": "5000", "LOCKD_MAX_TTL_MS": "100"}, "exceeds max_ttl_ms"),
        ([], {"LOCKD_MAX_WAIT_MS": "soon"}, "max_wait_ms"),
    ]
    for flags, env, message in cases:
        proc = subprocess.run([LOCKD, "serve", *flags], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path, timeout=60)
        assert proc.returncode == 2, (flags, env, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr


def test_ready_line_redacts_the_store_password(pg_url, tmp_path, http):
    url = pg_url.replace("postgres@", "postgres:hunter2@", 1)  # trust auth ignores it
    port = free_port()
    with ServiceProcess([LOCKD, "serve", "--store", url, "--port", str(port),
                         "--key-dir", str(tmp_path / "k")],
                        ready_url=f"http://127.0.0.1:{port}/healthz",
                        log_path=tmp_path / "pw.log") as proc:
        assert acquire(http, f"http://127.0.0.1:{port}", "pw/a").status_code == 200
    log = proc.log()
    assert "hunter2" not in log
    assert f"lockd listening on http://127.0.0.1:{port} (store postgresql+psycopg://postgres:***@" in log


def test_connection_bounds_come_from_flags_and_environment(tmp_path, http):
    """``--request-timeout-ms`` / ``LOCKD_REQUEST_TIMEOUT_MS`` and ``--max-event-streams`` /
    ``LOCKD_MAX_EVENT_STREAMS`` reach the server; nonsense is exit 2."""
    import socket
    import time

    port = free_port()
    env = {"LOCKD_MAX_EVENT_STREAMS": "1", "LOCKD_MAX_CONNECTIONS": "50"}
    with ServiceProcess([LOCKD, "serve", "--port", str(port), "--request-timeout-ms", "300",
                         "--write-timeout-ms", "1000"], env=env, cwd=tmp_path,
                        ready_url=f"http://127.0.0.1:{port}/healthz",
                        log_path=tmp_path / "b.log"):
        url = f"http://127.0.0.1:{port}"
        idle = socket.create_connection(("127.0.0.1", port))
        idle.settimeout(5)
        start = time.monotonic()
        assert idle.recv(100) == b""  # closed by lockd, not by the 5 s socket timeout
        assert time.monotonic() - start < 1.5
        idle.close()
        with http.stream("GET", f"{url}/v1/events") as first:
            assert first.status_code == 200
            second = http.get(f"{url}/v1/events")
            assert second.status_code == 503 and second.json()["code"] == "too_many_streams"
    for flags in (["--max-connections", "0"], ["--request-timeout-ms", "5"]):
        proc = subprocess.run([LOCKD, "serve", *flags], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_a_bad_postgres_url_says_why_in_its_last_line(pg_admin_dsn, tmp_path):
    """The final line carries the cause, not only the timeout; a bad parameter is named."""
    base = pg_admin_dsn.rsplit("/", 1)[0]
    cases = {
        f"{base}/no_such_db_18": 'FATAL: database "no_such_db_18" does not exist',
        f"{pg_admin_dsn}?bogus=1": 'PostgreSQL store URL: invalid URI query parameter: "bogus"',
        f"{pg_admin_dsn}?pool_max=abc": "PostgreSQL store URL: pool_max='abc' is not an integer",
    }
    for url, cause in cases.items():
        store = url + ("&" if "?" in url else "?") + "pool_timeout=1"
        proc = subprocess.run([LOCKD, "serve", "--store", store, "--port", str(free_port()),
                               "--key-dir", str(tmp_path / "keys")],
                              capture_output=True, text=True, timeout=60)
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
        assert proc.returncode == 1, last
        assert last.endswith(cause) and "lockd cannot start: PostgreSQL store" in last, last
        if "FATAL" in cause:
            assert ": could not connect within 1.0 s: connection failed: " in last, last


def test_port_in_use_is_one_line_and_exit_1_for_both_servers(tmp_path):
    """Before any start-up, one line naming the address; the same status for both."""
    import socket

    from harness import VENV_BIN

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        jwks = tmp_path / "jwks.json"
        jwks.write_text('{"keys": []}')
        for argv in ([LOCKD, "serve", "--store", f"sqlite:///{tmp_path}/l.db",
                      "--key-dir", str(tmp_path / "keys")],
                     [str(VENV_BIN / "resource-proxy"), "serve", "--jwks-file", str(jwks),
                      "--database-url", f"sqlite:///{tmp_path}/r.db"]):
            proc = subprocess.run([*argv, "--port", str(port)], capture_output=True, text=True,
                                  timeout=60)
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            name = "lockd" if argv[0] == LOCKD else "resource-proxy"
            assert proc.returncode == 1, lines
            assert len(lines) == 1 and lines[0].endswith(
                f"{name} cannot start: cannot listen on 127.0.0.1:{port}: address already in use (is "
                "another server running on it? choose another port with --port)"), lines


def test_lockd_sends_each_response_in_one_write(tmp_path):
    """lockd's HTTP protocol writes through the coalescing transport (head and body
    of a response leave in one ``send``), on top of the connection bounds."""
    from fastapi import FastAPI

    from lockd.server.cli import uvicorn_config
    from lockd.server.settings import Settings

    config = uvicorn_config(FastAPI(), Settings(store=f"sqlite:///{tmp_path}/c.db"))
    assert config.http.__name__.startswith("Coalescing")


def test_help_names_the_status_page_docs_and_metrics():
    from harness import VENV_BIN

    for argv in ([LOCKD, "--help"], [LOCKD, "serve", "--help"],
                 [str(VENV_BIN / "resource-proxy"), "--help"],
                 [str(VENV_BIN / "resource-proxy"), "serve", "--help"]):
        shown = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        text = " ".join(shown.stdout.split())
        assert "/ the status page" in text and "/docs the API (Swagger UI, works offline)" in text
        assert "/metrics (Prometheus)" in text, argv
