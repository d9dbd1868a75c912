"""The I/O-free rules of semaphores and elections, on top of ``ClientCore``'s (``core.py``).

A permit and a leader's lease are acquired, renewed and released by the same step rules as a
lock's lease (``ClientCore._acquire_steps`` with a ``Route``, ``_renewal_steps``,
``_release_steps``); what is added here is where those requests go, the requests only these
primitives have (proclaim, handover), and the resume rule of ``observe`` (``ObserveCursor``).
"""

from __future__ import annotations

from typing import Any

from lockd.client.core import ClientCore, Route, Send, Steps
from lockd.client.errors import LeaseLostError
from lockd.client.leadership import ElectionEvent
from lockd.client.wire import SseEvent, election_path, sem_path

__all__ = ["PrimitivesCore", "ObserveCursor", "OBSERVED_KINDS"]

OBSERVED_KINDS = ("state", "leader", "proclaim", "resign")
"""The SSE event types of ``GET /v1/elections/{name}/observe`` that ``observe()`` yields."""


def check_limit(limit: Any) -> int:
    """A semaphore's ``limit``: an int (``TypeError`` otherwise; lockd checks the range, 1-10000)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int number of permits, got {limit!r}")
    return limit


def check_value(value: Any) -> str:
    """An election value: a str (``TypeError`` otherwise; lockd checks its size, 4096 bytes)."""
    if not isinstance(value, str):
        raise TypeError(f"value must be a str, got {value!r}")
    return value


class PrimitivesCore(ClientCore):
    """``ClientCore`` plus the routes and rules of semaphores and elections."""

    def _permit_steps(self, name: str, limit: int, ttl: float, wait: float | None,
                      owner: str | None, client_id: str | None, renew_every: float | None, *,
                      raise_timeout: bool) -> Steps[tuple[float, Any] | None]:
        """Acquire one permit of semaphore ``name`` (``limit`` permits) within ``wait`` seconds:
        the rule of ``_acquire_steps`` (``LockNotAcquired`` while full is retried within the
        wait; ``LimitMismatch`` is not)."""
        path = sem_path(name)
        route = Route(path + "/acquire", path + "/renew", {"limit": check_limit(limit)},
                      f"semaphore {name!r}")
        return self._acquire_steps(name, ttl, wait, owner, client_id, renew_every,
                                   raise_timeout=raise_timeout, route=route)

    def _campaign_steps(self, name: str, value: str, ttl: float, wait: float | None,
                        owner: str | None, client_id: str | None, renew_every: float | None, *,
                        raise_timeout: bool) -> Steps[tuple[float, Any] | None]:
        """Campaign in election ``name`` with ``value`` until leading, within ``wait`` seconds
        (the rule of ``_acquire_steps``)."""
        path = election_path(name)
        route = Route(path + "/campaign", path + "/renew", {"value": check_value(value)},
                      f"election {name!r}", held_by="led by")
        return self._acquire_steps(name, ttl, wait, owner, client_id, renew_every,
                                   raise_timeout=raise_timeout, route=route)

    def _proclaim_steps(self, lease: Any, value: str) -> Steps[Any]:
        """Set the leader's value (same lease, same fence): lockd's answer (``{election, owner,
        value, fence, seq}``). A lease not live here raises ``LeaseLostError`` without asking;
        a 410 marks it lost."""
        check_value(value)
        lease.check()
        try:
            body = yield Send("POST", lease._path("proclaim"),
                              json={"lease_id": lease.lease_id, "value": value})
        except LeaseLostError as exc:
            lease._mark_lost(exc)
            raise
        lease.value = value
        return body

    @staticmethod
    def _handover_send(name: str, target: str, lease_id: str | None) -> Send:
        """Ask the leader of ``name`` to hand over to ``target`` (an owner label, or ``"next"``):
        an admin's request, or the leader's own when ``lease_id`` is its lease."""
        if not isinstance(target, str) or not target:
            raise TypeError(f"target must be an owner label or 'next', got {target!r}")
        body: dict[str, Any] = {"target": target}
        if lease_id is not None:
            body["lease_id"] = lease_id
        return Send("POST", election_path(name) + "/handover", json=body)


class ObserveCursor:
    """The resume rule of ``observe(name)``: the path and ``Last-Event-ID`` of each connection,
    which events to yield, and the pause before reconnecting.

    The first connection (without ``last_event_id``) yields the ``state`` event, then every
    change. A reconnect sends ``Last-Event-ID`` = the last ``seq`` seen, so lockd replays what
    came after it; entries already yielded are skipped, and so is a ``state`` no newer than
    them (lockd sends a newer one when its log no longer has every entry missed: the state
    stands in for them). The pause
    before a reconnect doubles from 50 ms to 2 s while connections fail or end without an event.
    """

    def __init__(self, name: str, last_event_id: int | None = None):
        self.name = name
        self.path = election_path(name) + "/observe"
        if last_event_id is not None and (isinstance(last_event_id, bool)
                                          or not isinstance(last_event_id, int)):
            raise TypeError(f"last_event_id must be an int seq, got {last_event_id!r}")
        self.last_seq: int | None = last_event_id
        self._pause = 0.05

    def headers(self) -> dict[str, str]:
        """The headers of the next connection (``Last-Event-ID`` once a seq is known)."""
        return {} if self.last_seq is None else {"Last-Event-ID": str(self.last_seq)}

    def take(self, sse: SseEvent) -> ElectionEvent | None:
        """The ``ElectionEvent`` to yield for ``sse``, or ``None`` to skip it."""
        if sse.type not in OBSERVED_KINDS:
            return None  # overflow notices, unknown future types: the resume covers them
        event = ElectionEvent.from_sse(sse, self.name)
        self._pause = 0.05
        if event.kind == "state":
            if self.last_seq is not None and event.seq <= self.last_seq:
                return None  # resuming: nothing new, the log replay says what changes next
            self.last_seq = event.seq  # a first state, or the log lost entries we missed
            return event
        if self.last_seq is not None and event.seq <= self.last_seq:
            return None
        self.last_seq = event.seq
        return event

    def pause(self) -> float:
        """Seconds to wait before the next connection (grows while nothing arrives)."""
        pause = self._pause
        self._pause = min(self._pause * 2, 2.0)
        return pause
