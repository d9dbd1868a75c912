"""Child processes that cannot outlive the demo.

Every child (servers and workers) is started in its own session, so a Ctrl-C in the terminal
reaches only the demo, which then stops its children itself in order (SIGCONT first, in case one
is frozen, then SIGTERM, then SIGKILL) and reaps them. On Linux each child also asks the kernel
for ``PR_SET_PDEATHSIG`` = SIGKILL, so even a SIGKILLed demo leaves no orphans behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

__all__ = ["ChildSet", "die_with_parent", "executable", "spawn"]

_PR_SET_PDEATHSIG = 1
_libc = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; no-op elsewhere).

    With ``expected_parent``, exit at once if the parent is already gone (the race between fork
    and this call).
    """
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def spawn(argv: Sequence[str], *, env: dict[str, str] | None = None,
          cwd: str | os.PathLike[str] | None = None, stdout: int | IO | None = None,
          stderr: int | IO | None = None) -> subprocess.Popen:
    """Start ``argv`` in a new session, dying with this process (see module docstring)."""
    return subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, start_new_session=True,
                            preexec_fn=die_with_parent if _libc is not None else None)


class ChildSet:
    """The children of one demo run; ``stop_all()`` stops and reaps every one still running."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        self._procs.append(proc)
        return proc

    def spawn(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        return self.add(spawn(argv, **kw))

    @staticmethod
    def stop(proc: subprocess.Popen, timeout: float = 5.0) -> int:
        """SIGCONT + SIGTERM, wait ``timeout`` seconds, then SIGKILL; returns the exit status."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every child, newest first (workers before the servers they talk to)."""
        for proc in reversed(self._procs):
            self.stop(proc, timeout)
        self._procs.clear()


def executable(name: str) -> str:
    """The console script ``name`` installed beside this Python (a venv's or the image's bin)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} is not installed (pip install the project first)")
    return found

