"""Bounds on HTTP connections, in time and number, for both servers (lockd and the proxy).

uvicorn alone bounds neither: a connection that never sends a byte, or sends half its headers
or half its body, stays open for ever (its keep-alive timer runs only *between* requests), and
``limit_concurrency`` answers a bare ``text/plain`` 503 without ``Retry-After`` only after it
has read a request, so a flood of half-open sockets still takes every file descriptor. No ASGI
middleware can help: the app is not called before the headers are complete. So the bounds live
in uvicorn's own protocol class (``httptools``), subclassed here and passed as
``uvicorn.Config(http=bounded_protocol(bounds))``:

``request_timeout_s`` (default 10 s)
    A request must arrive whole, headers AND body, within this time, counted from the moment
    the connection opened or the previous response ended; otherwise the connection is closed
    (a handler still reading the body sees a disconnect). It is also the longest an idle
    connection is kept before its first request. Handlers that wait (an acquire with
    ``wait_ms``, an event stream) are not limited: the request itself was complete.
``max_connections`` (default 1000; keep it below ``ulimit -n``)
    A connection opened while this many are open is answered ``503`` ``overloaded`` with
    ``Retry-After: 1`` and ``Connection: close`` as soon as its first bytes arrive (its
    request is not read, no handler runs), or closed within a second if it sends nothing.
``write_timeout_s`` (default 10 s)
    A client that does not read what it is sent (its socket buffer full, uvicorn's write
    buffer above its high-water mark) for this long is disconnected: a stalled event-stream
    subscriber is dropped, never buffered without limit.
``send_buffer_bytes`` (default 64 KiB)
    The kernel send buffer of each connection (``SO_SNDBUF``; Linux otherwise grows it up to
    ``tcp_wmem``'s maximum, 4 MiB by default, per connection): what a client that reads nothing
    can make the server hold in the kernel, so 300 stalled clients cost 300 x 128 KiB (Linux
    doubles the value), not 1.2 GiB, and a stalled client is noticed (its writes pause) after
    ~200 KiB instead of megabytes.

Closing for a bound is logged at DEBUG (any client can cause it).

Disconnect watch: every request's scope carries ``scope[DISCONNECT_WATCH]``, a function
``watch(callback)`` that arranges for ``callback()`` to be called (once, on the event loop) when
the connection is lost, replacing any earlier callback; ``watch(None)`` stops watching. It
returns ``False`` if the connection is already gone. A handler that waits (a queued acquire)
uses it to learn of a client that went away without a task of its own polling ``receive()``.

Parking: ``parker(scope)`` is, on this protocol, a function ``park(task, answer, context=None)``:
the app is about to return without answering; when ``task`` is done, ``answer(task)`` (called in
``context``) returns the coroutine that sends the request's whole answer through the ``send``
the app was given (the disconnect watch is stopped first). The ASGI call then ends at once (no
500 for a response never started), so its task, frames, scope objects and middleware state are
freed while the request waits;
``task`` and the answer count as the server's tasks (a graceful stop waits for them), an answer
that raises is logged and answered 500 as uvicorn does for an app, and the connection's
keep-alive and pipelined requests resume when the late answer completes. The
request's scope is cut down, in place, to what writing, logging and counting the answer read
(type, method, path; with uvicorn's access log on also HTTP version, raw path, query string,
client; no headers, no lockd keys).
Elsewhere ``parker`` returns ``None``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lockd.common.problems import problem_bytes

__all__ = ["DISCONNECT_WATCH", "ConnectionBounds", "bounded_protocol", "descriptor_warning",
           "parker"]

log = logging.getLogger("lockd.http.connections")

_REFUSE_GRACE_S = 1.0

DISCONNECT_WATCH = "lockd.watch_disconnect"
"""The scope key of a request's disconnect watch (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class ConnectionBounds:
    """The three bounds (seconds, count); see the module docstring."""

    request_timeout_s: float = 10.0
    max_connections: int = 1000
    write_timeout_s: float = 10.0
    send_buffer_bytes: int = 65_536


def _overloaded_response(max_connections: int) -> bytes:
    body = problem_bytes(503, "overloaded", "Service unavailable",
                         f"this server already has {max_connections} open connections; "
                         "retry after the Retry-After delay")
    head = ("HTTP/1.1 503 Service Unavailable\r\n"
            "content-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\n"
            "retry-after: 1\r\n"
            "connection: close\r\n\r\n")
    return head.encode("ascii") + body


class _BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of ``bounds`` (a class attribute)."""

    bounds: ConnectionBounds = ConnectionBounds()
    _overloaded: bytes = b""
    # Slots, not instance-dict entries: uvicorn's protocol already fills its instance dict to a
    # resize threshold, and one more key there costs ~1.5 KB per connection (measured,
    # bench/notes/waiters.md).
    __slots__ = ("_deadline", "_stall", "_refused", "_on_lost", "_lost", "_parked", "_running",
                 "_late", "_late_cycle")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(getattr(self, "pipeline", None), deque):
            self.pipeline = _Pipeline()  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._refused = False
        self._on_lost: Any = None  # the disconnect watch's callback
        self._lost = False
        self._parked: Any = None  # the scope of the request whose ASGI call parked it
        self._running: Any = None  # the cycle whose ASGI call runs now
        self._late: Any = None  # the parked request's answer(task) and its cycle
        self._late_cycle: Any = None

    # --- disconnect watch -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[DISCONNECT_WATCH] = self._watch_lost  # type: ignore[literal-required]
        if self._deadline is None:  # a pipelined request after a complete one: its own clock
            self._arm(self.bounds.request_timeout_s)

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a new request's cycle; nothing waits on its event yet
            _lighten(self.cycle, "message_event")

    def _watch_lost(self, callback: Any) -> bool:
        if self._lost:
            return False
        self._on_lost = callback
        return True

    # --- parking: the answer is sent after the ASGI call has ended ----------------------------

    def _park(self, scope: Any, task: asyncio.Future[Any],
              answer: Callable[[asyncio.Future[Any]], Awaitable[None]],
              context: contextvars.Context | None = None) -> None:
        """Called by the app of the request of ``scope`` (module docstring): it returns
        unanswered; once ``task`` is done, ``answer(task)`` (run in ``context``) sends the
        answer."""
        cycle = self._running
        assert cycle is not None and cycle.scope is scope
        self._parked = scope
        self.tasks.add(task)
        self._late, self._late_cycle = answer, cycle
        task.add_done_callback(self._answer_parked, context=context)  # one: no callback list
        keys = _PARKED_SCOPE if self.access_log else _PARKED_SCOPE_QUIET
        kept = {key: scope[key] for key in keys if key in scope}
        scope.clear()  # in place: the cycle and the app's ``send`` hold this same dict
        scope.update(kept)
        if self.scope is scope:  # no pipelined request began: its parse state is not needed
            self.headers = _NO_HEADERS  # type: ignore[assignment]
            self.url = b""

    def _answer_parked(self, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        self._on_lost = None  # the parked request's disconnect watch ends with its wait
        cycle, answer = self._late_cycle, self._late
        self._late = self._late_cycle = None
        sending = self.loop.create_task(self._finish(cycle, answer(task)))
        self.tasks.add(sending)
        sending.add_done_callback(self.tasks.discard)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if self.config.reset_contextvars:
            task = self.loop.create_task(self._run_asgi(cycle, app), context=contextvars.Context())
        else:
            task = self.loop.create_task(self._run_asgi(cycle, app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _run_asgi(self, cycle: Any, app: Any) -> None:
        """uvicorn's ``RequestResponseCycle.run_asgi``, except that an app that parked its
        request returns without an answer and leaves the cycle to the late answer."""
        self._running = cycle
        try:
            await self._finish(cycle, app(cycle.scope, cycle.receive, cycle.send))
        finally:
            if self._running is cycle:  # not already a pipelined request's that started
                self._running = None

    async def _finish(self, cycle: Any, call: Awaitable[Any]) -> None:
        """Await ``call`` (the app, or a parked request's late answer) and check, as uvicorn
        does, that it answered: an exception is logged and answered 500 (or the connection
        closed if the answer had started)."""
        parked = False
        try:
            result = await call
        except BaseException as exc:
            cycle.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not cycle.response_started:
                await cycle.send_500_response()
            else:
                cycle.transport.close()
        else:
            parked = self._parked is cycle.scope
            if parked:
                self._parked = None
            elif result is not None:
                cycle.logger.error("ASGI callable should return None, but returned '%s'.", result)
                cycle.transport.close()
            elif not cycle.response_started and not cycle.disconnected:
                cycle.logger.error("ASGI callable returned without starting response.")
                await cycle.send_500_response()
            elif not cycle.response_complete and not cycle.disconnected:
                cycle.logger.error("ASGI callable returned without completing response.")
                cycle.transport.close()
        finally:
            if not parked:
                cycle.on_response = _nothing

    # --- time to send a request -------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._request_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _request_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.debug("closing a connection from %s: no whole request within %.1f s",
                      _peer(self.client), self.bounds.request_timeout_s)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over = len(self.connections) >= self.bounds.max_connections
        super().connection_made(transport)
        _lighten(getattr(self, "flow", None), "_is_writable_event")
        sock = transport.get_extra_info("socket")
        if sock is not None and self.bounds.send_buffer_bytes:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.bounds.send_buffer_bytes)
        if over:
            self._refused = True
            self._arm(min(_REFUSE_GRACE_S, self.bounds.request_timeout_s))
            return
        self._arm(self.bounds.request_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if not self.transport.is_closing():
                log.debug("refusing a connection from %s: %d connections are open",
                          _peer(self.client), self.bounds.max_connections)
                self.transport.write(self._overloaded)
                self.transport.close()
            return
        super().data_received(data)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._arm(self.bounds.request_timeout_s)  # answered early: idle, wait for the next
        else:
            self._disarm()  # whole: the handler may take as long as it needs (a waiting acquire)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self._deadline is None and not self.transport.is_closing():
            self._arm(self.bounds.request_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        super().connection_lost(exc)
        self._lost = True
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()

    # --- a client that does not read ------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.bounds.write_timeout_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        if not self.transport.is_closing():
            log.debug("dropping a connection from %s: it read nothing for %.1f s",
                      _peer(self.client), self.bounds.write_timeout_s)
            self.transport.abort()


class _LeanEvent(asyncio.Event):
    """An ``asyncio.Event`` whose list of waiters is made on the first ``wait()``: the deque
    ``asyncio.Event`` makes up front is ~0.6 KB, and uvicorn keeps two events per connection
    (flow control, the request cycle's) that are almost never waited on."""

    def __init__(self) -> None:
        self._waiters = ()  # type: ignore[assignment]
        self._value = False

    async def wait(self) -> Literal[True]:
        if not self._value and not self._waiters:
            self._waiters = []  # type: ignore[assignment]
        return await super().wait()


def _lighten(owner: Any, attribute: str) -> None:
    """Replace ``owner.attribute``, a plain ``asyncio.Event`` nobody waits on yet, with a
    ``_LeanEvent`` in the same state (nothing, if uvicorn's internals are not as expected)."""
    event = getattr(owner, attribute, None)
    if type(event) is asyncio.Event and not event._waiters:
        lean = _LeanEvent()
        if event.is_set():
            lean.set()
        setattr(owner, attribute, lean)


class _Pipeline(list):  # type: ignore[type-arg]
    """uvicorn's queue of pipelined requests (``appendleft``, ``pop``, truth) as a list: an
    empty deque is ~0.6 KB per connection, an empty list 56 bytes."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


_PARKED_SCOPE = ("type", "http_version", "method", "path", "raw_path", "query_string", "client")
"""What a parked request's scope keeps: what writing, logging and counting its answer read."""
_PARKED_SCOPE_QUIET = ("type", "method", "path")  # the same without uvicorn's access log
_NO_HEADERS: tuple[Any, ...] = ()  # on_message_begin gives the next request a list of its own


_CAN_PARK = hasattr(HttpToolsProtocol, "_start_asgi_task")
"""uvicorn starts each request's ASGI call through this method, which parking overrides."""


def _nothing() -> None:
    pass


def parker(scope: Any) -> Any:
    """The ``park(task, answer, context=None)`` function of the request of ``scope`` (module
    docstring) when it is served by lockd's HTTP protocol and its ASGI call is running, else
    ``None``."""
    protocol = getattr(scope.get(DISCONNECT_WATCH), "__self__", None)
    if not isinstance(protocol, _BoundedProtocol) or not _CAN_PARK:
        return None
    running = protocol._running  # the request must be the one whose ASGI call runs now
    return partial(protocol._park, scope) if running is not None and running.scope is scope else None


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "-"


def bounded_protocol(bounds: ConnectionBounds) -> type[asyncio.Protocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)`` to enforce ``bounds``."""
    return type("BoundedHttpToolsProtocol", (_BoundedProtocol,),
                {"bounds": bounds, "_overloaded": _overloaded_response(bounds.max_connections)})


def descriptor_warning(max_connections: int, spare: int = 64) -> str | None:
    """A warning if ``max_connections`` plus ``spare`` descriptors (store connections, files,
    the listening socket) exceed this process's ``RLIMIT_NOFILE``: then a flood exhausts the
    descriptors before the cap answers 503. ``None`` when the limit leaves room."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or max_connections + spare <= soft:
        return None
    return (f"max_connections ({max_connections}) leaves fewer than {spare} of the "
            f"{soft} file descriptors this process may open (ulimit -n): lower it or raise "
            "the limit")
