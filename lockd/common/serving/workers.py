"""``serve --workers N`` for both servers: N worker processes serving one TCP port.

Why: one Python process uses one core, and a server's request work (HTTP parsing, routing,
JSON, token signing or verification, the database driver) is CPU-bound. Several processes on
one port use several cores, where the server keeps no state between requests that its
database does not hold (the proxy; lockd on PostgreSQL or etcd, not on embedded SQLite). What
the processes do *not* share is each server's business: see ``resource_proxy.cli`` and
``lockd.server.cli``.

How: the parent opens N listening sockets on the port with ``SO_REUSEPORT`` (a port another
process holds fails the start here, with exit status 1 from the caller), then forks N workers
*before* any event loop, thread, pool or store connection exists; worker i keeps socket i. The
kernel spreads new connections over the N sockets by their address hash. (One shared socket
would not: the worker that wakes first accepts every connection waiting, so 8 keep-alive
clients measured all on one worker.) Each worker then builds its own app, opens its own
database pool, and serves until told to stop.

Lifecycle: SIGTERM/SIGINT to the parent is passed to every worker, each finishes its in-flight
requests (uvicorn's graceful shutdown), and the parent exits 0 when they all did. A parent
killed outright (SIGKILL) takes its workers with it (Linux ``PR_SET_PDEATHSIG``). A worker that
fails to start or exits on its own makes the parent stop the others and exit 1 (fail-stop: the
service manager restarts the whole server; no half-sized server keeps running unnoticed).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

__all__ = ["default_workers", "listening_sockets", "run_workers"]

log = logging.getLogger("lockd.workers")


def default_workers() -> int:
    """The number of CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def listening_sockets(host: str, port: int, count: int, backlog: int = 2048) -> list[socket.socket]:
    """``count`` sockets listening on ``host``:``port`` with ``SO_REUSEPORT`` (port 0: the one
    the first got). Raises ``OSError`` if the address cannot be had."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # port 0: every socket on the port the first got
            sock.listen(backlog)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGTERM this worker when the parent dies (``PR_SET_PDEATHSIG``): a parent
    killed with SIGKILL must not leave workers serving the port unsupervised."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM handling still applies
        return
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def run_workers(sockets: list[socket.socket], serve: Callable[[socket.socket], int],
                name: str = "server") -> int:
    """Fork one worker per socket, each running ``serve(its socket)`` (its exit status), and
    supervise them; returns the parent's exit status (0 after a clean stop, 1 if a worker
    failed). ``name`` (``lockd``, ``resource-proxy``) prefixes the parent's log lines."""
    children: dict[int, int] = {}
    parent = os.getpid()
    for index, sock in enumerate(sockets):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                _die_with_parent(parent)
                for other in sockets:
                    if other is not sock:
                        other.close()
                code = serve(sock)
            except BaseException:  # noqa: BLE001 - a worker must never return into the parent's loop
                log.exception("%s worker %d failed", name, index)
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = index
    for sock in sockets:
        sock.close()
    stopping = False

    def stop(signum: int | None = None, frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            index = children.pop(pid, None)
            if index is None:
                continue
            code = _exit_code(status)
            if code != 0 or not stopping:
                failed = True
                if not stopping:
                    log.error("%s worker %d (pid %d) exited with status %d; "
                              "stopping the others", name, index, pid, code)
                    stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if failed else 0
