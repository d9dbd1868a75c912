"""The fence core's HTTP routes (claims, fences, health, metrics), what every resource kind's
routes share, and the ONE place errors become RFC 9457 problem details.

Routes are thin: read the body (bounded: 413 above ``max_body_bytes``; JSON parsed with exact
Decimals: ``raw_body``, ``parse``), take the ``Fencing-Token`` header (``token_of``), call the
service, write JSON (``reply``, counted in the metrics). The rows' routes are
``rows.api``'s, the objects' ``objects.api``'s.

Writes take an optional ``Idempotency-Key`` header (``keyed``, ``idempotency``): the answer
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
from resource_proxy.claims import ClaimService
from resource_proxy.codec import dumps, loads
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

__all__ = ["routes", "route", "reply", "raw_body", "parse", "keyed", "token_of",
           "query_pairs",
           "install_problem_handlers", "problem_response", "TOKEN_HEADER"]

log = logging.getLogger("resource_proxy.api")

TOKEN_HEADER = "fencing-token"
MAX_TOKEN_CHARS = 4096  # lockd's tokens are ~250 characters; a longer header is not one
routes: list[Route] = []


def route(table: list[Route], path: str, method: str):
    """Register a plain Starlette route in ``table``: no FastAPI parameter solving on the hot path (it costs
    more CPU than the rest of a request's Python work); handlers read ``request`` themselves."""

    def register(endpoint):
        table.append(Route(path, endpoint, methods=[method]))
        return endpoint

    return register


def _service(request: Request) -> ClaimService:
    return request.app.state.claims


def reply(request: Request, call: str, body: Any, status: int = 200) -> Response:
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


async def raw_body(request: Request) -> bytes:
    """The request's body bytes, at most ``max_body_bytes`` (``PayloadTooLarge``)."""
    return await bounded_body(request.stream(), request.headers.get("content-length"),
                              request.app.state.settings.max_body_bytes, PayloadTooLarge)


def parse(raw: bytes) -> Any:
    """The body's JSON (numbers as exact Decimals); ``InvalidRequest`` if it is not JSON."""
    try:
        return loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequest("the body is not valid JSON") from None


def keyed(request: Request, body: bytes) -> Keyed | None:
    """The request's ``Idempotency-Key`` with what identifies the request (None: no key)."""
    key = parse_key(request.headers.get(IDEMPOTENCY_HEADER))
    if key is None:
        return None
    path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    return Keyed(key, request.method, path, body)


def query_pairs(request: Request) -> list[tuple[str, str]]:
    """The query's ``name=value`` pairs, percent-decoded strictly: bytes that are not UTF-8 are
    422, not silently replaced by U+FFFD (which would filter on another value)."""
    raw = request.scope.get("query_string", b"").decode("latin-1")
    try:
        return parse_qsl(raw, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise InvalidRequest("the query string is not UTF-8 once percent-decoded") from None


def token_of(request: Request) -> str | None:
    token = request.headers.get(TOKEN_HEADER)
    if token is not None and len(token) > MAX_TOKEN_CHARS:
        raise InvalidTokenError(f"the Fencing-Token header exceeds {MAX_TOKEN_CHARS} characters")
    return token


# -- fences ------------------------------------------------------------------------------------

@route(routes, "/v1/fences/claim", "POST")
async def claim_all(request: Request) -> Response:
    """Every lock of the token (a multi-lock token's several) in one transaction."""
    return reply(request, "claim", await _service(request).claim_all(token_of(request)))


@route(routes, "/v1/fences/{lock:path}/claim", "POST")
async def claim(request: Request) -> Response:
    lock = request.path_params["lock"]
    result = await _service(request).claim(lock, token_of(request))
    return reply(request, "claim", result)


@route(routes, "/v1/fences/{lock:path}", "GET")
async def get_fence(request: Request) -> Response:
    lock = request.path_params["lock"]
    return reply(request, "fence", await _service(request).fence(lock))


# -- operations --------------------------------------------------------------------------------

@route(routes, "/healthz", "GET")
async def healthz(request: Request) -> Response:
    service = _service(request)
    await service.store.ping()
    jwks = "unavailable" if service.keys.available is False else "ok"
    return reply(request, "healthz", {"status": "ok" if jwks == "ok" else "degraded",
                                       "jwks": jwks, "server": "resource-proxy"})


@route(routes, "/metrics", "GET")
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

