"""The one door of every event stream (``/v1/events``, ``/v1/locks/{name}/events``,
``/v1/elections/{name}/observe``): ``open_stream`` takes a slot of the caller's identity
(``lockd.server.limits.StreamSlots``) before the stream starts and gives it back when the
response ends, however it ends (the client left, lockd stopped, an error).

Refusals: 503 ``too_many_streams`` when every slot of this lockd is taken, 429
``too_many_identity_streams`` (with ``identity`` and ``limit``) when the identity holds its
share; both with ``Retry-After: 5``, counted in ``lockd_identity_limited_total`` (``limit``:
``streams``) for the second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from lockd.common.middleware import IDENTITY
from lockd.common.responses import problem_response
from lockd.server.limits import StreamSlots

__all__ = ["SSE_HEADERS", "open_stream"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_RETRY = {"Retry-After": "5"}


class _SlotResponse(StreamingResponse):
    """An SSE response that gives its stream slot back when it ends."""

    def __init__(self, content: AsyncIterator[bytes], give_back: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._give_back = give_back

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._give_back()


async def open_stream(request: Request,
                      start: Callable[[], Awaitable[AsyncIterator[bytes]]]) -> Response:
    """Take a stream slot for the caller (see the module docstring), then ``start()`` the
    stream's body; if ``start`` raises, the slot is given back and the error goes on."""
    slots: StreamSlots = request.app.state.stream_slots
    identity = request.scope.get(IDENTITY)
    who = None if identity is None else identity.name
    refused = slots.take(who)
    if refused == "total":
        return problem_response(
            503, "too_many_streams", "Service unavailable",
            f"this lockd already serves {slots.total} event streams "
            "(LOCKD_MAX_EVENT_STREAMS); retry later", headers=_RETRY)
    if refused is not None:
        request.app.state.metrics.identity_limited.labels(who, "streams").inc()
        return problem_response(
            429, "too_many_identity_streams", "Too many streams",
            f"identity {who!r} has {slots.held(who or '')} event streams open, its share of "
            f"this lockd's {slots.total} (a quarter); close some or retry later",
            {"identity": who, "limit": slots.share}, headers=_RETRY)
    try:
        body = await start()
    except BaseException:
        slots.give_back(who)
        raise
    return _SlotResponse(body, lambda: slots.give_back(who))
