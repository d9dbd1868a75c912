"""The docs' examples run beside a reader's Quick start: with 127.0.0.1:7070 and :7071 taken,
``readme_servers`` still starts lockd and the proxy (on free ports) and the examples' text is
pointed at them."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import httpx

from tests.system.readme.support import LOCKD_PORT, PROXY_PORT, ported, readme_servers


def _occupy(port: int, stack: contextlib.ExitStack) -> None:
    """Listen on ``port`` for the test (if something else already does, it is taken anyway)."""
    sock = stack.enter_context(socket.socket())
    with contextlib.suppress(OSError):
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_the_examples_servers_run_beside_servers_on_the_default_ports(tmp_path: Path):
    with contextlib.ExitStack() as stack:
        for port in (LOCKD_PORT, PROXY_PORT):
            _occupy(port, stack)
        with readme_servers(tmp_path) as env:
            lockd = ported("http://127.0.0.1:7070", env)
            proxy = ported("http://127.0.0.1:7071", env)
            assert ":7070" not in lockd and ":7071" not in proxy
            assert env["LOCKD_URL"] == lockd
            assert httpx.get(lockd + "/healthz").json()["server"] == "lockd"
            assert httpx.get(proxy + "/healthz").json()["server"] == "resource-proxy"
