"""Helpers shared by the test suites: free ports, real server processes, PostgreSQL databases.

Everything here talks to real things: processes are started with ``subprocess`` and stopped with
real signals; databases are created on the machine's PostgreSQL or in a throwaway cluster made with
``initdb``/``pg_ctl``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg

__all__ = [
    "PG_ADMIN_DSN",
    "VENV_BIN",
    "free_port",
    "ServiceProcess",
    "create_database",
    "drop_database",
    "sqlalchemy_url",
    "ThrowawayPostgres",
    "pg_available",
    "wait_for",
    "PgRelay",
]

PG_ADMIN_DSN = os.environ.get("TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
VENV_BIN = Path(sys.executable).parent
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until truthy (returns its value) or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class ServiceProcess:
    """A server started as a real process, ready once ``ready_url`` answers 200.

    Output goes to a log file (``log_path``) so a failing test can show it. ``stop()`` sends
    SIGTERM and waits; ``kill()`` sends SIGKILL; ``pause()``/``resume()`` SIGSTOP/SIGCONT.
    """

    def __init__(self, argv: list[str], *, ready_url: str, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None, log_path: str | os.PathLike[str] | None = None):
        self.argv = argv
        self.ready_url = ready_url
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.log_path = Path(log_path or tempfile.mkstemp(prefix="svc-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> ServiceProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.ready_url, timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"{self.argv} not ready at {self.ready_url}:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (after SIGCONT, in case it is paused) and wait; SIGKILL if it does not stop."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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


class PgRelay:
    """A TCP relay on loopback between a client and PostgreSQL that can cut connections at a
    chosen point of the PostgreSQL wire protocol, for tests of what a client sees then.

    ``cut_after(b"COMMIT")`` arms it: the next client message that carries SQL text containing
    the pattern (a simple ``Query`` or an extended ``Parse``) is forwarded to the server, the
    server's answer is read and thrown away (so the server has acted on the message), then both
    sides of that connection are closed; ``cut_done`` is set. ``refuse()`` closes every
    connection and every new one at once (the server is never reached); ``restore()`` undoes
    it. Use ``sslmode=disable`` in the client's DSN: the relay reads plaintext messages.
    """

    _SSL_CODES = (80877103, 80877104)  # SSLRequest, GSSENCRequest: startup continues after them

    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._pattern: bytes | None = None
        self._refusing = False
        self._closed = False
        self.cut_done = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, pattern: bytes) -> None:
        with self._lock:
            self._pattern = pattern.upper()
            self.cut_done.clear()

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            self._close(sock)

    def restore(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        self._closed = True
        self.refuse()
        self._close(self._listener)

    def __enter__(self) -> PgRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _close(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                self._close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                self._close(client)
                continue
            with self._lock:  # refuse() may have run while this one was connecting
                refusing = self._refusing
                if not refusing:
                    self._sockets |= {client, server}
                    self.connections += 1
            if refusing:
                self._close(client)
                self._close(server)
                continue
            swallow = threading.Event()
            answered = threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, swallow, answered),
                             daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, swallow, answered),
                             daemon=True).start()

    def _downstream(self, server: socket.socket, client: socket.socket, swallow: threading.Event,
                    answered: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if swallow.is_set():
                    answered.set()
                    continue
                client.sendall(data)
        except OSError:
            pass
        finally:
            answered.set()
            self._close(client)

    def _matches(self, message: bytes) -> bool:
        if message[:1] not in (b"Q", b"P"):
            return False
        with self._lock:
            if self._pattern is None or self._pattern not in message.upper():
                return False
            self._pattern = None  # one cut per arming
            return True

    def _upstream(self, client: socket.socket, server: socket.socket, swallow: threading.Event,
                  answered: threading.Event) -> None:
        buffer, startup = b"", True
        try:
            while data := client.recv(65536):
                buffer += data
                out, cut = b"", False
                while True:
                    if startup:  # untyped: int32 length (itself included), int32 code, ...
                        if len(buffer) < 8 or len(buffer) < int.from_bytes(buffer[:4], "big"):
                            break
                        size = int.from_bytes(buffer[:4], "big")
                        startup = int.from_bytes(buffer[4:8], "big") in self._SSL_CODES
                    else:  # typed: 1 byte type, int32 length (itself included), payload
                        if len(buffer) < 5 or len(buffer) < 1 + int.from_bytes(buffer[1:5], "big"):
                            break
                        size = 1 + int.from_bytes(buffer[1:5], "big")
                        cut = cut or self._matches(buffer[:size])
                    out, buffer = out + buffer[:size], buffer[size:]
                if cut:
                    swallow.set()
                    server.sendall(out + buffer)
                    answered.wait(10)
                    self.cut_done.set()
                    return
                server.sendall(out)
        except OSError:
            pass
        finally:
            self._close(server)
            self._close(client)
