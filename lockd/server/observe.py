"""``ObservedStore``: a ``Store`` wrapper that turns store calls into metrics and lock events.

``LockService`` talks to the store through it, so grants, renewals, releases and expiries are
seen exactly where they happen, with no extra store round trip on any request path.

Lease tracking. Every lease this process grants or renews is tracked in memory (lock name →
lease id, fence, owner, TTL, grant time, local deadline = time of the store's answer + TTL on
the monotonic clock; the store started the lease before it answered, so by the local deadline
the store has expired it too). Tracking ends with:

* a release or force-release here: ``released`` (hold time, event);
* a release notification from the store (PostgreSQL NOTIFY, etcd watch, i.e. a release at
  another replica) arriving more than ``0.25 s`` before the deadline: ``released`` event;
  notifications of this process's own releases are recognised and skipped;
* an **expiry**, counted in ``lockd_lease_expirations_total`` when the first of these shows it:
  (a) this process grants the lock again (the store only does so once the old lease is gone and
  it was not released here or reported released), (b) the holder's renew or release is answered
  410 for the tracked lease, or (c) the sweeper, which every ``sweep_s`` looks at leases whose
  deadline passed and asks the store (``get``, one call per lapsed lease, off the request path):
  the lock is free or held under another fence → expired. Held under the same fence with more
  than 1.5 s left → the lease was renewed at another replica, which tracks it now; less → etcd
  has not reaped it yet (it checks about every 500 ms): look again later.

So an expiry is counted (and logged: one INFO line naming lock, fence, owner and TTL) once, by
the replica that granted or last renewed the lease, and only for a lease that really lapsed.
Known limits: a lease whose client alternates between replicas with a TTL under 1.5 s may be
counted by two of them; a release at another replica in the last 0.25 s before the deadline
counts as an expiry; a lease granted here by a lockd that then crashes is counted by nobody.

Clock skew: every ``skew_interval_s`` the store's ``clock_offset()`` sets
``lockd_store_clock_skew_seconds`` (SQLite: 0 by definition).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from dataclasses import dataclass
from typing import Any

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.events import EventHub
from lockd.server.metrics import LockdMetrics
from lockd.server.store.base import (
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
    Store,
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


class ObservedStore:
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
        self._contended: set[str] = set()
        self._own_releases: dict[str, int] = {}  # notifications still due for releases made here
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        store.subscribe(self._on_release_notice)  # before the service's listener: see above

    @property
    def active(self) -> int:
        return len(self._live)

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

    def _end(self, lock: str, tracked: _Tracked, outcome: str, now: float) -> None:
        """Stop tracking ``lock``'s lease; record its hold time and publish its end."""
        if self._live.get(lock) is tracked:
            del self._live[lock]
        if outcome == "expired":
            self.metrics.expirations.inc()
            log.info("lease expired: lock %r, fence %d, owner %r (TTL %d ms, not renewed in time)",
                     lock, tracked.fence, tracked.owner, tracked.ttl_ms)
            end = min(now, tracked.deadline)
        else:
            end = now
        if tracked.granted_at is not None:
            self.metrics.hold[outcome].observe(max(0.0, end - tracked.granted_at))
        self.events.publish("expired" if outcome == "expired" else "released", lock,
                            tracked.fence, tracked.owner, forced=outcome == "forced")

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
                      client_id: str | None) -> Grant | Holder:
        result = await self.inner.acquire(lock, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner,
                                          client_id=client_id)
        if not isinstance(result, Grant):
            if len(self._contended) >= _MAX_CONTENDED:
                self._contended.clear()
            self._contended.add(lock)
            return result
        now = self._now()
        old = self._live.get(lock)
        if old is not None and old.fence == result.fence:  # a retried acquire: same lease
            old.deadline = now + result.ttl_ms / 1000
            old.ttl_ms = result.ttl_ms
            heapq.heappush(self._heap, (old.deadline, old.fence, lock))
            return result
        if old is not None:  # the lock was granted again: the old lease lapsed unreleased
            self._end(lock, old, "expired", now)
        if lock in self._contended:
            self._contended.discard(lock)
            self.metrics.handoffs.inc()
        self._track(lock, _Tracked(result.lease_id, result.fence, result.owner, result.ttl_ms,
                                   now, now + result.ttl_ms / 1000))
        self.metrics.lease_ttl.observe(result.ttl_ms / 1000)
        self.events.publish("acquired", lock, result.fence, result.owner, result.ttl_ms)
        return result

    async def renew(self, lock: str, lease_id: str, ttl_ms: int) -> Grant:
        before = self._now()
        tracked = self._live.get(lock)
        if tracked is not None and tracked.lease_id != lease_id:
            tracked = None
        try:
            grant = await self.inner.renew(lock, lease_id, ttl_ms)
        except LeaseLost:
            self.metrics.renewals["lease_lost"].inc()
            self.metrics.renewal_failures["lease_lost"].inc()
            if tracked is not None and self._live.get(lock) is tracked:
                self._end(lock, tracked, "expired", self._now())
            raise
        except StoreUnavailable:
            self.metrics.renewals["error"].inc()
            self.metrics.renewal_failures["store_unavailable"].inc()
            raise
        now = self._now()
        self.metrics.renewals["ok"].inc()
        if tracked is not None:
            left = max(0.0, tracked.deadline - before)
            self.metrics.renewal_margin.observe(left)
            if tracked.ttl_ms > 0:
                self.metrics.renewal_margin_ratio.observe(min(1.0, left * 1000 / tracked.ttl_ms))
            tracked.deadline = now + grant.ttl_ms / 1000
            tracked.ttl_ms = grant.ttl_ms
            heapq.heappush(self._heap, (tracked.deadline, tracked.fence, lock))
        else:  # granted at another replica (or before a restart): track it from here on
            self._track(lock, _Tracked(lease_id, grant.fence, grant.owner, grant.ttl_ms, None,
                                       now + grant.ttl_ms / 1000))
        return grant

    async def release(self, lock: str, lease_id: str) -> None:
        tracked = self._live.get(lock)
        if tracked is not None and tracked.lease_id != lease_id:
            tracked = None
        self._own_release(lock)
        try:
            await self.inner.release(lock, lease_id)
        except LeaseLost:
            self._on_release_notice_cancelled(lock)
            if tracked is not None and self._live.get(lock) is tracked:
                self._end(lock, tracked, "expired", self._now())
            raise
        except StoreUnavailable:
            self._on_release_notice_cancelled(lock)
            raise
        self.metrics.releases["released"].inc()
        if tracked is not None and self._live.get(lock) is tracked:
            self._end(lock, tracked, "released", self._now())
        elif tracked is None:
            self.events.publish("released", lock, None, None)

    # --- multi-lock leases: every lock of the set is tracked (and evented) like a lease -------

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        result = await self.inner.acquire_many(locks, lease_id=lease_id, ttl_ms=ttl_ms,
                                               owner=owner, client_id=client_id)
        if not isinstance(result, MultiGrant):
            if len(self._contended) >= _MAX_CONTENDED:
                self._contended.clear()
            self._contended.update(h.lock for h in result)
            return result
        now = self._now()
        renewed = False
        for lock, fence in result.fences.items():
            old = self._live.get(lock)
            if old is not None and old.fence == fence:  # a retried acquire: same lease
                old.deadline = now + result.ttl_ms / 1000
                old.ttl_ms = result.ttl_ms
                heapq.heappush(self._heap, (old.deadline, old.fence, lock))
                renewed = True
                continue
            if old is not None:
                self._end(lock, old, "expired", now)
            if lock in self._contended:
                self._contended.discard(lock)
                self.metrics.handoffs.inc()
            self._track(lock, _Tracked(result.lease_id, fence, result.owner, result.ttl_ms,
                                       now, now + result.ttl_ms / 1000))
            self.events.publish("acquired", lock, fence, result.owner, result.ttl_ms)
        if not renewed:
            self.metrics.lease_ttl.observe(result.ttl_ms / 1000)
        return result

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        try:
            grant = await self.inner.renew_many(lease_id, ttl_ms)
        except LeaseLost:
            self.metrics.renewals["lease_lost"].inc()
            self.metrics.renewal_failures["lease_lost"].inc()
            now = self._now()
            for lock, tracked in list(self._live.items()):
                if tracked.lease_id == lease_id:
                    self._end(lock, tracked, "expired", now)
            raise
        except StoreUnavailable:
            self.metrics.renewals["error"].inc()
            self.metrics.renewal_failures["store_unavailable"].inc()
            raise
        now = self._now()
        self.metrics.renewals["ok"].inc()
        for lock, fence in grant.fences.items():
            tracked = self._live.get(lock)
            if tracked is not None and tracked.lease_id == lease_id:
                tracked.deadline = now + grant.ttl_ms / 1000
                tracked.ttl_ms = grant.ttl_ms
                heapq.heappush(self._heap, (tracked.deadline, tracked.fence, lock))
            else:
                self._track(lock, _Tracked(lease_id, fence, grant.owner, grant.ttl_ms, None,
                                           now + grant.ttl_ms / 1000))
        return grant

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        mine = {lock: t for lock, t in self._live.items() if t.lease_id == lease_id}
        for lock in mine:
            self._own_release(lock)
        try:
            freed = await self.inner.release_many(lease_id)
        except LeaseLost:
            # The store freed what was still live (and said so); the rest had lapsed.
            now = self._now()
            for lock, tracked in mine.items():
                self._on_release_notice_cancelled(lock)
                if self._live.get(lock) is tracked:
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
            if tracked is not None and self._live.get(lock) is tracked:
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
        tracked = self._live.get(lock)
        if tracked is not None and tracked.fence == ended.fence:
            self._end(lock, tracked, "forced", self._now())
        else:
            self.events.publish("released", lock, ended.fence, ended.owner, forced=True)
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
        for lock, tracked in due:
            await self._confirm(lock, tracked)

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
