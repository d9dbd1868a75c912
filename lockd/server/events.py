"""Lock events (acquired, released, expired) fanned out to Server-Sent Events streams.

An ``Event`` carries ``id`` (increasing per lockd process), ``type``, ``lock``, ``fence``,
``owner``, ``ttl_ms`` (acquired: the TTL granted) and ``at`` (unix ms); ``released`` events of
a force-release have ``forced: true``; events of a shared lease have ``mode: "shared"``, those
of a semaphore permit ``mode: "permit"``, name its slot's lock (``sem/{name}/{slot}``) and
carry ``semaphore`` (its name, what access is judged on). Never a lease id or a token. ``audit`` events
(``publish_audit``: an admin action or a burst of scope denials, ``lockd.server.audit``) carry
``id``, ``type``, ``at`` and the audit entry's fields, and go to admin streams only.

Which events a stream shows: those THIS lockd process saw (see ``lockd.server.observe``): grants,
releases and force-releases it served, expiries of leases it granted or renewed, and releases
made at another replica of leases it granted (learned from the store's release notification,
PostgreSQL NOTIFY / etcd watch). A lease granted and released entirely at another replica is
only on that replica's streams: watch every replica for the full picture.

Streams (``EventHub.stream``): an event is serialised ONCE, when it is published, and the same
bytes go to every stream. ``publish`` only appends to each matching stream's bounded queue
(``queue_size``) and wakes it; a stream writes what piled up at most every ``flush_s`` (default
100 ms) as one chunk, so a burst of events costs each stream one wake-up and one write, not one
per event. A stream whose client falls ``queue_size`` events behind (it does not read, so its
writes are blocked) is DROPPED at once: publishing stops paying for it, it gets ``event:
overflow`` with ``{"dropped": n}`` as its last event, and the stream ends (an ``EventSource``
reconnects with ``Last-Event-ID`` and is replayed what is still in the history). A client that
reads nothing at all is disconnected by the server's write timeout
(``lockd.common.serving.connections``). A comment line (``: keepalive``) is sent every ``heartbeat_s``
of silence so proxies do not cut idle streams. A reconnecting ``EventSource`` sends
``Last-Event-ID``; the events after it still in the recent history (``history`` events) are
replayed first (an overflow event says so when some are gone). ``close()`` ends every stream
(lockd calls it when it stops, so open streams do not hold up a graceful shutdown).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from lockd.common.namespace import token_name

__all__ = ["Event", "EventHub"]

_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(frozen=True, slots=True)
class Event:
    """One lock event; ``data()`` is what a stream client sees, ``sse()`` its SSE bytes, made
    when a stream first sends it and then shared by every stream (most events are never
    streamed: encoding each on publish cost a JSON encode per grant and per release)."""

    id: int
    type: str
    lock: str
    fence: int | None
    owner: str | None
    ttl_ms: int | None
    at: int
    forced: bool = False
    audit: dict[str, Any] | None = field(default=None, compare=False)
    mode: str | None = None
    wire: bytes = field(default=b"", repr=False, compare=False)

    def data(self) -> dict[str, Any]:
        if self.audit is not None:
            return {"id": self.id, "type": self.type, "at": self.at, **self.audit}
        doc: dict[str, Any] = {"id": self.id, "type": self.type, "lock": self.lock,
                               "fence": self.fence, "owner": self.owner, "ttl_ms": self.ttl_ms,
                               "at": self.at}
        if self.forced:
            doc["forced"] = True
        if self.mode in ("shared", "permit"):
            doc["mode"] = self.mode
        if self.mode == "permit" and (owned := token_name(self.lock)) is not None:
            doc[owned[0].kind] = owned[1]  # "semaphore": the name its access is judged on
        return doc

    def _encode(self) -> bytes:
        payload = _COMPACT(self.data())
        return f"id: {self.id}\nevent: {self.type}\ndata: {payload}\n\n".encode()

    def sse(self) -> bytes:
        wire = self.wire
        if not wire:
            wire = self._encode()
            object.__setattr__(self, "wire", wire)
        return wire


@dataclass(eq=False, slots=True)
class _Subscriber:
    match: Callable[[str], bool]
    audit: bool = False
    pending: deque[Event] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: int = 0  # > 0: this stream fell behind and was dropped
    closed: bool = False


class EventHub:
    """Publishes events to subscribers; keeps the last ``history`` events.

    ``queue_size``: events one stream may lag by before it is dropped (default 256).
    ``on_drop``: called once per dropped stream (for a metric). ``flush_s``: how often at most a
    stream writes (its events are batched). ``publish`` never blocks and costs O(streams) cheap
    appends; serialising is done once.
    """

    def __init__(self, *, history: int = 256, queue_size: int = 256,
                 on_drop: Callable[[], None] | None = None,
                 on_streams: Callable[[int], None] | None = None, flush_s: float = 0.1):
        self._seq = 0
        self._history: deque[Event] = deque(maxlen=history)
        self._subscribers: set[_Subscriber] = set()
        self._queue_size = queue_size
        self._on_drop = on_drop
        self._on_streams = on_streams
        self._flush_s = flush_s
        self._closed = False

    @property
    def streams(self) -> int:
        return len(self._subscribers)

    def publish(self, type_: str, lock: str, fence: int | None, owner: str | None,
                ttl_ms: int | None = None, *, forced: bool = False,
                mode: str | None = None) -> Event:
        """Record an event and offer it to every matching stream (dropping any that is full).
        ``mode``: the lease's (``shared`` and ``permit`` show in the event)."""
        self._seq += 1
        event = Event(self._seq, type_, lock, fence, owner, ttl_ms, int(time.time() * 1000),
                      forced, mode=mode)
        self._history.append(event)
        return self._offer(event)

    def publish_audit(self, entry: dict[str, Any]) -> Event:
        """Record an ``audit`` event (``entry``: an audit entry's fields) for admin streams only."""
        self._seq += 1
        event = Event(self._seq, "audit", str(entry.get("target", "")), None, None, None,
                      int(time.time() * 1000), audit=entry)
        self._history.append(event)
        return self._offer(event)

    def _offer(self, event: Event) -> Event:
        full: list[_Subscriber] = []
        lock, audit = event.lock, event.audit is not None
        for sub in self._subscribers:
            if (sub.audit if audit else sub.match(lock)):
                if len(sub.pending) >= self._queue_size:
                    full.append(sub)
                    continue
                sub.pending.append(event)
                if not sub.wake.is_set():
                    sub.wake.set()
        for sub in full:
            self._drop(sub)
        return event

    def _drop(self, sub: _Subscriber) -> None:
        sub.dropped = 1  # the event that did not fit; later ones never reach this stream
        self._subscribers.discard(sub)
        sub.wake.set()
        if self._on_drop is not None:
            self._on_drop()
        if self._on_streams is not None:
            self._on_streams(len(self._subscribers))

    def recent(self, match: Callable[[str], bool], limit: int, *,
               audit: bool = False) -> list[Event]:
        """The last ``limit`` events (oldest first) whose lock ``match`` accepts (and the audit
        events, with ``audit``)."""
        if limit <= 0:
            return []
        picked = [e for e in reversed(self._history) if _wants(e, match, audit)][:limit]
        return picked[::-1]

    def _after(self, match: Callable[[str], bool], last_id: int,
               audit: bool) -> tuple[list[Event], bool]:
        """Events after ``last_id`` still in history, and whether some were already gone."""
        events = [e for e in self._history if e.id > last_id and _wants(e, match, audit)]
        oldest = self._history[0].id if self._history else self._seq + 1
        return events, last_id + 1 < oldest and last_id < self._seq

    def close(self) -> None:
        """End every stream (and refuse new ones)."""
        self._closed = True
        for sub in list(self._subscribers):
            sub.closed = True
            sub.wake.set()

    async def stream(self, match: Callable[[str], bool], *, history: int = 0,
                     last_event_id: int | None = None, heartbeat_s: float = 15.0,
                     audit: bool = False) -> AsyncIterator[bytes]:
        """The SSE byte stream of the events ``match`` accepts (see the module docstring);
        with ``audit`` (an admin's stream) the audit events too."""
        sub = _Subscriber(match, audit)
        if self._closed:
            return
        self._subscribers.add(sub)
        if self._on_streams is not None:
            self._on_streams(len(self._subscribers))
        gap = False
        if last_event_id is not None:
            replay, gap = self._after(match, last_event_id, audit)
        else:
            replay = self.recent(match, history, audit=audit)
        seen = replay[-1].id if replay else self._seq  # later events arrive through the queue
        try:
            yield b"retry: 2000\n: connected\n\n"
            if gap:
                yield _overflow(0)
            if replay:
                yield b"".join(event.sse() for event in replay)
            while not sub.closed:
                if not sub.pending and not sub.dropped:
                    try:
                        async with asyncio.timeout(heartbeat_s):
                            await sub.wake.wait()
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    if self._flush_s > 0 and not sub.closed and not sub.dropped:
                        await asyncio.sleep(self._flush_s)  # let a burst pile up: one write
                sub.wake.clear()
                batch = [e.sse() for e in sub.pending if e.id > seen]
                if sub.pending:
                    seen = max(seen, sub.pending[-1].id)
                sub.pending.clear()
                if sub.dropped:
                    batch.append(_overflow(sub.dropped))
                if batch:
                    yield b"".join(batch)
                if sub.dropped:
                    return
        finally:
            if sub in self._subscribers:
                self._subscribers.discard(sub)
                if self._on_streams is not None:
                    self._on_streams(len(self._subscribers))


def _wants(event: Event, match: Callable[[str], bool], audit: bool) -> bool:
    return audit if event.audit is not None else match(event.lock)


def _overflow(dropped: int) -> bytes:
    return (b"event: overflow\ndata: "
            + json.dumps({"dropped": dropped}).encode()
            + b"\n\n")
