"""``resource-proxy serve``: run the fencing proxy (flags override ``PROXY_*`` variables).

Its help text is plain (``_DESCRIPTION``); this docstring is for readers of the code.

Exit status: 0 after a clean stop (SIGTERM/SIGINT), 2 for bad configuration (flags, a policy
file that is malformed or does not bind every row to exactly one lock, found before or after
reflecting the tables; a partition or inheritance child named in ``--tables`` or the policy; a
template key of a type the database cannot bind; ``--require-db-fencing`` with a fenced table
the database does not protect; unusable TLS files: see ``lockd.common.tls.check_server_files``),
1 if the start failed (database unreachable, an allow-listed table missing, no usable key in
``--jwks-file``): one line says why.

``resource-proxy db install|check|uninstall``: ``dbcommand``.

``--workers N`` (``lockd.common.serving.workers``): N processes serve the one port. The proxy
keeps no state between requests that the database does not hold (fence rows, Idempotency-Key
records), so N processes behave as N proxies on one port; the fence check stays in the database
transaction. Each worker builds its own app: it reflects the tables, opens its own pool
(``pool_size`` connections each: N x ``pool_size`` in all) and loads the JWKS itself.
``/metrics`` and ``/v1/activity`` describe the worker that answered (each has its own
counters); ``/healthz`` is answered by whichever worker accepts it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import ssl
import sys
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from lockd.common.access import AccessFileError
from lockd.common.logs import configure_logging
from lockd.common.options import add_bound_arguments, add_tls_arguments, tls_files_problem
from lockd.common.serving.listen import ListenError, bind_listener, listen_failure
from lockd.common.serving.server import Server, uvicorn_config
from lockd.common.serving.workers import default_workers, listening_sockets, run_workers
from lockd.tokens import Verifier
from resource_proxy import dbcommand
from resource_proxy.access import load_table_access
from resource_proxy.app import create_app
from resource_proxy.jwks import lockd_verify
from resource_proxy.policy import PolicyError, describe_unfenced, load_policy
from resource_proxy.rows.dbstatus import DbFencingRequired
from resource_proxy.settings import Settings
from resource_proxy.store import prepare

__all__ = ["main"]

log = logging.getLogger("resource_proxy")


def _ready_line(app, settings: Settings, port: int) -> str:
    """The ready line, naming the unfenced tables the start-up found (if any)."""
    rows = getattr(app.state, "rows", None)
    unfenced = describe_unfenced(rows.binding.unfenced) if rows else ""
    scheme = "https" if settings.tls_cert is not None else "http"
    return f"resource-proxy listening on {scheme}://{settings.host}:{port}{unfenced}"


def _usable_keys(path: Path) -> frozenset[str]:
    try:
        return Verifier(json.loads(path.read_text())).kids
    except (OSError, ValueError):
        return frozenset()


_DESCRIPTION = ("The fencing proxy: writes to the tables it serves must carry a lockd fencing "
                "token whose fence is not older than the last one seen for that lock.")
_PAGES = ("Once running, the proxy serves at http://HOST:PORT: / the status page (highest "
          "fences, rejected stale writes, a link to lockd's page), /docs the API (Swagger UI, "
          "works offline), /openapi.json, /metrics (Prometheus), /healthz.")


def _problem_text(error: Any) -> str:
    """A settings error's message as we wrote it: a validator's ``ValueError`` text without the
    "Value error, " pydantic puts in front of it; pydantic's own messages as they are."""
    if error.get("type") == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    return str(error["msg"])


def _version() -> str:
    """The installed distribution's version (the same as ``lockd.__version__``)."""
    try:
        return version("lockd")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="resource-proxy", description=_DESCRIPTION,
                                     epilog="Flags override PROXY_* environment variables. "
                                            + _PAGES)
    parser.add_argument("--version", action="version", version=f"resource-proxy {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the proxy",
                                description="Run the fencing proxy's HTTP server.",
                                epilog=_PAGES)
    serve.add_argument("--database-url", help="sqlite:///PATH or postgresql://… (env "
                       "PROXY_DATABASE_URL; default sqlite:///./resource.db)")
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--lockd-url", help="lockd base URL; its JWKS is read from /v1/keys "
                        "(env PROXY_LOCKD_URL; this or --jwks-file is required)")
    source.add_argument("--jwks-file", help="a JWKS file with lockd's public keys "
                        "(env PROXY_JWKS_FILE)")
    serve.add_argument("--tables", help="comma-separated allow-list (env PROXY_TABLES; "
                       "default: every table)")
    serve.add_argument("--policy", help="YAML/JSON file giving tables their lock template "
                       "(env PROXY_POLICY; default: table T is written under lock T)")
    serve.add_argument("--access-file", help="YAML identities (clients with tables:, admins) "
                       "scoping which tables each may write (env PROXY_ACCESS_FILE)")
    serve.add_argument("--require-db-fencing", action="store_true", default=None,
                       help="refuse to start unless the database's fence triggers protect every "
                       "fenced table too (resource-proxy db install; env PROXY_REQUIRE_DB_FENCING)")
    serve.add_argument("--objects-dir", help="serve fenced objects (/v1/objects) with this "
                       "directory as the blob store (env PROXY_OBJECTS_DIR; default: no objects)")
    serve.add_argument("--objects-s3-url", help="serve fenced objects with this S3-compatible "
                       "endpoint as the blob store (env PROXY_OBJECTS_S3_URL; needs the s3 "
                       "extra; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
    serve.add_argument("--objects-s3-bucket", help="its bucket, created if missing (env "
                       "PROXY_OBJECTS_S3_BUCKET)")
    serve.add_argument("--objects-s3-prefix", help="key prefix of the blobs (env "
                       "PROXY_OBJECTS_S3_PREFIX; default lockd-objects/)")
    serve.add_argument("--max-object-bytes", type=int, help="largest object body, 413 above "
                       "(env PROXY_MAX_OBJECT_BYTES; default 1 GiB)")
    serve.add_argument("--objects-inline-max", type=int, help="bodies of at most this many "
                       "bytes are kept in the proxy's database, in the fence's transaction "
                       "(env PROXY_OBJECTS_INLINE_MAX; default 16384; 0: every body is a blob)")
    serve.add_argument("--objects-grace-ms", type=int, help="orphan blobs older than this are "
                       "swept (env PROXY_OBJECTS_GRACE_MS; default 600000)")
    serve.add_argument("--objects-sweep-interval-ms", type=int, help="how often the orphan "
                       "sweeper runs, and once at start (env PROXY_OBJECTS_SWEEP_INTERVAL_MS; "
                       "default 60000)")
    serve.add_argument("--host", help="listen address (env PROXY_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (env PROXY_PORT; default 7071)")
    serve.add_argument("--workers", type=int, help="worker processes serving the port (env "
                       "PROXY_WORKERS; default: the number of CPUs on PostgreSQL, 1 on SQLite, "
                       "which allows only 1)")
    serve.add_argument("--log-level", help="debug, info, warning, error (env PROXY_LOG_LEVEL; "
                       "default info)")
    serve.add_argument("--log-format", choices=["text", "json"],
                       help="log line format (env PROXY_LOG_FORMAT; default text)")
    add_bound_arguments(serve, "PROXY")
    tls = add_tls_arguments(serve, "PROXY")
    tls.add_argument("--lockd-ca", help="CA of lockd's certificate for an https --lockd-url "
                                        "(env PROXY_LOCKD_CA)")
    tls.add_argument("--lockd-cert", help="client certificate for lockd (env PROXY_LOCKD_CERT)")
    tls.add_argument("--lockd-key", help="its private key (env PROXY_LOCKD_KEY)")
    dbcommand.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "db":
        return dbcommand.run(args)
    given = {
        name: value
        for name, value in vars(args).items()
        if name != "command" and value is not None
    }
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "settings"
            print(f"resource-proxy: {where}: {_problem_text(error)}", file=sys.stderr)
        return 2
    tls_files = tls_files_problem(settings)
    if tls_files:
        print(f"resource-proxy: {tls_files}", file=sys.stderr)
        return 2
    if settings.lockd_ca is not None or settings.lockd_cert is not None:
        try:
            lockd_verify(settings)
        except (OSError, ssl.SSLError) as exc:
            print(f"resource-proxy: cannot use the TLS files for lockd: {exc}", file=sys.stderr)
            return 2
    try:
        access = (load_table_access(settings.access_file)
                  if settings.access_file is not None else None)
    except AccessFileError as exc:
        print(f"resource-proxy: {exc}", file=sys.stderr)
        return 2
    if access is not None and settings.tls_client_ca is None and any(
            i.subject for i in access.identities):
        print(f"resource-proxy: access file {settings.access_file}: certificate subjects need "
              "--tls-client-ca (without mTLS no client certificate is seen)", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    workers = settings.workers or (1 if settings.is_sqlite else default_workers())
    if workers > 1 and settings.is_sqlite:
        print("resource-proxy: --workers: the SQLite store serves from one process "
              "(use --workers 1, or PostgreSQL)", file=sys.stderr)
        return 2
    try:  # bound before anything else starts: a port in use is one line, exit 1
        if workers == 1:
            sockets = [bind_listener(settings.host, settings.port)]
        else:
            sockets = listening_sockets(settings.host, settings.port, workers)
    except OSError as exc:
        reason = str(exc) if isinstance(exc, ListenError) else (
            listen_failure(settings.host, settings.port, exc))
        log.error("resource-proxy cannot start: %s", reason)
        return 1
    try:
        policy = load_policy(settings.policy)
    except PolicyError as exc:
        print(f"resource-proxy: {exc}", file=sys.stderr)
        return 2
    try:
        binding = prepare(settings.database_url, settings.tables, policy,
                          require_db_fencing=settings.require_db_fencing)
    except (PolicyError, DbFencingRequired) as exc:
        print(f"resource-proxy: {exc}", file=sys.stderr)
        return 2
    except (ValueError, SQLAlchemyError) as exc:
        reason = getattr(exc, "orig", None) or exc
        log.error("resource-proxy cannot start: %s", str(reason).strip().splitlines()[0])
        return 1
    if settings.jwks_file is not None and not _usable_keys(settings.jwks_file):
        log.error("resource-proxy cannot start: no usable Ed25519 key in %s", settings.jwks_file)
        return 1
    try:
        app = create_app(settings, policy=policy, binding=binding, access=access)
    except (OSError, ValueError) as exc:  # an unreadable API key file, a too short key
        log.error("resource-proxy cannot start: %s", exc)
        return 1
    if workers == 1:
        return _serve(app, settings, sockets[0])
    log.info("resource-proxy starting %d workers", workers)

    def serve(listening: socket.socket) -> int:
        # each worker builds its own app: it reflects the tables and loads the key set itself
        return _serve(create_app(settings, policy=policy, access=access, announce=False),
                      settings, listening)

    return run_workers(sockets, serve, name="resource-proxy")


def _serve(app, settings: Settings, sock: socket.socket) -> int:
    """Run one server process on the bound socket ``sock`` until SIGTERM/SIGINT: 0 after a
    clean stop, 1 if it did not start."""
    config = uvicorn_config(app, settings, name="resource-proxy", logger=log,
                            log_level=settings.log_level.lower())
    server = Server(config, logger=log, name="resource-proxy",
                    ready=partial(_ready_line, app, settings))
    with contextlib.suppress(SystemExit):  # uvicorn exits 3 when the lifespan fails
        server.run(sockets=[sock])
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
