"""The lock routes: ``/v1/locks/{name}/acquire|renew|release`` (served by ``HotPathMiddleware``
in front of FastAPI's stack: nearly all of lockd's traffic), multi-lock leases
(``/v1/leases/acquire|renew|release``), the state and list reads, and the admin's
``/v1/locks/{name}/force-release`` (audited). The shared plumbing: ``lockd.server.core``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from lockd.common.middleware import REQUEST_ID_KEY
from lockd.common.responses import JsonReply
from lockd.server.access import identity_name, visible_prefixes
from lockd.server.audit import AuditTrail
from lockd.server.core.answers import HotRequest, lease_answer
from lockd.server.core.http import (
    GuardedRoute,
    admin_denied,
    body_doc,
    bound_client_id,
    client_gone,
    in_scope,
    internal,
    limits,
    problem_doc,
    problem_of,
    problems,
    read_body,
)
from lockd.server.core.schemas import ReleasedBody
from lockd.server.errors import LockdError
from lockd.server.locks import renewals
from lockd.server.locks.schemas import (
    RENEW_EACH_BODY_BYTES,
    AcquireManyRequest,
    AcquireRequest,
    ForceReleasedBody,
    LeaseBody,
    LockPage,
    LockStateBody,
    MultiLeaseBody,
    ReleaseManyRequest,
    ReleaseRequest,
    RenewEachBody,
    RenewEachRequest,
    RenewManyRequest,
    RenewRequest,
)
from lockd.server.locks.service import LockService
from lockd.server.store.values import LockState

__all__ = ["HOT_ROUTES", "HotPathMiddleware", "HotRoute", "create_router", "is_hot_path"]

_RELEASED = b'{"released":true}'
"""The body of every release's answer, encoded once."""


def _service(request: Request) -> LockService:
    return request.app.state.locks


def _state_body(state: LockState, waiters: int) -> dict[str, Any]:
    return {"lock": state.lock, "held": state.held, "fence": state.fence, "owner": state.owner,
            "ttl_ms": state.ttl_ms, "waiters": waiters, "mode": state.mode}


async def _acquire(request: Request, name: str) -> Response:
    service = _service(request)
    service.check_name(name)
    in_scope(request, name)
    who = identity_name(request.scope)
    limits(request).check_lease(who)
    body = await read_body(request, AcquireRequest)
    wait_ms = body.wait_ms
    call = service.acquire(name, ttl_ms=body.ttl_ms, wait_ms=wait_ms, owner=body.owner,
                           client_id=bound_client_id(request.scope, body.client_id),
                           mode=body.mode)
    del body  # a queued acquire keeps this frame for its whole wait, not the parsed body too
    return await lease_answer(request, call, wait_ms, name, who)


async def _renew(request: Request, name: str) -> Response:
    service = _service(request)
    service.check_name(name)
    in_scope(request, name)
    body = await read_body(request, RenewRequest)
    lease = await service.renew(name, body.lease_id, body.ttl_ms)
    limits(request).held(identity_name(request.scope), lease.lease_id, lease.ttl_ms)
    return JsonReply(lease.body())


async def _release(request: Request, name: str) -> Response:
    service = _service(request)
    service.check_name(name)
    in_scope(request, name)
    body = await read_body(request, ReleaseRequest)
    await service.release(name, body.lease_id)
    limits(request).released(identity_name(request.scope), body.lease_id)
    return JsonReply(_RELEASED)


async def _acquire_many(request: Request) -> Response:
    service = _service(request)
    body = await read_body(request, AcquireManyRequest)
    wait_ms, locks = body.wait_ms, body.locks
    in_scope(request, service.check_names(locks))  # all or nothing: before anything is asked
    who = identity_name(request.scope)
    limits(request).check_lease(who)
    call = service.acquire_many(locks, ttl_ms=body.ttl_ms, wait_ms=wait_ms, owner=body.owner,
                                client_id=bound_client_id(request.scope, body.client_id),
                                modes=body.modes)
    del body  # as in _acquire
    return await lease_answer(request, call, wait_ms, locks, who)


async def _renew_many(request: Request) -> Response:
    """A set's lease carries no lock names: the set was checked against the scope when it was
    granted, and only its acquirer holds the lease id."""
    body = await read_body(request, RenewManyRequest)
    lease = await _service(request).renew_many(body.lease_id, body.ttl_ms)
    limits(request).held(identity_name(request.scope), lease.lease_id, lease.ttl_ms)
    return JsonReply(lease.body())


async def _renew_each(request: Request) -> Response:
    """Every item checked (422) and in scope (403) before any is renewed; then each on its own
    (``lockd.server.locks.renewals``)."""
    service = _service(request)
    body = await read_body(request, RenewEachRequest, RENEW_EACH_BODY_BYTES)
    items = [(item.lock, item.lease_id, item.ttl_ms) for item in body.leases]
    renewals.check_items(service, items)
    in_scope(request, [lock for lock, _, _ in items])
    results = await renewals.renew_each(service, items)
    held, who = limits(request).held, identity_name(request.scope)
    for result in results:
        if not isinstance(result, LockdError):
            held(who, result.lease_id, result.ttl_ms)
    return JsonReply(renewals.answer_body(items, results))


async def _release_many(request: Request) -> Response:
    body = await read_body(request, ReleaseManyRequest)
    await _service(request).release_many(body.lease_id)
    limits(request).released(identity_name(request.scope), body.lease_id)
    return JsonReply(_RELEASED)


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
    per lock cycle; here the same handlers run with the same problem mapping (``problem_of``,
    ``internal``), and the FastAPI routes stay for the OpenAPI document and as the fallback.
    Served in front of FastAPI's middleware stack, inside lockd's request middleware only (see
    ``lockd.server.app``): every layer is a coroutine frame and objects that a queued acquire
    keeps for as long as it waits."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _HOT_PATH.fullmatch(scope["path"])
            if match is not None:
                request = HotRequest(scope, receive, send)
                handler, name = _HOT_HANDLERS[match[2]], match[1]
                del match  # not kept for a queued acquire's whole wait
                try:
                    response = await handler(request, name)
                except LockdError as exc:
                    response = problem_of(exc)
                except ClientDisconnect:
                    response = client_gone(request)
                except Exception as exc:
                    response = internal(request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_router() -> APIRouter:
    """The lock routes; they find the ``LockService`` at ``request.app.state.locks``."""
    router = APIRouter(route_class=GuardedRoute)

    for hot in HOT_ROUTES:
        router.add_api_route(f"/v1/locks/{{name:path}}/{hot.action}", _hot_endpoint(hot),
                             methods=["POST"], response_model=hot.answer,
                             openapi_extra=body_doc(hot.body), responses=problems(*hot.problems))

    @router.post("/v1/leases/acquire", response_model=MultiLeaseBody,
                 operation_id="acquireMany", openapi_extra=body_doc(AcquireManyRequest),
                 responses=problems(403, 409, 413, 422, 429, 503))
    async def acquire_many(request: Request) -> Response:
        """Grant every listed lock in one atomic step, or none; waits up to ``wait_ms`` behind
        earlier waiters of any of them (409 ``held`` naming every held lock if not granted)."""
        return await _acquire_many(request)

    @router.post("/v1/leases/renew", response_model=MultiLeaseBody, operation_id="renewMany",
                 openapi_extra=body_doc(RenewManyRequest),
                 responses=problems(410, 413, 422, 503))
    async def renew_many(request: Request) -> Response:
        """Extend every lock of a live multi-lock lease (same fences); 410 if it is not live."""
        return await _renew_many(request)

    @router.post("/v1/leases/renew-each", response_model=RenewEachBody, operation_id="renewEach",
                 openapi_extra=body_doc(RenewEachRequest),
                 responses=problems(403, 413, 422))
    async def renew_each(request: Request) -> Response:
        """Renew many single-lock leases in one request (1-1000), each answered on its own in
        ``results`` (200 and the lease, or the problem a single renew would answer: 410
        ``lease_lost``, 503). A malformed item: 422 for the whole request, nothing renewed."""
        return await _renew_each(request)

    @router.post("/v1/leases/release", response_model=ReleasedBody, operation_id="releaseMany",
                 openapi_extra=body_doc(ReleaseManyRequest),
                 responses=problems(410, 413, 422, 503))
    async def release_many(request: Request) -> Response:
        """End a multi-lock lease: every lock of it is free at once. 410 if it is not live."""
        return await _release_many(request)

    @router.get("/v1/locks", response_model=LockPage, responses=problems(422, 503))
    async def list_locks(request: Request, prefix: str = "", limit: int = 100,
                         cursor: str | None = None) -> Response:
        """Locks whose name starts with ``prefix``, in name order, ``limit`` (1-1000) a page;
        only those the caller's scope covers."""
        items, next_cursor = await _service(request).list(
            prefix, limit, cursor, within=visible_prefixes(request.scope, prefix))
        return JSONResponse({"items": [_state_body(s, w) for s, w in items],
                             "next_cursor": next_cursor})

    @router.get("/v1/locks/{name:path}", response_model=LockStateBody,
                responses=problems(403, 422, 503))
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

    @router.post("/v1/locks/{name:path}/force-release", response_model=ForceReleasedBody,
                 responses={s: problem_doc(s, d) for s, d in (
                     (401, "Unauthorized"), (403, "Forbidden"), (422, "Invalid request"),
                     (503, "Service unavailable"))})
    async def force_release(name: str, request: Request) -> Response:
        """Admin: end the live lease of ``name`` whoever holds it; the next grant gets a higher
        fence, the old holder's renew/release get 410."""
        denied = admin_denied(request, "force-release")
        if denied is not None:
            return denied
        service = _service(request)
        service.check_name(name)
        audit: AuditTrail = request.app.state.audit
        who, rid = identity_name(request.scope), request.scope.get(REQUEST_ID_KEY)
        try:
            ended = await service.force_release(name)
        except LockdError as exc:
            audit.record(who, "force_release", name, exc.code, rid)
            raise
        audit.record(who, "force_release", name, "released" if ended else "not_held", rid,
                     **({"fence": ended.fence, "owner": ended.owner} if ended else {}))
        return JSONResponse({"lock": name, "released": ended is not None,
                             "fence": ended.fence if ended else None,
                             "owner": ended.owner if ended else None})

    return router
