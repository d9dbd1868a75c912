"""The one way to start lockd and the resource proxy as real processes, for tests, benchmarks and
chaos runs.

``LockdServer(store_url, key_dir=..., log_dir=...)`` is ``lockd serve`` on a store URL with a key
directory and a port of its own; ``ProxyServer(database_url, lockd_url, log_dir=...)`` is
``resource-proxy serve``. Both are ready once ``/healthz`` answers 200, restart on the same port,
store and keys, and can be stopped (SIGTERM), killed (SIGKILL), paused (SIGSTOP) and resumed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from harness.processes import VENV_BIN, ServiceProcess, free_port, wait_for

__all__ = ["Server", "LockdServer", "ProxyServer", "blob_deletes_settled"]

_PENDING = "resource_proxy_object_blob_deletes_pending "


def blob_deletes_settled(url: str, timeout: float = 10.0) -> None:
    """Wait until the proxy at ``url`` has finished deleting every replaced object's blob it
    began to delete (they go after the answer): its ``/metrics`` gauge reads 0."""
    import httpx

    def settled() -> bool:
        try:
            text = httpx.get(f"{url}/metrics", timeout=5).text
        except httpx.HTTPError:  # restarting: ask again
            return False
        line = next((x for x in text.splitlines() if x.startswith(_PENDING)), None)
        return line is not None and float(line[len(_PENDING):]) == 0

    wait_for(settled, timeout, what="the replaced blobs' deletes")


class Server:
    """A server process of the project's: ``argv()`` names it, the rest is common.

    ``env`` adds to the environment, ``args`` to the command line, ``wrapper`` goes in front of
    it (``faketime``, say); the log of every start goes to ``log_dir/<kind>-<port>-<n>.log``.
    """

    kind = "server"

    def __init__(self, *, log_dir: str | os.PathLike[str], port: int | None = None,
                 env: dict[str, str] | None = None, args: Sequence[str] = (),
                 wrapper: Sequence[str] = ()):
        self.log_dir = Path(log_dir)
        self.port = port or free_port()
        self.env = env
        self.args = list(args)
        self.wrapper = list(wrapper)
        self.proc: ServiceProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def argv(self) -> list[str]:
        return [*self.wrapper, *self.command(), "--port", str(self.port), *self.args]

    def start(self, timeout: float = 20.0) -> Server:
        """Start it and wait until ``/healthz`` answers 200 (``TimeoutError`` after ``timeout`` s)."""
        self.starts += 1
        self.proc = ServiceProcess(
            self.argv(), ready_url=self.url + "/healthz", env=self.env,
            log_path=self.log_dir / f"{self.kind}-{self.port}-{self.starts}.log").start(timeout)
        return self

    def restart(self) -> Server:
        """Stop (if running) and start again on the same port, store and keys."""
        self.stop()
        return self.start()

    def stop(self) -> int | None:
        return self.proc.stop() if self.proc else None

    def kill(self) -> None:
        if self.proc:
            self.proc.kill()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.pause()

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.resume()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        """Started and not exited (a paused server is running)."""
        return self.proc is not None and self.proc.running

    def log(self) -> str:
        """Every start's log, oldest first."""
        logs = sorted(self.log_dir.glob(f"{self.kind}-{self.port}-*.log"),
                      key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LockdServer(Server):
    """``lockd serve --store STORE_URL --key-dir KEY_DIR`` (``key_dir`` defaults to
    ``log_dir/keys``)."""

    kind = "lockd"

    def __init__(self, store_url: str, *, log_dir: str | os.PathLike[str],
                 key_dir: str | os.PathLike[str] | None = None, **kwargs):
        super().__init__(log_dir=log_dir, **kwargs)
        self.store_url = store_url
        self.key_dir = Path(key_dir) if key_dir else self.log_dir / "keys"

    def command(self) -> list[str]:
        return [str(VENV_BIN / "lockd"), "serve", "--store", self.store_url,
                "--key-dir", str(self.key_dir)]


class ProxyServer(Server):
    """``resource-proxy serve --database-url DB --lockd-url LOCKD`` with, when given, a policy
    file, a ``--tables`` list and an objects directory."""

    kind = "proxy"

    def __init__(self, database_url: str, lockd_url: str, *, log_dir: str | os.PathLike[str],
                 policy: str | os.PathLike[str] | None = None, tables: Sequence[str] = (),
                 objects_dir: str | os.PathLike[str] | None = None, **kwargs):
        super().__init__(log_dir=log_dir, **kwargs)
        self.database_url = database_url
        self.lockd_url = lockd_url
        self.policy = policy
        self.tables = list(tables)
        self.objects_dir = objects_dir

    def command(self) -> list[str]:
        argv = [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", self.database_url,
                "--lockd-url", self.lockd_url]
        if self.policy is not None:
            argv += ["--policy", str(self.policy)]
        if self.tables:
            argv += ["--tables", ",".join(self.tables)]
        if self.objects_dir is not None:
            argv += ["--objects-dir", str(self.objects_dir)]
        return argv
