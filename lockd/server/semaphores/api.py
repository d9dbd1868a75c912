"""The semaphore routes (``/v1/semaphores/{name}/acquire|renew|release``, the state), on the
core's plumbing (bodies, problems, the lease-answer path). The caller's scope is checked on the
SEMAPHORE's name, not on its reserved slot locks ``sem/{name}/{slot}``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from lockd.server.access import identity_name
from lockd.server.core.answers import lease_answer
from lockd.server.core.http import (
    GuardedRoute,
    body_doc,
    bound_client_id,
    in_scope,
    limits,
    problems,
    read_body,
)
from lockd.server.core.schemas import ReleasedBody
from lockd.server.semaphores.schemas import (
    PermitLeaseBody,
    SemAcquireRequest,
    SemReleaseRequest,
    SemRenewRequest,
    SemStateBody,
)
from lockd.server.semaphores.service import SemaphoreService

__all__ = ["create_semaphore_router"]


def _semaphores(request: Request) -> SemaphoreService:
    return request.app.state.semaphores


async def _acquire(request: Request, name: str) -> Response:
    semaphores = _semaphores(request)
    semaphores.check_name(name)
    in_scope(request, name)
    who = identity_name(request.scope)
    limits(request).check_lease(who)
    body = await read_body(request, SemAcquireRequest)
    wait_ms = body.wait_ms
    call = semaphores.acquire(name, limit=body.limit, ttl_ms=body.ttl_ms, wait_ms=wait_ms,
                              owner=body.owner,
                              client_id=bound_client_id(request.scope, body.client_id))
    del body
    return await lease_answer(request, call, wait_ms, f"semaphore {name}", who)


def create_semaphore_router() -> APIRouter:
    """The semaphore routes; they find the services on ``request.app.state``."""
    router = APIRouter(route_class=GuardedRoute)

    @router.post("/v1/semaphores/{name:path}/acquire", response_model=PermitLeaseBody,
                 operation_id="acquirePermit", openapi_extra=body_doc(SemAcquireRequest),
                 responses=problems(403, 409, 413, 422, 429, 503))
    async def sem_acquire(name: str, request: Request) -> Response:
        """Grant one permit (a slot and a fence), waiting up to ``wait_ms`` behind earlier
        waiters: 409 ``held`` (every permit taken) or ``limit_mismatch`` (live permits hold
        another ``limit``) if not granted."""
        return await _acquire(request, name)

    @router.post("/v1/semaphores/{name:path}/renew", response_model=PermitLeaseBody,
                 operation_id="renewPermit", openapi_extra=body_doc(SemRenewRequest),
                 responses=problems(403, 410, 413, 422, 503))
    async def sem_renew(name: str, request: Request) -> Response:
        """Extend a live permit (same slot, fence and token); 410 if it is not live."""
        semaphores = _semaphores(request)
        semaphores.check_name(name)
        in_scope(request, name)
        body = await read_body(request, SemRenewRequest)
        lease = await semaphores.renew(name, body.lease_id, body.ttl_ms)
        limits(request).held(identity_name(request.scope), lease.lease_id, lease.ttl_ms)
        return JSONResponse(lease.body())

    @router.post("/v1/semaphores/{name:path}/release", response_model=ReleasedBody,
                 operation_id="releasePermit", openapi_extra=body_doc(SemReleaseRequest),
                 responses=problems(403, 410, 413, 422, 503))
    async def sem_release(name: str, request: Request) -> Response:
        """End a live permit; the longest waiter is granted next. 410 if it is not live."""
        semaphores = _semaphores(request)
        semaphores.check_name(name)
        in_scope(request, name)
        body = await read_body(request, SemReleaseRequest)
        await semaphores.release(name, body.lease_id)
        limits(request).released(identity_name(request.scope), body.lease_id)
        return JSONResponse({"released": True})

    @router.get("/v1/semaphores/{name:path}", response_model=SemStateBody,
                operation_id="getSemaphore", responses=problems(403, 422, 503))
    async def get_semaphore(name: str, request: Request) -> Response:
        """The semaphore's limit, last fence, live permits (never a lease id) and the waiters
        queued at this lockd; 403 ``forbidden_lock`` outside the caller's scope."""
        semaphores = _semaphores(request)
        semaphores.check_name(name)
        in_scope(request, name)
        state = await semaphores.get(name)
        return JSONResponse({
            "semaphore": name, "limit": state.limit, "fence": state.fence,
            "permits": [{"owner": p.owner, "slot": p.slot, "ttl_ms": p.ttl_ms, "fence": p.fence}
                        for p in state.permits],
            "waiters": semaphores.waiters(name),
            "waiting_owners": semaphores.waiting_owners(name)})

    return router
