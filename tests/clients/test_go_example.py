"""clients/go/examples/revived: a Go worker frozen past its lease has its late write refused
(StaleTokenError) and the newer holder's row stays, as the database itself shows."""

from __future__ import annotations

import os
import re
import subprocess
import uuid

from tests.clients.conftest import ROOT


def test_the_revived_workers_write_is_refused(go_build, servers):
    lockd, proxy = servers
    key = uuid.uuid4().int % 1_000_000_000 + 1
    binary = go_build("./examples/revived")
    run = subprocess.run([str(binary), str(key)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LOCKD_URL": lockd.url,
                                          "PROXY_URL": proxy.url})
    assert run.returncode == 0, run.stdout + run.stderr
    fences = re.search(r"write refused: .*\(presented (\d+), highest (\d+)\)", run.stdout)
    assert fences and int(fences[1]) < int(fences[2]), run.stdout
    assert "worker-a: lease lost: true" in run.stdout
    rows = [row for row in proxy.rows("items") if row[0] == key]
    assert rows == [(key, "worker-b", 2)], rows
