"""A Docker engine for the compose tests: the one already running, else a ``dockerd`` of our own.

``ensure_dockerd()`` returns a :class:`Dockerd`; ``stop()`` stops the daemon only when this process
started it (SIGTERM, which also stops the containerd it started; SIGKILL after 30 s). A started
daemon keeps the default data root, so images (the stand-in base images, the build cache) stay
for the next run. Its flags come from ``LOCKD_TEST_DOCKERD_ARGS`` (default ``--iptables=false``:
our machines have no iptables binary). The storage driver is dockerd's own choice: overlay2 where
the kernel and file system allow it (here: the image build takes ~20 s instead of ~4 min with vfs,
which copies every layer), vfs elsewhere, or the one a data root was made with.

Missing tools raise :class:`DockerMissing` (the caller skips: nothing to test here); a daemon that
is installed but cannot be reached or started raises :class:`DockerUnavailable` (the caller skips,
or fails under CI=true).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness import wait_for

DEFAULT_DOCKERD_ARGS = "--iptables=false"


class DockerMissing(Exception):
    """docker, dockerd or docker-compose is not installed."""


class DockerUnavailable(Exception):
    """dockerd is installed but no daemon answers and none could be started."""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def daemon_answers(docker: str) -> bool:
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@dataclass
class Dockerd:
    docker: str
    compose: str
    proc: subprocess.Popen | None = None  # set when we started the daemon
    log_path: Path | None = None

    @property
    def started_here(self) -> bool:
        return self.proc is not None

    def stop(self) -> int | None:
        """Stop the daemon if we started it; its exit status (None if it was not ours)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def ensure_dockerd(log_path: Path, timeout: float = 60.0) -> Dockerd:
    """The running engine, or one started now (as root) with its log in ``log_path``."""
    docker, dockerd, compose = _which("docker"), _which("dockerd"), _which("docker-compose")
    missing = [n for n, p in (("docker", docker), ("dockerd", dockerd),
                              ("docker-compose", compose)) if p is None]
    if docker and compose and daemon_answers(docker):
        return Dockerd(docker, compose)
    if missing:
        raise DockerMissing(f"{', '.join(missing)} not installed "
                            "(make system-deps installs docker.io and docker-compose)")
    assert docker and dockerd and compose
    if os.geteuid() != 0:
        raise DockerUnavailable("no Docker daemon answers and only root can start dockerd")
    args = shlex.split(os.environ.get("LOCKD_TEST_DOCKERD_ARGS", DEFAULT_DOCKERD_ARGS))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([dockerd, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    engine = Dockerd(docker, compose, proc, log_path)
    try:
        wait_for(lambda: proc.poll() is not None or daemon_answers(docker), timeout=timeout,
                 interval=0.5, what="dockerd to answer")
    except TimeoutError:
        pass
    if proc.poll() is not None or not daemon_answers(docker):
        engine.stop()
        tail = log_path.read_text(errors="replace")[-2000:]
        raise DockerUnavailable(f"dockerd {' '.join(args)} did not start "
                                f"(exit {proc.returncode}):\n{tail}")
    return engine
