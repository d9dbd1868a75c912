"""What a newcomer reads: ``--version`` everywhere, lockctl's help and its error lines
(each asserted as the one line it is), ``force-release``, and the client's logging (one
non-repeating line for a lost lease; nothing on stderr when the program configured no logging)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import version

import pytest

import lockd
from harness import VENV_BIN, free_port, run_program
from lockd import LeaseState, LockClient
from lockd.client.lockctl import (
    EXIT_ERROR,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _parser,
)
from tests.client.conftest import LockdServer, _workdir

LOCKCTL = str(VENV_BIN / "lockctl")
CLIENT_KEY = "client-key-Yb27Qm4LxwE"
ADMIN_KEY = "admin-key-Pw91Zr6TcsK"


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOCKD_")}
    return run_program(list(argv), text=True, timeout=30, env={**clean, **(env or {})})


def lockctl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run(LOCKCTL, *args, env=env)


@pytest.fixture(scope="module")
def secured():
    """A lockd that wants an API key, with an admin key for force-release."""
    server = LockdServer(_workdir("lockd-keys-"),
                         env={"LOCKD_API_KEYS": CLIENT_KEY, "LOCKD_ADMIN_KEYS": ADMIN_KEY}).start()
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


# ---------------------------------------------------------------- versions and help


@pytest.mark.parametrize("program", ["lockd", "lockctl", "resource-proxy"])
def test_version_flag_prints_the_installed_version(program):
    r = run(str(VENV_BIN / program), "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{program} {version('lockd')}"
    assert lockd.__version__ == version("lockd")


def test_every_lockctl_option_has_help_text():
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= {"acquire", "renew", "release", "status", "ls", "watch", "run",
                                "force-release"}
    missing = [f"{cmd} {opt.option_strings or opt.dest}"
               for cmd, p in [("lockctl", parser), *sub.choices.items()]
               for opt in p._actions
               if not isinstance(opt, argparse._SubParsersAction) and not opt.help]
    assert missing == []


def test_resource_proxy_help_is_plain_text_and_names_the_variables():
    top = run(str(VENV_BIN / "resource-proxy"), "--help").stdout
    assert "``" not in top and "::" not in top
    serve = run(str(VENV_BIN / "resource-proxy"), "serve", "--help").stdout
    for var in ("PROXY_DATABASE_URL", "PROXY_LOCKD_URL", "PROXY_JWKS_FILE", "PROXY_TABLES",
                "PROXY_POLICY", "PROXY_HOST", "PROXY_PORT", "PROXY_LOG_LEVEL"):
        assert var in serve, var


def test_gitignore_ignores_the_sqlite_lock_file():
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", "lockd.db.lock"],
                       cwd=VENV_BIN.parent.parent)
    assert r.returncode == 0


# ---------------------------------------------------------------- lockctl's lines


def test_acquire_says_it_does_not_renew(shared_lockd, name):
    r = lockctl("--url", shared_lockd.url, "acquire", name, "--ttl", "2s")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (
        "  note      not renewed: it expires in 2s unless `lockctl renew` extends it "
        "(`lockctl run` holds a lock while a command runs)")


def test_stopped_lockd_names_the_url_and_how_to_point_elsewhere():
    url = f"http://127.0.0.1:{free_port()}"
    r = lockctl("--url", url, "status", "x")
    assert r.returncode == EXIT_UNAVAILABLE
    assert r.stderr.splitlines() == [
        f"lockctl: cannot reach lockd at {url} (ConnectError: [Errno 111] Connection refused);"
        " is it running? Point lockctl elsewhere with --url or LOCKD_URL"]


def test_the_clients_connection_error_names_the_url_and_asks_if_the_server_runs():
    from lockd import FencedSession
    from lockd.client.errors import TransportError

    url = f"http://127.0.0.1:{free_port()}"
    with LockClient(url) as client, pytest.raises(TransportError) as caught:
        client.status("x")
    assert str(caught.value) == (
        f"GET /v1/locks/x: cannot reach {url} (ConnectError: [Errno 111] Connection refused); "
        "is the server running there, and is that the right URL?")
    assert caught.value.url == url and caught.value.reason.startswith("ConnectError: ")
    with FencedSession(url, retries=0) as db, pytest.raises(TransportError) as caught:
        db.lock_for("accounts", 7)
    assert str(caught.value) == (
        f"GET /v1/tables/accounts/lock?key=7: cannot reach {url} (ConnectError: [Errno 111] "
        "Connection refused); is the server running there, and is that the right URL?")


def test_url_without_a_scheme_is_a_usage_error():
    r = lockctl("status", "x", env={"LOCKD_URL": "127.0.0.1:7070"})
    assert r.returncode == EXIT_USAGE
    assert r.stderr.splitlines() == [
        "lockctl: the lockd URL '127.0.0.1:7070' (LOCKD_URL) needs a scheme: "
        "http://127.0.0.1:7070 or https://..."]


def test_401_says_how_to_pass_the_key(secured, name):
    r = lockctl("--url", secured.url, "status", name)
    assert r.returncode == EXIT_ERROR
    assert len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith("lockctl: lockd wants an API key (401: ")
    assert r.stderr.rstrip().endswith("): pass it with --api-key or set LOCKD_API_KEY")
    assert lockctl("--url", secured.url, "status", name,
                   env={"LOCKD_API_KEY": CLIENT_KEY}).returncode == 0


def test_force_release_needs_the_admin_key_and_ends_the_holders_lease(secured, name):
    with LockClient(secured.url, api_key=CLIENT_KEY) as client:
        lease = client.acquire(name, 30.0, owner="stuck-job", auto_renew=False)
        r = lockctl("--url", secured.url, "force-release", name,
                    env={"LOCKD_API_KEY": CLIENT_KEY})
        assert r.returncode == EXIT_ERROR
        assert r.stderr.splitlines() == [
            "lockctl: force-release needs an admin key (403: this call needs an admin key): "
            "pass one of lockd's LOCKD_ADMIN_KEYS with --api-key or LOCKD_API_KEY"]
        assert client.status(name).held
        r = lockctl("--url", secured.url, "force-release", name,
                    env={"LOCKD_API_KEY": ADMIN_KEY})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (f"force-released {name} (fence {lease.fence}, "
                                    "owner 'stuck-job')")
        assert not client.status(name).held
        with pytest.raises(lockd.LeaseLostError):
            client.renew(lease)
        r = lockctl("--url", secured.url, "force-release", name,
                    env={"LOCKD_API_KEY": ADMIN_KEY})
        assert r.returncode == 0 and r.stdout.strip() == f"{name} was not held"


# ---------------------------------------------------------------- the client's logging


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lost_lease_warning_is_one_line_without_repeating(shared_lockd, name, caplog):
    clock = _Clock()
    with LockClient(shared_lockd.url, clock=clock) as client:
        lease = client.acquire(name, 5.0, auto_renew=False)
        clock.now += 6.0  # past the local deadline, no renewal
        with caplog.at_level(logging.WARNING, logger="lockd.client"):
            assert lease.state is LeaseState.LOST
    assert [r.getMessage() for r in caplog.records] == [
        f"lease of {name!r} (fence {lease.fence}) lost: local deadline passed without a renewal"]


def test_the_client_library_prints_nothing_when_logging_is_not_configured(shared_lockd, name):
    script = textwrap.dedent(f"""
        import logging
        from lockd import LockClient
        now = [0.0]
        with LockClient({shared_lockd.url!r}, clock=lambda: now[0]) as client:
            lease = client.acquire({name!r}, 5.0, auto_renew=False)
            now[0] = 10.0
            assert lease.is_lost()
        assert any(isinstance(h, logging.NullHandler)
                   for h in logging.getLogger("lockd.client").handlers)
        print("ok")
    """)
    r = run(sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n" and r.stderr == ""
