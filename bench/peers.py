"""The servers a run measures, each a real process of its own: lockd on each store, etcd, the
proxy, the do-nothing HTTP servers; plus the machine's PostgreSQL and Redis (already running).

Every ``start_*`` returns an object with ``host``, ``port`` (where the load generator connects),
``pid`` (for resident memory) and ``stop()``. PostgreSQL databases are fresh per run
(``create_database``) and dropped at the end; Redis keys use a unique prefix and are deleted.
etcd is ONE member (``EtcdCluster(1)``): on a 2-core machine three members would triple etcd's
CPU and fsyncs on the same disk without adding anything a user of a real cluster would see.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    PG_ADMIN_DSN,
    VENV_BIN,
    ServiceProcess,
    create_database,
    drop_database,
    free_port,
    pg_available,
    sqlalchemy_url,
)
from harness.etcd import EtcdCluster, etcd_available
from harness.servers import LockdServer
from harness.tls_servers import TLSProcess
from lockd.common.tls import client_context
from lockd.demo.certs import make_demo_tls

__all__ = [
    "Server",
    "Workspace",
    "rss_mb",
    "serve_noop",
    "redis_available",
    "REDIS_HOST",
    "REDIS_PORT",
]

REDIS_HOST, REDIS_PORT = "127.0.0.1", int(os.environ.get("BENCH_REDIS_PORT", "6379"))
PYTHON = sys.executable


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def redis_available() -> str | None:
    """None if redis-py is installed and Redis answers PING at 127.0.0.1:6379, else the
    reason."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py is not installed (pip install -e '.[bench]')"
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return None if s.recv(16).startswith(b"+PONG") else "no PONG"
    except OSError as exc:
        return str(exc)


@dataclass
class Server:
    """A server process the generator talks to."""

    name: str
    host: str
    port: int
    proc: Any  # ServiceProcess | LockdServer | subprocess.Popen | EtcdCluster
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        if isinstance(self.proc, ServiceProcess | LockdServer):
            return self.proc.pid
        if isinstance(self.proc, EtcdCluster):
            return self.proc.members[0].proc.pid
        return self.proc.pid

    def addr(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}

    def stop(self) -> None:
        if isinstance(self.proc, ServiceProcess | LockdServer | EtcdCluster):
            self.proc.stop()
        else:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()


def serve_noop(port: int) -> None:
    """The cheapest HTTP server: every request gets a fixed ``200 {}`` (uvloop protocol).

    The generator's ceiling is measured against it: nothing here costs more than parsing the
    request line boundaries."""
    import uvloop

    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"

    class Noop(asyncio.Protocol):
        def connection_made(self, transport):  # type: ignore[override]
            self.t = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            n = self.buf.count(b"\r\n\r\n")
            if n:
                self.buf = self.buf[self.buf.rfind(b"\r\n\r\n") + 4:]
                self.t.write(response * n)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Noop, "127.0.0.1", port,
                                                                backlog=2048)
        print(f"noop listening on {port}", flush=True)
        await server.serve_forever()

    uvloop.run(main())


_FASTAPI_NOOP = """
import sys, uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
app = FastAPI()
@app.get("/noop")
async def noop():
    return JSONResponse({})
@app.get("/healthz")
async def healthz():
    return JSONResponse({})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, server_header=False)
"""


class Workspace:
    """Owns everything a run starts; ``close()`` stops and removes it all."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lockd-bench-"))
        self.servers: list[Server] = []
        self.databases: list[str] = []
        self.etcds: list[EtcdCluster] = []
        self.redis_prefix = f"lockd-bench-{uuid.uuid4().hex[:8]}"

    # -- prerequisites -----------------------------------------------------------------------

    @staticmethod
    def missing() -> dict[str, str]:
        """Which peers cannot run here, and why."""
        out = {}
        if (why := pg_available()) is not None:
            out["postgres"] = why
        if (why := etcd_available()) is not None:
            out["etcd"] = why
        if (why := redis_available()) is not None:
            out["redis"] = why
        return out

    # -- servers -------------------------------------------------------------------------------

    def database(self) -> str:
        """A fresh PostgreSQL database (libpq DSN), dropped at ``close()``."""
        dsn = create_database(PG_ADMIN_DSN, prefix="bench")
        self.databases.append(dsn)
        return dsn

    def etcd(self) -> Server:
        cluster = EtcdCluster(1).start()
        self.etcds.append(cluster)
        member = cluster.members[0]
        server = Server("etcd", "127.0.0.1", member.client_port, cluster,
                        {"url": cluster.url("lockd-bench")})
        return server

    def lockd(self, store: str, name: str, env: dict[str, str] | None = None,
              tls: bool = False, args: tuple[str, ...] = ()) -> Server:
        """``lockd serve`` on ``store``: ``sqlite``, ``postgres``, ``etcd`` or a store URL.
        ``tls``: https with a certificate made now (``extra["tls_ca"]``: the CA file to trust);
        ``args``: more flags (``--workers 2``)."""
        if store == "sqlite":
            url = f"sqlite:///{self.dir / f'{name}.db'}"
        elif store == "postgres":
            url = sqlalchemy_url(self.database())
        elif store == "etcd":
            url = self.etcd().extra["url"]
        else:
            url = store
        port = free_port()
        argv = [str(VENV_BIN / "lockd"), "serve", "--store", url, "--port", str(port),
                "--key-dir", str(self.dir / "keys"), "--log-level", "warning", *args]
        if tls:
            certs = make_demo_tls(self.dir / f"{name}-tls")
            argv += ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
            proc: ServiceProcess = TLSProcess(
                argv, ready_url=f"https://127.0.0.1:{port}/healthz", env=env,
                log_path=self.dir / f"{name}.log",
                http_options={"verify": client_context(certs.ca)}).start(timeout=60)
            extra = {"store": url, "tls_ca": str(certs.ca)}
        else:
            proc = ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz", env=env,
                                  log_path=self.dir / f"{name}.log").start(timeout=60)
            extra = {"store": url}
        server = Server(name, "127.0.0.1", port, proc, extra)
        self.servers.append(server)
        return server

    def lockd_replicas(self, url: str, name: str, count: int) -> list[Server]:
        """``count`` ``lockd serve`` processes on ONE store ``url`` and one key directory (the
        run's, shared with every other lockd here): replicas of one lockd service, started one
        after the other (``harness.servers.LockdServer``), each on its own port."""
        out = []
        for k in range(count):
            proc = LockdServer(url, log_dir=self.dir, key_dir=self.dir / "keys",
                               args=("--log-level", "warning")).start(timeout=60)
            server = Server(f"{name}-{k}", "127.0.0.1", proc.port, proc, {"store": url})
            self.servers.append(server)
            out.append(server)
        return out

    def proxy(self, dsn: str, jwks: dict, policy: str, name: str = "proxy",
              env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Server:
        """``resource-proxy serve`` on ``dsn``; ``args``: more flags (``--workers 2``);
        ``env``: e.g. ``PYTHONPATH`` of another source tree (``bench.compare``)."""
        jwks_path = self.dir / f"{name}-jwks.json"
        jwks_path.write_text(json.dumps(jwks))
        policy_path = self.dir / f"{name}-policy.yaml"
        policy_path.write_text(policy)
        port = free_port()
        argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", dsn,
                "--jwks-file", str(jwks_path), "--policy", str(policy_path),
                "--port", str(port), "--log-level", "warning", *args]
        proc = ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz", env=env,
                              log_path=self.dir / f"{name}.log").start(timeout=60)
        server = Server(name, "127.0.0.1", port, proc)
        self.servers.append(server)
        return server

    def noop(self, kind: str = "raw") -> Server:
        """A do-nothing HTTP server: ``raw`` (uvloop protocol) or ``fastapi`` (uvicorn)."""
        port = free_port()
        if kind == "raw":
            code = f"from bench.peers import serve_noop; serve_noop({port})"
        else:
            code = _FASTAPI_NOOP
        argv = [PYTHON, "-c", code] + ([] if kind == "raw" else [str(port)])
        proc = ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz",
                              cwd=Path(__file__).resolve().parents[1],
                              log_path=self.dir / f"noop-{kind}.log").start(timeout=30)
        server = Server(f"noop-{kind}", "127.0.0.1", port, proc)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.stop()
        for cluster in self.etcds:
            with contextlib.suppress(Exception):
                cluster.stop()
        for dsn in self.databases:
            drop_database(dsn, PG_ADMIN_DSN)
        self.redis_cleanup()

    def redis_cleanup(self) -> None:
        if redis_available() is not None:
            return
        import redis

        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        try:
            keys = list(client.scan_iter(match=f"{self.redis_prefix}*", count=1000))
            for lo in range(0, len(keys), 500):
                client.delete(*keys[lo:lo + 500])
        finally:
            client.close()
