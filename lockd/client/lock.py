"""``Lock`` / ``AsyncLock``: a reusable lock object, as ``client.lock(name, ttl=...)`` returns it.

Modelled on redis-py's ``Lock`` and kazoo's ``Lock``::

    lock = client.lock("jobs/nightly", ttl=30)          # no request yet
    if lock.acquire(blocking=True, timeout=10):         # True / False (seconds)
        try:
            session = FencedSession(proxy_url, lock.lease)  # or lock.token / lock.fence
            ...
        finally:
            lock.release()
    lock.acquire(blocking=False)                        # reusable: a new lease, a higher fence

    with client.lock("jobs/nightly", ttl=30, wait=60) as lease:   # as before: yields the Lease
        ...

``with`` yields the ``Lease`` (not the ``Lock``) so every ``with client.lock(...) as lease:``
written before this object existed keeps working: ``FencedSession(url, lease)``, ``lease.lost``,
``lease.check()``. It acquires within ``wait`` seconds (``None``: forever) and raises
``AcquireTimeout`` instead of running the block; see ``LockClient.lock`` for the exit rules.

Each acquire gets a new lease (renewed in the background every ttl/3 unless ``auto_renew`` is
off). ``acquire`` on a Lock that already owns a live lease raises ``RuntimeError`` (the lock is not
re-entrant, like ``threading.Lock``); ``release`` of a Lock that owns nothing raises
``RuntimeError``; ``release`` of a lease lost meanwhile raises ``LeaseLostError`` (the work done
under it may have run unprotected). One Lock object is for one thread or task at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from lockd.client.lease import AsyncLease, Lease, LeaseState, LockStatus

__all__ = ["Lock", "AsyncLock"]

_LIVE = (LeaseState.HELD, LeaseState.RENEWED, LeaseState.UNKNOWN)


class _Client(Protocol):
    """What a ``Lock`` asks of its client (``LockClient`` is one)."""

    def acquire(self, name: str, ttl: float, *, wait: float | None = None,
                **kw: Any) -> Lease: ...

    def try_acquire(self, name: str, ttl: float, *, wait: float = 0.0,
                    **kw: Any) -> Lease | None: ...

    def renew(self, lease: Lease, *, ttl: float | None = None) -> Lease: ...

    def release(self, lease: Lease) -> None: ...

    def status(self, name: str) -> LockStatus: ...


class _AsyncClient(Protocol):
    """What an ``AsyncLock`` asks of its client (``lockd.AsyncLockClient`` is one)."""

    async def acquire(self, name: str, ttl: float, *, wait: float | None = None,
                      **kw: Any) -> AsyncLease: ...

    async def try_acquire(self, name: str, ttl: float, *, wait: float = 0.0,
                          **kw: Any) -> AsyncLease | None: ...

    async def renew(self, lease: AsyncLease, *, ttl: float | None = None) -> AsyncLease: ...

    async def release(self, lease: AsyncLease) -> None: ...

    async def status(self, name: str) -> LockStatus: ...


class _LockBase:
    """What ``Lock`` and ``AsyncLock`` share: the settings of every acquire and the current lease."""

    lease: Any

    def __init__(self, client: Any, name: str, ttl: float, *, wait: float | None,
                 owner: str | None, renew_every: float | None, on_lost: Callable[[Any], Any] | None,
                 auto_renew: bool):
        self.client = client
        self.name = name
        self.ttl = ttl
        """Seconds each acquire asks for."""
        self.wait = wait
        """Seconds ``acquire()`` and ``with`` wait by default (``None``: forever)."""
        self.owner = owner
        self.renew_every = renew_every
        self.auto_renew = auto_renew
        self._on_lost = on_lost
        self.lease = None
        """The current (or last) lease; ``None`` before the first acquire."""

    @property
    def fence(self) -> int | None:
        """The fence of the current (or last) lease; ``None`` before the first acquire."""
        return self.lease.fence if self.lease is not None else None

    @property
    def token(self) -> str | None:
        """The fencing token of the current (or last) lease; ``None`` before the first acquire."""
        return self.lease.token if self.lease is not None else None

    def owned(self) -> bool:
        """True while this object holds a live lease (held, renewed, or a renewal being retried
        before the local deadline). No request: the client's own view of its lease."""
        return self.lease is not None and self.lease.state in _LIVE

    def _wait_for(self, blocking: bool, timeout: float | None) -> float | None:
        if not blocking:
            if timeout is not None:
                raise ValueError("timeout makes no sense with blocking=False")
            return 0.0
        return self.wait if timeout is None else timeout

    def _check_not_owned(self) -> None:
        if self.owned():
            raise RuntimeError(f"this Lock already holds {self.name!r} (fence {self.fence}); "
                               "release it first")

    def _owned_lease(self) -> Any:
        if self.lease is None or self.lease.state is LeaseState.RELEASED:
            raise RuntimeError(f"this Lock does not hold {self.name!r}")
        return self.lease

    def _kw(self) -> dict[str, Any]:
        return {"owner": self.owner, "renew_every": self.renew_every, "on_lost": self._on_lost,
                "auto_renew": self.auto_renew}

    def __repr__(self) -> str:
        state = self.lease.state.value if self.lease is not None else "never acquired"
        return f"{type(self).__name__}({self.name!r}, ttl={self.ttl}, {state})"


class Lock(_LockBase):
    """A reusable lock of ``LockClient`` (``client.lock(name, ttl, ...)``); see the module doc."""

    lease: Lease | None

    def __init__(self, client: _Client, name: str, ttl: float, *, wait: float | None = None,
                 owner: str | None = None, renew_every: float | None = None,
                 on_lost: Callable[[Lease], Any] | None = None, auto_renew: bool = True):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Get a new lease: True if granted, False if the lock stayed held.

        ``blocking=False`` tries once; otherwise waits ``timeout`` seconds (default: the Lock's
        ``wait``, ``None`` = forever). Raises ``RuntimeError`` if this object already owns the
        lock, ``ValidationError``, ``ServiceUnavailable`` (lockd did not answer within the wait).
        """
        wait = self._wait_for(blocking, timeout)
        self._check_not_owned()
        if wait is None:
            lease: Lease | None = self.client.acquire(self.name, self.ttl, **self._kw())
        else:
            lease = self.client.try_acquire(self.name, self.ttl, wait=wait, **self._kw())
        if lease is None:
            return False
        self.lease = lease
        return True

    def release(self) -> None:
        """Release the current lease (``LockClient.release``): ``RuntimeError`` if this object
        holds none, ``LeaseLostError`` if it was lost before this release."""
        self.client.release(self._owned_lease())

    def extend(self, ttl: float | None = None) -> None:
        """Renew now for ``ttl`` seconds from now (default: the lease's TTL); same fence.
        Later renewals keep the new TTL. ``LeaseLostError`` if the lease is no longer live."""
        lease = self._owned_lease()
        self.client.renew(lease, ttl=ttl)
        if ttl is not None:
            self.ttl = ttl

    def locked(self) -> bool:
        """True if anyone holds the lock now (asks lockd: ``GET /v1/locks/{name}``)."""
        return self.client.status(self.name).held

    def __enter__(self) -> Lease:
        self._check_not_owned()
        self.lease = self.client.acquire(self.name, self.ttl, wait=self.wait, **self._kw())
        return self.lease

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self.lease is not None
        self.lease.__exit__(exc_type, exc, tb)


class AsyncLock(_LockBase):
    """The asyncio twin of ``Lock``: ``await lock.acquire()``, ``await lock.release()``,
    ``await lock.extend()``, ``await lock.locked()``, ``async with``; ``owned()``, ``fence``
    and ``token`` need no request and are plain."""

    lease: AsyncLease | None

    def __init__(self, client: _AsyncClient, name: str, ttl: float, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[AsyncLease], Any] | None = None, auto_renew: bool = True):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """See ``Lock.acquire``."""
        wait = self._wait_for(blocking, timeout)
        self._check_not_owned()
        if wait is None:
            lease: AsyncLease | None = await self.client.acquire(self.name, self.ttl,
                                                                 **self._kw())
        else:
            lease = await self.client.try_acquire(self.name, self.ttl, wait=wait, **self._kw())
        if lease is None:
            return False
        self.lease = lease
        return True

    async def release(self) -> None:
        """See ``Lock.release``."""
        await self.client.release(self._owned_lease())

    async def extend(self, ttl: float | None = None) -> None:
        """See ``Lock.extend``."""
        lease = self._owned_lease()
        await self.client.renew(lease, ttl=ttl)
        if ttl is not None:
            self.ttl = ttl

    async def locked(self) -> bool:
        """See ``Lock.locked``."""
        return (await self.client.status(self.name)).held

    async def __aenter__(self) -> AsyncLease:
        self._check_not_owned()
        self.lease = await self.client.acquire(self.name, self.ttl, wait=self.wait, **self._kw())
        return self.lease

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self.lease is not None
        await self.lease.__aexit__(exc_type, exc, tb)
