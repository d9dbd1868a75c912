"""What the proxy's status page shows, and the one place an answer is counted.

``record(request, call, status, error)`` is called by ``api`` for every answer (success or
problem): it feeds the Prometheus metrics (``metrics``) and the ``Activity`` view. The view is
this process's own, in memory and bounded: the highest fence it has seen honoured per lock (the
``fences_max`` locks fenced most recently) and the last ``rejections_max`` rejected fenced
calls (stale tokens above all). The authoritative highest fences are in the protected
database (``GET /v1/fences/{lock}``); proxies sharing it each show what they served.

Routes: ``GET /`` (the status page, ``status_page``) and ``GET /v1/activity`` (its JSON:
``{fences: [{lock, highest, at}], rejections: [{at, call, code, status, lock, presented,
highest}], stale_total, writes_ok_total}``, newest first; ``at`` in unix ms).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from lockd.common.middleware import START
from resource_proxy.errors import ProxyError, StaleToken
from resource_proxy.metrics import OUTCOMES, WRITE_CALLS, ProxyMetrics
from resource_proxy.status_page import render as render_status_page

__all__ = ["Activity", "activity_routes", "call_of", "record"]

_TOKEN_HEADER = "fencing-token"
_CALLS = {
    "insert_row": "insert", "put_row": "upsert", "patch_row": "update", "delete_row": "delete",
    "get_row": "read", "list_rows": "list", "batch": "batch", "claim": "claim",
    "claim_all": "claim",
    "get_fence": "fence", "healthz": "healthz", "metrics": "metrics",
}
_FENCED = frozenset((*WRITE_CALLS, "read", "list"))


class Activity:
    """Recent fences and rejections of this proxy process (bounded; see the module doc)."""

    def __init__(self, *, fences_max: int = 200, rejections_max: int = 100):
        self._fences: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._fences_max = fences_max
        self._rejections: deque[dict[str, Any]] = deque(maxlen=rejections_max)
        self.stale_total = 0
        self.writes_ok_total = 0

    def fenced(self, lock: str, highest: int) -> None:
        old = self._fences.pop(lock, None)
        self._fences[lock] = (max(highest, old[0]) if old else highest, int(time.time() * 1000))
        if len(self._fences) > self._fences_max:
            self._fences.popitem(last=False)

    def rejected(self, call: str, error: ProxyError, lock: str | None) -> None:
        entry: dict[str, Any] = {"at": int(time.time() * 1000), "call": call,
                                 "code": error.code, "status": error.status, "lock": lock,
                                 "presented": error.extra.get("presented"),
                                 "highest": error.extra.get("highest")}
        self._rejections.append(entry)

    def snapshot(self) -> dict[str, Any]:
        fences = [{"lock": lock, "highest": highest, "at": at}
                  for lock, (highest, at) in reversed(self._fences.items())]
        return {"fences": fences, "rejections": list(reversed(self._rejections)),
                "stale_total": self.stale_total, "writes_ok_total": self.writes_ok_total}


def call_of(request: Request) -> str:
    """The call a request was routed to (``insert``, ``read``, …; ``other`` if none)."""
    endpoint = request.scope.get("endpoint")
    return _CALLS.get(getattr(endpoint, "__name__", ""), "other")


def _claims_lock(request: Request) -> tuple[str, int] | None:
    """(lock, fence) of the request's token if it was verified already (a cache lookup); an
    answered fenced call raised the lock's highest to that fence, whatever the token's mode."""
    token = request.headers.get(_TOKEN_HEADER)
    core = getattr(request.app.state, "claims", None)
    if not token or core is None:
        return None
    claims = core.keys.peek(token.strip())
    if claims is None or claims.lock is None or claims.fence is None:
        return None
    return (claims.lock, claims.fence)


def record(request: Request, call: str, status: int, error: ProxyError | None = None) -> None:
    """Count one answer in the metrics and the activity view."""
    metrics: ProxyMetrics = request.app.state.metrics
    activity: Activity = request.app.state.activity
    metrics.requests.labels(call, status).inc()
    if call in WRITE_CALLS:
        outcome = "ok" if error is None else OUTCOMES.get(error.code, "error")
        metrics.writes[(call, outcome)].inc()
        start = request.scope.get(START)
        if start is not None:
            metrics.write_seconds[call].observe(time.perf_counter() - start)
    if call not in _FENCED:
        return
    if error is None:
        if call in WRITE_CALLS:
            activity.writes_ok_total += 1
        claims = _claims_lock(request)
        if claims is not None:
            activity.fenced(*claims)
        return
    if isinstance(error, StaleToken):
        lock = error.extra.get("lock")
        presented, highest = error.extra.get("presented"), error.extra.get("highest")
        metrics.stale[call].inc()
        activity.stale_total += 1
        if isinstance(presented, int) and isinstance(highest, int):
            metrics.fence_lag.observe(highest - presented)
            if isinstance(lock, str):
                activity.fenced(lock, highest)
        activity.rejected(call, error, lock if isinstance(lock, str) else None)
    elif error.code in ("invalid_token", "token_required", "lock_not_allowed", "shared_token"):
        claims = _claims_lock(request)
        activity.rejected(call, error, claims[0] if claims else None)


async def _status_page(request: Request) -> Response:
    page = render_status_page(request.app.state.settings.lockd_url)
    return HTMLResponse(page, headers={"Cache-Control": "no-cache"})


async def _activity(request: Request) -> Response:
    return JSONResponse(request.app.state.activity.snapshot(),
                        headers={"Cache-Control": "no-store"})


activity_routes = [Route("/", _status_page, methods=["GET"]),
                   Route("/v1/activity", _activity, methods=["GET"])]
