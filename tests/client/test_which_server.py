"""Both servers say who they are (``X-Lockd-Server`` on every response, ``server`` in
``/healthz``), so a client pointed at the other one says so instead of a bare 404; and
``lockctl ... | head`` ends quietly when the pipe closes."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from harness import VENV_BIN
from lockd import LockClient
from lockd.client.errors import ProtocolError
from lockd.client.fenced import FencedSession

LOCKCTL = str(VENV_BIN / "lockctl")


def test_each_server_names_itself(shared_lockd, proxy):
    for url, server in ((shared_lockd.url, "lockd"), (proxy.url, "resource-proxy")):
        health = httpx.get(url + "/healthz")
        assert health.json()["server"] == server
        assert health.headers["x-lockd-server"] == server
        missing = httpx.get(url + "/no/such/route")
        assert missing.status_code == 404 and missing.headers["x-lockd-server"] == server


def test_lock_client_at_the_proxy_says_which_server_it_reached(proxy, name):
    with LockClient(proxy.url) as client, pytest.raises(ProtocolError) as caught:
        client.acquire(name, ttl=5, wait=1)
    assert caught.value.code == "wrong_server"
    assert "this is resource-proxy, lockd's default port is 7070" in str(caught.value)
    assert proxy.url in str(caught.value)


def test_fenced_session_at_lockd_says_which_server_it_reached(shared_lockd):
    with FencedSession(shared_lockd.url) as db, pytest.raises(ProtocolError) as caught:
        db.lock_for("items", 1)
    assert "this is lockd, resource-proxy's default port is 7071" in str(caught.value)


def test_lockctl_at_the_proxy_says_which_server_it_reached(proxy, name):
    r = subprocess.run([LOCKCTL, "--url", proxy.url, "status", name], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0
    assert "this is resource-proxy, lockd's default port is 7070" in r.stderr
    assert "Traceback" not in r.stderr


def test_lockctl_survives_a_closed_pipe(shared_lockd, name):
    """``lockctl ls | head``: the reader is gone before lockctl writes; no traceback."""
    proc = subprocess.Popen([LOCKCTL, "--url", shared_lockd.url, "status", name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader exits first, as head does after its lines
    _, err = proc.communicate(timeout=30)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode in (0, 141), (proc.returncode, err.decode())
