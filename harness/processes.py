"""Real server processes for tests, benchmarks and chaos runs: free ports, readiness, signals.

``ServiceProcess`` starts a server as a real process and stops it with real signals;
``wait_for`` (and ``wait_for_async``) poll a condition with a deadline (tests wait on conditions,
not on time); ``TIMING_SLACK`` scales the duration bounds tests assert.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from harness import zygote

__all__ = ["VENV_BIN", "TIMING_SLACK", "free_port", "wait_for", "wait_for_async", "ServiceProcess"]

VENV_BIN = Path(sys.executable).parent

TIMING_SLACK = float(os.environ.get("TEST_TIMING_SLACK", "1.0"))
"""Multiplier for the duration bounds tests assert (``elapsed < 2.0 * TIMING_SLACK``); default
1.0, from ``TEST_TIMING_SLACK`` (e.g. 3 on a loaded machine). Scales margins, never what is proved."""


PORT_BLOCK = 1500
"""Ports per test worker: worker N (``PYTEST_XDIST_WORKER=gwN``) takes its ports from
``[20000 + N * PORT_BLOCK, 20000 + (N + 1) * PORT_BLOCK)``, below the kernel's ephemeral range
(32768 and up), so a port one worker was given is never another worker's nor a client socket's."""

_next_port: dict[int, int] = {}
_port_lock = threading.Lock()


def _worker_index() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Outside a parallel run, the kernel picks it. Under pytest-xdist, each worker takes the next
    free port of its own block (``PORT_BLOCK``), round-robin, so two workers never race for one.
    """
    index = _worker_index()
    if index is None or index >= (32768 - 20000) // PORT_BLOCK:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    base = 20000 + index * PORT_BLOCK
    with _port_lock:
        for _ in range(PORT_BLOCK):
            offset = _next_port.get(index)
            if offset is None:  # a child process of a test starts elsewhere in the block
                offset = random.randrange(PORT_BLOCK)
            _next_port[index] = (offset + 1) % PORT_BLOCK
            port = base + offset
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise OSError(f"no free port left in worker {index}'s block from {base}")


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


async def wait_for_async(predicate, timeout: float = 10.0, interval: float = 0.02,
                         what: str = "condition"):
    """``wait_for`` for event loops: ``predicate`` may be sync or return an awaitable; polls
    without blocking the loop and raises ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class ServiceProcess:
    """A server started as a real process, ready once ``ready_url`` answers 200.

    Output goes to a log file (``log_path``) so a failing test can show it. ``stop()`` sends
    SIGTERM and waits; ``kill()`` sends SIGKILL; ``pause()``/``resume()`` SIGSTOP/SIGCONT.
    """

    def __init__(self, argv: list[str], *, ready_url: str, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None, log_path: str | os.PathLike[str] | None = None,
                 http_options: dict | None = None):
        self.argv = argv
        self.ready_url = ready_url
        self.http_options = http_options or {}  # for the readiness check: TLS ``verify=``
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.log_path = Path(log_path or tempfile.mkstemp(prefix="svc-", suffix=".log")[1])
        self.proc: subprocess.Popen | zygote.ZygoteChild | None = None

    def start(self, timeout: float = 20.0) -> ServiceProcess:
        if zygote.enabled() and zygote.supports(self.argv, self.env):
            self.proc = zygote.spawn(self.argv, env=self.env, cwd=self.cwd, log_path=self.log_path)
        else:
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.ready_url, timeout=1.0, **self.http_options).status_code == 200:
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

    @property
    def running(self) -> bool:
        """Started and not exited (a paused process is running)."""
        return self.proc is not None and self.proc.poll() is None

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
