"""PostgreSQL for tests, benchmarks and chaos runs: fresh databases on the machine's server, and
throwaway clusters (``initdb``/``pg_ctl`` in a temporary directory) for runs that crash or stop it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from harness.processes import free_port

__all__ = ["PG_ADMIN_DSN", "PG_BIN", "pg_available", "create_database", "drop_database",
           "sqlalchemy_url", "ThrowawayPostgres"]

PG_ADMIN_DSN = os.environ.get("TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


def pg_available(dsn: str = PG_ADMIN_DSN) -> str | None:
    """None if PostgreSQL answers at ``dsn``, else the reason."""
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("select 1")
        return None
    except psycopg.Error as exc:
        return str(exc).strip()


def create_database(admin_dsn: str = PG_ADMIN_DSN, prefix: str = "t") -> str:
    """Create a fresh database with a unique name; return its plain libpq DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_dsn.rsplit("/", 1)[0] + "/" + name


def drop_database(dsn: str, admin_dsn: str = PG_ADMIN_DSN) -> None:
    name = dsn.rsplit("/", 1)[1].split("?")[0]
    with contextlib.suppress(psycopg.Error), psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sqlalchemy_url(dsn: str) -> str:
    """``postgresql://…`` → ``postgresql+psycopg://…`` (the form lockd and the proxy take)."""
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own in a temp directory, for tests that stop or crash it.

    PostgreSQL refuses to run as root, so the cluster runs as the ``postgres`` OS user when the
    tests run as root. ``stop(mode)`` with ``"immediate"`` crashes it like a power cut.
    """

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgthrow-"))
        self.data = self.dir / "data"
        self.log = self.dir / "pg.log"
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(PG_BIN / args[0]), *args[1:]]
        if self._user:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> ThrowawayPostgres:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\nfsync = on\nmax_connections = 200\nshared_buffers = 32MB\n")
        return self

    def start(self) -> ThrowawayPostgres:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
