"""A waiting request that learns its client went away: ``until_disconnect``.

Used by ``lockd.server.core.answers`` for waits that run inside the request's ASGI call (every
waiting route but a hot acquire on lockd's own HTTP protocol, which is parked instead:
``ParkedWait``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from lockd.common.serving.connections import DISCONNECT_WATCH

__all__ = ["ClientGone", "until_disconnect"]

_T = TypeVar("_T")


class ClientGone(Exception):
    """The HTTP client disconnected while its request was still waiting."""


async def _disconnected(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Return when the ASGI server reports ``http.disconnect`` (the body is already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Coroutine[Any, Any, _T]) -> _T:
    """Run ``work``; cancel it if the client disconnects first (raising ``ClientGone``).

    On lockd's own HTTP protocol (``scope[DISCONNECT_WATCH]``) ``work`` runs in the request's
    own task and the connection's loss cancels that task: a queued acquire costs no task, no
    ``receive()`` poller and no ``asyncio.wait`` of its own. Elsewhere (another ASGI server)
    a second task watches ``receive()`` for ``http.disconnect``."""
    watch = request.scope.get(DISCONNECT_WATCH)
    if watch is None:
        return await _until_disconnect_polling(request, work)
    task = asyncio.current_task()
    assert task is not None
    gone = False

    def lost() -> None:
        nonlocal gone
        gone = True
        task.cancel()

    if not watch(lost):
        work.close()
        raise ClientGone
    try:
        return await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:  # ours alone, not also a cancel from outside
            raise ClientGone from None
        raise
    finally:
        watch(None)


async def _until_disconnect_polling(request: Request, work: Coroutine[Any, Any, _T]) -> _T:
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done() and not watch.done():  # we ourselves were cancelled
            task.cancel()
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone
