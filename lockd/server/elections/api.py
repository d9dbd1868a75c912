"""The election routes: ``/v1/elections/{name}/campaign|renew|resign|proclaim|handover``, the
state, ``observe`` (SSE, resumable with ``Last-Event-ID``) and the list, on the core's plumbing;
docs/http-api.md lists each answer. A handover needs an admin or the leader's own ``lease_id``
and is audited; observe streams take a slot of ``lockd.server.streams`` like the lock event
streams. An election named ``.../observe`` cannot be read with ``GET /v1/elections/{name}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from lockd.common.middleware import REQUEST_ID_KEY
from lockd.common.responses import problem_response
from lockd.server.access import covers, identity_name
from lockd.server.audit import AuditTrail
from lockd.server.core.answers import lease_answer
from lockd.server.core.http import (
    GuardedRoute,
    admin_denied,
    body_doc,
    bound_client_id,
    in_scope,
    last_event_id,
    limits,
    problems,
    read_body,
)
from lockd.server.elections.schemas import (
    CampaignRequest,
    ElectionLeaseBody,
    ElectionListBody,
    ElectionRenewBody,
    ElectionRenewRequest,
    ElectionStateBody,
    HandoverBody,
    HandoverRequest,
    ProclaimedBody,
    ProclaimRequest,
    ResignedBody,
    ResignRequest,
)
from lockd.server.elections.service import ElectionService
from lockd.server.errors import LockdError
from lockd.server.streams import open_stream

__all__ = ["create_election_router"]



def _elections(request: Request) -> ElectionService:
    return request.app.state.elections


def _checked(request: Request, name: str) -> ElectionService:
    """The election service, once ``name`` is a lock name the caller's scope covers."""
    elections = _elections(request)
    elections.check_name(name)
    in_scope(request, name)
    return elections


def create_election_router() -> APIRouter:
    """The election routes; they find the ``ElectionService`` at ``app.state.elections``."""
    router = APIRouter(route_class=GuardedRoute)

    @router.post("/v1/elections/{name:path}/campaign", response_model=ElectionLeaseBody,
                 openapi_extra=body_doc(CampaignRequest),
                 responses=problems(403, 409, 413, 422, 429, 503))
    async def campaign(name: str, request: Request) -> Response:
        """Lead the election, waiting up to ``wait_ms`` behind earlier candidates (409 if not
        elected by then). The lease's fence is higher than every earlier leader's."""
        elections = _checked(request, name)
        who = identity_name(request.scope)
        limits(request).check_lease(who)
        body = await read_body(request, CampaignRequest)
        call = elections.campaign(name, value=body.value, ttl_ms=body.ttl_ms,
                                  wait_ms=body.wait_ms, owner=body.owner,
                                  client_id=bound_client_id(request.scope, body.client_id))
        return await lease_answer(request, call, body.wait_ms, name, who)

    @router.post("/v1/elections/{name:path}/renew", response_model=ElectionRenewBody,
                 operation_id="renewLeader", openapi_extra=body_doc(ElectionRenewRequest),
                 responses=problems(403, 410, 413, 422, 503))
    async def renew(name: str, request: Request) -> Response:
        """Extend the leader's lease (same fence); ``handover_requested`` asks it to resign."""
        elections = _checked(request, name)
        body = await read_body(request, ElectionRenewRequest)
        lease = await elections.renew(name, body.lease_id, body.ttl_ms)
        limits(request).held(identity_name(request.scope), lease.lease_id, lease.ttl_ms)
        return JSONResponse(lease.body())

    @router.post("/v1/elections/{name:path}/resign", response_model=ResignedBody,
                 openapi_extra=body_doc(ResignRequest),
                 responses=problems(403, 410, 413, 422, 503))
    async def resign(name: str, request: Request) -> Response:
        """End the leader's term; the next candidate leads at once. 410 if not the leader."""
        elections = _checked(request, name)
        body = await read_body(request, ResignRequest)
        await elections.resign(name, body.lease_id)
        limits(request).released(identity_name(request.scope), body.lease_id)
        return JSONResponse({"resigned": True})

    @router.post("/v1/elections/{name:path}/proclaim", response_model=ProclaimedBody,
                 openapi_extra=body_doc(ProclaimRequest),
                 responses=problems(403, 410, 413, 422, 503))
    async def proclaim(name: str, request: Request) -> Response:
        """Set the leader's value; same term, same fence. 410 if not the live leader."""
        elections = _checked(request, name)
        body = await read_body(request, ProclaimRequest)
        state = await elections.proclaim(name, body.lease_id, body.value)
        return JSONResponse({"election": name,
                             "owner": state.leader.owner if state.leader else "",
                             "value": state.value, "fence": state.fence, "seq": state.seq})

    @router.post("/v1/elections/{name:path}/handover", response_model=HandoverBody,
                 openapi_extra=body_doc(HandoverRequest),
                 responses=problems(401, 403, 409, 410, 413, 422, 503))
    async def handover(name: str, request: Request) -> Response:
        """Ask the leader to step down for ``target`` (an owner, or ``"next"``): its renewals
        answer ``handover_requested`` and that candidate is admitted first. An admin, or the
        leader naming its own ``lease_id``. Audited."""
        elections = _checked(request, name)
        body = await read_body(request, HandoverRequest)
        elections.check_target(body.target)
        if body.lease_id is None:
            denied = admin_denied(request, "a handover without the leader's lease_id")
            if denied is not None:
                return denied
        audit: AuditTrail = request.app.state.audit
        who, rid = identity_name(request.scope), request.scope.get(REQUEST_ID_KEY)
        by = "admin" if body.lease_id is None else "leader"
        try:
            state = await elections.handover(name, body.target, body.lease_id)
        except LockdError as exc:
            audit.record(who, "election_handover", name, exc.code, rid, handover_to=body.target,
                         by=by)
            raise
        audit.record(who, "election_handover", name, "requested", rid, handover_to=body.target,
                     by=by, fence=state.fence,
                     owner=state.leader.owner if state.leader else None)
        return JSONResponse({"election": name, "handover_to": body.target})

    @router.get("/v1/elections/{name:path}/observe", response_class=StreamingResponse,
                responses={200: {"description": "text/event-stream: state, then leader / "
                                 "proclaim / resign entries in seq order (id = seq)",
                                 "content": {"text/event-stream": {"schema": {
                                     "type": "string"}}}},
                           **problems(403, 422, 429, 503)})
    async def observe(name: str, request: Request) -> Response:
        """Server-Sent Events of the election: the current ``state`` first, then every change
        in order; reconnect with ``Last-Event-ID`` to resume without gaps."""
        elections = _checked(request, name)
        settings = request.app.state.settings
        if elections.closed:
            return problem_response(503, "shutting_down", "Service unavailable",
                                    "this lockd is stopping; observe at another replica or "
                                    "retry later", headers={"Retry-After": "5"})
        last_id = last_event_id(request)

        async def start() -> AsyncIterator[bytes]:  # after a stream slot was taken
            state, after = await elections.start_observing(name, last_id)
            return elections.observe(name, state, after,
                                     heartbeat_s=settings.events_heartbeat_ms / 1000)

        return await open_stream(request, start)

    @router.get("/v1/elections", response_model=ElectionListBody, responses=problems(503))
    async def list_elections(request: Request) -> Response:
        """The elections led through this lockd process (a campaign granted or a leader
        renewed here; the 1,000 most recent), in name order: only those the caller's scope
        covers."""
        scope = request.scope
        items = await _elections(request).known(lambda name: covers(scope, name))
        return JSONResponse({"items": items})

    @router.get("/v1/elections/{name:path}", response_model=ElectionStateBody,
                responses=problems(403, 422, 503))
    async def get_election(name: str, request: Request) -> Response:
        """The leader (owner, TTL left; never its lease id), its value and fence, the last log
        seq, a pending handover, and the candidates waiting at this lockd."""
        return JSONResponse(await _checked(request, name).get(name))

    return router
