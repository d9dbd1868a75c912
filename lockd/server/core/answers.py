"""The lease-answer path every acquire-like route shares (a lock, a set, a permit, a campaign):
the identity's lease and waiter limits around the service call, the wait cancelled when the
client goes away (499, nothing granted), and a parked wait on lockd's own HTTP protocol
(``ParkedWait``: the queued acquire keeps no ASGI call, bench/notes/waiters.md)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any

from fastapi import Request, Response
from starlette.types import Receive, Scope, Send

from lockd.common.responses import JsonReply
from lockd.common.serving.connections import DISCONNECT_WATCH, parker
from lockd.server.core.disconnects import ClientGone, until_disconnect
from lockd.server.core.http import internal_at, problem_of
from lockd.server.errors import LockdError
from lockd.server.limits import IdentityLimits, Reservation

__all__ = ["HotRequest", "ParkedWait", "lease_answer"]

log = logging.getLogger(__name__)


async def lease_answer(request: Request, call: Coroutine[Any, Any, Any], wait_ms: int,
                       locks: str | Sequence[str], who: str) -> Response:
    """The lease ``call`` grants, as the answer. With ``wait_ms`` > 0 the wait ends early if the
    client goes away: 499, nothing granted (``locks``, one name or several, for the log line).
    The acquire counts as one of ``who``'s leases from now (a reservation, given back unless
    granted) and as one of its waiters while it waits (``lockd.server.limits``)."""
    limits: IdentityLimits = request.app.state.limits
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
            if type(request) is HotRequest and parker(request.scope) is not None:
                parked = True  # leave_wait and the reservation's end: when it ends
                return ParkedWait(call, limits, who, locks, reservation)
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
    return JsonReply(lease.body())


def _went_away(locks: str | Sequence[str]) -> None:
    what = f"lock {locks!r}" if isinstance(locks, str) else f"locks {', '.join(locks[:8])}"
    log.info("client went away while waiting for %s", what)


class HotRequest(Request):
    """The ``Request`` of ``HotPathMiddleware``: its waiting acquire may park (``ParkedWait``)."""


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


class ParkedWait:
    """A waiting acquire served by ``HotPathMiddleware`` on lockd's HTTP protocol, sent as the
    handler's response: instead of waiting inside the request's ASGI call it parks the request
    (``lockd.common.serving.connections.parker``) and runs ``call`` (the ``LockService``
    coroutine) as a task of its own; the ASGI call ends at once, freeing its task, ~10
    coroutine frames, ``Request``, contexts and closures (bench/notes/waiters.md). When ``call``
    ends, ``_answer`` answers exactly as ``lease_answer`` would (lease, problem, or 499 after
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
        """The answer ``lease_answer`` would have given for ``task``'s outcome."""
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
                response = internal_at(self.scope, asyncio.CancelledError())
        elif (exc := task.exception()) is None:
            lease = task.result()
            self.reservation.granted(lease.lease_id, lease.ttl_ms)
            response = JsonReply(lease.body())
        elif isinstance(exc, LockdError):
            response = problem_of(exc)
        else:
            response = internal_at(self.scope, exc)
        return response(self.scope, _no_receive, self.send)
