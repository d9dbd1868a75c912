"""``lockd serve``: LOCKD_* variables, flags over variables, clear failures on bad settings."""

from __future__ import annotations

import subprocess

from tests.lockd.calls import acquire
from tests.lockd.conftest import LOCKD
from tests.support import ServiceProcess, free_port


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
    ``LOCKD_MAX_EVENT_STREAMS`` reach the server (issue 15); nonsense is exit 2."""
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
