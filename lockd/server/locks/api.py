"""lockd's HTTP routes, and the ONE place where errors become RFC 9457 problem details.

Every failure leaves as ``application/problem+json`` ``{type, title, status, detail, code, ...}``:

===================================================  ======  ====================
cause                                                status  code
===================================================  ======  ====================
``LockdError`` subclasses (``lockd.server.errors``)         theirs  theirs
bad name / field / TTL / wait / cursor, missing       422     ``invalid_request``
field, malformed JSON, non-JSON ``Content-Type``
body over ``settings.max_body_bytes``                413     ``payload_too_large``
unknown route / method                               404/405 ``not_found`` / ``method_not_allowed``
anything unexpected (logged with its traceback)      500     ``internal`` (no trace in the body)
client gone before its body was complete             (499)   none: one DEBUG line, no traceback
===================================================  ======  ====================

Malformed JSON is 422 like every other unacceptable body (one status for "your body is wrong";
``errors`` lists what). A 409 ``held`` carries ``Retry-After`` (the holder's TTL, whole seconds).

Request bodies are read here, not by FastAPI, so that the size limit applies while reading and
a waiting acquire can watch its connection: if the client goes away, the wait is cancelled and
the waiter leaves the queue at once (uvicorn does not cancel a handler on disconnect by itself).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import re
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from lockd.common.middleware import KEY_ID, REQUEST_ID_KEY
from lockd.common.problems import PROBLEM_JSON
from lockd.common.responses import bounded_body, error_response, problem_response
from lockd.common.serving.connections import DISCONNECT_WATCH, parker
from lockd.server.access import authorize, identity_name, visible_prefixes
from lockd.server.core.disconnects import ClientGone, until_disconnect
from lockd.server.errors import ForbiddenLock, InvalidRequest, LockdError, LockHeld, PayloadTooLarge
from lockd.server.limits import IdentityLimits, Reservation
from lockd.server.locks.schemas import (
    AcquireManyRequest,
    AcquireRequest,
    HealthBody,
    LeaseBody,
    LockPage,
    LockStateBody,
    MultiLeaseBody,
    ReleasedBody,
    ReleaseManyRequest,
    ReleaseRequest,
    RenewManyRequest,
    RenewRequest,
)
from lockd.server.locks.service import LockService
from lockd.server.store.values import LockState

__all__ = ["HOT_ROUTES", "HotPathMiddleware", "HotRoute", "create_router", "in_scope",
           "install_error_handlers", "is_hot_path"]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


# --- problems: the one mapping ------------------------------------------------------------------


def _lockd_error(exc: LockdError) -> Response:
    headers = None
    if isinstance(exc, LockHeld):
        ttl_ms = int(exc.extra.get("ttl_ms") or 0)
        headers = {"Retry-After": str(max(1, math.ceil(ttl_ms / 1000)))}
    elif exc.status == 429:
        headers = {"Retry-After": str(max(1, int(exc.extra.get("retry_after_s") or 1)))}
    return error_response(exc, headers)


def _invalid(errors: Sequence[Any]) -> InvalidRequest:
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


def _internal(request: Request, exc: BaseException) -> JSONResponse:
    return _internal_at(request.scope, exc)


def _internal_at(scope: Scope, exc: BaseException) -> JSONResponse:
    log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"),
              exc_info=(type(exc), exc, exc.__traceback__))
    return problem_response(500, "internal", "Internal error",
                            "the server failed unexpectedly; the failure was logged")


def _client_gone(request: Request) -> Response:
    """A client that disconnected before its request body was complete: one DEBUG line (any
    client can cause it, so never an ERROR with a traceback), and an answer nobody receives."""
    log.debug("client disconnected during the body of %s %s", request.method, request.url.path)
    return Response(status_code=499)


def install_error_handlers(app: FastAPI) -> None:
    """Map every error an HTTP client can cause (and every one it cannot) to a problem."""

    async def on_lockd_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LockdError)
        return _lockd_error(exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _lockd_error(_invalid(exc.errors()))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _http_error(exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        if isinstance(exc, ClientDisconnect):
            return _client_gone(request)
        return _internal(request, exc)

    app.add_exception_handler(LockdError, on_lockd_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


class _GuardedRoute(APIRoute):
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
                return _client_gone(request)
            except Exception as exc:
                return _internal(request, exc)

        return guarded


# --- request bodies -----------------------------------------------------------------------------


async def read_body(request: Request, model: type[_M]) -> _M:
    """Read and validate a JSON body of at most ``settings.max_body_bytes``.

    An empty body counts as ``{}`` (so a missing field is reported as such). Raises
    ``PayloadTooLarge`` (413) or ``InvalidRequest`` (422).
    """
    content_type = request.headers.get("content-type")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise InvalidRequest(f"Content-Type must be application/json (got {media or '-'!r})")
    raw = await bounded_body(request.stream(), request.headers.get("content-length"),
                             request.app.state.settings.max_body_bytes, PayloadTooLarge)
    raw = raw.strip() or b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise _invalid(exc.errors(include_url=False, include_input=False)) from None


# --- routes -------------------------------------------------------------------------------------


def _service(request: Request) -> LockService:
    return request.app.state.service


def _state_body(state: LockState, waiters: int) -> dict[str, Any]:
    return {"lock": state.lock, "held": state.held, "fence": state.fence, "owner": state.owner,
            "ttl_ms": state.ttl_ms, "waiters": waiters, "mode": state.mode}


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}}}


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"description": HTTPStatus(s).phrase, "content": {PROBLEM_JSON: {}}}
            for s in statuses}


def bound_client_id(scope: Scope, client_id: str | None) -> str | None:
    """The ``client_id`` the store compares: with API keys configured, the request's
    ``client_id`` joined with the identity of the key that sent it (``lockd.common.middleware.KEY_ID``), so the same
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


def _limits(request: Request) -> IdentityLimits:
    return request.app.state.limits


async def _acquire(request: Request, name: str) -> Response:
    service = _service(request)
    service.check_name(name)
    in_scope(request, name)
    who = identity_name(request.scope)
    _limits(request).check_lease(who)
    body = await read_body(request, AcquireRequest)
    wait_ms = body.wait_ms
    call = service.acquire(name, ttl_ms=body.ttl_ms, wait_ms=wait_ms, owner=body.owner,
                           client_id=bound_client_id(request.scope, body.client_id),
                           mode=body.mode)
    del body  # a queued acquire keeps this frame for its whole wait, not the parsed body too
    return await _lease_answer(request, call, wait_ms, name, who)


async def _lease_answer(request: Request, call, wait_ms: int,
                        locks: str | Sequence[str], who: str) -> Response:
    """The lease ``call`` grants, as the answer. With ``wait_ms`` > 0 the wait ends early if the
    client goes away: 499, nothing granted (``locks``, one name or several, for the log line).
    The acquire counts as one of ``who``'s leases from now (a reservation, given back unless
    granted) and as one of its waiters while it waits (``lockd.server.limits``)."""
    limits = _limits(request)
    try:
        reservation = limits.reserve(who)  # counted from now: concurrent acquires see it
    except LockdError:
        call.close()
        raise
    if wait_ms > 0:
        try:
            limits.enter_wait(who)
        except LockdError:
            reservation.cancel()
            call.close()
            raise
    parked = False
    try:
        if wait_ms == 0:
            lease = await call
        else:
            if type(request) is _HotRequest and parker(request.scope) is not None:
                parked = True  # leave_wait and the reservation's end: when it ends
                return _ParkedWait(call, limits, who, locks, reservation)
            try:
                lease = await until_disconnect(request, call)
            except ClientGone:
                _went_away(locks)
                return Response(status_code=499)
            finally:
                limits.leave_wait(who)
        reservation.granted(lease.lease_id, lease.ttl_ms)
    finally:
        if not parked:
            reservation.cancel()  # not granted (a no-op once it was)
    return JSONResponse(lease.body())


def _went_away(locks: str | Sequence[str]) -> None:
    what = f"lock {locks!r}" if isinstance(locks, str) else f"locks {', '.join(locks[:8])}"
    log.info("client went away while waiting for %s", what)


class _HotRequest(Request):
    """The ``Request`` of ``HotPathMiddleware``: its waiting acquire may park (``_ParkedWait``)."""


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


class _ParkedWait:
    """A waiting acquire served by ``HotPathMiddleware`` on lockd's HTTP protocol, sent as the
    handler's response: instead of waiting inside the request's ASGI call it parks the request
    (``lockd.common.serving.connections.parker``) and runs ``call`` (the ``LockService``
    coroutine) as a task of its own; the ASGI call ends at once, freeing its task, ~10
    coroutine frames, ``Request``, contexts and closures (bench/notes/waiters.md). When ``call``
    ends, ``_answer`` answers exactly as ``_lease_answer`` would (lease, problem, or 499 after
    the connection's loss cancelled it) through the middleware's ``send`` (request id header,
    metrics), in a short task. What a queued acquire holds: this object, the task and its
    two frames (``LockService.acquire``, ``WaitQueues.acquire``)."""

    __slots__ = ("call", "limits", "who", "locks", "reservation", "scope", "send", "task",
                 "gone")

    def __init__(self, call: Coroutine[Any, Any, Any], limits: IdentityLimits, who: str,
                 locks: str | Sequence[str], reservation: Reservation) -> None:
        self.call: Coroutine[Any, Any, Any] | None = call
        self.limits, self.who, self.locks = limits, who, locks
        self.reservation = reservation
        self.scope: Scope = {}
        self.send: Send | None = None
        self.task: asyncio.Task[Any] | None = None
        self.gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call, self.call = self.call, None
        assert call is not None
        watch, park = scope[DISCONNECT_WATCH], parker(scope)
        assert park is not None
        context = contextvars.copy_context()  # the request id, for the wait's log lines
        task = self.task = asyncio.get_running_loop().create_task(call, context=context)
        if not watch(self._lost):  # gone already: never started
            self._lost()
        self.scope, self.send = scope, send
        park(task, self._answer, context)

    def _lost(self) -> None:
        self.gone = True
        if self.task is not None:
            self.task.cancel()

    def _answer(self, task: asyncio.Task[Any]) -> Awaitable[None]:
        """The answer ``_lease_answer`` would have given for ``task``'s outcome."""
        assert self.send is not None
        self.task = None  # (the protocol has stopped the disconnect watch)
        self.limits.leave_wait(self.who)
        response: Response
        if task.cancelled() or task.exception() is not None:
            self.reservation.cancel()
        if task.cancelled():
            if self.gone:
                _went_away(self.locks)
                response = Response(status_code=499)
            else:  # cancelled by the server, not by the client's hang-up
                response = _internal_at(self.scope, asyncio.CancelledError())
        elif (exc := task.exception()) is None:
            lease = task.result()
            self.reservation.granted(lease.lease_id, lease.ttl_ms)
            response = JSONResponse(lease.body())
        elif isinstance(exc, LockdError):
            response = _lockd_error(exc)
        else:
            response = _internal_at(self.scope, exc)
        return response(self.scope, _no_receive, self.send)


async def _renew(request: Request, name: str) -> Response:
    service = _service(request)
    service.check_name(name)
    in_scope(request, name)
    body = await read_body(request, RenewRequest)
    lease = await service.renew(name, body.lease_id, body.ttl_ms)
    _limits(request).held(identity_name(request.scope), lease.lease_id, lease.ttl_ms)
    return JSONResponse(lease.body())


async def _release(request: Request, name: str) -> Response:
    service = _service(request)
    service.check_name(name)
    in_scope(request, name)
    body = await read_body(request, ReleaseRequest)
    await service.release(name, body.lease_id)
    _limits(request).released(identity_name(request.scope), body.lease_id)
    return JSONResponse({"released": True})


async def _acquire_many(request: Request) -> Response:
    service = _service(request)
    body = await read_body(request, AcquireManyRequest)
    wait_ms, locks = body.wait_ms, body.locks
    in_scope(request, service.check_names(locks))  # all or nothing: before anything is asked
    who = identity_name(request.scope)
    _limits(request).check_lease(who)
    call = service.acquire_many(locks, ttl_ms=body.ttl_ms, wait_ms=wait_ms, owner=body.owner,
                                client_id=bound_client_id(request.scope, body.client_id),
                                modes=body.modes)
    del body  # as in _acquire
    return await _lease_answer(request, call, wait_ms, locks, who)


async def _renew_many(request: Request) -> Response:
    """A set's lease carries no lock names: the set was checked against the scope when it was
    granted, and only its acquirer holds the lease id."""
    body = await read_body(request, RenewManyRequest)
    lease = await _service(request).renew_many(body.lease_id, body.ttl_ms)
    _limits(request).held(identity_name(request.scope), lease.lease_id, lease.ttl_ms)
    return JSONResponse(lease.body())


async def _release_many(request: Request) -> Response:
    body = await read_body(request, ReleaseManyRequest)
    await _service(request).release_many(body.lease_id)
    _limits(request).released(identity_name(request.scope), body.lease_id)
    return JSONResponse({"released": True})


@dataclass(frozen=True, slots=True)
class HotRoute:
    """One of ``POST /v1/locks/{name}/ACTION``: its handler and what the OpenAPI document says
    of it. ``HOT_ROUTES`` is read by both ``HotPathMiddleware`` and ``create_router``."""

    action: str
    handler: Callable[[Request, str], Awaitable[Response]]
    body: type[BaseModel]
    answer: type[BaseModel]
    problems: tuple[int, ...]
    doc: str


HOT_ROUTES: tuple[HotRoute, ...] = (
    HotRoute("acquire", _acquire, AcquireRequest, LeaseBody, (403, 409, 413, 422, 429, 503),
             "Grant the lock, waiting up to ``wait_ms`` behind earlier waiters (409 if not)."),
    HotRoute("renew", _renew, RenewRequest, LeaseBody, (403, 410, 413, 422, 503),
             "Extend a live lease (same fence); 410 if it is not live."),
    HotRoute("release", _release, ReleaseRequest, ReleasedBody, (403, 410, 413, 422, 503),
             "End a live lease; the longest waiter is granted next. 410 if it is not live."),
)
"""lockd's hot routes: nearly all of its traffic (see ``HotPathMiddleware``)."""

_HOT_HANDLERS = {route.action: route.handler for route in HOT_ROUTES}
_HOT_PATH = re.compile(r"/v1/locks/(.+)/(" + "|".join(_HOT_HANDLERS) + ")")


def is_hot_path(scope: Scope) -> bool:
    """``POST /v1/locks/{name}/ACTION`` of ``HOT_ROUTES``: what ``HotPathMiddleware`` serves."""
    return (scope["type"] == "http" and scope["method"] == "POST"
            and _HOT_PATH.fullmatch(scope["path"]) is not None)


def _hot_endpoint(route: HotRoute) -> Callable[..., Awaitable[Response]]:
    """The FastAPI endpoint of ``route`` (for the OpenAPI document and as the fallback)."""
    handler = route.handler

    async def endpoint(name: str, request: Request) -> Response:
        return await handler(request, name)

    endpoint.__name__ = endpoint.__qualname__ = route.action
    endpoint.__doc__ = route.doc
    return endpoint


class HotPathMiddleware:
    """Sends ``POST /v1/locks/{name}/acquire|renew|release`` (``HOT_ROUTES``) straight to their
    handlers.

    These three calls are nearly all of lockd's traffic. FastAPI's router, dependency
    resolution and per-route exception/exit-stack middlewares cost about a fifth of lockd's CPU
    per lock cycle; here the same handlers run with the same problem mapping (``_lockd_error``,
    ``_internal``), and the FastAPI routes stay for the OpenAPI document and as the fallback.
    Served in front of FastAPI's middleware stack, inside lockd's request middleware only (see
    ``lockd.server.app``): every layer is a coroutine frame and objects that a queued acquire
    keeps for as long as it waits."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _HOT_PATH.fullmatch(scope["path"])
            if match is not None:
                request = _HotRequest(scope, receive, send)
                handler, name = _HOT_HANDLERS[match[2]], match[1]
                del match  # not kept for a queued acquire's whole wait
                try:
                    response = await handler(request, name)
                except LockdError as exc:
                    response = _lockd_error(exc)
                except ClientDisconnect:
                    response = _client_gone(request)
                except Exception as exc:
                    response = _internal(request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_router() -> APIRouter:
    """The v1 routes; they find the ``LockService`` at ``request.app.state.service``."""
    router = APIRouter(route_class=_GuardedRoute)

    for hot in HOT_ROUTES:
        router.add_api_route(f"/v1/locks/{{name:path}}/{hot.action}", _hot_endpoint(hot),
                             methods=["POST"], response_model=hot.answer,
                             openapi_extra=_body_doc(hot.body), responses=_problems(*hot.problems))

    @router.post("/v1/leases/acquire", response_model=MultiLeaseBody,
                 operation_id="acquireMany", openapi_extra=_body_doc(AcquireManyRequest),
                 responses=_problems(403, 409, 413, 422, 429, 503))
    async def acquire_many(request: Request) -> Response:
        """Grant every listed lock in one atomic step, or none; waits up to ``wait_ms`` behind
        earlier waiters of any of them (409 ``held`` naming every held lock if not granted)."""
        return await _acquire_many(request)

    @router.post("/v1/leases/renew", response_model=MultiLeaseBody, operation_id="renewMany",
                 openapi_extra=_body_doc(RenewManyRequest),
                 responses=_problems(410, 413, 422, 503))
    async def renew_many(request: Request) -> Response:
        """Extend every lock of a live multi-lock lease (same fences); 410 if it is not live."""
        return await _renew_many(request)

    @router.post("/v1/leases/release", response_model=ReleasedBody, operation_id="releaseMany",
                 openapi_extra=_body_doc(ReleaseManyRequest),
                 responses=_problems(410, 413, 422, 503))
    async def release_many(request: Request) -> Response:
        """End a multi-lock lease: every lock of it is free at once. 410 if it is not live."""
        return await _release_many(request)

    @router.get("/v1/locks", response_model=LockPage, responses=_problems(422, 503))
    async def list_locks(request: Request, prefix: str = "", limit: int = 100,
                         cursor: str | None = None) -> Response:
        """Locks whose name starts with ``prefix``, in name order, ``limit`` (1-1000) a page;
        only those the caller's scope covers."""
        items, next_cursor = await _service(request).list(
            prefix, limit, cursor, within=visible_prefixes(request.scope, prefix))
        return JSONResponse({"items": [_state_body(s, w) for s, w in items],
                             "next_cursor": next_cursor})

    @router.get("/v1/locks/{name:path}", response_model=LockStateBody,
                responses=_problems(403, 422, 503))
    async def get_lock(name: str, request: Request) -> Response:
        """The lock's state (never its lease id) and the waiters queued at this lockd; 403
        ``forbidden_lock`` outside the caller's scope."""
        _service(request).check_name(name)
        in_scope(request, name)
        state, waiters = await _service(request).get(name)
        return JSONResponse({
            **_state_body(state, waiters),
            "holders": [{"owner": h.owner, "ttl_ms": h.ttl_ms, "mode": h.mode}
                        for h in state.holders],
            "waiting_owners": _service(request).waiting_owners(name)})

    @router.get("/v1/keys")
    async def keys(request: Request) -> Response:
        """The JWKS whose keys verify lockd's tokens."""
        return JSONResponse(request.app.state.jwks, headers={"Cache-Control": "max-age=60"})

    @router.get("/healthz", response_model=HealthBody, responses=_problems(503))
    async def healthz(request: Request) -> Response:
        """200 when the store answers, else 503 ``store_unavailable``."""
        await _service(request).ping()
        return JSONResponse({"status": "ok"})

    return router
