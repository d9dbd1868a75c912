"""A leader's lease (``LeaderLease`` / ``AsyncLeaderLease``), the graceful handover rule, and what
an election shows (``ElectionStatus``, ``ElectionEvent``). No I/O here but the handover's own
thread or task, which asks the client to resign.

The leader of election ``name`` is the exclusive holder of lock ``name``: its lease is renewed,
lost and fenced like a lock's (the token's lock is ``name``, its fence strictly increases with
every new leader). Releasing it is resigning (``POST /v1/elections/{name}/resign``).

Graceful handover: when a renewal answers ``handover_requested`` (an admin, or this leader, asked
lockd to hand the lead to ``handover_to``: an owner, or ``"next"``), the lease sets its
``handover`` event, calls every ``on_handover(lease, target)`` callback once, and resigns when
they have returned or ``handover_grace`` seconds (default 5) have passed, whichever is first;
the candidate lockd prefers is granted next. Until then the lease is renewed as usual, so a
leader finishes or hands over its work while still leading.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lockd.client.errors import LockClientError, ProtocolError
from lockd.client.lease import (
    FINAL,
    AsyncLease,
    AsyncLeaseClient,
    Lease,
    LeaseRef,
    SyncLeaseClient,
)
from lockd.client.wire import SseEvent, check_leader_body, election_path

__all__ = [
    "LeaderLease",
    "AsyncLeaderLease",
    "ElectionStatus",
    "ElectionEvent",
    "DEFAULT_HANDOVER_GRACE",
]

log = logging.getLogger("lockd.client")

DEFAULT_HANDOVER_GRACE = 5.0
"""Seconds a leader waits for its ``on_handover`` callbacks before it resigns anyway."""


class _Leader:
    """What a leader's lease adds to ``Lease``/``AsyncLease``: ``election``, ``value`` (the last
    proclaimed), ``handover_to`` and the ``/v1/elections/...`` routes."""

    _parse = staticmethod(check_leader_body)
    election: str
    value: str
    handover_to: str | None
    handover_grace: float
    _mutex: threading.Lock
    _state: Any

    def _init_leader(self, body: Mapping[str, Any]) -> None:
        data = check_leader_body(body)
        self.election, self.value = data["election"], data["value"]
        self.handover_to = None
        """Whom lockd asked this leader to hand over to (an owner, or ``"next"``); ``None``
        until a renewal says so."""
        self.handover_grace = DEFAULT_HANDOVER_GRACE
        self._handover_callbacks: list[Callable[..., Any]] = []
        self._handover_started = False

    def _path(self, op: str) -> str:
        return election_path(self.election) + "/" + ("resign" if op == "release" else op)

    def ref(self) -> LeaseRef:
        base: Any = self
        return LeaseRef(self.election, base.lease_id, kind="election")

    def as_dict(self) -> dict[str, Any]:
        """The lease in the contract's shape (includes the secret ``lease_id``)."""
        base: Any = super()
        return {**base.as_dict(), "election": self.election, "value": self.value}

    def on_handover(self, callback: Callable[..., Any]) -> None:
        """Call ``callback(lease, target)`` once when lockd asks this leader to hand over; the
        lease resigns when it returns (or after ``handover_grace`` seconds)."""
        with self._mutex:
            if not self._handover_started:
                self._handover_callbacks.append(callback)
                return
        log.warning("on_handover of %r registered after the handover began: not called",
                    self.election)

    def _on_renewed(self, sent_at: float, body: Mapping[str, Any]) -> None:
        base: Any = super()
        base._on_renewed(sent_at, body)
        data = check_leader_body(body)
        if not data["handover_requested"]:
            return
        with self._mutex:
            if self._handover_started or self._state in FINAL:
                return
            self._handover_started = True
            self.handover_to = data["handover_to"] or "next"
            callbacks = list(self._handover_callbacks)
        log.info("leader of %r asked to hand over to %r; resigning within %g s",
                 self.election, self.handover_to, self.handover_grace)
        self._begin_handover(callbacks, self.handover_to)

    def _begin_handover(self, callbacks: list[Callable[..., Any]], target: str) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        base: Any = self
        return (f"{type(self).__name__}(election={self.election!r}, fence={base.fence}, "
                f"state={base._state.value!r}, ttl={base.ttl})")


class LeaderLease(_Leader, Lease):
    """A leader's lease from ``LockClient.campaign`` (or an ``Election``): a ``Lease`` (states,
    renewal thread, ``lost``, ``on_lost``, ``renew()``, ``release()`` = resign, ``with``).
    ``handover`` is a ``threading.Event`` set when lockd asks this leader to hand over;
    ``on_handover`` callbacks run in a thread of their own."""

    def __init__(self, client: SyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_leader(body)
        self.handover = threading.Event()

    def _begin_handover(self, callbacks: list[Callable[..., Any]], target: str) -> None:
        self.handover.set()
        threading.Thread(target=self._hand_over, args=(callbacks, target), daemon=True,
                         name=f"lockd-handover:{self.election}").start()

    def _hand_over(self, callbacks: list[Callable[..., Any]], target: str) -> None:
        if callbacks:
            worker = threading.Thread(target=_call_each, args=(callbacks, self, target),
                                      daemon=True, name=f"lockd-on-handover:{self.election}")
            worker.start()
            worker.join(self.handover_grace)
        _resign_quietly(self, lambda: self._client.release(self))

    def __enter__(self) -> LeaderLease:
        return self


class AsyncLeaderLease(_Leader, AsyncLease):
    """The ``AsyncLease`` twin of ``LeaderLease``: ``handover`` is an ``asyncio.Event``; an
    ``on_handover`` callback may be a coroutine function (cancelled when the grace ends)."""

    def __init__(self, client: AsyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_leader(body)
        self.handover = asyncio.Event()

    def _begin_handover(self, callbacks: list[Callable[..., Any]], target: str) -> None:
        self.handover.set()
        task = asyncio.ensure_future(self._hand_over(callbacks, target))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _hand_over(self, callbacks: list[Callable[..., Any]], target: str) -> None:
        async def run_all() -> None:
            for callback in callbacks:
                try:
                    result = callback(self, target)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("on_handover callback %r raised", callback)

        try:
            await asyncio.wait_for(run_all(), self.handover_grace)
        except TimeoutError:
            log.warning("on_handover of %r still running after %g s: resigning",
                        self.election, self.handover_grace)
        try:
            await self._client.release(self)
        except LockClientError as exc:
            log.warning("resign of %r after a handover failed: %s", self.election, exc.detail)

    async def __aenter__(self) -> AsyncLeaderLease:
        return self


def _call_each(callbacks: list[Callable[..., Any]], *args: Any) -> None:
    for callback in callbacks:
        try:
            callback(*args)
        except Exception:
            log.exception("on_handover callback %r raised", callback)


def _resign_quietly(lease: LeaderLease, resign: Callable[[], Any]) -> None:
    try:
        resign()
    except LockClientError as exc:
        log.warning("resign of %r after a handover failed: %s", lease.election, exc.detail)


@dataclass(frozen=True, slots=True)
class ElectionStatus:
    """``GET /v1/elections/{name}``: ``leader`` (its owner label; ``None``: nobody leads),
    ``value`` (the leader's, ``""`` without one), ``fence`` (the leader's, else the last issued),
    ``ttl`` (seconds left of the leader's lease), ``seq`` (the last change's number),
    ``handover_to`` (a pending handover's target), ``waiters`` and their owners at this lockd."""

    election: str
    leader: str | None
    value: str
    fence: int
    ttl: float
    seq: int
    handover_to: str | None = None
    waiters: int = 0
    waiting_owners: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: Any) -> ElectionStatus:
        try:
            leader = body.get("leader")
            return cls(election=str(body["election"]),
                       leader=None if leader is None else str(leader.get("owner") or ""),
                       value=str(body.get("value") or ""), fence=int(body.get("fence") or 0),
                       ttl=int((leader or {}).get("ttl_ms") or 0) / 1000,
                       seq=int(body.get("seq") or 0), handover_to=body.get("handover_to"),
                       waiters=int(body.get("waiters") or 0),
                       waiting_owners=tuple(map(str, body.get("waiting_owners") or ())))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed election status: {exc!r}") from exc

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``ttl_ms`` in milliseconds)."""
        leader = (None if self.leader is None else
                  {"owner": self.leader, "ttl_ms": round(self.ttl * 1000)})
        return {"election": self.election, "leader": leader, "value": self.value,
                "fence": self.fence, "seq": self.seq, "handover_to": self.handover_to,
                "waiters": self.waiters, "waiting_owners": list(self.waiting_owners)}


@dataclass(frozen=True, slots=True)
class ElectionEvent:
    """One change of an election, as ``observe()`` yields it. ``kind``: ``"state"`` (the
    election when observing began: ``owner`` ``None`` if nobody led), ``"leader"`` (a new
    leader, a new term: ``fence`` is its fence), ``"proclaim"`` (the same leader, a new
    ``value``) or ``"resign"`` (the leader let go; a leader whose lease lapsed shows up as the
    next ``"leader"``). ``seq`` strictly increases per election; the stream resumes after the
    last one seen, and when lockd's log no longer had what was missed, the next event is a
    ``"state"`` (the election as it is then) whose ``seq`` jumps past the gap."""

    kind: str
    seq: int
    owner: str | None
    value: str
    fence: int
    election: str = ""

    @classmethod
    def from_sse(cls, event: SseEvent, election: str) -> ElectionEvent:
        data = event.data
        try:
            if not isinstance(data, Mapping):
                raise TypeError("data is not an object")
            seq = data.get("seq")
            if seq is None and event.id is not None:
                seq = event.id
            if event.type == "state":
                leader = data.get("leader")
                owner = None if leader is None else str(leader.get("owner") or "")
            else:
                raw = data.get("owner")
                owner = None if raw is None else str(raw)
            return cls(kind=str(data.get("kind") or event.type), seq=int(seq or 0), owner=owner,
                       value=str(data.get("value") or ""), fence=int(data.get("fence") or 0),
                       election=str(data.get("election") or election))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed election event {event.type!r}: {exc!r}") from exc

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "seq": self.seq, "owner": self.owner, "value": self.value,
                "fence": self.fence, "election": self.election}
