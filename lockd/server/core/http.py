"""The HTTP plumbing every primitive's routes share, and the ONE place where errors become
RFC 9457 problem details.

===================================================  ======  ====================
cause                                                status  code
===================================================  ======  ====================
``LockdError`` subclasses (``lockd.server.errors``)  theirs  theirs
bad name / field / TTL / wait / cursor, missing       422     ``invalid_request``
field, malformed JSON, non-JSON ``Content-Type``
body over ``settings.max_body_bytes``                413     ``payload_too_large``
unknown route / method                               404/405 ``not_found`` / ``method_not_allowed``
anything unexpected (logged with its traceback)      500     ``internal`` (no trace in the body)
client gone before its body was complete             (499)   none: one DEBUG line, no traceback
===================================================  ======  ====================

A 409 ``held`` carries ``Retry-After`` (the holder's TTL, whole seconds), a 429 its own.
Bodies are read here, not by FastAPI, so the size limit applies while reading and a waiting
acquire can watch its connection (``lockd.server.core.answers``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Scope

from lockd.common.keys import KeySet, bearer_key
from lockd.common.middleware import KEY_ID, REQUEST_ID_KEY, ROLE
from lockd.common.problems import PROBLEM_JSON
from lockd.common.responses import error_response, problem_response, received_body
from lockd.server.access import authorize
from lockd.server.errors import ForbiddenLock, InvalidRequest, LockdError, LockHeld, PayloadTooLarge
from lockd.server.limits import IdentityLimits
from lockd.server.metrics import LockdMetrics

__all__ = ["GuardedRoute", "admin_denied", "body_doc", "bound_client_id", "client_gone",
           "in_scope", "install_error_handlers", "internal", "internal_at", "last_event_id",
           "limits", "problem_doc", "problem_of", "problems", "read_body"]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


def problem_of(exc: LockdError) -> Response:
    """``exc`` as its problem response (``Retry-After`` on 409 ``held`` and on 429)."""
    headers = None
    if isinstance(exc, LockHeld):
        ttl_ms = int(exc.extra.get("ttl_ms") or 0)
        headers = {"Retry-After": str(max(1, math.ceil(ttl_ms / 1000)))}
    elif exc.status == 429:
        headers = {"Retry-After": str(max(1, int(exc.extra.get("retry_after_s") or 1)))}
    return error_response(exc, headers)


def invalid_body(errors: Sequence[Any]) -> InvalidRequest:
    """An ``InvalidRequest`` listing pydantic errors (never echoing input: it may hold secrets)."""
    items = [
        {"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", "")),
         "type": str(e.get("type", ""))}
        for e in errors
    ]
    if any(item["type"] == "json_invalid" for item in items):
        detail = "request body is not valid JSON"
    else:
        detail = "; ".join(
            (".".join(i["loc"]) + ": " if i["loc"] else "") + i["msg"] for i in items
        ) or "invalid request"
    return InvalidRequest(detail, errors=items)


def _http_error(exc: StarletteHTTPException) -> JSONResponse:
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "HTTP error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, phrase.lower().replace(" ", "_").replace("-", "_")
    )
    detail = exc.detail if isinstance(exc.detail, str) else phrase
    if exc.status_code == 404 and detail == phrase:
        detail = "no such route; see /docs for the API"
    return problem_response(exc.status_code, code, phrase, detail, headers=exc.headers)


def internal(request: Request, exc: BaseException) -> JSONResponse:
    return internal_at(request.scope, exc)


def internal_at(scope: Scope, exc: BaseException) -> JSONResponse:
    log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"),
              exc_info=(type(exc), exc, exc.__traceback__))
    return problem_response(500, "internal", "Internal error",
                            "the server failed unexpectedly; the failure was logged")


def client_gone(request: Request) -> Response:
    """A client that disconnected before its request body was complete: one DEBUG line (any
    client can cause it, so never an ERROR with a traceback), and an answer nobody receives."""
    log.debug("client disconnected during the body of %s %s", request.method, request.url.path)
    return Response(status_code=499)


def install_error_handlers(app: FastAPI) -> None:
    """Map every error an HTTP client can cause (and every one it cannot) to a problem."""

    async def on_lockd_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LockdError)
        return problem_of(exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return problem_of(invalid_body(exc.errors()))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _http_error(exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        if isinstance(exc, ClientDisconnect):
            return client_gone(request)
        return internal(request, exc)

    app.add_exception_handler(LockdError, on_lockd_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


class GuardedRoute(APIRoute):
    """Turns an unexpected exception in a route into a logged 500 problem right here, so it
    does not travel on to Starlette's server-error middleware (which would log it twice)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (LockdError, StarletteHTTPException, RequestValidationError):
                raise
            except ClientDisconnect:
                return client_gone(request)
            except Exception as exc:
                return internal(request, exc)

        return guarded


async def read_body(request: Request, model: type[_M], min_limit: int = 0) -> _M:
    """Read and validate a JSON body of at most ``settings.max_body_bytes`` (or ``min_limit``
    bytes if more: a route whose bodies list many items).

    An empty body counts as ``{}`` (so a missing field is reported as such). Raises
    ``PayloadTooLarge`` (413) or ``InvalidRequest`` (422). The two headers it needs are read
    off the scope's list in one pass, the body straight from ``receive`` (``received_body``).
    """
    content_type = content_length = None
    for key, value in request.scope["headers"]:
        if key == b"content-type":
            if content_type is None:
                content_type = value.decode("latin-1")
        elif key == b"content-length" and content_length is None:
            content_length = value.decode("latin-1")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise InvalidRequest(f"Content-Type must be application/json (got {media or '-'!r})")
    limit = max(request.app.state.settings.max_body_bytes, min_limit)
    raw = await received_body(request.receive, content_length, limit, PayloadTooLarge)
    raw = raw.strip() or b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_body(exc.errors(include_url=False, include_input=False)) from None


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a route that reads ``model`` with ``read_body``; a nested
    model's schema is written in place (pydantic's ``$defs`` would be refs nothing resolves)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": inline(schema)}}}}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI problem responses of a route (``statuses``)."""
    return {s: {"description": HTTPStatus(s).phrase, "content": {PROBLEM_JSON: {}}}
            for s in statuses}


def problem_doc(status: int, description: str) -> dict[str, Any]:
    """One OpenAPI problem response with the ``Problem`` schema and its own ``description``."""
    return {"description": description,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def bound_client_id(scope: Scope, client_id: str | None) -> str | None:
    """The ``client_id`` the store compares: with API keys configured, the request's
    ``client_id`` joined with the identity of the key that sent it (``KEY_ID``), so the same
    ``client_id`` from another key never matches another key's lease (``.`` cannot occur in a
    ``client_id``, so no two keys' values collide). Without keys, the ``client_id`` itself."""
    key_id = scope.get(KEY_ID)
    return f"{client_id}.{key_id}" if client_id and key_id else client_id


def in_scope(request: Request, locks: str | Sequence[str]) -> None:
    """``lockd.server.access.authorize``; a denial is also counted (metric, audit trail)."""
    try:
        authorize(request.scope, locks)
    except ForbiddenLock as exc:
        state = request.app.state
        state.metrics.auth_failures["forbidden_lock"].inc()
        state.audit.denied(exc.extra["identity"], exc.extra["lock"],
                           request.scope.get(REQUEST_ID_KEY))
        raise


def limits(request: Request) -> IdentityLimits:
    """The per-identity bounds of leases, waiters and streams (``lockd.server.limits``)."""
    return request.app.state.limits


def admin_denied(request: Request, what: str) -> Response | None:
    """None if the request carries an admin key, else the 401/403 problem to answer (``what``:
    the call, as the problem names it when no admin key is configured)."""
    admin: KeySet = request.app.state.admin_keys
    metrics: LockdMetrics = request.app.state.metrics
    if not admin and not request.app.state.cert_roles.admins and not request.app.state.has_admins:
        metrics.auth_failures["forbidden"].inc()
        return problem_response(403, "forbidden", "Forbidden",
                                f"{what} is disabled: no admin key is configured "
                                "(LOCKD_ADMIN_KEYS, LOCKD_ADMIN_KEYS_FILE or admins: in "
                                "LOCKD_ACCESS_FILE)")
    role = request.scope.get(ROLE)
    if role == "admin":
        return None
    if role == "client":
        metrics.auth_failures["forbidden"].inc()
        return problem_response(403, "forbidden", "Forbidden", "this call needs an admin key")
    missing = bearer_key(request.scope) is None
    metrics.auth_failures["missing" if missing else "wrong"].inc()
    return problem_response(
        401, "unauthorized", "Unauthorized",
        "this call needs an admin key: send Authorization: Bearer <key>" if missing
        else "the API key is not valid", headers={"WWW-Authenticate": 'Bearer realm="lockd"'})


def last_event_id(request: Request) -> int | None:
    """The ``Last-Event-ID`` header: ``None`` if absent or empty, else a decimal event id of at
    most 18 ASCII digits (``²`` passes ``str.isdigit()`` but is no id); otherwise 422."""
    raw = request.headers.get("last-event-id", "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidRequest("Last-Event-ID must be an event id (decimal digits) or empty")
    return int(raw)
