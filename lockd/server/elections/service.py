"""Leader election: campaign, renew, resign, proclaim, handover, read and observe.

The leader IS the exclusive holder of lock ``name`` (the ``ElectionStore``): its fence is the
lock's, and its token an ordinary single-lock token of ``name`` from the core's signer. A
campaign waits in lock ``name``'s queue (candidates and acquires of one name wait in one line);
observers read the store's log in ``seq`` order. docs/primitives.md ("Elections") and
docs/internals.md ("Elections") say how handover, observe and the list work.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lockd.common.namespace import ELECTION
from lockd.server.core.base import Core, new_lease_id
from lockd.server.core.names import check_name
from lockd.server.core.waiting import Waiter, WaitQueues
from lockd.server.errors import (
    ClientIdConflict,
    InvalidRequest,
    LeaseLost,
    LockHeld,
    NoLeader,
    StoreUnavailable,
)
from lockd.server.metrics import LockdMetrics
from lockd.server.store.values import (
    EXCLUSIVE,
    MULTI_PREFIX,
    SHARED_PREFIX,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
)

__all__ = ["MAX_VALUE_BYTES", "ElectionService", "Leadership", "NoLeader"]

log = logging.getLogger(__name__)

MAX_VALUE_BYTES = 4096
_LOG_BATCH = 256  # log entries read (and written to a stream) at once
_KNOWN_MAX = 1000  # elections remembered for the status page list
_KNOWN_FRESH_S = 5.0  # longest a listed election is shown without a store read
_CACHE_MAX = 10_000


@dataclass(slots=True)
class _Known:
    """A listed election: its state as last read (``None``: never read), when (monotonic
    seconds), until when it is shown without a read, and whether it changed since."""

    state: ElectionState | None = None
    read_at: float = 0.0
    fresh_until: float = 0.0
    changed: bool = True


@dataclass(frozen=True, slots=True)
class Leadership:
    """A leader's lease as the API returns it; ``handover_to`` is set on renewals only."""

    election: str
    lease_id: str
    fence: int
    token: str
    ttl_ms: int
    owner: str
    value: str | None = None
    handover_to: str | None = None

    def body(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"election": self.election, "lock": self.election,
                               "lease_id": self.lease_id, "fence": self.fence,
                               "token": self.token, "ttl_ms": self.ttl_ms, "owner": self.owner}
        if self.value is not None:
            doc["value"] = self.value
        else:
            doc["handover_requested"] = self.handover_to is not None
            doc["handover_to"] = self.handover_to
        return doc


class _Candidate(Waiter):
    """A campaign as the wait queues see it: an exclusive waiter for lock ``name`` that also
    carries the value it leads with."""

    __slots__ = ("value",)

    def __init__(self, name: str, lease_id: str, ttl_ms: int, owner: str,
                 client_id: str | None, value: str) -> None:
        super().__init__((name,), lease_id, ttl_ms, owner, client_id)
        self.value = value


class _Campaign:
    """A campaign as the wait queues ask it (``waiting.Kind``): ``elect_campaign`` of one lock."""

    __slots__ = ("_elections",)

    def __init__(self, elections: ElectionService) -> None:
        self._elections = elections

    async def ask(self, waiter: _Candidate) -> Grant | list[Holder]:
        result = await self._elections.store.elect_campaign(
            waiter.locks[0], lease_id=waiter.lease_id, ttl_ms=waiter.ttl_ms,
            owner=waiter.owner, client_id=waiter.client_id, value=waiter.value)
        return [result] if isinstance(result, Holder) else result

    async def release(self, grant: Grant) -> None:
        """A grant nobody will receive (the candidate disconnected): resign it at once."""
        await self._elections.resign(grant.lock, grant.lease_id)

    @staticmethod
    def holder(grant: Grant, lock: str) -> Holder:
        return Holder(lock, grant.owner, grant.ttl_ms, grant.fence)

    @staticmethod
    def refused(holders: list[Holder]) -> LockHeld:
        holder = holders[0]
        return _led(holder.lock, holder.owner, holder.ttl_ms)

    async def held_behind_queue(self, locks: tuple[str, ...], waited: bool) -> LockHeld:
        (name,) = locks
        state = await self._elections.store.get(name)
        owner, ttl_ms = state.owner or "", state.ttl_ms
        if waited:
            return _led(name, owner, ttl_ms)
        return _led(name, owner, ttl_ms,
                    f"election {name!r} is led or being handed over; "
                    f"{self._elections.waiting.count(name)} candidate(s) are queued ahead")


def _led(name: str, owner: str, ttl_ms: int, detail: str | None = None) -> LockHeld:
    """409 ``held``: the election is led by ``owner`` for another ``ttl_ms``."""
    return LockHeld(detail or f"election {name!r} is led by {owner!r} for another "
                    f"{max(0, ttl_ms)} ms", lock=name, election=name, owner=owner,
                    ttl_ms=max(0, ttl_ms))


def state_doc(state: ElectionState) -> dict[str, Any]:
    """``state`` as the API shows it (no lease id; ``waiters`` are added by the caller)."""
    leader = state.leader
    return {"election": state.name,
            "leader": None if leader is None else {"owner": leader.owner,
                                                   "ttl_ms": max(0, leader.ttl_ms)},
            "value": state.value, "fence": state.fence, "seq": state.seq,
            "handover_to": state.handover}


def _sse(event_id: int, kind: str, doc: dict[str, Any]) -> bytes:
    payload = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


def _entry_sse(name: str, entry: ElectionEvent) -> bytes:
    return _sse(entry.seq, entry.kind, {"election": name, "seq": entry.seq, "kind": entry.kind,
                                        "owner": entry.owner, "value": entry.value,
                                        "fence": entry.fence})


class ElectionService:
    """Elections on ``core`` (see the module docstring). ``metrics`` (optional) counts leader
    changes, terms and handovers. Errors: ``InvalidRequest`` (name, TTL, wait, value over 4096
    bytes, target), ``LockHeld``, ``LeaseLost``, ``NoLeader``, ``ClientIdConflict``,
    ``StoreUnavailable``. Durations are integer milliseconds."""

    def __init__(self, core: Core, metrics: LockdMetrics | None = None) -> None:
        self.core = core
        self.store = core.store
        # The locks' own queues: candidates and acquires of ``name`` wait in one line.
        self.waiting: WaitQueues = core.waiting
        self._metrics = metrics
        self._campaign = _Campaign(self)
        self._terms: dict[str, tuple[str, float]] = {}  # name -> (lease id, monotonic start)
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._known: OrderedDict[str, _Known] = OrderedDict()  # least recently led first
        self._closed = False
        self.streams = 0
        self.store.subscribe(self._notified)

    # --- checks ---------------------------------------------------------------------------------

    @staticmethod
    def check_name(name: str) -> None:
        """The namespace's rule for an election's name (``lockd.server.core.names``): every
        election route calls it, reads included."""
        check_name(name, ELECTION)

    @staticmethod
    def _check_lease_id(name: str, lease_id: str) -> None:
        """``LeaseLost`` for a lease id that can never be a leader's: a multi-lock lease's or a
        shared lease's (lockd draws those with their prefixes), so no election route renews,
        resigns or proclaims with a lease the store holds in another shape."""
        if lease_id.startswith((MULTI_PREFIX, SHARED_PREFIX)):
            raise LeaseLost(f"that lease is not the live leader of election {name!r}",
                            lock=name)

    @staticmethod
    def check_value(value: str) -> None:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_VALUE_BYTES:
            raise InvalidRequest(f"value must be at most {MAX_VALUE_BYTES} bytes of UTF-8 "
                                 f"(got {size})")

    @staticmethod
    def check_target(target: str) -> None:
        if not target or len(target) > 255 or not target.isprintable():
            raise InvalidRequest("target must be a candidate's owner (1-255 printable "
                                 "characters) or \"next\"")

    def _remember(self, name: str) -> None:
        """``name`` was led through this lockd just now (granted or renewed): listed, most
        recent last, and re-read at the next list."""
        known = self._known
        entry = known.get(name)
        if entry is None:
            if len(known) >= _KNOWN_MAX:
                known.popitem(last=False)
            entry = known[name] = _Known()
        else:
            known.move_to_end(name)
        entry.changed = True

    # --- leases ---------------------------------------------------------------------------------

    def _leadership(self, grant: Grant, *, value: str | None = None,
                    handover_to: str | None = None) -> Leadership:
        """The leader's lease and token: a single-lock token of the election's lock, signed by
        the core's one signer in the mode of the STORE's grant. A leader holds the lock
        exclusively, so any other grant is refused (``ClientIdConflict``), never signed."""
        if grant.mode != EXCLUSIVE:
            raise ClientIdConflict(
                f"the client_id holds election {grant.lock!r}'s lock {grant.mode}, not as its "
                "leader; campaign with another client_id", lock=grant.lock,
                election=grant.lock, held_mode=grant.mode)
        self._remember(grant.lock)
        return Leadership(grant.lock, grant.lease_id, grant.fence,
                          self.core.signer.token(grant.lock, grant.fence, grant.mode, ELECTION),
                          grant.ttl_ms, grant.owner, value, handover_to)

    async def campaign(self, name: str, *, value: str, ttl_ms: int, wait_ms: int = 0,
                       owner: str = "", client_id: str | None = None) -> Leadership:
        """Lead ``name`` with ``value``, waiting up to ``wait_ms`` behind earlier candidates.
        Raises ``LockHeld`` if not elected in time, ``InvalidRequest``, ``StoreUnavailable``."""
        self.check_name(name)
        self.check_value(value)
        self.core.check_ttl(ttl_ms)
        self.core.check_wait(wait_ms)
        waiter = _Candidate(name, new_lease_id(), ttl_ms, owner, client_id, value)
        grant: Grant = await self.waiting.acquire(self._campaign, waiter, wait_ms)
        if grant.lease_id == waiter.lease_id:  # a new term (not a client_id retry)
            self._new_term(name, grant.lease_id)
        self._wake(name)
        return self._leadership(grant, value=value)

    async def renew(self, name: str, lease_id: str, ttl_ms: int | None = None) -> Leadership:
        """Extend the leader's lease (same fence and token); the answer says whether a handover
        is wanted. Raises ``LeaseLost`` if ``lease_id`` is not the live leader."""
        self.check_name(name)
        self._check_lease_id(name, lease_id)
        if ttl_ms is not None:
            self.core.check_ttl(ttl_ms)
        grant, handover_to = await self.store.elect_renew(name, lease_id, ttl_ms)
        # the store's word on the handover (it may have been asked at another replica): a
        # candidate it names that is queued here goes first; none named, none preferred
        self.waiting.prefer(name, handover_to)
        return self._leadership(grant, handover_to=handover_to)

    async def resign(self, name: str, lease_id: str) -> None:
        """End the leader's lease; the next candidate (the preferred one, after a handover) is
        elected at once. Raises ``LeaseLost``."""
        self.check_name(name)
        self._check_lease_id(name, lease_id)
        await self.store.elect_resign(name, lease_id)
        self.waiting.may_be_free(name)
        self._end_term(name, lease_id)
        self._wake(name)

    async def proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """Set the leader's value without a new term (same fence). Raises ``LeaseLost``."""
        self.check_name(name)
        self.check_value(value)
        self._check_lease_id(name, lease_id)
        state = await self.store.elect_proclaim(name, lease_id, value)
        self._wake(name)
        return state

    async def handover(self, name: str, target: str, lease_id: str | None) -> ElectionState:
        """Ask the leader to step down in favour of ``target`` (an owner, or ``"next"``).

        With ``lease_id``, only if it is the live leader's lease (renewed by the check; else
        ``LeaseLost``); without, the caller is an admin (the route checks) and ``NoLeader``
        when nobody leads."""
        self.check_name(name)
        self.check_target(target)
        if lease_id is not None:
            self._check_lease_id(name, lease_id)
            await self.store.elect_renew(name, lease_id, None)
        try:
            state = await self.store.elect_handover(name, target)
        except LeaseLost:
            if lease_id is not None:
                raise
            raise NoLeader(f"nobody leads election {name!r}: there is no one to hand over "
                           "from", election=name) from None
        self.waiting.prefer(name, target)
        if self._metrics is not None:
            self._metrics.election_handovers.inc()
        self._wake(name)
        return state

    # --- terms (metrics) ------------------------------------------------------------------------

    def _new_term(self, name: str, lease_id: str) -> None:
        self.waiting.prefer(name, None)  # the store cleared the handover with the new term
        now = time.monotonic()
        old = self._terms.pop(name, None)
        if self._metrics is not None:
            self._metrics.election_leader_changes.inc()
            if old is not None:  # the last term here lapsed unresigned: it ended by now
                self._metrics.election_term.observe(now - old[1])
        if len(self._terms) >= _CACHE_MAX:
            self._terms.clear()
        self._terms[name] = (lease_id, now)

    def _end_term(self, name: str, lease_id: str) -> None:
        term = self._terms.get(name)
        if term is not None and term[0] == lease_id:
            del self._terms[name]
            if self._metrics is not None:
                self._metrics.election_term.observe(time.monotonic() - term[1])

    # --- reading --------------------------------------------------------------------------------

    async def get(self, name: str) -> dict[str, Any]:
        """The election now and the candidates waiting at this lockd (``waiting_owners``: their
        owners, head first)."""
        self.check_name(name)
        state = await self.store.elect_get(name)
        return {**state_doc(state), "waiters": self.waiting.count(name),
                "waiting_owners": self.waiting.owners(name)}

    async def known(self, visible: Any = None) -> list[dict[str, Any]]:
        """``get`` of every election led through this lockd (name order; see the module
        docstring) that ``visible(name)`` accepts (``None``: all), each read from the store
        only if it may have changed since the last list (a leader's ``ttl_ms`` is then what
        is left of it now)."""
        items = []
        for name in sorted(n for n in self._known if visible is None or visible(n)):
            entry = self._known.get(name)
            if entry is None:
                continue  # dropped while an earlier one was read
            now = time.monotonic()
            if entry.changed or entry.state is None or now >= entry.fresh_until:
                entry.changed = False
                state = await self.store.elect_get(name)
                now = time.monotonic()
                entry.state, entry.read_at = state, now
                left_s = state.leader.ttl_ms / 1000 if state.leader else _KNOWN_FRESH_S
                entry.fresh_until = now + min(left_s, _KNOWN_FRESH_S)
            doc = state_doc(entry.state)
            if doc["leader"] is not None:
                elapsed_ms = int((now - entry.read_at) * 1000)
                doc["leader"]["ttl_ms"] = max(0, doc["leader"]["ttl_ms"] - elapsed_ms)
            items.append({**doc, "waiters": self.waiting.count(name),
                          "waiting_owners": self.waiting.owners(name)})
        return items

    # --- observe --------------------------------------------------------------------------------

    def _notified(self, name: str) -> None:
        """Store listener: an election write (or a release) of ``name``, here or elsewhere."""
        self._wake(name)

    def _wake(self, name: str) -> None:
        """``name`` changed (a write here, or the store said so): wake its observers, re-read
        it at the next list."""
        entry = self._known.get(name)
        if entry is not None:
            entry.changed = True
        for wake in self._watchers.get(name, ()):
            wake.set()

    async def start_observing(self, name: str,
                              last_event_id: int | None) -> tuple[ElectionState | None, int]:
        """What a new stream starts from: the state to send first (``None``: none, a resumed
        stream) and the ``seq`` after which it reads the log. One store read; raises
        ``StoreUnavailable`` (before the stream begins, so the client gets a 503)."""
        self.check_name(name)
        if last_event_id is not None:
            entries = await self.store.elect_log(name, last_event_id, 1)
            if entries and entries[0].seq == last_event_id + 1:
                return None, last_event_id  # the log still has everything missed
            if not entries:
                state = await self.store.elect_get(name)
                if state.seq >= last_event_id:
                    return None, last_event_id  # nothing missed
                return state, state.seq  # an id this election never reached: start afresh
        state = await self.store.elect_get(name)  # a fresh stream, or a gap in the log
        return state, state.seq

    async def observe(self, name: str, state: ElectionState | None, after: int, *,
                      heartbeat_s: float) -> AsyncIterator[bytes]:
        """The SSE bytes of one observer (see the module docstring); ends at ``close()`` or
        when the store stops answering (the client resumes with ``Last-Event-ID``)."""
        wake = asyncio.Event()
        self._watchers.setdefault(name, set()).add(wake)
        self.streams += 1
        try:
            yield b"retry: 2000\n: connected\n\n"
            if state is not None:
                yield _sse(state.seq, "state", state_doc(state))
            while not self._closed:
                wake.clear()  # before reading: a write during the read wakes the next wait
                try:
                    entries = await self.store.elect_log(name, after, _LOG_BATCH)
                    if entries and entries[0].seq > after + 1:  # the log was trimmed past us
                        state = await self.store.elect_get(name)
                        yield _sse(state.seq, "state", state_doc(state))
                        after = state.seq
                        continue
                except StoreUnavailable as exc:
                    log.info("election stream of %r ends: %s", name, exc.detail)
                    return
                if entries:
                    after = entries[-1].seq
                    yield b"".join(_entry_sse(name, e) for e in entries)
                    continue
                if self._closed:
                    return
                try:
                    async with asyncio.timeout(heartbeat_s):
                        await wake.wait()
                except TimeoutError:
                    yield b": keepalive\n\n"
        finally:
            self.streams -= 1
            watchers = self._watchers.get(name)
            if watchers is not None:
                watchers.discard(wake)
                if not watchers:
                    del self._watchers[name]

    def close(self) -> None:
        """End every observe stream (lockd is stopping) and refuse new ones."""
        self._closed = True
        for watchers in self._watchers.values():
            for wake in watchers:
                wake.set()

    @property
    def closed(self) -> bool:
        return self._closed
