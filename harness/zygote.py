"""A forking server starter: real processes without paying Python's imports on every start.

A ``lockd serve`` or ``resource-proxy serve`` spends about half a CPU-second importing FastAPI,
pydantic, SQLAlchemy and psycopg before it listens, and the test suite starts well over a
thousand of them on a 2-core machine. The zygote is one process per test process that imports
all of that once, then forks a child per start: the child sets its own session, log file,
working directory, environment and ``sys.argv`` exactly as a fresh ``exec`` would, and runs the
same entry point. The child is a real process with its own pid, stopped, paused and killed with
real signals; only the imports are shared (copy-on-write).

What it runs: the project's console scripts (``lockd``, ``lockctl``, ``resource-proxy``),
``python -m MODULE`` and ``python SCRIPT.py``. Anything else (a wrapper such as ``faketime``, a
foreign binary, an environment that changes the interpreter: ``PYTHON*``, ``LD_*``) is started
with a plain exec by the caller, so the zygote never changes what runs, only how fast it starts.

Used by ``harness.processes.ServiceProcess`` when ``HARNESS_ZYGOTE=1`` (the test suite sets it;
benchmarks do not, so they measure servers started the ordinary way).

Protocol on the zygote's Unix socket, one connection per child: the client sends one JSON line
``{"argv", "env", "cwd", "log_path"}``; the zygote answers ``pid N`` (or ``error TEXT``), and
later ``exit RC`` when the child has exited (RC as ``Popen.returncode``: negative for a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from importlib.metadata import entry_points
from pathlib import Path

__all__ = ["enabled", "supports", "spawn", "run_program", "ZygoteChild"]

VENV_BIN = Path(sys.executable).parent

PRELOAD = (
    "lockd.server.cli", "lockd.client.lockctl", "resource_proxy.cli",
    "lockd.server.store.sqlite", "lockd.server.store.postgres", "lockd.server.store.etcd",
    "uvicorn.loops.uvloop", "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.websockets_impl", "uvicorn.lifespan.on",
    "sqlalchemy.dialects.postgresql.psycopg", "sqlalchemy.dialects.sqlite.aiosqlite",
    "psycopg_pool", "redis",
)
"""Modules imported once in the zygote (a missing one is skipped): what the servers load."""

INTERPRETER_ENV = ("PYTHON", "LD_", "FAKETIME", "MALLOC")
"""Environment prefixes read when the interpreter starts: a start that changes them is exec'd."""

PROJECT_DIST = "lockd"

PIPE_INPUT_MAX = 60_000
"""Bytes of ``input`` that ``run_program`` hands a forked child through its stdin pipe (what
a pipe buffers without a reader); more goes through ``subprocess.run``."""


def enabled() -> bool:
    """True when ``HARNESS_ZYGOTE=1`` (set by the test suite's conftest)."""
    return os.environ.get("HARNESS_ZYGOTE") == "1"


@functools.cache
def _scripts() -> dict[str, str]:
    """The project's console scripts: name -> ``module:function``."""
    return {ep.name: ep.value for ep in entry_points(group="console_scripts")
            if ep.dist is not None and ep.dist.name == PROJECT_DIST}


def supports(argv: list[str], env: dict[str, str]) -> bool:
    """Whether the zygote can start ``argv`` under ``env`` exactly as an exec would."""
    if not argv:
        return False
    for key in set(env) | set(os.environ):
        if key.startswith(INTERPRETER_ENV) and env.get(key) != os.environ.get(key):
            return False
    first = Path(argv[0])
    if first.parent == VENV_BIN and first.name in _scripts():
        return True
    if argv[0] == sys.executable and len(argv) >= 2:
        return (argv[1] == "-m" and len(argv) >= 3) or argv[1].endswith(".py")
    return False


# --- the client side: one zygote per test process ---------------------------------------------

_lock = threading.Lock()
_zygote: tuple[subprocess.Popen, str] | None = None


def _socket_path() -> str:
    """Start the zygote once (per process) and return its socket's path."""
    global _zygote
    with _lock:
        if _zygote is not None and _zygote[0].poll() is None:
            return _zygote[1]
        directory = tempfile.mkdtemp(prefix="zygote-")
        path = os.path.join(directory, "sock")
        log = open(os.path.join(directory, "zygote.log"), "ab")
        root = Path(__file__).resolve().parent.parent
        proc = subprocess.Popen([sys.executable, "-m", "harness.zygote", path], cwd=root,
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the zygote did not start (see {directory}/zygote.log)")
            time.sleep(0.02)
        atexit.register(proc.stdin.close)  # EOF on its stdin: the zygote exits
        _zygote = (proc, path)
        return path


class ZygoteChild:
    """A child of the zygote, with the part of ``subprocess.Popen`` the harness uses:
    ``pid``, ``returncode``, ``poll()`` and ``wait(timeout)``."""

    def __init__(self, argv: list[str], sock: socket.socket, pid: int, rest: bytes):
        self.args = argv
        self.pid = pid
        self.returncode: int | None = None
        self._sock = sock
        self._buffer = rest

    def _read_exit(self, timeout: float | None) -> bool:
        """Read the ``exit RC`` line within ``timeout`` s (None: block); True once known."""
        if self.returncode is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(256)
            except (TimeoutError, BlockingIOError):
                return False
            if not chunk:  # the zygote is gone: the exit status went with it
                if _alive(self.pid):
                    if deadline is not None and time.monotonic() >= deadline:
                        return False
                    time.sleep(0.05)
                    continue
                self.returncode = -signal.SIGKILL
                return True
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        self.returncode = int(line.split()[1])
        self._sock.close()  # the zygote reaps the child now (until then its pid stays taken)
        return True

    def poll(self) -> int | None:
        self._read_exit(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_exit(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: an orphan's reaper may never come)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def spawn(argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike[str] | None,
          log_path: str | os.PathLike[str], stdout_path: str | None = None,
          stderr_path: str | None = None, stdin_path: str | None = None) -> ZygoteChild:
    """Start ``argv`` as a child of the zygote (``RuntimeError`` if the zygote refuses it).

    Both output streams go to ``log_path`` unless ``stdout_path``/``stderr_path`` are given;
    stdin is ``stdin_path`` or ``/dev/null``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(_socket_path())
    request = {"argv": argv, "env": env, "cwd": os.fspath(cwd or os.getcwd()),
               "log_path": os.fspath(log_path), "stdout_path": stdout_path,
               "stderr_path": stderr_path, "stdin_path": stdin_path}
    sock.sendall(json.dumps(request).encode() + b"\n")
    buffer = b""
    sock.settimeout(30)
    while b"\n" not in buffer:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("the zygote closed the connection before answering")
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    word, _, value = line.decode().partition(" ")
    if word != "pid":
        sock.close()
        raise RuntimeError(f"the zygote could not start {argv[0]}: {value}")
    return ZygoteChild(argv, sock, int(value), rest)


def run_program(argv: list[str], *, input: bytes | str | None = None, env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None, timeout: float | None = None,
        text: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, ...)``, forked from the zygote when it is
    enabled and can start ``argv`` (else a plain ``subprocess.run``). On ``timeout`` (s) the
    child is killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    env = dict(os.environ if env is None else env)
    if not (enabled() and supports(argv, env)) or len(input or b"") > PIPE_INPUT_MAX:
        return subprocess.run(argv, input=input, env=env, cwd=cwd, timeout=timeout, text=text,
                              capture_output=True)
    with tempfile.TemporaryDirectory(prefix="zrun-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
        data = input.encode() if isinstance(input, str) else input
        with open(paths["stdin"], "wb") as f:
            f.write(data or b"")
        child = spawn(argv, env=env, cwd=cwd, log_path=paths["stdout"],
                      stdout_path=paths["stdout"], stderr_path=paths["stderr"],
                      stdin_path=paths["stdin"] if input is not None else None)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        out, err = (Path(paths[n]).read_bytes() for n in ("stdout", "stderr"))
    if text:
        out, err = out.decode(), err.decode()
    return subprocess.CompletedProcess(argv, code, out, err)


# --- the zygote itself -------------------------------------------------------------------------

def _target(argv: list[str]):
    """(``sys.path[0]``, ``sys.argv``, a function running the program) for ``argv``."""
    import runpy
    first = Path(argv[0])
    scripts = _scripts()
    if first.parent == VENV_BIN and first.name in scripts:
        module, _, function = scripts[first.name].partition(":")
        def run():
            return getattr(importlib.import_module(module), function)()
        return str(VENV_BIN), argv, run
    if argv[1] == "-m":
        module = argv[2]
        def run():
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        return os.getcwd(), [module, *argv[3:]], run
    script = argv[1]
    def run():
        runpy.run_path(script, run_name="__main__")
    return str(Path(script).resolve().parent), argv[1:], run


def _name_process(name: str) -> None:
    """The process name ``ps -o comm`` and ``top`` show (Linux, 15 bytes); the command line
    stays the zygote's."""
    import ctypes
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def _child(request: dict, closing: list) -> None:
    """In the forked child: become the program ``request`` names, then exit with its status."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for thing in closing:
            with contextlib.suppress(OSError):
                thing.close() if hasattr(thing, "close") else os.close(thing)
        os.setsid()
        for fd, name in ((1, "stdout_path"), (2, "stderr_path")):
            out = os.open(request.get(name) or request["log_path"],
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, fd)
            os.close(out)
        if request.get("stdin_path"):  # a pipe, as subprocess.run(input=...) gives
            data = Path(request["stdin_path"]).read_bytes()
            stdin, feed = os.pipe()
            os.write(feed, data)  # within the pipe's buffer: run_program() sends no more
            os.close(feed)
        else:
            stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()
        random.seed()
        path0, sys.argv, run = _target(request["argv"])
        _name_process(Path(sys.argv[0]).name)
        sys.path[0] = path0
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            result = run()
            code = result if isinstance(result, int) else 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    """Preload, listen on ``path`` and fork a child per request until stdin closes."""
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    import gc
    gc.collect()
    gc.freeze()  # the preloaded objects stay shared between children (copy-on-write)
    _Zygote(path).loop()


class _Child:
    """A forked child and its client's connection (None once the client has gone before the
    exit); ``told`` once its exit was sent."""

    def __init__(self, pid: int, conn: socket.socket | None):
        self.pid, self.conn, self.told = pid, conn, False


class _Zygote:
    """The zygote's loop: accept a request, fork, and tell each client its child's exit.

    A child that has exited stays a zombie until its client has read the exit (the client
    then closes the connection), as a ``Popen`` child stays one until ``poll()`` or ``wait()``
    reads it: until then its pid cannot be reused, so a late signal to it never reaches
    another process (the machine's pids wrap at 32,768 during a suite)."""

    def __init__(self, path: str):
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path + ".tmp")
        self.listener.listen(64)
        os.rename(path + ".tmp", path)  # the client waits for the name: it appears once listening
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "child")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
        self.children: dict[int, _Child] = {}

    def loop(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
                elif key.data == "accept":
                    self.start(self.listener.accept()[0])
                elif key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                else:
                    self.client_closed(key.data)
            self.report_exits()

    def start(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            buffer = b""
            while b"\n" not in buffer:
                chunk = conn.recv(65536)
                if not chunk:
                    conn.close()
                    return
                buffer += chunk
            request = json.loads(buffer.partition(b"\n")[0])
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(f"error {exc}\n".encode())
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, [self.listener, conn, self.selector, self.wake_r, self.wake_w,
                             *(c.conn for c in self.children.values() if c.conn is not None)])
        child = self.children[pid] = _Child(pid, conn)
        with contextlib.suppress(OSError):
            conn.sendall(f"pid {pid}\n".encode())
        self.selector.register(conn, selectors.EVENT_READ, child)

    def report_exits(self) -> None:
        """Tell each client whose child has exited, leaving the zombie (``WNOWAIT``)."""
        for child in list(self.children.values()):
            if child.told:
                continue
            try:
                info = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                self.forget(child)
                continue
            if info is None:
                continue
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            child.told = True
            try:
                if child.conn is None:
                    raise OSError("the client has gone")
                child.conn.sendall(f"exit {code}\n".encode())
            except OSError:  # nothing will read it
                self.forget(child)

    def client_closed(self, child: _Child) -> None:
        """The client read the exit (or dropped the child): reap it once it has exited."""
        with contextlib.suppress(OSError):
            if child.conn.recv(256):
                return  # clients send nothing after the request
        if child.told:
            self.forget(child)
        else:  # no one will read this child's exit: reap it when it comes
            self.selector.unregister(child.conn)
            child.conn.close()
            child.conn = None

    def forget(self, child: _Child) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, os.WNOHANG)
        self.children.pop(child.pid, None)
        if child.conn is not None:
            self.selector.unregister(child.conn)
            child.conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
