"""The lock service: validation, lease ids, signed tokens, and the queue of waiters per lock.

The store decides who holds a lock; this module decides who asks next. Waiters live here, in
memory, as asyncio events: a waiting acquire holds no database connection and no thread.

Waiting, step by step (one queue per lock name, first come first served within this process):

1. A new acquire with nobody queued tries the store once. Granted: done. Held and
   ``wait_ms == 0``: 409. Otherwise it joins the queue.
2. With waiters queued, a new acquire never goes to the store ahead of them: ``wait_ms == 0``
   answers 409 at once (no barging), a waiting one joins the tail. (Exception: a retry with the
   ``client_id`` of the live lease gets that lease back, or it would wait on itself.)
3. Only the head of the queue talks to the store. It retries ``store.acquire`` when
   (a) a release of the lock is reported (released here: at once; elsewhere: the store's
   ``subscribe`` notification), or (b) the holder's remaining ``ttl_ms`` (from the ``Holder``
   the store returned) has run out. There is no polling loop.
4. A waiter that is granted, times out or is cancelled (its HTTP client went away) leaves the
   queue at once and promotes the next one, so nothing is left behind to delay it. A head that
   leaves with a grant passes the new holder's TTL to the next head, which sleeps on it without
   another store round trip.

Lockd processes sharing a store each keep their own queue: across processes the order is not
FCFS (whoever's head reaches the store first wins), but fences and mutual exclusion hold.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
from dataclasses import dataclass
from functools import partial
from typing import Any

from lockd.common.names import LOCK_NAME_RULE, is_lock_name
from lockd.server.errors import InvalidRequest, LockdError, LockHeld, StoreUnavailable
from lockd.server.schemas import PREFIX_RE
from lockd.server.settings import Settings
from lockd.server.store.base import Grant, Holder, LockState, Store
from lockd.tokens import KeyRing

__all__ = ["Lease", "LockService", "new_lease_id", "encode_cursor", "decode_cursor"]

log = logging.getLogger(__name__)

_TOKEN_CACHE_SIZE = 10_000
LIST_LIMIT_MAX = 1000


def new_lease_id() -> str:
    """An unguessable lease id: 192 random bits, URL-safe base64 (32 characters)."""
    return secrets.token_urlsafe(24)


def encode_cursor(last_name: str) -> str:
    """The opaque ``next_cursor`` for a page that ended at ``last_name``."""
    return base64.urlsafe_b64encode(last_name.encode()).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> str:
    """The last name of the previous page; ``InvalidRequest`` if ``cursor`` is not one of ours."""
    try:
        name = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("cursor is not valid; pass back next_cursor unchanged") from exc
    if not is_lock_name(name):
        raise InvalidRequest("cursor is not valid; pass back next_cursor unchanged")
    return name


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted or renewed lease, as the API returns it (``ttl_ms``: time left)."""

    lock: str
    lease_id: str
    fence: int
    token: str
    ttl_ms: int
    owner: str

    def body(self) -> dict[str, Any]:
        return {"lock": self.lock, "lease_id": self.lease_id, "fence": self.fence,
                "token": self.token, "ttl_ms": self.ttl_ms, "owner": self.owner}


class _Waiter:
    """One queued acquire. ``turn``: it became the head; ``wake``: the lock may have freed."""

    __slots__ = ("turn", "wake", "hint", "owner")

    def __init__(self, owner: str = "") -> None:
        self.owner = owner  # shown by GET /v1/locks/{name} (waiting_owners)
        self.turn = asyncio.Event()
        self.wake = asyncio.Event()
        self.hint: Holder | None = None  # the new holder, passed on by a head that was granted


async def _sleep(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` pass, whichever is first."""
    if event.is_set():
        return
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass


class LockService:
    """Everything lockd does, independent of HTTP. Durations are integer milliseconds.

    It takes no clock: expiry is the store's business (judged by the store's clock), and
    ``wait_ms`` deadlines run on the event loop's monotonic timer, which no wall-clock jump
    can shorten. Raises ``InvalidRequest`` (bad name/TTL/wait/cursor), ``LockHeld``,
    ``LeaseLost`` and ``StoreUnavailable``.
    """

    def __init__(self, store: Store, keyring: KeyRing, settings: Settings):
        self.store = store
        self.keyring = keyring
        self.settings = settings
        self._queues: dict[str, dict[_Waiter, None]] = {}
        self._tokens: dict[tuple[str, int], str] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False
        store.subscribe(self._may_be_free)

    # --- checks ---------------------------------------------------------------------------------

    @staticmethod
    def check_name(name: str) -> None:
        if not is_lock_name(name):
            raise InvalidRequest(LOCK_NAME_RULE, lock=name[:300])

    def _check_ttl(self, ttl_ms: int) -> None:
        low, high = self.settings.min_ttl_ms, self.settings.max_ttl_ms
        if not low <= ttl_ms <= high:
            raise InvalidRequest(f"ttl_ms must be between {low} and {high} (got {ttl_ms})")

    def _check_wait(self, wait_ms: int) -> None:
        high = self.settings.max_wait_ms
        if not 0 <= wait_ms <= high:
            raise InvalidRequest(f"wait_ms must be between 0 and {high} (got {wait_ms})")

    # --- leases ---------------------------------------------------------------------------------

    def _lease(self, grant: Grant) -> Lease:
        key = (grant.lock, grant.fence)
        token = self._tokens.get(key)
        if token is None:
            token = self.keyring.sign(grant.lock, grant.fence)
            if len(self._tokens) >= _TOKEN_CACHE_SIZE:
                del self._tokens[next(iter(self._tokens))]
            self._tokens[key] = token
        return Lease(grant.lock, grant.lease_id, grant.fence, token, grant.ttl_ms, grant.owner)

    @staticmethod
    def _held(lock: str, owner: str, ttl_ms: int, detail: str | None = None) -> LockHeld:
        return LockHeld(
            detail or f"lock {lock!r} is held by {owner!r} for another {ttl_ms} ms",
            lock=lock, owner=owner, ttl_ms=max(0, ttl_ms),
        )

    async def acquire(self, name: str, *, ttl_ms: int, wait_ms: int = 0, owner: str = "",
                      client_id: str | None = None) -> Lease:
        """Grant ``name`` for ``ttl_ms``, waiting up to ``wait_ms`` behind earlier waiters.

        Raises ``LockHeld`` if not granted in time, ``StoreUnavailable``, ``InvalidRequest``.
        """
        self.check_name(name)
        self._check_ttl(ttl_ms)
        self._check_wait(wait_ms)
        lease_id = new_lease_id()
        if self._queues.get(name):
            if client_id:
                retried = await self._retry(name, lease_id, ttl_ms, owner, client_id)
                if retried is not None:
                    return retried
            if wait_ms == 0 or self._closing:
                raise await self._held_behind_queue(name)
            return await self._wait(name, lease_id, ttl_ms, owner, client_id, wait_ms)
        if wait_ms == 0 or self._closing:
            result = await self.store.acquire(
                name, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner, client_id=client_id
            )
            if isinstance(result, Grant):
                return self._lease(result)
            raise self._held(name, result.owner, result.ttl_ms)
        return await self._wait(name, lease_id, ttl_ms, owner, client_id, wait_ms)

    async def _retry(self, name: str, lease_id: str, ttl_ms: int, owner: str,
                     client_id: str) -> Lease | None:
        """With waiters queued: return the live lease of ``client_id`` (a retried acquire)."""
        result = await self._store_acquire(name, lease_id, ttl_ms, owner, client_id)
        if not isinstance(result, Grant):
            return None
        if result.lease_id != lease_id or not self._queues.get(name):
            return self._lease(result)  # the same client's live lease, or nobody queued any more
        # The lock was free for an instant during a handoff: it belongs to the queue's head.
        await self._release_quietly(name, lease_id)
        return None

    async def _held_behind_queue(self, name: str) -> LockHeld:
        state = await self.store.get(name)
        waiting = len(self._queues.get(name) or ())
        return self._held(
            name, state.owner or "", state.ttl_ms,
            f"lock {name!r} is held or being handed over; {waiting} waiter(s) are queued ahead",
        )

    async def _wait(self, name: str, lease_id: str, ttl_ms: int, owner: str,
                    client_id: str | None, wait_ms: int) -> Lease:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        queue = self._queues.setdefault(name, {})
        waiter = _Waiter(owner)
        queue[waiter] = None
        handoff: Holder | None = None
        holder: Holder | None = None
        try:
            while True:
                if self._closing:
                    raise StoreUnavailable("lockd is shutting down; retry the acquire")
                if next(iter(queue)) is not waiter:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        state = await self.store.get(name)
                        raise self._held(name, state.owner or "", state.ttl_ms)
                    await _sleep(waiter.turn, remaining)
                    continue
                # The head of the queue: the only waiter that talks to the store.
                if holder is None and waiter.hint is not None and not waiter.wake.is_set():
                    holder = waiter.hint
                waiter.hint = None
                if holder is None:
                    waiter.wake.clear()
                    result = await self._store_acquire(name, lease_id, ttl_ms, owner, client_id)
                    if isinstance(result, Grant):
                        handoff = Holder(name, result.owner, result.ttl_ms, result.fence)
                        return self._lease(result)
                    holder = result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._held(name, holder.owner, holder.ttl_ms)
                await _sleep(waiter.wake, min(remaining, max(holder.ttl_ms, 1) / 1000))
                holder = None
        finally:
            self._leave(name, queue, waiter, handoff)

    def _leave(self, name: str, queue: dict[_Waiter, None], waiter: _Waiter,
               handoff: Holder | None) -> None:
        was_head = next(iter(queue)) is waiter
        del queue[waiter]
        if not queue:
            if self._queues.get(name) is queue:
                del self._queues[name]
            return
        if was_head:
            head = next(iter(queue))
            head.hint = handoff
            head.turn.set()

    async def _store_acquire(self, name: str, lease_id: str, ttl_ms: int, owner: str,
                             client_id: str | None) -> Grant | Holder:
        """``store.acquire`` that survives the caller's cancellation: a grant nobody will
        receive (the client disconnected mid-call) is released instead of blocking the lock
        until its TTL."""
        task = asyncio.ensure_future(self.store.acquire(
            name, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner, client_id=client_id
        ))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(partial(self._orphaned, name, lease_id))
            raise

    def _orphaned(self, name: str, lease_id: str, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if isinstance(result, Grant) and result.lease_id == lease_id:
            self._spawn(self._release_quietly(name, lease_id))

    def _spawn(self, coro: Any) -> None:
        background = asyncio.ensure_future(coro)
        self._background.add(background)
        background.add_done_callback(self._background.discard)

    async def _release_quietly(self, name: str, lease_id: str) -> None:
        try:
            await self.release(name, lease_id)
        except LockdError as exc:
            log.warning("could not release unclaimed lease of %r: %s", name, exc.detail)

    def _may_be_free(self, name: str) -> None:
        """Store listener and local hook: wake the head waiter of ``name``, if any."""
        queue = self._queues.get(name)
        if queue:
            next(iter(queue)).wake.set()

    async def renew(self, name: str, lease_id: str, ttl_ms: int | None = None) -> Lease:
        """Extend a live lease to ``ttl_ms`` from now (``None``: the lease's own TTL, the last
        one it was granted or renewed with).

        Same fence (and token). Raises ``LeaseLost`` if the lease is not live.
        """
        self.check_name(name)
        if ttl_ms is not None:
            self._check_ttl(ttl_ms)
        return self._lease(await self.store.renew(name, lease_id, ttl_ms))

    async def release(self, name: str, lease_id: str) -> None:
        """End a live lease and hand the lock to the head waiter at once. Raises ``LeaseLost``."""
        self.check_name(name)
        await self.store.release(name, lease_id)
        self._may_be_free(name)

    # --- reading --------------------------------------------------------------------------------

    def waiters(self, name: str) -> int:
        """How many acquires are queued for ``name`` at this lockd process."""
        return len(self._queues.get(name) or ())

    def waiting_owners(self, name: str) -> list[str]:
        """The ``owner`` labels of the acquires queued for ``name`` at this lockd process, head
        first (``""`` for an acquire that gave none). Other replicas' waiters are not included."""
        return [waiter.owner for waiter in self._queues.get(name) or ()]

    def waiting(self) -> int:
        """How many acquires are queued at this lockd process, over all locks (a metric)."""
        return sum(len(queue) for queue in self._queues.values())

    async def get(self, name: str) -> tuple[LockState, int]:
        """The store's view of ``name`` and the number of local waiters."""
        self.check_name(name)
        return await self.store.get(name), self.waiters(name)

    async def list(self, prefix: str = "", limit: int = 100,
                   cursor: str | None = None) -> tuple[list[tuple[LockState, int]], str | None]:
        """One page of locks whose name starts with ``prefix``, in name order, and the cursor
        of the next page (``None``: this was the last)."""
        if not PREFIX_RE.fullmatch(prefix):
            raise InvalidRequest("prefix must be at most 255 characters of A-Z a-z 0-9 . _ : / -")
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidRequest(f"limit must be between 1 and {LIST_LIMIT_MAX} (got {limit})")
        after = decode_cursor(cursor) if cursor else None
        states = await self.store.list(prefix, limit + 1, after)
        more = len(states) > limit
        states = states[:limit]
        next_cursor = encode_cursor(states[-1].lock) if more else None
        return [(s, self.waiters(s.lock)) for s in states], next_cursor

    async def ping(self) -> None:
        await self.store.ping()

    # --- shutdown -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Answer every queued acquire with 503 now (a lockd stopping must not keep clients
        waiting minutes); later acquires only try once."""
        self._closing = True
        for queue in list(self._queues.values()):
            for waiter in queue:
                waiter.turn.set()
                waiter.wake.set()
