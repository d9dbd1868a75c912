"""``resource-proxy serve --workers N``: N worker processes serving one listening socket.

Why: one Python process uses one core, and the proxy's request work (HTTP parsing, routing, a
new token's Ed25519 verification) is CPU-bound; the proxy keeps no state between requests that
the database does not hold (fence rows, Idempotency-Key records), so N processes behave as N
proxies on one port. The fence check stays in the database transaction, as for several proxies.

How: the parent binds the socket, then forks N workers *before* any event loop, thread, pool or
key set exists. Each worker builds its own app: it reflects the tables, opens its own pool
(``pool_size`` connections each: N × ``pool_size`` in all), loads the JWKS itself, and accepts on
the shared socket (the kernel hands each new connection to one worker).

Lifecycle: SIGTERM/SIGINT to the parent is passed to every worker, each finishes its in-flight
requests (uvicorn's graceful shutdown), and the parent exits 0 when they all did. A worker that
fails to start or exits on its own makes the parent stop the others and exit 1 (fail-stop: the
service manager restarts the whole proxy; no half-sized proxy keeps running unnoticed).

Per worker, not per proxy: ``/metrics`` and ``/v1/activity`` describe the worker that answered
the request (each has its own counters); sum them over scrapes or run ``--workers 1`` when a
single view matters. ``/healthz`` is answered by whichever worker accepts it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

__all__ = ["default_workers", "run_workers"]

log = logging.getLogger("resource_proxy")


def default_workers() -> int:
    """The number of CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def run_workers(count: int, sock: socket.socket, serve: Callable[[socket.socket], int]) -> int:
    """Fork ``count`` workers, each running ``serve(sock)`` (its exit status), and supervise
    them; returns the parent's exit status (0 after a clean stop, 1 if a worker failed)."""
    children: dict[int, int] = {}
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                code = serve(sock)
            except BaseException:  # noqa: BLE001 - a worker must never return into the parent's loop
                log.exception("resource-proxy worker %d failed", index)
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = index
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
                    log.error("resource-proxy worker %d (pid %d) exited with status %d; "
                              "stopping the others", index, pid, code)
                    stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if failed else 0
