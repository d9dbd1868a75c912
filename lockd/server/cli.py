"""``lockd serve``: run the lock service under uvicorn.

::

    lockd serve [--store URL] [--host 127.0.0.1] [--port 7070] [--key-dir DIR] [--log-level L]
                [--workers N] [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]

Flags override ``LOCKD_*`` environment variables (see ``lockd.server.settings``). Start-up opens the
key directory and the store *before* the HTTP server, so a problem (a SQLite file in use by
another lockd, PostgreSQL down, an unreadable key) ends the process with one clear line and
exit status 1; unusable TLS files (``--tls-cert/--tls-key/--tls-client-ca``, see
``lockd.common.tls.check_server_files``) end it with one line and exit status 2 before that.
When ready it logs ``lockd listening on http[s]://HOST:PORT (store URL)`` with any
password in the URL redacted. SIGTERM or SIGINT: queued acquires are answered 503 at once,
in-flight requests finish, the store closes, exit status 0.

``--workers N`` (PostgreSQL and etcd stores; default 1): N processes serve the one port
(``lockd.common.serving.workers``: ``SO_REUSEPORT`` sockets bound by the parent, then a fork per worker
before any event loop; the key directory is read once, by the parent). Each worker opens its own
store (its own pool and LISTEN connection / etcd watch) and is, to the store, one more lockd
replica; the kernel spreads client connections over the workers. What that promises is
``WORKERS_PROMISE``: mutual exclusion, strictly increasing fences and expiry by the store's
clock hold as for one process, because the store decides every grant; the FIFO order of
waiters holds only among the waiters queued on the same worker (waiters are per process, like
separate replicas: a release on one worker wakes the waiters on the others through the store's
release notification, and they then race for the lock). ``/metrics``, ``/v1/events`` streams
(event ids are per process) and the status page describe the worker that answered. The
embedded SQLite store is single-process: ``--workers`` above 1 with it is refused (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from lockd import __version__
from lockd.common.logs import configure_logging
from lockd.common.options import add_bound_arguments, add_tls_arguments, tls_files_problem
from lockd.common.serving.listen import ListenError, bind_listener, listen_failure
from lockd.common.serving.server import Server
from lockd.common.serving.server import uvicorn_config as _uvicorn_config
from lockd.common.serving.workers import listening_sockets, run_workers
from lockd.server import keys_cli
from lockd.server.access import access_file_problem
from lockd.server.app import create_app
from lockd.server.dev_certs import make_dev_certs, usage
from lockd.server.errors import StoreUnavailable
from lockd.server.settings import Settings
from lockd.server.store import is_sqlite_url, open_store, redact_url
from lockd.tokens import KeyRing

__all__ = ["main", "build_parser", "WORKERS_PROMISE"]

log = logging.getLogger("lockd")

_GRACEFUL_SHUTDOWN_S = 10

WORKERS_PROMISE = (
    "worker processes serving the port (env LOCKD_WORKERS; default 1; PostgreSQL and etcd "
    "stores only). Mutual exclusion, fences and expiry hold as with one process (the store "
    "decides); FIFO order holds only among waiters on the same worker (a release on one worker "
    "wakes the others' waiters through the store's notifications, and they race)."
)


_PAGES = ("Once running, lockd serves at http://HOST:PORT: / the status page (locks, holders, "
         "live events), /docs the API (Swagger UI, works offline), /openapi.json, /metrics "
         "(Prometheus), /healthz.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockd", description="A lease-and-fence lock service.",
                                     epilog=_PAGES)
    parser.add_argument("--version", action="version", version=f"lockd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the HTTP server",
                                description="Run the lockd HTTP server.", epilog=_PAGES)
    serve.add_argument("--store", help="store URL (env LOCKD_STORE; default sqlite:///./lockd.db)")
    serve.add_argument("--host", help="address to listen on (env LOCKD_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (env LOCKD_PORT; default 7070)")
    serve.add_argument("--key-dir", help="signing key directory (env LOCKD_KEY_DIR; "
                                         "default ./lockd-keys)")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"],
                       help="log level (env LOCKD_LOG_LEVEL; default info)")
    serve.add_argument("--log-format", choices=["text", "json"],
                       help="log line format (env LOCKD_LOG_FORMAT; default text)")
    serve.add_argument("--workers", type=int, help=WORKERS_PROMISE)
    add_bound_arguments(serve, "LOCKD")
    serve.add_argument("--max-event-streams", type=int,
                       help="event streams beyond this get 503 (env LOCKD_MAX_EVENT_STREAMS; "
                            "default 100)")
    add_tls_arguments(serve, "LOCKD")
    serve.add_argument("--access-file", help="YAML of identities and the lock-name prefixes "
                                             "they may use (env LOCKD_ACCESS_FILE)")
    serve.add_argument("--max-leases-per-identity", type=int,
                       help="live leases per identity, beyond: 429 (default 100000)")
    serve.add_argument("--max-waiters-per-identity", type=int,
                       help="queued acquires per identity, beyond: 429 (default 10000)")
    keys_cli.add_parser(commands)
    dev = commands.add_parser("dev", help="helpers for trying lockd locally",
                              description="Helpers for trying lockd locally.")
    dev_actions = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")
    certs = dev_actions.add_parser(
        "certs", help="make a development CA, a server and a client certificate",
        description="Write ca.pem/.key, server.pem/.key (127.0.0.1, ::1, localhost) and "
                    "client.pem/.key into DIR, for trying TLS and mTLS locally (docs/tls.md).")
    certs.add_argument("dir", metavar="DIR", help="directory to write into (created if missing)")
    return parser


def _dev(args: argparse.Namespace) -> int:
    """``lockd dev certs DIR``: exit 0, or 2 (one line) when a file is there already."""
    directory = Path(args.dir)
    try:
        make_dev_certs(directory)
    except (FileExistsError, OSError) as exc:
        print(f"lockd dev certs: {exc}", file=sys.stderr)
        return 2
    print(usage(directory))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lockd`` console script; returns the exit status."""
    args = build_parser().parse_args(keys_cli.protect_kids(sys.argv[1:] if argv is None else argv))
    if args.command == "keys":
        return keys_cli.run(args)
    if args.command == "dev":
        return _dev(args)
    overrides = {key: value for key, value in vars(args).items()
                 if key != "command" and value is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        print(f"lockd: invalid settings: {problems}", file=sys.stderr)
        return 2
    tls_files = tls_files_problem(settings)
    if tls_files:
        print(f"lockd: {tls_files}", file=sys.stderr)
        return 2
    access = access_file_problem(settings.access_file)
    if access:
        print(f"lockd: {access}", file=sys.stderr)
        return 2
    if settings.workers > 1 and is_sqlite_url(settings.store):
        print("lockd: --workers: the SQLite store serves from one process (use --workers 1, "
              "or a PostgreSQL or etcd store)", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers == 1:
        return _run(serve(settings))
    return _serve_workers(settings)


def _run(main_coro) -> int:
    loop_factory = uvicorn.Config(app=FastAPI(), loop="auto", log_config=None).get_loop_factory()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main_coro)


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` (``lockd.common.serving.server.uvicorn_config``:
    connection bounds, TLS, one ``send`` per response), with lockd's graceful-shutdown timeout
    and no ``server`` header."""
    return _uvicorn_config(app, settings, name="lockd", logger=log,
                           timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S, server_header=False)


def _serve_workers(settings: Settings) -> int:
    """``--workers N`` > 1: bind N ``SO_REUSEPORT`` sockets and read the keys here (a port in
    use or a bad key directory: one line, exit 1, nothing forked), then fork the workers, each
    running ``serve`` on its socket; exit 0 after a clean stop, 1 if a worker failed."""
    try:
        sockets = listening_sockets(settings.host, settings.port, settings.workers)
    except OSError as exc:
        log.error("lockd cannot start: %s", listen_failure(settings.host, settings.port, exc))
        return 1
    try:
        keyring = KeyRing.load_or_create(settings.key_dir)  # once: workers do not race for it
    except (OSError, ValueError) as exc:
        log.error("lockd cannot start: %s", exc)
        for sock in sockets:
            sock.close()
        return 1
    log.info("lockd starting %d workers", settings.workers)
    return run_workers(sockets, lambda sock: _run(serve(settings, sock, keyring)), name="lockd")


async def serve(settings: Settings, listener: socket.socket | None = None,
                keyring: KeyRing | None = None) -> int:
    """Open keys and store, serve until SIGTERM/SIGINT, close the store. Returns exit status.

    ``listener``: an already listening socket (a worker's); None: bind ``settings.host:port``
    here. ``keyring``: the keys already loaded (by the workers' parent); None: load them here.
    """
    if listener is None:
        try:
            listener = bind_listener(settings.host, settings.port)
        except ListenError as exc:
            log.error("lockd cannot start: %s", exc)
            return 1
    try:
        store = open_store(settings.store, clock=time.time)
        if keyring is None:
            keyring = KeyRing.load_or_create(settings.key_dir)
    except (OSError, ValueError) as exc:
        log.error("lockd cannot start: %s", exc)
        listener.close()
        return 1
    try:
        await store.open()
    except StoreUnavailable as exc:
        log.error("lockd cannot start: %s", exc.detail)
        return 1
    try:
        try:
            app = create_app(settings, store=store, keyring=keyring)
        except (OSError, ValueError) as exc:  # e.g. an unreadable API key file
            log.error("lockd cannot start: %s", exc)
            return 1
        server = Server(uvicorn_config(app, settings), logger=log, name="lockd",
                        ready=partial(_ready_line, settings), on_stop=partial(_on_stop, app))
        await server.serve(sockets=[listener])
        return 0 if server.started else 1
    finally:
        await store.close()
        listener.close()


def _ready_line(settings: Settings, port: int) -> str:
    host = settings.host
    shown = f"[{host}]" if ":" in host else host
    worker = f" [worker pid {os.getpid()}]" if settings.workers > 1 else ""
    return (f"lockd listening on {settings.scheme}://{shown}:{port} "
            f"(store {redact_url(settings.store)}){worker}")


def _on_stop(app: FastAPI, signal_name: str) -> None:
    """The first stop signal: answer every queued acquire now (graceful shutdown is then not
    held up by clients waiting minutes) and end the open event and election streams."""
    core = getattr(app.state, "core", None)
    if core is not None:
        core.shutdown()
    elections = getattr(app.state, "elections", None)
    if elections is not None:
        elections.close()
    events = getattr(app.state, "events", None)
    if events is not None:
        events.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
