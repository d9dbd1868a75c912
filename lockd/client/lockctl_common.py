"""What every ``lockctl`` subcommand shares: exit codes, output, arguments, and running a
command while a lease is held (``run``, ``sem run``, ``elect``). See ``lockd.client.lockctl``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from lockd.client.durations import parse_duration
from lockd.client.errors import (
    LeaseLostError,
    LimitMismatch,
    LockClientError,
    LockNotAcquired,
    ServiceUnavailable,
    ValidationError,
)

__all__ = [
    "EXIT_OK",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_UNAVAILABLE",
    "EXIT_NOT_ACQUIRED",
    "EXIT_LEASE_LOST",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "Out",
    "duration",
    "default_owner",
    "exit_code",
    "lease_id_of",
    "run_under",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69
EXIT_NOT_ACQUIRED = 75
EXIT_LEASE_LOST = 79
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: the reader of stdout went away

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def duration(text: str) -> float:
    """argparse type: a human duration -> seconds (float)."""
    try:
        return parse_duration(text) / 1000
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def default_owner() -> str:
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
    return f"lockctl {user}@{socket.gethostname()} pid {os.getpid()}"


class Out:
    """Human text or (``--json``) one JSON document per result on stdout; errors on stderr."""

    def __init__(self, as_json: bool):
        self.as_json = as_json

    def emit(self, doc: Any, human: str) -> None:
        if self.as_json:
            print(json.dumps(doc, sort_keys=True))
        else:
            print(human)
        sys.stdout.flush()

    def error(self, exc: LockClientError | str) -> None:
        if isinstance(exc, str):
            doc: dict[str, Any] = {"error": "error", "detail": exc}
            text = exc
        else:
            doc = {"error": exc.code, "status": exc.status, "detail": exc.detail}
            for key in ("lock", "owner", "ttl_ms", "limit"):
                if exc.problem.get(key) is not None:
                    doc[key] = exc.problem[key]
            text = exc.detail
        if self.as_json:
            print(json.dumps(doc, sort_keys=True), file=sys.stderr)
        else:
            print(f"lockctl: {text}", file=sys.stderr)


def exit_code(exc: LockClientError) -> int:
    if isinstance(exc, LockNotAcquired):
        return EXIT_NOT_ACQUIRED
    if isinstance(exc, LeaseLostError):
        return EXIT_LEASE_LOST
    if isinstance(exc, ServiceUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, ValidationError | LimitMismatch):
        return EXIT_USAGE
    return EXIT_ERROR


def lease_id_of(given: str | None) -> str:
    """The lease id of renew/release: the argument, ``-`` (first line of stdin) or, left out,
    ``$LOCKD_LEASE_ID``; if none is there, one line saying which and exit 2 (no usage dump:
    the arguments were fine, the id was missing)."""
    if given == "-":
        value = sys.stdin.readline().strip()
        missing = "standard input is empty"
    elif given is None:
        raw = os.environ.get("LOCKD_LEASE_ID")
        value = (raw or "").strip()
        missing = "LOCKD_LEASE_ID is unset" if raw is None else "LOCKD_LEASE_ID is empty"
    else:
        value, missing = given.strip(), "LEASE_ID is empty"
    if not value:
        print(f"lockctl: no lease id: {missing} (pass LEASE_ID, '-' to read it from stdin, or "
              f"set LOCKD_LEASE_ID to the lease_id `lockctl acquire` printed)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return value


def run_under(client: Any, lease: Any, command: list[str], env: dict[str, str], out: Out,
              grace: float, *, step_down: threading.Event | None = None) -> int:
    """Run ``command`` (its own process group, ``env``) while ``lease`` is held, then release
    the lease; returns lockctl's exit status.

    If the lease is lost, the command's group gets SIGTERM, then SIGKILL after ``grace``
    seconds, and the status is ``EXIT_LEASE_LOST``. If ``step_down`` is set (a leader asked to
    hand over), the command is stopped the same way, the lease released, and the command's own
    status is passed through. SIGINT, SIGTERM and SIGHUP sent to lockctl go to the command.
    """
    try:
        child = subprocess.Popen(command, env=env, process_group=0)
    except OSError as exc:
        lease.__exit__(type(exc), exc, exc.__traceback__)  # release; its errors are logged
        out.error(f"cannot run {command[0]!r}: {exc.strerror or exc}")
        return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_EXECUTE

    def forward(signum: int, _frame: Any) -> None:
        _killpg(child, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    stopped = handed_over = False
    try:
        while child.poll() is None:
            if lease.lost.wait(0.05):
                reason = lease.lost_reason.detail if lease.lost_reason else "lease lost"
                out.error(f"{reason}; stopping the command (pid {child.pid})")
                _stop(child, grace)
                stopped = True
                break
            if step_down is not None and step_down.is_set():
                out.error(f"asked to hand over to {getattr(lease, 'handover_to', None)!r}; "
                          f"stopping the command (pid {child.pid}) and resigning")
                _stop(child, grace)
                handed_over = True
                break
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    lost = stopped
    try:
        client.release(lease)
    except LeaseLostError as exc:
        if not stopped:
            out.error(f"{exc.detail} (the command had exited with {_status_code(status)})")
        lost = True
    except LockClientError as exc:
        out.error(f"release failed ({exc.detail}); lockd frees the lock when its TTL runs out")
    if lost and not handed_over:
        return EXIT_LEASE_LOST
    return _status_code(status)


def _status_code(status: int) -> int:
    return 128 - status if status < 0 else status


def _killpg(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _stop(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM the command's process group; SIGKILL it if it is still running after ``grace``."""
    _killpg(child, signal.SIGTERM)
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        _killpg(child, signal.SIGKILL)
    child.wait()
    _killpg(child, signal.SIGKILL)  # stragglers of the group that ignored SIGTERM
