"""lockd's operations routes and app wiring: ``/`` (status page), ``/metrics``, event streams,
the audit trail, the signing keys, health, API keys, request ids, and the OpenAPI document's
problem responses.

===============================================  ==============================================
route                                            meaning
===============================================  ==============================================
``GET /``                                        the live status page (``lockd.server.status_page``)
``GET /metrics``                                 Prometheus text (``lockd.server.metrics``); no key
``GET /v1/events?prefix=&history=``              SSE stream of the events of locks named
                                                 ``prefix…`` and of the permits of semaphores
                                                 named ``prefix…`` (``lockd.server.events``)
``GET /v1/locks/{name}/events?history=``         SSE stream of one lock's events
``GET /v1/audit?since=&limit=``                  admin key only: the audit trail, paged
``GET /v1/keys``                                 the JWKS that verifies lockd's tokens
``GET /healthz``                                 200 while the store answers, else 503
===============================================  ==============================================

Every stream (these and election observers) opens through ``lockd.server.streams.open_stream``:
at most ``max_event_streams`` streams are open at once (beyond, 503 ``too_many_streams``), and
an identity holds at most a quarter of them (beyond, 429 ``too_many_identity_streams``); both
with ``Retry-After: 5``. ``history`` (0-256, default 0) replays that many recent events first; a reconnecting client's
``Last-Event-ID`` replays what it missed instead (anything but an event id there is 422). Because ``/v1/locks/{name}/events`` is an
event stream, the state of a lock whose name ends in ``/events`` cannot be read with
``GET /v1/locks/{name}`` (list it with ``GET /v1/locks?prefix=``).

Access (``lockd.common.middleware.RequestMiddleware``): with ``api_keys`` set, every call but ``/``,
``/healthz``, ``/metrics``, ``/v1/keys`` (public keys: proxies fetch them), ``/openapi.json`` and
``/docs`` (with its assets) needs ``Authorization: Bearer <key>`` (401 ``unauthorized`` with
``WWW-Authenticate: Bearer`` otherwise); an admin key works wherever a client key does.
Admin calls (the audit trail; a lock's force-release, ``lockd.server.locks.api``) need an admin
key: none sent or a wrong one is 401, a client key is 403 ``forbidden``, and with no admin key
configured they are disabled (403). With mTLS,
``LOCKD_CERT_CLIENTS`` / ``LOCKD_CERT_ADMINS`` list client-certificate subjects that stand for a
client / admin key (see ``lockd.common.tls``). With an access file (``lockd.server.access``)
an identity sees only the locks its prefixes cover: in event streams (``/v1/locks/{name}/events``
outside them is 403 ``forbidden_lock``) and so on the status page, which reads the list and the
stream with the key it is given; admin streams also carry the audit events. ``/healthz`` and
``/metrics`` stay open so probes and Prometheus need no secret (they show no lock names).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.types import ASGIApp

from lockd.common.apidocs import DOCS_PATHS
from lockd.common.keys import KeySet, load_keys
from lockd.common.middleware import ROLE, RequestMiddleware
from lockd.common.names import LOCK_NAME_RULE, is_lock_name
from lockd.common.problems import PROBLEM_JSON
from lockd.common.tls import CertRoles
from lockd.server.access import granted_name, load_access_file, visibility
from lockd.server.audit import AuditTrail
from lockd.server.core.http import (
    GuardedRoute,
    admin_denied,
    in_scope,
    last_event_id,
    problem_doc,
    problems,
)
from lockd.server.core.names import check_prefix
from lockd.server.errors import InvalidRequest
from lockd.server.events import EventHub
from lockd.server.limits import IdentityLimits, StreamSlots
from lockd.server.metrics import CONTENT_TYPE_LATEST, LockdMetrics
from lockd.server.settings import Settings
from lockd.server.status_page import STATUS_PAGE
from lockd.server.streams import open_stream

__all__ = ["OPEN_PATHS", "create_ops_router", "create_service_router",
           "install_request_middleware"]

OPEN_PATHS = frozenset({"/", "/healthz", "/metrics", "/v1/keys", "/openapi.json", *DOCS_PATHS})
HISTORY_MAX = 256
AUDIT_LIMIT_MAX = 1000


class HealthBody(BaseModel):
    status: str = "ok"
    server: str = "lockd"
    """Which server answered (the proxy's says ``resource-proxy``)."""


class AuditPage(BaseModel):
    """A page of the audit trail (``lockd.server.audit.AuditEntry.body`` items)."""

    items: list[dict[str, Any]]
    next_since: int | None


PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"},
        "status": {"type": "integer"}, "detail": {"type": "string"},
        "code": {"type": "string"},
    },
    "additionalProperties": True,
}


_SSE_DOC = {200: {"description": "text/event-stream of acquired/released/expired events",
                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
            422: problem_doc(422, "Invalid request"),
            429: problem_doc(429, "The identity holds its share of the event streams"),
            503: problem_doc(503, "Too many event streams")}


def _history(value: int) -> int:
    if not 0 <= value <= HISTORY_MAX:
        raise InvalidRequest(f"history must be between 0 and {HISTORY_MAX} (got {value})")
    return value


async def _stream(request: Request, match: Callable[[str], bool], history: int) -> Response:
    """An event stream of the locks ``match`` accepts and the caller's scope covers; an
    admin's stream also carries the audit events."""
    hub: EventHub = request.app.state.events
    settings: Settings = request.app.state.settings
    last_id = last_event_id(request)
    scope = request.scope
    visible = visibility(scope)
    if visible is not None:
        wanted = match

        def match(lock: str) -> bool:
            return visible(lock) and wanted(lock)

    async def start() -> AsyncIterator[bytes]:
        return hub.stream(match, history=history, last_event_id=last_id,
                          heartbeat_s=settings.events_heartbeat_ms / 1000,
                          audit=scope.get(ROLE) == "admin")

    return await open_stream(request, start)


def create_ops_router() -> APIRouter:
    """The operations routes; include it BEFORE ``lockd.server.locks.api.create_router`` (its
    ``/v1/locks/{name}`` would otherwise swallow ``/v1/locks/{name}/events``)."""
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    async def status_page() -> Response:
        return HTMLResponse(STATUS_PAGE, headers={"Cache-Control": "no-cache"})

    @router.get("/metrics", responses={200: {"description": "Prometheus text exposition",
                                             "content": {"text/plain": {"schema": {
                                                 "type": "string"}}}}})
    async def metrics(request: Request) -> Response:
        """Prometheus metrics of this lockd process (see ``lockd.server.metrics``)."""
        return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/v1/events", response_class=StreamingResponse, responses=_SSE_DOC)
    async def events(request: Request, prefix: str = "", history: int = 0) -> Response:
        """Server-Sent Events of the locks whose name starts with ``prefix``."""
        check_prefix(prefix)
        return await _stream(request, lambda lock: granted_name(lock).startswith(prefix)
                             or lock.startswith(prefix), _history(history))

    @router.get("/v1/locks/{name:path}/events", response_class=StreamingResponse,
                responses=_SSE_DOC)
    async def lock_events(name: str, request: Request, history: int = 0) -> Response:
        """Server-Sent Events of one lock: acquired, released, expired (with fences)."""
        if not is_lock_name(name):
            raise InvalidRequest(LOCK_NAME_RULE)
        in_scope(request, name)
        return await _stream(request, name.__eq__, _history(history))

    @router.get("/v1/audit", response_model=AuditPage,
                responses={s: problem_doc(s, d) for s, d in (
                    (401, "Unauthorized"), (403, "Forbidden"), (422, "Invalid request"))})
    async def audit(request: Request, since: int = 0, limit: int = 100) -> Response:
        """Admin: the audit trail kept by this lockd process (``lockd.server.audit``): entries
        with an id above ``since``, oldest first, ``limit`` (1-1000) a page; ``next_since``
        pages on (``null``: this page reached the newest entry)."""
        denied = admin_denied(request, "the audit trail")
        if denied is not None:
            return denied
        if not 1 <= limit <= AUDIT_LIMIT_MAX:
            raise InvalidRequest(f"limit must be between 1 and {AUDIT_LIMIT_MAX} (got {limit})")
        if since < 0:
            raise InvalidRequest(f"since must be an audit entry id, 0 or more (got {since})")
        entries, next_since = request.app.state.audit.since(since, limit)
        return JSONResponse({"items": [e.body() for e in entries], "next_since": next_since})

    return router


def create_service_router() -> APIRouter:
    """``/v1/keys`` and ``/healthz``: what proxies and probes read, open without a key."""
    router = APIRouter(route_class=GuardedRoute)

    @router.get("/v1/keys")
    async def keys(request: Request) -> Response:
        """The JWKS whose keys verify lockd's tokens."""
        return JSONResponse(request.app.state.jwks, headers={"Cache-Control": "max-age=60"})

    @router.get("/healthz", response_model=HealthBody, responses=problems(503))
    async def healthz(request: Request) -> Response:
        """200 when the store answers, else 503 ``store_unavailable``."""
        await request.app.state.core.store.ping()
        return JSONResponse({"status": "ok", "server": "lockd"})

    return router


def _secrets(values: tuple[Any, ...]) -> list[str]:
    return [v.get_secret_value() if hasattr(v, "get_secret_value") else str(v) for v in values]


def install_request_middleware(app: FastAPI, settings: Settings,
                metrics: LockdMetrics) -> Callable[[ASGIApp], RequestMiddleware]:
    """Keys (read now: a missing key file fails the start), the outermost middleware, and the
    OpenAPI post-processing. Call after every other middleware is added. Returns a function
    that wraps another ASGI app in the same request middleware (same keys, metrics), for an app
    served in front of FastAPI's stack (``lockd.server.app``'s hot path)."""
    api_keys = KeySet(load_keys(_secrets(settings.api_keys), settings.api_keys_file))
    admin_keys = KeySet(load_keys(_secrets(settings.admin_keys), settings.admin_keys_file))
    app.state.admin_keys = admin_keys
    cert_roles = app.state.cert_roles = CertRoles(settings.cert_clients, settings.cert_admins)
    identities = load_access_file(settings.access_file) if settings.access_file else None
    app.state.has_admins = any(i.role == "admin" for i in (identities.identities
                                                           if identities else ()))
    app.state.audit = AuditTrail(app.state.events)
    limited = metrics.identity_limited
    app.state.limits = IdentityLimits(
        settings.max_leases_per_identity, settings.max_waiters_per_identity,
        on_limited=lambda who, limit: limited.labels(who, limit).inc())
    app.state.stream_slots = StreamSlots(settings.max_event_streams)
    acquire_outcomes = metrics.acquire_outcomes

    def on_response(scope: Any, status: int, seconds: float) -> None:
        if scope["method"] == "POST" and scope["path"].endswith("/acquire"):
            outcome = "granted" if status == 200 else "held" if status == 409 else "error"
            counter, histogram = acquire_outcomes[outcome]
            counter.inc()
            histogram.observe(seconds)

    options: dict[str, Any] = dict(
        api_keys=api_keys, admin_keys=admin_keys, open_paths=OPEN_PATHS,
        max_header_bytes=settings.max_header_bytes, on_response=on_response,
        cert_roles=cert_roles, on_auth_failure=lambda reason: metrics.auth_failures[reason].inc(),
        identities=identities)
    app.add_middleware(RequestMiddleware, **options)
    _document_problems(app)
    return partial(RequestMiddleware, **options)


def operation_id(route: APIRoute) -> str:
    """The OpenAPI operationId of a route: its handler's name in camelCase (``listLocks``), so
    generated clients get short names (FastAPI's default is ``list_locks_v1_locks_get``)."""
    head, *rest = route.name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _name_request_schema(operation: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Move an inline, titled request body schema (a pydantic model's) into
    ``components.schemas`` under its title, so generators name the type ``AcquireRequest``."""
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = content.get("schema")
    if not schema or "$ref" in schema or "title" not in schema:
        return
    schemas.setdefault(schema["title"], schema)
    content["schema"] = {"$ref": f"#/components/schemas/{schema['title']}"}


def _document_problems(app: FastAPI) -> None:
    """Make the OpenAPI document tell the truth about failures: every problem response has the
    ``Problem`` schema (FastAPI's default 422 shape is replaced), and every operation lists 401
    (outside the open paths) and 431."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, summary=app.summary,
                          description=app.description, routes=app.routes)
        components = doc.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        schemas["Problem"] = PROBLEM_SCHEMA
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["servers"] = [{"url": "/", "description": "this lockd"}]
        doc["info"]["license"] = {"name": "Apache-2.0", "identifier": "Apache-2.0"}
        for path, operations in doc.get("paths", {}).items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                for status, response in responses.items():
                    if status.startswith(("4", "5")):
                        response["content"] = {PROBLEM_JSON: {
                            "schema": {"$ref": "#/components/schemas/Problem"}}}
                responses.setdefault("431", problem_doc(431, "Request headers too large"))
                if "{name}" in path:  # a name with a control character matches no route
                    responses.setdefault("404", problem_doc(404, "No such route"))
                if path not in OPEN_PATHS:
                    responses.setdefault("401", problem_doc(401, "Missing or wrong API key"))
                    operation["security"] = [{"bearer": []}, {}]
                else:
                    operation["security"] = []  # open on purpose, also with API keys
                _name_request_schema(operation, schemas)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
