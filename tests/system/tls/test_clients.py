"""The clients over mTLS: ``AsyncLockClient``/``AsyncFencedSession`` with ``verify=``/``cert=``,
and ``lockctl --ca/--cert/--key`` or ``LOCKD_CA``/``LOCKD_CERT``/``LOCKD_KEY``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

from harness import VENV_BIN, run_program
from lockd import AsyncFencedSession, AsyncLockClient


def test_async_client_and_session_over_mtls(servers, pki, name):
    name = "items"  # no policy: table items is written under the lock named items
    lockd = servers.lockd(mtls=True)
    proxy = servers.proxy(lockd.url, mtls=True, lockd_client=pki.client)

    async def run() -> int:
        async with AsyncLockClient(lockd.url, verify=str(pki.ca), cert=pki.client.tuple) as c:
            async with c.lock(name, ttl=3) as lease:
                async with AsyncFencedSession(proxy.url, lease, verify=str(pki.ca),
                                              cert=str(pki.dir / "client-combined.pem")) as db:
                    await db.insert("items", {"id": "async", "v": "tls", "n": 2})
                    return (await db.get("items", "async"))["n"]

    combined = pki.dir / "client-combined.pem"
    combined.write_bytes(pki.client.cert.read_bytes() + pki.client.key.read_bytes())
    os.chmod(combined, 0o600)
    assert asyncio.run(run()) == 2


def _lockctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOCKD_")}
    return run_program([str(VENV_BIN / "lockctl"), *args], text=True, timeout=60,
                       env={**base, **(env or {})})


def test_lockctl_over_mtls_with_flags_and_environment(servers, pki, name):
    lockd = servers.lockd(mtls=True)
    flags = ["--url", lockd.url, "--ca", str(pki.ca), "--cert", str(pki.client.cert),
             "--key", str(pki.client.key)]
    got = _lockctl(*flags, "--json", "acquire", name, "--ttl", "30s")
    assert got.returncode == 0, got.stderr
    lease = json.loads(got.stdout)
    env = {"LOCKD_URL": lockd.url, "LOCKD_CA": str(pki.ca), "LOCKD_CERT": str(pki.client.cert),
           "LOCKD_KEY": str(pki.client.key)}
    status = _lockctl("--json", "status", name, env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["fence"] == lease["fence"]
    released = _lockctl("release", name, lease["lease_id"], env=env)
    assert released.returncode == 0, released.stderr
    # no client certificate: lockd refuses the handshake, which lockctl reports as unavailable
    refused = _lockctl("--url", lockd.url, "--ca", str(pki.ca), "status", name)
    assert refused.returncode == 69, (refused.returncode, refused.stderr)
    # a CA lockctl cannot read is a usage error
    unreadable = _lockctl(*flags[:2], "--ca", str(pki.dir / "missing.pem"), "status", name)
    assert unreadable.returncode == 2 and "cannot use the TLS files" in unreadable.stderr
