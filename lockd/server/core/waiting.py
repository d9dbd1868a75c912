"""Waiting acquires: one FIFO queue per lock name, in memory, for every kind of request.

A request names a set of locks (a single lock is the set of one) and waits as one ``Waiter`` in
the queue of each; the store decides every grant, the queues decide who asks it next. A waiter
holds no connection, no thread and no task of its own (bench/notes/waiters.md). A mode is a rule
function (``_admits``, ``_admitted``), not another queue; a request kind (``Kind``: a lock, a
set, a permit, a campaign) supplies the store call and the shape of a refusal. The rules, with
their reasons: docs/waiting.md.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from collections.abc import Awaitable, Iterable, Mapping
from functools import partial
from itertools import islice
from typing import Any, Protocol

from lockd.server.errors import LockdError, LockHeld, StoreUnavailable
from lockd.server.store.base import Store
from lockd.server.store.values import EXCLUSIVE, SHARED, Holder

__all__ = ["PERMIT", "Deadlines", "Kind", "WaitQueues", "Waiter"]

PERMIT = "permit"
"""The mode of a semaphore waiter (its queue is the semaphore's: ``sem_key(name)``)."""

log = logging.getLogger(__name__)

Queue = dict["Waiter", None]
"""One lock's waiters in arrival order (a dict: ordered, O(1) removal from the middle)."""


class Waiter:
    """One acquire request as the queues see it: the set of locks it asks for, what it asks the
    store, and its place in line.

    ``turn``: it may have become allowed to ask the store; ``wake``: one of its locks may have
    freed; ``hint``: the holders a waiter just granted handed over. Two flags and, only while it
    sleeps, one future and a timeout (an entry of the queues' ``Deadlines``); not
    ``asyncio.Event``s (each an object and a deque, ~0.7 KB) nor an ``asyncio.timeout`` nor a
    timer handle each (~0.5 KB): thousands may be queued."""

    __slots__ = ("locks", "lease_id", "ttl_ms", "owner", "client_id", "mode", "limit", "hint",
                 "turn", "wake", "_future", "_on")

    def __init__(self, locks: tuple[str, ...], lease_id: str, ttl_ms: int, owner: str = "",
                 client_id: str | None = None, mode: str | Mapping[str, str] = EXCLUSIVE,
                 limit: int = 0) -> None:
        self.locks = locks
        # EXCLUSIVE, SHARED or PERMIT for every lock of the set, or a mapping lock -> mode
        # (a multi-lock set mixing modes; a lock it does not name is exclusive)
        self.mode = mode
        self.limit = limit  # PERMIT: the semaphore's limit, the waiters its queue admits
        self.lease_id = lease_id
        self.ttl_ms = ttl_ms
        self.owner = owner  # shown by GET /v1/locks/{name} (waiting_owners)
        self.client_id = client_id
        self.hint: list[Holder] | None = None
        self.turn = False
        self.wake = False
        self._future: asyncio.Future[None] | None = None
        self._on = ""  # the flag the sleeping waiter waits for: "turn" or "wake"

    def set_turn(self) -> None:
        self.turn = True
        if self._on == "turn":
            self._resolve()

    def set_wake(self) -> None:
        self.wake = True
        if self._on == "wake":
            self._resolve()

    def _resolve(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def nap(self, flag: str, seconds: float, deadlines: Deadlines) -> asyncio.Future[None] | None:
        """Sleep until ``flag`` (``"turn"`` or ``"wake"``) is set or ``seconds`` pass, without
        a coroutine of its own (one frame less per queued request): the future to await, then
        call ``woke()`` (also on cancellation); ``None`` if ``flag`` is already set. The
        timeout is one entry of the shared ``deadlines`` (~0.1 KB, not a ~0.5 KB timer
        handle per sleeping waiter)."""
        if getattr(self, flag):
            return None
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        self._on = flag
        deadlines.add(loop, loop.time() + seconds, future)
        return future

    def woke(self) -> None:
        """End the ``nap`` (its ``Deadlines`` entry just goes stale)."""
        self._future = None
        self._on = ""

    @property
    def refused_asleep(self) -> bool:
        """Asleep until woken (after the store refused it, or behind one that was), with no
        wake-up pending: the semaphore is full as far as this waiter knows."""
        return self._on == "wake" and not self.wake


class Deadlines:
    """One event-loop timer for many sleeping waiters: a heap of ``(when, n, future)`` (loop
    time, seconds), the timer armed for the earliest; when it fires, every due future not yet
    done is resolved. A future resolved or cancelled earlier stays in the heap as a stale entry
    until its time; when the heap outgrows twice its size after the last clean-up (at least
    1,024 entries), the stale entries are dropped in one pass (amortised O(1) per ``add``)."""

    __slots__ = ("_heap", "_loop", "_timer", "_at", "_count", "_limit")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._at = math.inf
        self._count = itertools.count()
        self._limit = 1024

    def add(self, loop: asyncio.AbstractEventLoop, when: float,
            future: asyncio.Future[None]) -> None:
        """Resolve ``future`` at ``when`` (``loop.time()``) unless it is done by then."""
        if loop is not self._loop:  # a new event loop (tests): the old entries are moot
            self._loop, self._heap, self._timer, self._at = loop, [], None, math.inf
        heap = self._heap
        if len(heap) >= self._limit:
            heap[:] = [entry for entry in heap if not entry[2].done()]
            heapq.heapify(heap)
            self._limit = max(1024, 2 * len(heap))
        heapq.heappush(heap, (when, next(self._count), future))
        if when < self._at:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        assert self._loop is not None
        heap, now = self._heap, self._loop.time() + 0.001  # the loop's clock: ms resolution
        while heap and heap[0][0] <= now:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
        while heap and heap[0][2].done():  # do not wake up for stale entries
            heapq.heappop(heap)
        if heap:
            self._arm(heap[0][0])


class Kind(Protocol):
    """What differs between kinds of request (one lock, a set): the store calls, and how a
    refusal reads. A grant is whatever the store grants (it has ``lease_id``); a refusal is the
    list of holders in the way."""

    def ask(self, waiter: Waiter) -> Awaitable[Any]:
        """One store acquire for ``waiter``: its grant, or a ``list[Holder]``."""

    async def release(self, grant: Any) -> None:
        """Release ``grant`` (ending it wakes the next waiters). Raises ``LockdError``."""

    def holder(self, grant: Any, lock: str) -> Holder:
        """``grant`` as the holder of ``lock`` (the handoff hint for the next head)."""

    def refused(self, holders: list[Holder]) -> LockHeld:
        """The 409 after the store refused."""

    async def held_behind_queue(self, locks: tuple[str, ...], waited: bool) -> LockHeld:
        """The 409 of a request that never reached the store for waiters ahead of it
        (``waited``: after its ``wait_ms``; else at once, with ``wait_ms == 0``)."""


# --- the grant rule: who may ask the store now (rule 4, by mode) --------------------------------


def mode_of(waiter: Waiter, lock: str) -> str:
    """``waiter``'s mode on ``lock``: EXCLUSIVE, SHARED or PERMIT."""
    mode = waiter.mode
    return mode if isinstance(mode, str) else mode.get(lock, EXCLUSIVE)


def _admits(queue: Queue, waiter: Waiter, lock: str) -> bool:
    """Whether ``queue`` (of ``lock``) lets ``waiter`` ask the store: an exclusive waiter when
    it heads the queue; a shared one when every waiter ahead of it is shared on ``lock`` too; a
    semaphore waiter when fewer than its ``limit`` waiters are ahead of it."""
    mode = mode_of(waiter, lock)
    if mode == EXCLUSIVE:
        return next(iter(queue)) is waiter
    if mode == SHARED:
        for ahead in queue:
            if ahead is waiter:
                return True
            if mode_of(ahead, lock) != SHARED:
                return False
        return False
    for ahead in islice(queue, waiter.limit):
        if ahead is waiter:
            return True
    return False


def _admitted(queue: Queue, lock: str) -> list[Waiter]:
    """The waiters ``queue`` (of ``lock``) lets ask now (promoted when one before them leaves,
    woken when the lock may have freed): its head; if the head is shared, the run of shared
    waiters from the head; on a semaphore queue the first ``limit`` (the head's)."""
    head = next(iter(queue))
    mode = mode_of(head, lock)
    if mode == EXCLUSIVE:
        return [head]
    if mode == PERMIT:
        return [w for i, w in enumerate(islice(queue, head.limit)) if i < w.limit]
    run = []
    for waiter in queue:
        if mode_of(waiter, lock) != SHARED:
            break
        run.append(waiter)
    return run


def _excludes(holder: Holder, waiter: Waiter, lock: str) -> bool:
    """Whether ``holder`` (a lease just granted) refuses ``waiter`` on ``lock``: only then is it
    a useful handoff hint (a shared grant does not refuse the next shared waiter)."""
    return holder.mode == EXCLUSIVE or mode_of(waiter, lock) == EXCLUSIVE


def _behind_refused(queue: Queue, waiter: Waiter) -> bool:
    """Whether a waiter ahead of ``waiter`` in ``queue`` sleeps refused (``refused_asleep``):
    then a permit waiter does not ask the store until woken, or it could take the next freed
    permit before the one ahead of it (the release wakes the first not woken; a grant's leave
    wakes the next)."""
    for ahead in queue:
        if ahead is waiter:
            return False
        if ahead.refused_asleep:
            return True
    return False


def _wake_one(admitted: list[Waiter]) -> None:
    """Wake the first of ``admitted`` not already woken (one that is asking the store now asks
    again if refused, so a permit freed during its call is not missed)."""
    for waiter in admitted:
        if not waiter.wake:
            waiter.set_wake()
            return


def _soonest(holders: list[Holder]) -> float:
    """Seconds until the first of ``holders`` expires (at least 1 ms)."""
    if len(holders) == 1:
        return max(holders[0].ttl_ms, 1) / 1000
    return min((max(h.ttl_ms, 1) for h in holders), default=1) / 1000


class WaitQueues:
    """The queues of one lockd process and the rules that serve them (module docstring).

    ``queues`` maps each lock name that has waiters to its queue; read it, do not change it.
    ``may_be_free`` is the store's release listener and the local release hook."""

    def __init__(self, store: Store) -> None:
        self.queues: dict[str, Queue] = {}
        self.closing = False
        self.preferred: dict[str, str] = {}  # lock name -> the owner its queue admits first
        self._background: set[asyncio.Task[Any]] = set()
        self._deadlines = Deadlines()
        store.subscribe(self.may_be_free)

    # --- acquiring ------------------------------------------------------------------------------

    async def acquire(self, kind: Kind, waiter: Waiter, wait_ms: int) -> Any:
        """``waiter``'s grant, asked of the store when the rules let it, waiting up to
        ``wait_ms`` ms. Raises ``LockHeld`` (from ``kind``) and ``StoreUnavailable``.

        One coroutine for the whole wait, sleeping in ``Waiter.nap`` (not ``sleep``): each
        frame costs a queued request ~0.3 KB."""
        if self.queued(waiter.locks):  # rule 2
            if waiter.client_id:
                retried = await self._retry(kind, waiter)
                if retried is not None:
                    return retried
            if wait_ms == 0 or self.closing:
                if not self._admitted_at_tail(waiter):
                    raise await kind.held_behind_queue(waiter.locks, False)
                result = await kind.ask(waiter)  # e.g. a reader behind readers only
                if isinstance(result, list):
                    raise kind.refused(result)
                return result
        elif wait_ms == 0 or self.closing:  # rule 1
            result = await kind.ask(waiter)
            if isinstance(result, list):
                raise kind.refused(result)
            return result
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        queues = self.queues
        for name in waiter.locks:  # rule 3: one step, so every queue agrees with arrival order
            queues.setdefault(name, {})[waiter] = None
        if self.preferred and self.preferred.get(waiter.locks[0]) == waiter.owner:
            self._promote(waiter.locks[0])  # an election's handover target goes first
        granted = None
        try:
            while True:
                if self.closing:
                    raise StoreUnavailable("lockd is shutting down; retry the acquire")
                if not self._admitted_by_all(waiter):
                    waiter.hint = None  # a hint is good only at the moment it is handed over
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise await kind.held_behind_queue(waiter.locks, True)
                    waiter.turn = False  # set again by _leave when a waiter ahead goes
                    nap = waiter.nap("turn", remaining, self._deadlines)
                    if nap is not None:
                        try:
                            await nap
                        finally:
                            waiter.woke()
                    continue
                # Rule 4: admitted by every queue, the only local waiter for these locks that
                # asks the store (unless the waiter granted before it said who holds them now).
                holders = None if waiter.wake else waiter.hint
                waiter.hint = None
                if holders is None and waiter.mode == PERMIT and not waiter.wake \
                        and _behind_refused(queues[waiter.locks[0]], waiter):
                    holders = []  # behind a refused waiter: asleep until woken, not asking
                elif holders is None:
                    waiter.wake = False
                    result = await self._ask(kind, waiter)
                    if not isinstance(result, list):
                        granted = result
                        return result
                    holders = result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise kind.refused(holders) if holders else \
                        await kind.held_behind_queue(waiter.locks, True)
                nap = waiter.nap("wake", min(remaining, _soonest(holders)) if holders
                                 else remaining, self._deadlines)
                if nap is not None:
                    try:
                        await nap
                    finally:
                        waiter.woke()
        finally:
            self._leave(kind, waiter, granted)

    def queued(self, locks: Iterable[str]) -> bool:
        """Whether any of ``locks`` has waiters queued here."""
        queues = self.queues
        return any(queues.get(name) for name in locks)

    async def _retry(self, kind: Kind, waiter: Waiter) -> Any:
        """With waiters queued: the live lease of ``waiter.client_id`` (a retried acquire)."""
        result = await self._ask(kind, waiter)
        if isinstance(result, list):
            return None
        if result.lease_id != waiter.lease_id or not self.queued(waiter.locks):
            return result  # the same client's live lease, or nobody queued any more
        # The locks were free for an instant during a handoff: they belong to the queues.
        await self._release_quietly(kind, result)
        return None

    def _admitted_at_tail(self, waiter: Waiter) -> bool:
        """Whether every queue of ``waiter``'s set would let it ask at once if it joined the
        tail (a shared request behind shared ones only; a permit behind fewer than ``limit``,
        none of them refused): then a request that does not wait may ask the store without
        passing anyone."""
        queues = self.queues
        for name in waiter.locks:
            queue = queues.get(name)
            if not queue:
                continue
            mode = mode_of(waiter, name)
            if mode == EXCLUSIVE:
                return False
            if mode == PERMIT:
                if len(queue) >= waiter.limit or any(w.refused_asleep for w in queue):
                    return False
            else:
                for ahead in queue:
                    if mode_of(ahead, name) != SHARED:
                        return False
        return True

    def _admitted_by_all(self, waiter: Waiter) -> bool:
        """Whether every queue of ``waiter``'s set lets it ask the store (rule 4). A loop, not
        ``all(...)``: a generator would keep a closure cell in every waiting frame."""
        queues = self.queues
        for name in waiter.locks:
            if not _admits(queues[name], waiter, name):
                return False
        return True

    def _leave(self, kind: Kind, waiter: Waiter, granted: Any) -> None:
        """Take ``waiter`` out of every queue; promote the next of each it was admitted by,
        handing it the new holder when ``waiter`` leaves with a grant that excludes it (rule
        5). Leaving a semaphore queue wakes the next admitted waiter (module docstring)."""
        queues = self.queues
        for name in waiter.locks:
            queue = queues[name]
            was_admitted = _admits(queue, waiter, name)
            del queue[waiter]
            if not queue:
                del queues[name]
                continue
            if not was_admitted:
                continue
            admitted = _admitted(queue, name)
            if mode_of(waiter, name) == PERMIT:  # a permit refuses nobody: no hint
                for promoted in admitted:
                    promoted.set_turn()
                _wake_one(admitted)
                continue
            holder = None if granted is None else kind.holder(granted, name)
            for promoted in admitted:
                promoted.hint = ([holder] if holder is not None
                                 and _excludes(holder, promoted, name) else None)
                promoted.set_turn()

    # --- the store, shielded from disconnects (rule 6) -------------------------------------------

    async def _ask(self, kind: Kind, waiter: Waiter) -> Any:
        """``kind.ask`` that survives the caller's cancellation: a grant nobody will receive
        (the client disconnected mid-call) is released instead of blocking its locks until its
        TTL."""
        task = asyncio.ensure_future(kind.ask(waiter))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(partial(self._orphaned, kind, waiter.lease_id))
            raise

    def _orphaned(self, kind: Kind, lease_id: str, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if not isinstance(result, list) and result.lease_id == lease_id:
            background = asyncio.ensure_future(self._release_quietly(kind, result))
            self._background.add(background)
            background.add_done_callback(self._background.discard)

    @staticmethod
    async def _release_quietly(kind: Kind, grant: Any) -> None:
        try:
            await kind.release(grant)
        except LockdError as exc:
            log.warning("could not release an unclaimed lease: %s", exc.detail)

    # --- preference: an election's handover target goes first ------------------------------------

    def prefer(self, name: str, owner: str | None) -> None:
        """Admit the first waiter of ``name`` labelled ``owner`` before the others (an election's
        handover target): it moves to the head of the queue now, or when it joins later, until
        ``prefer(name, None)``. ``None`` and ``"next"`` (the head is next anyway) clear it.

        Only a waiter for ``name`` alone moves: a multi-lock waiter keeps its place, so every
        queue still agrees on the order of the waiters that span several (rule 3)."""
        if owner is None or owner == "next":
            self.preferred.pop(name, None)
            return
        if self.preferred.get(name) == owner:
            return
        if len(self.preferred) >= 10_000:  # one per election with a pending handover: be safe
            self.preferred.clear()
        self.preferred[name] = owner
        self._promote(name)

    def _promote(self, name: str) -> None:
        """Move the preferred waiter of ``name`` (if queued here) to the head and let it ask."""
        owner = self.preferred.get(name)
        queue = self.queues.get(name)
        if owner is None or not queue:
            return
        chosen = next((w for w in queue if w.owner == owner and len(w.locks) == 1), None)
        if chosen is None or next(iter(queue)) is chosen:
            return
        rest = [w for w in queue if w is not chosen]
        queue.clear()  # in place: the same dict stays the queue of ``name``
        queue[chosen] = None
        queue.update(dict.fromkeys(rest))
        chosen.hint = None
        chosen.set_turn()  # the old head finds itself behind at its next wake-up and waits

    # --- wake-ups -------------------------------------------------------------------------------

    def may_be_free(self, name: str) -> None:
        """Store listener and local hook: ``name`` may have just freed; wake whom its queue's
        rule admits."""
        queue = self.queues.get(name)
        if queue:
            admitted = _admitted(queue, name)
            if mode_of(admitted[0], name) == PERMIT:
                _wake_one(admitted)  # a release frees one permit
                return
            for waiter in admitted:
                waiter.set_wake()

    def shutdown(self) -> None:
        """Answer every queued request with 503 now; later ones only ask the store once."""
        self.closing = True
        for queue in list(self.queues.values()):
            for waiter in queue:
                waiter.set_turn()
                waiter.set_wake()

    # --- reading --------------------------------------------------------------------------------

    def owners(self, name: str) -> list[str]:
        """The ``owner`` labels of the waiters queued for ``name``, in arrival order."""
        return [waiter.owner for waiter in self.queues.get(name) or ()]

    def by_mode(self) -> dict[str, int]:
        """How many requests are queued, by mode (a metric): ``permit`` for semaphores,
        ``shared`` for a request shared on every lock of its set, else ``exclusive``."""
        counts = {EXCLUSIVE: 0, SHARED: 0, PERMIT: 0}
        for waiter in {waiter for queue in self.queues.values() for waiter in queue}:
            mode = waiter.mode
            if not isinstance(mode, str):
                mode = SHARED if all(mode.get(n) == SHARED for n in waiter.locks) else EXCLUSIVE
            counts[mode] += 1
        return counts

    def count(self, name: str) -> int:
        """How many waiters are queued for ``name``."""
        return len(self.queues.get(name) or ())

    def total(self) -> int:
        """How many requests are queued, over all locks (a set queued on several counts once)."""
        return len({waiter for queue in self.queues.values() for waiter in queue})
