"""The guard in a web service: a FastAPI dependency and a plain ASGI middleware, both reading
``Fencing-Token``, naming the lock from the route's parameters and answering the project's
problem documents (401, 403, 409 ...: ``lockd.guard.errors``).

FastAPI::

    app = FastAPI()
    add_problem_handlers(app)                           # GuardError -> application/problem+json
    guard = FenceGuard("http://127.0.0.1:7070")

    @app.put("/orders/{order_id}")
    def put_order(order_id: str, fence: Fence = Depends(Fenced("orders/{order_id}", guard=guard))):
        with fences.transaction(conn, fence):           # the claim, atomic with the write
            ...

Any ASGI app (Starlette, Quart, Litestar ...)::

    app = FenceMiddleware(app, guard, [("PUT", "/orders/{order_id}", "orders/{order_id}")])
    # a matching request's verified Fence is scope["state"]["fence"] (Starlette: request.state.fence)

Both only verify (signature, lock, mode): staleness is decided by the fence store's claim, in
the write's own transaction. A lock template names path parameters as ``{name}``; nothing else
of ``str.format`` is understood. A dependency without ``guard=`` uses ``app.state.fence_guard``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request

from lockd.common.fencerule import WRITE, Fence, Purpose
from lockd.common.responses import error_response
from lockd.guard.errors import GuardError
from lockd.guard.guard import HEADER, FenceGuard

__all__ = ["Fenced", "FenceMiddleware", "add_problem_handlers", "lock_name"]

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def lock_name(template: str, params: Mapping[str, Any]) -> str:
    """``template`` with each ``{name}`` replaced by ``params[name]`` (``KeyError`` if absent)."""
    return _PARAM.sub(lambda m: str(params[m.group(1)]), template)


class Fenced:
    """A FastAPI dependency: the verified write ``Fence`` of the request's token for the lock
    ``template`` names (``"orders/{order_id}"``: from the path parameters). Raises the guard's
    errors (``add_problem_handlers`` answers them). ``purpose``: ``WRITE`` (default) or
    ``READ`` (a fenced read: a shared token passes)."""

    def __init__(self, template: str, *, guard: FenceGuard | None = None,
                 purpose: Purpose = WRITE):
        self.template = template
        self.guard = guard
        self.purpose = purpose

    def __call__(self, request: Request) -> Fence:
        guard = self.guard or request.app.state.fence_guard
        lock = lock_name(self.template, request.path_params)
        return guard.check(request.headers.get(HEADER), lock, purpose=self.purpose)


def add_problem_handlers(app: Any) -> None:
    """Answer every ``GuardError`` raised by a route or a dependency of ``app`` (FastAPI or
    Starlette) as its problem document."""

    async def handler(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, GuardError)
        return error_response(exc)

    app.add_exception_handler(GuardError, handler)


def _route(path: str) -> re.Pattern[str]:
    pattern, at = "", 0
    for m in _PARAM.finditer(path):
        pattern += re.escape(path[at:m.start()]) + f"(?P<{m.group(1)}>[^/]+)"
        at = m.end()
    return re.compile("^" + pattern + re.escape(path[at:]) + "$")


class FenceMiddleware:
    """ASGI middleware: for a request matching one of ``routes`` (``(method, path template,
    lock template)``), verify its token for the lock and put the ``Fence`` in
    ``scope["state"]["fence"]``, or answer the guard's problem document without calling the
    app. Other requests pass untouched."""

    def __init__(self, app: Any, guard: FenceGuard, routes: Sequence[tuple[str, str, str]],
                 *, purpose: Purpose = WRITE):
        self.app = app
        self.guard = guard
        self.purpose = purpose
        self.routes = [(method.upper(), _route(path), lock) for method, path, lock in routes]

    def _match(self, scope: Mapping[str, Any]) -> str | None:
        for method, pattern, lock in self.routes:
            if scope["method"] == method:
                found = pattern.match(scope["path"])
                if found:
                    return lock_name(lock, found.groupdict())
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        lock = self._match(scope) if scope["type"] == "http" else None
        if lock is not None:
            token = None
            for name, value in scope.get("headers", ()):
                if name.decode("latin-1").lower() == HEADER.lower():
                    token = value.decode("latin-1")
            try:
                fence = await _in_thread(self.guard.check, token, lock, self.purpose)
            except GuardError as exc:
                await error_response(exc)(scope, receive, send)
                return
            scope.setdefault("state", {})["fence"] = fence
        await self.app(scope, receive, send)


async def _in_thread(check: Any, token: str | None, lock: str, purpose: Purpose) -> Fence:
    """``check`` off the event loop (a key fetch blocks)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(check, token, lock, purpose=purpose)
