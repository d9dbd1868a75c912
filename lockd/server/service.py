"""The lock service: validation, lease ids, signed tokens, and the queue of waiters per lock.

The store decides who holds a lock; this module decides who asks next. Waiters live here, in
memory, as small objects (two flags; a future and a timer only while asleep): a waiting
acquire holds no database connection, no thread and no task of its own.

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

Multi-lock leases (``acquire_many``) wait in the same queues, with no hold-and-wait:

5. A waiting multi-lock acquire joins the tail of the queue of EVERY lock it wants, in one step
   (no await in between), so the queues of all locks agree with arrival order here. It holds
   nothing while it waits. A later acquire of any of its locks (single or multi) queues behind
   it, exactly as in step 2.
6. It talks to the store only when it heads ALL its queues; then one atomic ``acquire_many``
   grants every lock or none. Refused, it sleeps until a release of any of its locks is
   reported or the shortest holder's TTL runs out, as in step 3.

Since every queue is ordered by arrival here, the earliest waiter heads all of its queues: within
one lockd process multi-lock acquires are first come, first served, and cannot deadlock (no
waiter holds anything another waits for). Across processes, each process's queues are FCFS among
its own waiters; a waiter at one replica can lose the race to the store to a later request at
another replica, any number of times, but never waits while holding a lock, so there is still no
deadlock, and its own queue position is never taken by a local latecomer.
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
from lockd.server.errors import (
    InvalidRequest,
    LeaseLost,
    LockdError,
    LockHeld,
    StoreUnavailable,
)
from lockd.server.schemas import PREFIX_RE
from lockd.server.settings import Settings
from lockd.server.store.base import (
    MULTI_PREFIX,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    Store,
)
from lockd.tokens import MAX_LOCKS, MAX_TOKEN_CHARS, KeyRing, multi_token_fits

__all__ = ["Lease", "LockService", "MultiLease", "new_lease_id", "encode_cursor",
           "decode_cursor"]

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


@dataclass(frozen=True, slots=True)
class MultiLease:
    """A granted or renewed multi-lock lease (``fences``: name -> fence, in name order)."""

    lease_id: str
    fences: dict[str, int]
    token: str
    ttl_ms: int
    owner: str

    def body(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id,
                "locks": [{"lock": name, "fence": fence} for name, fence in self.fences.items()],
                "token": self.token, "ttl_ms": self.ttl_ms, "owner": self.owner}


class _Waiter:
    """One queued acquire. ``turn``: it became the head; ``wake``: the lock may have freed.

    Two flags and, only while it sleeps, one future and one timer handle; not two
    ``asyncio.Event``s (each an object and a deque, ~0.7 KB) nor an ``asyncio.timeout``: a
    queued waiter lives as long as its wait, and thousands may be queued
    (bench/notes/waiters.md)."""

    __slots__ = ("owner", "hint", "turn", "wake", "_future", "_on")

    def __init__(self, owner: str = "") -> None:
        self.owner = owner  # shown by GET /v1/locks/{name} (waiting_owners)
        self.hint: Holder | None = None  # the new holder, passed on by a head that was granted
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

    async def sleep(self, flag: str, seconds: float) -> None:
        """Wait until ``flag`` (``"turn"`` or ``"wake"``) is set or ``seconds`` pass, on the
        event loop's monotonic timer."""
        if getattr(self, flag):
            return
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        self._on = flag
        timer = loop.call_later(seconds, _resolve_future, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None
            self._on = ""


def _resolve_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
        self._ordered = bool(getattr(store, "ordered", False))
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
                    await waiter.sleep("turn", remaining)
                    continue
                # The head of the queue: the only waiter that talks to the store.
                if holder is None and waiter.hint is not None and not waiter.wake:
                    holder = waiter.hint
                waiter.hint = None
                if holder is None:
                    waiter.wake = False
                    result = await self._store_acquire(name, lease_id, ttl_ms, owner, client_id)
                    if isinstance(result, Grant):
                        handoff = Holder(name, result.owner, result.ttl_ms, result.fence)
                        return self._lease(result)
                    holder = result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._held(name, holder.owner, holder.ttl_ms)
                await waiter.sleep("wake", min(remaining, max(holder.ttl_ms, 1) / 1000))
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
            head.set_turn()

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
            next(iter(queue)).set_wake()

    async def renew(self, name: str, lease_id: str, ttl_ms: int | None = None) -> Lease:
        """Extend a live lease to ``ttl_ms`` from now (``None``: the lease's own TTL, the last
        one it was granted or renewed with).

        Same fence (and token). Raises ``LeaseLost`` if the lease is not live.
        """
        self.check_name(name)
        self._check_single(lease_id)
        if ttl_ms is not None:
            self._check_ttl(ttl_ms)
        return self._lease(await self.store.renew(name, lease_id, ttl_ms))

    async def release(self, name: str, lease_id: str) -> None:
        """End a live lease and hand the lock to the head waiter at once. Raises ``LeaseLost``.

        On a store whose operations apply in call order (``ordered``: SQLite) the head is woken
        before the release is sent: it runs only once this task waits for the store, so its
        acquire is queued right behind the release, often into the same transaction (one fsync
        per handoff, not two). If the release fails, the head's acquire just finds the lock held
        and sleeps again: the store still decides every grant."""
        self.check_name(name)
        self._check_single(lease_id)
        released = self.store.release(name, lease_id)
        if self._ordered:
            self._may_be_free(name)
        await released
        self._may_be_free(name)

    @staticmethod
    def _check_single(lease_id: str) -> None:
        if lease_id.startswith(MULTI_PREFIX):
            raise InvalidRequest("lease_id is a multi-lock lease's: renew or release the whole set"
                                 " with POST /v1/leases/renew or /v1/leases/release")

    # --- multi-lock leases ----------------------------------------------------------------------

    def check_names(self, names: list[str]) -> tuple[str, ...]:
        """The distinct lock names of a multi-lock acquire, in name order (the order every
        store locks them in). ``InvalidRequest`` for none, more than ``MAX_LOCKS``, a bad name
        or a duplicate."""
        if not 1 <= len(names) <= MAX_LOCKS:
            raise InvalidRequest(f"locks must list 1 to {MAX_LOCKS} lock names (got {len(names)})")
        for name in names:
            self.check_name(name)
        ordered = tuple(sorted(set(names)))
        if len(ordered) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise InvalidRequest(f"locks must be distinct; repeated: {', '.join(dupes)}",
                                 locks=dupes)
        if not multi_token_fits(ordered):
            raise InvalidRequest(
                f"the lock names are too long for one token of at most {MAX_TOKEN_CHARS} "
                "characters (it travels in one header); use shorter names or fewer locks")
        return ordered

    def _multi_lease(self, grant: MultiGrant) -> MultiLease:
        key = (grant.lease_id, -1)  # the fences of a lease never change: one token per lease
        token = self._tokens.get(key)
        if token is None:
            token = self.keyring.sign_many(grant.fences)
            if len(self._tokens) >= _TOKEN_CACHE_SIZE:
                del self._tokens[next(iter(self._tokens))]
            self._tokens[key] = token
        return MultiLease(grant.lease_id, grant.fences, token, grant.ttl_ms, grant.owner)

    @staticmethod
    def _held_many(holders: list[Holder], detail: str | None = None) -> LockHeld:
        """409 naming every held lock and its holder (``ttl_ms``: the soonest expiry)."""
        listed = ", ".join(f"{h.lock!r} by {h.owner!r} for {max(0, h.ttl_ms)} ms" for h in holders)
        ttl = min((max(0, h.ttl_ms) for h in holders), default=0)
        return LockHeld(
            detail or f"held: {listed}",
            held=[{"lock": h.lock, "owner": h.owner, "ttl_ms": max(0, h.ttl_ms)} for h in holders],
            ttl_ms=ttl,
        )

    async def _held_many_behind_queue(self, locks: tuple[str, ...]) -> LockHeld:
        holders = []
        for name in locks:
            state = await self.store.get(name)
            if state.held:
                holders.append(Holder(name, state.owner or "", state.ttl_ms, state.fence))
        queued = sorted(n for n in locks if self._queues.get(n))
        detail = (f"locks {', '.join(queued)} have waiters queued ahead"
                  + ("; held: " + ", ".join(f"{h.lock!r} by {h.owner!r}" for h in holders)
                     if holders else ""))
        return self._held_many(holders, detail)

    async def acquire_many(self, names: list[str], *, ttl_ms: int, wait_ms: int = 0,
                           owner: str = "", client_id: str | None = None) -> MultiLease:
        """Grant every lock of ``names`` in one atomic store step, waiting up to ``wait_ms``
        behind earlier waiters of any of them (see the module docstring, steps 5-6).

        Raises ``LockHeld`` (naming every held lock), ``StoreUnavailable``, ``InvalidRequest``.
        """
        locks = self.check_names(names)
        self._check_ttl(ttl_ms)
        self._check_wait(wait_ms)
        lease_id = MULTI_PREFIX + new_lease_id()
        if any(self._queues.get(n) for n in locks):
            if client_id:
                retried = await self._retry_many(locks, lease_id, ttl_ms, owner, client_id)
                if retried is not None:
                    return retried
            if wait_ms == 0 or self._closing:
                raise await self._held_many_behind_queue(locks)
            return await self._wait_many(locks, lease_id, ttl_ms, owner, client_id, wait_ms)
        if wait_ms == 0 or self._closing:
            result = await self.store.acquire_many(locks, lease_id=lease_id, ttl_ms=ttl_ms,
                                                   owner=owner, client_id=client_id)
            if isinstance(result, MultiGrant):
                return self._multi_lease(result)
            raise self._held_many(result)
        return await self._wait_many(locks, lease_id, ttl_ms, owner, client_id, wait_ms)

    async def _retry_many(self, locks: tuple[str, ...], lease_id: str, ttl_ms: int, owner: str,
                          client_id: str) -> MultiLease | None:
        result = await self._store_acquire_many(locks, lease_id, ttl_ms, owner, client_id)
        if not isinstance(result, MultiGrant):
            return None
        if result.lease_id != lease_id or not any(self._queues.get(n) for n in locks):
            return self._multi_lease(result)
        await self._release_many_quietly(lease_id)  # free for an instant: the queues' turn
        return None

    async def _wait_many(self, locks: tuple[str, ...], lease_id: str, ttl_ms: int, owner: str,
                         client_id: str | None, wait_ms: int) -> MultiLease:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        waiter = _Waiter(owner)
        queues = [self._queues.setdefault(name, {}) for name in locks]
        for queue in queues:  # one step: every queue agrees with arrival order
            queue[waiter] = None
        holders: list[Holder] = []
        try:
            while True:
                if self._closing:
                    raise StoreUnavailable("lockd is shutting down; retry the acquire")
                waiter.hint = None
                if not all(next(iter(queue)) is waiter for queue in queues):
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise await self._held_many_behind_queue(locks)
                    waiter.turn = False  # set again by _leave when an earlier waiter goes
                    await waiter.sleep("turn", remaining)
                    continue
                # Heads every queue: the only local waiter for these locks that asks the store.
                waiter.wake = False
                result = await self._store_acquire_many(locks, lease_id, ttl_ms, owner,
                                                        client_id)
                if isinstance(result, MultiGrant):
                    return self._multi_lease(result)
                holders = result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._held_many(holders)
                soonest = min(max(h.ttl_ms, 1) for h in holders) if holders else 1
                await waiter.sleep("wake", min(remaining, soonest / 1000))
        finally:
            for name, queue in zip(locks, queues, strict=True):
                self._leave(name, queue, waiter, None)

    async def _store_acquire_many(self, locks: tuple[str, ...], lease_id: str, ttl_ms: int,
                                  owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        """``store.acquire_many`` surviving the caller's cancellation (see ``_store_acquire``)."""
        task = asyncio.ensure_future(self.store.acquire_many(
            locks, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner, client_id=client_id))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(partial(self._orphaned_many, lease_id))
            raise

    def _orphaned_many(self, lease_id: str, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if isinstance(result, MultiGrant) and result.lease_id == lease_id:
            self._spawn(self._release_many_quietly(lease_id))

    async def _release_many_quietly(self, lease_id: str) -> None:
        try:
            await self.release_many(lease_id)
        except LockdError as exc:
            log.warning("could not release unclaimed multi-lock lease: %s", exc.detail)

    @staticmethod
    def _check_multi(lease_id: str) -> None:
        if not lease_id.startswith(MULTI_PREFIX):
            raise LeaseLost("no live multi-lock lease with that id")

    async def renew_many(self, lease_id: str, ttl_ms: int | None = None) -> MultiLease:
        """Extend every lock of a live multi-lock lease (same fences, same token).
        Raises ``LeaseLost`` unless every lock of the set is still held by it."""
        self._check_multi(lease_id)
        if ttl_ms is not None:
            self._check_ttl(ttl_ms)
        return self._multi_lease(await self.store.renew_many(lease_id, ttl_ms))

    async def release_many(self, lease_id: str) -> None:
        """End a multi-lock lease and wake the head waiter of each of its locks at once.
        Raises ``LeaseLost``."""
        self._check_multi(lease_id)
        freed = await self.store.release_many(lease_id)
        for name in freed:
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
        """How many acquires are queued at this lockd process, over all locks (a metric; a
        multi-lock acquire queued on several locks counts once)."""
        return len({waiter for queue in self._queues.values() for waiter in queue})

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
                waiter.set_turn()
                waiter.set_wake()
