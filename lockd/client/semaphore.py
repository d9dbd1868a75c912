"""``Semaphore`` / ``AsyncSemaphore``: a reusable counting semaphore with the ``Lock`` object's shape,
as ``client.semaphore(name, limit, ttl=...)`` returns it::

    sem = client.semaphore("jobs/encoders", 4, ttl=30)     # at most 4 permits; no request yet
    if sem.acquire(blocking=True, timeout=10):             # True / False (seconds)
        try:
            print(sem.slot, sem.fence)                     # 0..3, and a fence for the slot
        finally:
            sem.release()
    with client.semaphore("jobs/encoders", 4, ttl=30, wait=60) as permit:  # a PermitLease
        ...

Each acquire gets a new permit (renewed in the background every ttl/3): a lease on one slot of
``0 .. limit-1`` whose token names lock ``sem/{name}/{slot}`` with a fence that strictly
increases per semaphore. ``locked()`` asks lockd whether every permit is taken (as
``asyncio.Semaphore.locked``); ``owned(check=True)`` whether lockd shows this permit, by slot and
fence. Misuse and bad arguments raise as ``Lock`` does (``LockError``, ``LockValueError``); a
``limit`` other than the one the live permits were granted under raises ``LimitMismatch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lockd.client.lock import _LIVE, AsyncLock, Lock
from lockd.client.permits import AsyncPermitLease, PermitLease, SemaphoreStatus

__all__ = ["Semaphore", "AsyncSemaphore"]


class _SemaphoreRules:
    """What ``Semaphore`` and ``AsyncSemaphore`` share: ``limit``, ``slot``, reading lockd."""

    limit: int
    lease: Any

    @property
    def slot(self) -> int | None:
        """The current permit's slot; ``None`` before acquire and after release."""
        return self.lease.slot if self.lease is not None else None

    @staticmethod
    def _is_locked(status: SemaphoreStatus) -> bool:
        return status.limit > 0 and len(status.permits) >= status.limit

    def _held_by(self, lease: Any, status: SemaphoreStatus) -> bool:
        """lockd shows a live permit in this permit's slot at its fence (a fence is issued
        once per semaphore, so it names the permit)."""
        return lease.state in _LIVE and any(p.slot == lease.slot and p.fence == lease.fence
                                            for p in status.permits)


class Semaphore(_SemaphoreRules, Lock):
    """A reusable semaphore of ``LockClient`` (``client.semaphore(name, limit, ttl, ...)``)."""

    lease: PermitLease | None  # type: ignore[assignment]

    def __init__(self, client: Any, name: str, limit: int, ttl: float, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[PermitLease], Any] | None = None, auto_renew: bool = True):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)
        self.limit = limit

    def _acquire_lease(self, wait: float | None) -> PermitLease | None:
        if wait is None:
            return self.client.acquire_permit(self.name, self.limit, self.ttl, **self._kw())
        return self.client.try_acquire_permit(self.name, self.limit, self.ttl, wait=wait,
                                              **self._kw())

    def _enter_lease(self) -> PermitLease:
        return self.client.acquire_permit(self.name, self.limit, self.ttl, wait=self.wait,
                                          **self._kw())

    def _status(self) -> SemaphoreStatus:
        return self.client.semaphore_status(self.name)

    def status(self) -> SemaphoreStatus:
        """The semaphore at lockd now: limit, live permits (owner, slot, fence), waiters."""
        return self._status()

    def __enter__(self) -> PermitLease:
        return super().__enter__()  # type: ignore[return-value]


class AsyncSemaphore(_SemaphoreRules, AsyncLock):
    """The asyncio twin of ``Semaphore`` (``await`` ``acquire()``, ``release()``, ``locked()``,
    ``status()``, ``owned(check=True)``; ``async with``)."""

    lease: AsyncPermitLease | None  # type: ignore[assignment]

    def __init__(self, client: Any, name: str, limit: int, ttl: float, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[AsyncPermitLease], Any] | None = None,
                 auto_renew: bool = True):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)
        self.limit = limit

    async def _acquire_lease(self, wait: float | None) -> AsyncPermitLease | None:
        if wait is None:
            return await self.client.acquire_permit(self.name, self.limit, self.ttl,
                                                    **self._kw())
        return await self.client.try_acquire_permit(self.name, self.limit, self.ttl, wait=wait,
                                                    **self._kw())

    async def _enter_lease(self) -> AsyncPermitLease:
        return await self.client.acquire_permit(self.name, self.limit, self.ttl,
                                                wait=self.wait, **self._kw())

    async def _status(self) -> SemaphoreStatus:
        return await self.client.semaphore_status(self.name)

    async def status(self) -> SemaphoreStatus:
        """See ``Semaphore.status``."""
        return await self._status()

    async def __aenter__(self) -> AsyncPermitLease:
        return await super().__aenter__()  # type: ignore[return-value]
