"""The proxy's hot path: fenced ``PUT``/``PATCH`` of a row, ``POST /v1/batch`` and an
object's ``PUT`` served as raw ASGI in front of FastAPI's middleware stack.

These calls are nearly all of a fenced proxy's traffic. FastAPI/Starlette's layers
(server-error and exception middlewares, FastAPI's own outer middlewares, the router's scan of
every route) cost ~0.15 ms of CPU per request on top of uvicorn (bench/NOTES.md, "HTTP stack
ceiling"), about a quarter of a fenced write's cost. Here the same endpoints of
``rows.api`` (``put_row``, ``patch_row``, ``batch``: the same body bound, token
header, ``RowService`` call, fencing and metrics) and of ``objects.api`` (``put_object``) run behind the same request middleware
(API keys, request ids, header bound) and access middleware, with the same problem mapping
(``api.problem_response``). Matching uses the routes' own Starlette patterns, so a path is
served here exactly when the router would have sent it to the same endpoint; every other
request, and every request while FastAPI's native OpenTelemetry is on (so none escapes the
traces), takes the full stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.routing import Match, Route

from resource_proxy.api import problem_response
from resource_proxy.objects.api import object_routes, put_object
from resource_proxy.rows.api import batch, patch_row, put_row, row_routes

__all__ = ["HotPathMiddleware", "ProxyApp", "is_hot_path"]

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

_HOT_ENDPOINTS = (put_row, patch_row, batch, put_object)


def _hot_routes() -> dict[str, tuple[Route, ...]]:
    """method -> the hot routes for it: the routes' own objects, so the same patterns and
    convertors as the router's."""
    found: dict[str, tuple[Route, ...]] = {}
    for route in (*row_routes, *object_routes):
        if route.endpoint in _HOT_ENDPOINTS:
            for method in route.methods or ():
                if method != "HEAD":
                    found[method] = found.get(method, ()) + (route,)
    return found


_HOT = _hot_routes()


def _match(scope: Scope) -> dict[str, Any] | None:
    """The child scope (``endpoint``, ``path_params``) of the hot route ``scope`` fully matches,
    else None."""
    if scope["type"] != "http":
        return None
    for route in _HOT.get(scope["method"], ()):
        match, child = route.matches(scope)
        if match is Match.FULL:
            return child
    return None


def is_hot_path(scope: Scope) -> bool:
    """A fenced row ``PUT``/``PATCH``, ``POST /v1/batch`` or an object's ``PUT``: what
    ``HotPathMiddleware`` serves."""
    return _match(scope) is not None


class HotPathMiddleware:
    """Serves the hot routes (``is_hot_path``) with their endpoints directly; anything else goes
    on to ``app`` (FastAPI's full stack)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        endpoint = scope.get("endpoint")
        if endpoint not in _HOT_ENDPOINTS:  # not matched by ``ProxyApp``: match it here
            child = _match(scope)
            if child is None:
                await self.app(scope, receive, send)
                return
            scope.update(child)
            endpoint = child["endpoint"]
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except ClientDisconnect:  # gone mid-body: the request middleware drops it quietly
            raise
        except Exception as exc:  # the same mapping as the app's exception handlers
            response = problem_response(request, exc)
        await response(scope, receive, send)


class ProxyApp(FastAPI):
    """FastAPI, with the hot path (``HotPathMiddleware``) served in front of its middleware
    stack: request middleware -> [access middleware] -> ``HotPathMiddleware`` -> endpoint."""

    _front: ASGIApp | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        front = self._front
        if front is not None and not _telemetry_on(self):
            child = _match(scope)
            if child is not None:
                scope["app"] = self
                scope.update(child)  # the endpoint and path parameters, as the router sets them
                await front(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _telemetry_on(app: FastAPI) -> bool:
    native = getattr(app, "_native_telemetry", None)
    return native is not None and native.enabled()
