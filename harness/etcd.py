"""A real etcd cluster for tests: N members on loopback ports in a temporary directory.

``EtcdCluster(3).start()`` launches ``etcd`` processes (Debian's ``etcd-server``) and waits until
the cluster answers a linearizable read. Members can be killed (SIGKILL), paused (SIGSTOP),
stopped and restarted on their data directories, and the current leader is looked up through
``/v3/maintenance/status`` (a member is the leader when ``leader == header.member_id``).

``EtcdCluster(3, tls=pki)`` (``harness.certs.make_pki``) runs every member with TLS on both
its client and peer ports, client certificates required on both (``--client-cert-auth``,
``--peer-client-cert-auth``, trusting ``pki.ca``); ``cluster.url()`` then carries
``?ca=&cert=&key=`` for lockd, and the helpers here talk to it with the client certificate.

Raft timing is tighter than etcd's defaults (heartbeat 100 ms, election timeout 700 ms instead of
1000 ms) so that a failover takes about a second and etcd's minimum lease TTL,
``ceil(1.5 * election timeout)``, is 1 s instead of 2 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import httpx

from harness.processes import free_port, wait_for
from lockd.common.tls import client_context

if TYPE_CHECKING:
    from harness.certs import Pki

__all__ = ["ETCD_BIN", "etcd_available", "EtcdMember", "EtcdCluster"]

ETCD_BIN = os.environ.get("ETCD_BIN") or shutil.which("etcd") or "/usr/bin/etcd"
HEARTBEAT_MS = 100
ELECTION_MS = 700


def etcd_available() -> str | None:
    """None if an ``etcd`` binary is installed, else the reason."""
    if os.access(ETCD_BIN, os.X_OK):
        return None
    return f"no etcd binary at {ETCD_BIN} (run `make system-deps`)"


class EtcdMember:
    """One etcd process of a cluster; its data directory outlives restarts."""

    def __init__(self, name: str, data_dir: Path, client_port: int, peer_port: int,
                 tls: Pki | None = None):
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.name = name
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.log_path = data_dir.parent / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    def http_options(self) -> dict:
        """httpx keyword arguments to reach this member (CA and client certificate with TLS)."""
        if self.tls is None:
            return {}
        return {"verify": client_context(self.tls.ca, self.tls.client.tuple)}

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, initial_cluster: str, state: str, token: str) -> None:
        argv = [
            ETCD_BIN, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
            "--initial-cluster-token", token,
            "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
        ]
        if self.tls is not None:
            ca, server = str(self.tls.ca), self.tls.server
            argv += ["--cert-file", str(server.cert), "--key-file", str(server.key),
                     "--client-cert-auth", "--trusted-ca-file", ca,
                     "--peer-cert-file", str(server.cert), "--peer-key-file", str(server.key),
                     "--peer-client-cert-auth", "--peer-trusted-ca-file", ca]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.running:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL, like a crash (it also ends a paused member)."""
        if self.running:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.running:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def status(self, timeout: float = 1.0) -> dict | None:
        """``/v3/maintenance/status`` of this member, or None if it does not answer."""
        if not self.running:
            return None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.post(f"{self.client_url}/v3/maintenance/status", json={}, timeout=timeout,
                           **self.http_options())
            if r.status_code == 200:
                return r.json()
        return None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class EtcdCluster:
    """A throwaway etcd cluster of ``size`` members; ``stop()`` kills it and removes its files."""

    def __init__(self, size: int = 3, tls: Pki | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="etcd-cluster-"))
        self.tls = tls
        self.token = f"lockd-test-{uuid.uuid4().hex[:8]}"
        self.members = [
            EtcdMember(f"m{i}", self.dir / f"m{i}.etcd", free_port(), free_port(), tls)
            for i in range(size)
        ]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def url(self, prefix: str = "lockd") -> str:
        """The lockd store URL for this cluster: ``etcd://h:p,h:p,h:p/<prefix>`` (with TLS:
        ``?ca=…&cert=…&key=…``, lockd's client certificate being ``tls.client``)."""
        url = "etcd://" + ",".join(self.endpoints) + "/" + prefix
        if self.tls is not None:
            url += "?" + urlencode({"ca": str(self.tls.ca), "cert": str(self.tls.client.cert),
                                    "key": str(self.tls.client.key)})
        return url

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        for m in self.members:
            m.launch(self.initial_cluster, "new", self.token)
        try:
            self.wait_healthy(timeout)
        except TimeoutError:
            logs = "\n".join(f"--- {m.name}\n{m.log()[-3000:]}" for m in self.members)
            self.stop()
            raise TimeoutError(f"etcd cluster did not become healthy:\n{logs}") from None
        return self

    def stop(self) -> None:
        for m in self.members:
            m.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill_member(self, i: int) -> None:
        """SIGKILL member ``i`` (a crash: no graceful leadership transfer)."""
        self.members[i].kill()

    def restart_member(self, i: int) -> None:
        """Start a stopped or killed member again on its data directory."""
        m = self.members[i]
        if not m.running:
            m.launch(self.initial_cluster, "existing", self.token)

    def pause_member(self, i: int) -> None:
        self.members[i].signal(signal.SIGSTOP)

    def resume_member(self, i: int) -> None:
        self.members[i].signal(signal.SIGCONT)

    # -- inspection --------------------------------------------------------------------------

    def leader(self, timeout: float = 10.0) -> int:
        """Index of the member that is leader now (polls until one is elected)."""

        def find() -> int | None:
            for i, m in enumerate(self.members):
                st = m.status(timeout=0.5)
                if st and st.get("leader") and st["leader"] == st["header"]["member_id"]:
                    return i + 1  # truthy for wait_for
            return None

        return wait_for(find, timeout=timeout, interval=0.05, what="an etcd leader") - 1

    def linearizable_read_ok(self, member: int | None = None, timeout: float = 1.0) -> bool:
        """True if a quorum read succeeds through ``member`` (default: any running member)."""
        targets = [self.members[member]] if member is not None else self.members
        for m in targets:
            if not m.running:
                continue
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(f"{m.client_url}/v3/kv/range", json={"key": "Lw=="},
                               timeout=timeout, **m.http_options())
                if r.status_code == 200 and "header" in r.json():
                    return True
        return False

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running member answers a linearizable read."""
        deadline = time.monotonic() + timeout
        for i, m in enumerate(self.members):
            if not m.running:
                continue
            wait_for(lambda i=i: self.linearizable_read_ok(i),
                     timeout=max(0.1, deadline - time.monotonic()), interval=0.05,
                     what=f"etcd member {m.name}")

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
