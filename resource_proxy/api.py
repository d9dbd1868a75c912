"""HTTP routes of the proxy and the ONE place errors become RFC 9457 problem details.

Routes are thin: read the body (bounded: 413 above ``max_body_bytes``; JSON parsed with exact
Decimals), take the ``Fencing-Token`` header, call ``ProxyService``, write JSON. Row keys are
taken from the *raw* request path, so a percent-encoded ``,`` (``%2C``) or ``/`` (``%2F``)
inside a key value is not mistaken for a separator.

Writes and batches take an optional ``Idempotency-Key`` header (``idempotency``): the answer
is then the one the store recorded with the write, or replayed from an earlier request with the
same key (marked ``Idempotency-Replayed: true``).

Every failure, whether the proxy's own ``ProxyError``, a route that does not exist, a method
not allowed or a bug, leaves through ``install_problem_handlers`` as
``application/problem+json`` with ``type``, ``title``, ``status``, ``detail``, ``code``
(``Retry-After: 1`` with a 503 ``database_unavailable``).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from lockd.common.responses import bounded_body, error_response
from resource_proxy.activity import call_of, record
from resource_proxy.errors import (
    InvalidRequest,
    InvalidTokenError,
    LockdUnreachable,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProxyError,
    StaleToken,
    StoreUnavailable,
)
from resource_proxy.idempotency import HEADER as IDEMPOTENCY_HEADER
from resource_proxy.idempotency import Keyed, Reply, parse_key
from resource_proxy.metrics import CONTENT_TYPE_LATEST
from resource_proxy.service import ProxyService
from resource_proxy.values import dumps, loads
from resource_proxy.writes import OpKind

__all__ = ["routes", "install_problem_handlers", "problem_response", "TOKEN_HEADER"]

log = logging.getLogger("resource_proxy.api")

TOKEN_HEADER = "fencing-token"
MAX_TOKEN_CHARS = 4096  # lockd's tokens are ~250 characters; a longer header is not one
routes: list[Route] = []


def _route(path: str, method: str):
    """Register a plain Starlette route: no FastAPI parameter solving on the hot path (it costs
    more CPU than the rest of a request's Python work); handlers read ``request`` themselves."""

    def register(endpoint):
        routes.append(Route(path, endpoint, methods=[method]))
        return endpoint

    return register


def _service(request: Request) -> ProxyService:
    return request.app.state.service


def _reply(request: Request, call: str, body: Any, status: int = 200) -> Response:
    """A JSON response (204: empty), counted in the metrics (``activity.record``); a ``Reply``
    (a keyed write's) as it was recorded."""
    if isinstance(body, Reply):
        record(request, call, body.status)
        headers = {"Idempotency-Replayed": "true"} if body.replayed else None
        if body.status == 204:
            return Response(status_code=204, headers=headers)
        return Response(body.body, status_code=body.status, media_type="application/json",
                        headers=headers)
    record(request, call, status)
    if status == 204:
        return Response(status_code=204)
    return Response(dumps(body), status_code=status, media_type="application/json")


async def _raw_body(request: Request) -> bytes:
    """The request's body bytes, at most ``max_body_bytes`` (``PayloadTooLarge``)."""
    return await bounded_body(request.stream(), request.headers.get("content-length"),
                              request.app.state.settings.max_body_bytes, PayloadTooLarge)


def _parse(raw: bytes) -> Any:
    """The body's JSON (numbers as exact Decimals); ``InvalidRequest`` if it is not JSON."""
    try:
        return loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequest("the body is not valid JSON") from None


def _keyed(request: Request, body: bytes) -> Keyed | None:
    """The request's ``Idempotency-Key`` with what identifies the request (None: no key)."""
    key = parse_key(request.headers.get(IDEMPOTENCY_HEADER))
    if key is None:
        return None
    path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    return Keyed(key, request.method, path, body)


async def _write(request: Request, kind: OpKind, table: str, key: str | None) -> Any:
    """A row write: the row written (None for a delete), or a ``Reply`` when the request has
    an ``Idempotency-Key`` (whose digest covers the raw body bytes)."""
    raw = b"" if kind == "delete" else await _raw_body(request)
    row = None if kind == "delete" else _parse(raw)
    return await _service(request).write(kind, table, key, row, _token(request),
                                         _keyed(request, raw))


def _path(request: Request) -> tuple[str, str]:
    """(table, key) of a row route; the key as sent (still percent-encoded), after ``/rows/``."""
    params = request.path_params
    raw = request.scope.get("raw_path")
    if raw:
        parts = raw.decode("latin-1").split("/", 5)
        if len(parts) == 6:
            return params["table"], parts[5]
    return params["table"], params["key"].replace("%", "%25")


def _query(request: Request) -> list[tuple[str, str]]:
    """The query's ``name=value`` pairs, percent-decoded strictly: bytes that are not UTF-8 are
    422, not silently replaced by U+FFFD (which would filter on another value)."""
    raw = request.scope.get("query_string", b"").decode("latin-1")
    try:
        return parse_qsl(raw, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise InvalidRequest("the query string is not UTF-8 once percent-decoded") from None


def _token(request: Request) -> str | None:
    token = request.headers.get(TOKEN_HEADER)
    if token is not None and len(token) > MAX_TOKEN_CHARS:
        raise InvalidTokenError(f"the Fencing-Token header exceeds {MAX_TOKEN_CHARS} characters")
    return token


def _raw_query(request: Request, name: str) -> str | None:
    """The query parameter ``name`` as sent (still percent-encoded; ``+`` is a plus sign)."""
    for pair in request.scope.get("query_string", b"").decode("latin-1").split("&"):
        field, sep, value = pair.partition("=")
        if field == name and sep:
            return value
    return None


# -- the binding (which lock governs a row) ----------------------------------------------------

@_route("/v1/tables", "GET")
async def list_tables(request: Request) -> Response:
    return _reply(request, "tables", _service(request).tables())


@_route("/v1/tables/{table}/lock", "GET")
async def table_lock(request: Request) -> Response:
    """``?key=`` in the form of a row URL's key (values joined by ``,``, each percent-encoded)."""
    result = _service(request).lock_of(request.path_params["table"], _raw_query(request, "key"))
    return _reply(request, "lock", result)


# -- rows --------------------------------------------------------------------------------------

@_route("/v1/tables/{table}/rows", "POST")
async def insert_row(request: Request) -> Response:
    row = await _write(request, "insert", request.path_params["table"], None)
    return _reply(request, "insert", row, 201)


@_route("/v1/tables/{table}/rows/{key:path}", "PUT")
async def put_row(request: Request) -> Response:
    row = await _write(request, "upsert", *_path(request))
    return _reply(request, "upsert", row)


@_route("/v1/tables/{table}/rows/{key:path}", "PATCH")
async def patch_row(request: Request) -> Response:
    row = await _write(request, "update", *_path(request))
    return _reply(request, "update", row)


@_route("/v1/tables/{table}/rows/{key:path}", "DELETE")
async def delete_row(request: Request) -> Response:
    result = await _write(request, "delete", *_path(request))
    return _reply(request, "delete", result, 204)


@_route("/v1/tables/{table}/rows/{key:path}", "GET")
async def get_row(request: Request) -> Response:
    table, key = _path(request)
    row = await _service(request).read_row(table, key, _token(request))
    return _reply(request, "read", row)


@_route("/v1/tables/{table}/rows", "GET")
async def list_rows(request: Request) -> Response:
    table = request.path_params["table"]
    result = await _service(request).list_rows(table, _query(request), _token(request))
    return _reply(request, "list", result)


@_route("/v1/batch", "POST")
async def batch(request: Request) -> Response:
    raw = await _raw_body(request)
    result = await _service(request).batch(_parse(raw), _token(request), _keyed(request, raw))
    return _reply(request, "batch", result)


# -- fences ------------------------------------------------------------------------------------

@_route("/v1/fences/claim", "POST")
async def claim_all(request: Request) -> Response:
    """Every lock of the token (a multi-lock token's several) in one transaction."""
    return _reply(request, "claim", await _service(request).claim_all(_token(request)))


@_route("/v1/fences/{lock:path}/claim", "POST")
async def claim(request: Request) -> Response:
    lock = request.path_params["lock"]
    result = await _service(request).claim(lock, _token(request))
    return _reply(request, "claim", result)


@_route("/v1/fences/{lock:path}", "GET")
async def get_fence(request: Request) -> Response:
    lock = request.path_params["lock"]
    return _reply(request, "fence", await _service(request).fence(lock))


# -- operations --------------------------------------------------------------------------------

@_route("/healthz", "GET")
async def healthz(request: Request) -> Response:
    service = _service(request)
    await service.store.ping()
    jwks = "unavailable" if service.keys.available is False else "ok"
    return _reply(request, "healthz", {"status": "ok" if jwks == "ok" else "degraded",
                                       "jwks": jwks, "server": "resource-proxy"})


@_route("/metrics", "GET")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# -- the one problem mapping -------------------------------------------------------------------

def _problem(request: Request, error: ProxyError) -> Response:
    record(request, call_of(request), error.status, error)
    if isinstance(error, StaleToken):  # an operator's first question: who was fenced off?
        log.info("refused stale %s %s: %s", request.method, request.url.path, error.detail)
    headers = {"Retry-After": "1"} if isinstance(error, (StoreUnavailable, LockdUnreachable)) else None
    return error_response(error, headers)


def problem_response(request: Request, exc: Exception) -> Response:
    """The problem response for any exception a route raised: the proxy's own ``ProxyError``
    as itself, anything else (a bug) logged and answered 500 ``internal``. Used by the app's
    exception handlers and by the hot path (``resource_proxy.hot``)."""
    if isinstance(exc, ProxyError):
        return _problem(request, exc)
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _problem(request, ProxyError("internal error; see the proxy's log"))


def install_problem_handlers(app: FastAPI) -> None:
    """Map every exception a request can raise to a problem response (never a stack trace)."""

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> Response:
        return _problem(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _problem(request, InvalidRequest("the request does not fit this call"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            error: ProxyError = NotFound("no such route; /docs (or GET /openapi.json) "
                                         "describes the API")
        elif exc.status_code == 405:
            error = MethodNotAllowed(f"{request.method} is not allowed here")
        else:
            error = InvalidRequest(str(exc.detail))
        return _problem(request, error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return problem_response(request, exc)

