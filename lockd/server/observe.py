"""``ObservedStore``: a ``Store`` wrapper that turns store calls into metrics and lock events.

The services talk to the store through it, so grants, renewals, releases and expiries are seen
where they happen, with no extra store round trip on any request path. It tracks the leases
granted or renewed here and counts an expiry once, by the replica that last saw the lease
(docs/internals.md, "Metrics and events"). Semaphores and elections add their calls as mixins
(``lockd.server.semaphores.observe``, ``lockd.server.elections.observe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from dataclasses import dataclass
from typing import Any

from lockd.server.core.waiting import PERMIT as _PERMIT
from lockd.server.elections.observe import ObservedElections
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.events import EventHub
from lockd.server.metrics import LockdMetrics
from lockd.server.semaphores.observe import ObservedSemaphores
from lockd.server.store.base import Store
from lockd.server.store.values import (
    EXCLUSIVE,
    SHARED,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
)

__all__ = ["ObservedStore"]

log = logging.getLogger(__name__)

_RELEASE_MARGIN_S = 0.25  # a notification this close to the deadline may be an expiry
_UNREAPED_MS = 1500  # held past the deadline with at most this left: etcd not done reaping
_GRACE_S = 0.05
_MAX_CONTENDED = 10_000


@dataclass(slots=True)
class _Tracked:
    lease_id: str
    fence: int
    owner: str
    ttl_ms: int
    granted_at: float | None  # None: granted at another replica, renewed here
    deadline: float
    mode: str = EXCLUSIVE  # or SHARED, or _PERMIT (a semaphore's)
    slot: int = -1  # a permit's
    event_lock: str | None = None  # the lock its events name, if not the tracked name's


class ObservedStore(ObservedSemaphores, ObservedElections):
    """Wraps ``store``; see the module docstring. ``start()``/``stop()`` run the sweeper and
    the skew sampler (the app's lifespan calls them)."""

    def __init__(self, store: Store, metrics: LockdMetrics, events: EventHub, *,
                 sweep_s: float = 0.1, skew_interval_s: float = 10.0):
        self.inner = store
        self.metrics = metrics
        self.events = events
        self._sweep_s = sweep_s
        self._skew_interval_s = skew_interval_s
        self._live: dict[str, _Tracked] = {}
        self._heap: list[tuple[float, int, str]] = []  # (deadline, fence, lock), lazy deletion
        # shared leases: lock -> lease id -> tracked; permits: semaphore -> lease id -> tracked;
        # their deadlines: (deadline, lease id, lock or semaphore, mode), lazy deletion
        self._shared: dict[str, dict[str, _Tracked]] = {}
        self._permits: dict[str, dict[str, _Tracked]] = {}
        self._keyed_heap: list[tuple[float, str, str, str]] = []
        self._contended: set[str] = set()
        self._own_releases: dict[str, int] = {}  # notifications still due for releases made here
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        store.subscribe(self._on_release_notice)  # before the service's listener: see above

    @property
    def active(self) -> int:
        return len(self._live) + self.shared_active

    @property
    def shared_active(self) -> int:
        """Shared leases granted or renewed here and believed live."""
        return sum(len(leases) for leases in self._shared.values())

    @property
    def permits_active(self) -> int:
        """Semaphore permits granted or renewed here and believed live."""
        return sum(len(leases) for leases in self._permits.values())

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._sweep_forever(), name="lockd-expiry-sweeper"),
                       asyncio.create_task(self._sample_skew_forever(), name="lockd-skew")]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _now(self) -> float:
        loop = self._loop or asyncio.get_running_loop()
        return loop.time()

    # --- tracking ---------------------------------------------------------------------------

    def _track(self, lock: str, tracked: _Tracked) -> None:
        self._live[lock] = tracked
        heapq.heappush(self._heap, (tracked.deadline, tracked.fence, lock))

    def _track_keyed(self, table: dict[str, dict[str, _Tracked]], name: str,
                     tracked: _Tracked) -> None:
        table.setdefault(name, {})[tracked.lease_id] = tracked
        heapq.heappush(self._keyed_heap, (tracked.deadline, tracked.lease_id, name, tracked.mode))

    def _keyed(self, lock: str, lease_id: str, mode: str = SHARED) -> _Tracked | None:
        """The tracked shared lease (or, ``mode="permit"``, permit) ``lease_id`` of ``lock``."""
        table = self._permits if mode == _PERMIT else self._shared
        leases = table.get(lock)
        return None if leases is None else leases.get(lease_id)

    def _tracked_permit(self, name: str, lease_id: str, fence: int, owner: str, ttl_ms: int,
                        slot: int, event_lock: str) -> None:
        """Track a permit of semaphore ``name`` granted here just now."""
        now = self._now()
        self._track_keyed(self._permits, name, _Tracked(
            lease_id, fence, owner, ttl_ms, now, now + ttl_ms / 1000, _PERMIT, slot, event_lock))

    def _forget_keyed(self, lock: str, tracked: _Tracked) -> None:
        table = self._permits if tracked.mode == _PERMIT else self._shared
        leases = table.get(lock)
        if leases is not None and leases.get(tracked.lease_id) is tracked:
            del leases[tracked.lease_id]
            if not leases:
                del table[lock]

    def _still(self, lock: str, tracked: _Tracked | None) -> bool:
        """Whether ``tracked`` is still tracked (not ended or replaced meanwhile)."""
        if tracked is None:
            return False
        if tracked.mode == EXCLUSIVE:
            return self._live.get(lock) is tracked
        return self._keyed(lock, tracked.lease_id, tracked.mode) is tracked

    def _end(self, lock: str, tracked: _Tracked, outcome: str, now: float) -> None:
        """Stop tracking ``lock``'s lease (or a semaphore's permit); record its hold time and
        publish its end."""
        if tracked.mode == EXCLUSIVE:
            if self._live.get(lock) is tracked:
                del self._live[lock]
        else:
            self._forget_keyed(lock, tracked)
        if outcome == "expired":
            self.metrics.expirations.inc()
            log.info("lease expired: %s %r, fence %d, owner %r (TTL %d ms, not renewed in time)",
                     "semaphore" if tracked.mode == _PERMIT else "lock", lock, tracked.fence,
                     tracked.owner, tracked.ttl_ms)
            end = min(now, tracked.deadline)
        else:
            end = now
        if tracked.granted_at is not None:
            self.metrics.hold[outcome].observe(max(0.0, end - tracked.granted_at))
        if tracked.event_lock is not None:  # a permit's events name its slot's lock
            lock = tracked.event_lock
        self.events.publish("expired" if outcome == "expired" else "released", lock,
                            tracked.fence, tracked.owner, forced=outcome == "forced",
                            mode=tracked.mode)

    def _end_shared(self, lock: str, outcome: str, now: float) -> None:
        """Every tracked shared lease of ``lock`` ended (it was granted exclusively, or forced)."""
        for tracked in list(self._shared.get(lock, {}).values()):
            self._end(lock, tracked, outcome, now)

    def _granted(self, lock: str, lease_id: str, fence: int, owner: str, ttl_ms: int,
                 mode: str, now: float) -> bool:
        """Track a lease of ``lock`` the store just granted; ``False`` if it was a retried
        acquire of a lease tracked already (its deadline is pushed instead)."""
        if mode == SHARED:
            old = self._keyed(lock, lease_id)
            if old is not None:
                old.deadline = now + ttl_ms / 1000
                old.ttl_ms = ttl_ms
                heapq.heappush(self._keyed_heap, (old.deadline, lease_id, lock, SHARED))
                return False
            exclusive = self._live.get(lock)
            if exclusive is not None:  # granted shared: the exclusive lease lapsed unreleased
                self._end(lock, exclusive, "expired", now)
        else:
            old = self._live.get(lock)
            if old is not None and old.fence == fence:  # a retried acquire: same lease
                old.deadline = now + ttl_ms / 1000
                old.ttl_ms = ttl_ms
                heapq.heappush(self._heap, (old.deadline, old.fence, lock))
                return False
            if old is not None:  # the lock was granted again: the old lease lapsed unreleased
                self._end(lock, old, "expired", now)
            if lock in self._shared:  # granted exclusively: every shared lease lapsed too
                self._end_shared(lock, "expired", now)
        if lock in self._contended:
            self._contended.discard(lock)
            self.metrics.handoffs.inc()
        tracked = _Tracked(lease_id, fence, owner, ttl_ms, now, now + ttl_ms / 1000, mode)
        if mode == SHARED:
            self._track_keyed(self._shared, lock, tracked)
        else:
            self._track(lock, tracked)
        self.events.publish("acquired", lock, fence, owner, ttl_ms, mode=mode)
        return True

    def _own_release(self, lock: str) -> None:
        self._own_releases[lock] = self._own_releases.get(lock, 0) + 1

    def _on_release_notice(self, lock: str) -> None:
        """The store says ``lock`` was released (here or at another replica)."""
        pending = self._own_releases.get(lock)
        if pending:
            if pending == 1:
                del self._own_releases[lock]
            else:
                self._own_releases[lock] = pending - 1
            return
        tracked = self._live.get(lock)
        if tracked is not None and self._now() < tracked.deadline - _RELEASE_MARGIN_S:
            self._end(lock, tracked, "released", self._now())

    # --- the Store protocol -----------------------------------------------------------------

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def acquire(self, lock: str, *, lease_id: str, ttl_ms: int, owner: str,
                      client_id: str | None, mode: str = EXCLUSIVE) -> Grant | Holder:
        result = await self.inner.acquire(lock, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner,
                                          client_id=client_id, mode=mode)
        if not isinstance(result, Grant):
            if len(self._contended) >= _MAX_CONTENDED:
                self._contended.clear()
            self._contended.add(lock)
            return result
        if self._granted(lock, result.lease_id, result.fence, result.owner, result.ttl_ms,
                         result.mode, self._now()):
            self.metrics.lease_ttl.observe(result.ttl_ms / 1000)
        return result

    def _tracked(self, lock: str, lease_id: str) -> _Tracked | None:
        """The tracked lease ``lease_id`` of ``lock``, exclusive or shared."""
        tracked = self._live.get(lock)
        if tracked is not None and tracked.lease_id == lease_id:
            return tracked
        return self._keyed(lock, lease_id)

    def _renewed(self, lock: str, tracked: _Tracked | None, lease_id: str, fence: int,
                 owner: str, ttl_ms: int, mode: str, before: float | None,
                 slot: int = -1, event_lock: str | None = None) -> None:
        """A lease renewed (``tracked``: as tracked here before, if it was)."""
        now = self._now()
        if tracked is not None:
            if before is not None:
                left = max(0.0, tracked.deadline - before)
                self.metrics.renewal_margin.observe(left)
                if tracked.ttl_ms > 0:
                    self.metrics.renewal_margin_ratio.observe(
                        min(1.0, left * 1000 / tracked.ttl_ms))
            tracked.deadline = now + ttl_ms / 1000
            tracked.ttl_ms = ttl_ms
            if tracked.mode == EXCLUSIVE:
                heapq.heappush(self._heap, (tracked.deadline, tracked.fence, lock))
            else:
                heapq.heappush(self._keyed_heap, (tracked.deadline, lease_id, lock, tracked.mode))
            return
        # granted at another replica (or before a restart): track it from here on
        tracked = _Tracked(lease_id, fence, owner, ttl_ms, None, now + ttl_ms / 1000, mode, slot,
                           event_lock)
        if mode == EXCLUSIVE:
            self._track(lock, tracked)
        else:
            self._track_keyed(self._permits if mode == _PERMIT else self._shared, lock, tracked)

    def _renew_failed(self, exc: Exception, lost: list[tuple[str, _Tracked]]) -> None:
        """Count a failed renewal; a lost lease's tracked locks (``lost``) expired."""
        if isinstance(exc, LeaseLost):
            self.metrics.renewals["lease_lost"].inc()
            self.metrics.renewal_failures["lease_lost"].inc()
            now = self._now()
            for lock, tracked in lost:
                if self._still(lock, tracked):
                    self._end(lock, tracked, "expired", now)
        else:
            self.metrics.renewals["error"].inc()
            self.metrics.renewal_failures["store_unavailable"].inc()

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        before = self._now()
        tracked = self._tracked(lock, lease_id)
        try:
            grant = await self.inner.renew(lock, lease_id, ttl_ms)
        except (LeaseLost, StoreUnavailable) as exc:
            self._renew_failed(exc, [(lock, tracked)] if tracked is not None else [])
            raise
        self.metrics.renewals["ok"].inc()
        self._renewed(lock, tracked, lease_id, grant.fence, grant.owner, grant.ttl_ms,
                      grant.mode, before)
        return grant

    async def release(self, lock: str, lease_id: str) -> None:
        tracked = self._tracked(lock, lease_id)
        self._own_release(lock)
        try:
            await self.inner.release(lock, lease_id)
        except LeaseLost:
            self._on_release_notice_cancelled(lock)
            if self._still(lock, tracked):
                self._end(lock, tracked, "expired", self._now())
            raise
        except StoreUnavailable:
            self._on_release_notice_cancelled(lock)
            raise
        self.metrics.releases["released"].inc()
        if self._still(lock, tracked):
            self._end(lock, tracked, "released", self._now())
        elif tracked is None:
            self.events.publish("released", lock, None, None)

    # --- multi-lock leases: every lock of the set is tracked (and evented) like a lease -------

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None,
                           modes: dict[str, str] | None = None) -> MultiGrant | list[Holder]:
        result = await self.inner.acquire_many(locks, lease_id=lease_id, ttl_ms=ttl_ms,
                                               owner=owner, client_id=client_id, modes=modes)
        if not isinstance(result, MultiGrant):
            if len(self._contended) >= _MAX_CONTENDED:
                self._contended.clear()
            self._contended.update(h.lock for h in result)
            return result
        now = self._now()
        renewed = False
        granted_modes = result.modes or {}
        for lock, fence in result.fences.items():
            if not self._granted(lock, result.lease_id, fence, result.owner, result.ttl_ms,
                                 granted_modes.get(lock, EXCLUSIVE), now):
                renewed = True
        if not renewed:
            self.metrics.lease_ttl.observe(result.ttl_ms / 1000)
        return result

    def _of_lease(self, lease_id: str) -> dict[str, _Tracked]:
        """Every tracked lock of lease ``lease_id`` (a multi-lock set), exclusive or shared."""
        mine = {lock: t for lock, t in self._live.items() if t.lease_id == lease_id}
        for lock, leases in self._shared.items():
            tracked = leases.get(lease_id)
            if tracked is not None:
                mine[lock] = tracked
        return mine

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        try:
            grant = await self.inner.renew_many(lease_id, ttl_ms)
        except (LeaseLost, StoreUnavailable) as exc:
            self._renew_failed(exc, list(self._of_lease(lease_id).items())
                               if isinstance(exc, LeaseLost) else [])
            raise
        self.metrics.renewals["ok"].inc()
        modes = grant.modes or {}
        for lock, fence in grant.fences.items():
            self._renewed(lock, self._tracked(lock, lease_id), lease_id, fence, grant.owner,
                          grant.ttl_ms, modes.get(lock, EXCLUSIVE), None)
        return grant

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        mine = self._of_lease(lease_id)
        for lock in mine:
            self._own_release(lock)
        try:
            freed = await self.inner.release_many(lease_id)
        except LeaseLost:
            # The store freed what was still live (and said so); the rest had lapsed.
            now = self._now()
            for lock, tracked in mine.items():
                self._on_release_notice_cancelled(lock)
                if self._still(lock, tracked):
                    self._end(lock, tracked, "expired", now)
            raise
        except StoreUnavailable:
            for lock in mine:
                self._on_release_notice_cancelled(lock)
            raise
        now = self._now()
        self.metrics.releases["released"].inc()
        for lock in freed:
            tracked = mine.get(lock)
            if self._still(lock, tracked):
                self._end(lock, tracked, "released", now)
            elif tracked is None:
                self.events.publish("released", lock, None, None)
        return freed

    def _on_release_notice_cancelled(self, lock: str) -> None:
        pending = self._own_releases.get(lock, 0)
        if pending <= 1:
            self._own_releases.pop(lock, None)
        else:
            self._own_releases[lock] = pending - 1

    async def force_release(self, lock: str) -> Holder | None:
        self._own_release(lock)
        try:
            ended = await self.inner.force_release(lock)
        except BaseException:
            self._on_release_notice_cancelled(lock)
            raise
        if ended is None:
            self._on_release_notice_cancelled(lock)
            return None
        self.metrics.releases["forced"].inc()
        now = self._now()
        tracked = self._live.get(lock)
        forced_here = lock in self._shared
        self._end_shared(lock, "forced", now)  # a force-release ends every lease of the lock
        if tracked is not None and tracked.fence == ended.fence:
            self._end(lock, tracked, "forced", now)
        elif not forced_here:
            self.events.publish("released", lock, ended.fence, ended.owner, forced=True,
                                mode=ended.mode)
        return ended

    async def get(self, lock: str) -> LockState:
        return await self.inner.get(lock)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        return await self.inner.list(prefix, limit, after)

    def subscribe(self, listener: ReleaseListener) -> None:
        self.inner.subscribe(listener)

    async def ping(self) -> None:
        await self.inner.ping()

    async def clock_offset(self) -> float | None:
        return await self.inner.clock_offset()

    # --- background -------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                await self._sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expiry sweep failed")

    async def _sweep(self) -> None:
        """Look at every tracked lease whose deadline passed (see the module docstring)."""
        now = self._now()
        due: list[tuple[str, _Tracked]] = []
        while self._heap and self._heap[0][0] + _GRACE_S <= now:
            deadline, fence, lock = heapq.heappop(self._heap)
            tracked = self._live.get(lock)
            if tracked is None or tracked.fence != fence or tracked.deadline > deadline:
                continue  # released, replaced, or renewed since: a stale heap entry
            due.append((lock, tracked))
        keyed: list[tuple[str, _Tracked]] = []
        while self._keyed_heap and self._keyed_heap[0][0] + _GRACE_S <= now:
            deadline, lease_id, name, mode = heapq.heappop(self._keyed_heap)
            tracked = self._keyed(name, lease_id, mode)
            if tracked is not None and tracked.deadline <= deadline:
                keyed.append((name, tracked))
        for lock, tracked in due:
            await self._confirm(lock, tracked)
        for name, tracked in keyed:
            await self._confirm_keyed(name, tracked)

    async def _confirm_keyed(self, name: str, tracked: _Tracked) -> None:
        """A shared lease is live while the lock has a shared holder of its owner under its
        fence; a permit while the semaphore has a permit of its fence."""
        try:
            if tracked.mode == _PERMIT:
                left = await self._permit_left(name, tracked.fence)
            else:
                state = await self.inner.get(name)
                left = [h.ttl_ms for h in state.holders if h.mode == SHARED
                        and h.owner == tracked.owner] if state.fence == tracked.fence else []
        except StoreUnavailable:
            left = None
        if not self._still(name, tracked):
            return  # ended while we asked
        if left == []:
            self._end(name, tracked, "expired", self._now())
        elif left is not None and max(left) > _UNREAPED_MS:  # renewed at another replica
            self._forget_keyed(name, tracked)
        else:  # not reaped yet, or the store did not answer: look again later
            tracked.deadline = self._now() + max(max(left) / 1000 if left else 1.0,
                                                 self._sweep_s)
            heapq.heappush(self._keyed_heap,
                           (tracked.deadline, tracked.lease_id, name, tracked.mode))

    async def _confirm(self, lock: str, tracked: _Tracked) -> None:
        try:
            state = await self.inner.get(lock)
        except StoreUnavailable:
            self._requeue(lock, tracked, 1.0)
            return
        if self._live.get(lock) is not tracked:
            return  # ended while we asked
        if state.held and state.fence == tracked.fence:
            if state.ttl_ms > _UNREAPED_MS:  # renewed at another replica, which tracks it now
                del self._live[lock]
            else:
                self._requeue(lock, tracked, state.ttl_ms / 1000)
            return
        self._end(lock, tracked, "expired", self._now())

    def _requeue(self, lock: str, tracked: _Tracked, after_s: float) -> None:
        tracked.deadline = self._now() + max(after_s, self._sweep_s)
        heapq.heappush(self._heap, (tracked.deadline, tracked.fence, lock))

    async def _sample_skew_forever(self) -> None:
        while True:
            try:
                offset = await self.inner.clock_offset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.skew_errors.inc()
                log.debug("clock skew sample failed: %s", exc)
            else:
                if offset is not None:
                    self.metrics.skew.set(offset)
            await asyncio.sleep(self._skew_interval_s)

    def __getattr__(self, name: str) -> Any:  # store-specific extras (e.g. wait_watching)
        return getattr(self.inner, name)
