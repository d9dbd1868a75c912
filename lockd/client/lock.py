"""``Lock`` / ``AsyncLock``: a reusable lock object, as ``client.lock(name, ttl=...)`` returns it.

Modelled on redis-py's ``Lock`` (the same names behave the same where lockd allows it; the
differences, and why, are in ``docs/client-redis-compat.md``) and kazoo's ``Lock``::

    lock = client.lock("jobs/nightly", ttl=30)          # no request yet
    if lock.acquire(blocking=True, timeout=10):         # True / False (seconds)
        try:
            session = FencedSession(proxy_url, lock.lease)  # or lock.token / lock.fence
            ...
            lock.extend(60)                             # 60 s more than what is left
            lock.reacquire()                            # back to 30 s from now
        finally:
            lock.release()                              # lock.token, lock.fence: None again
    lock.acquire(blocking=False)                        # reusable: a new lease, a higher fence

    with client.lock("jobs/nightly", ttl=30, wait=60) as lease:   # as before: yields the Lease
        ...

``with`` yields the ``Lease`` (not the ``Lock``) so every ``with client.lock(...) as lease:``
written before this object existed keeps working: ``FencedSession(url, lease)``, ``lease.lost``,
``lease.check()``. It acquires within ``wait`` seconds (``None``: forever) and raises
``AcquireTimeout`` instead of running the block; see ``LockClient.lock`` for the exit rules.

``client.lock(name, ttl, shared=True)`` is the same object in shared mode: each acquire asks for
a shared (read) lease, which coexists with other shared ones and carries the lock's write epoch as
its fence (``lease.mode`` is ``"shared"``). ``Semaphore`` and ``Election`` (``semaphore.py``,
``election.py``) are this object over a semaphore's permits and an election's lead.

Each acquire gets a new lease (renewed in the background every ttl/3 unless ``auto_renew`` is
off). ``owned()`` is this object's own view, without a request; ``owned(check=True)`` asks lockd;
``locked()`` asks lockd whether anyone holds the lock. Misuse raises ``LockError`` (also a
``RuntimeError``): ``acquire`` on a Lock that already owns a live lease (the lock is not
re-entrant, like ``threading.Lock``), ``release``/``extend``/``reacquire`` of a Lock that owns
nothing. A bad argument raises ``LockValueError`` (also a ``ValueError``), before any request.
``release``/``extend``/``reacquire`` of a lease lost meanwhile raise ``LeaseLostError`` (the work
done under it may have run unprotected). One Lock object is for one thread or task at a time.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal, Protocol, overload

from lockd.client.errors import LockError, LockValueError, ValidationError
from lockd.client.lease import FINAL, AsyncLease, Lease, LeaseState, LockStatus
from lockd.client.wire import SHARED

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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _LockBase:
    """What ``Lock`` and ``AsyncLock`` share: the settings of every acquire, the current lease,
    and every rule that needs no request."""

    lease: Any

    def __init__(self, client: Any, name: str, ttl: float, *, wait: float | None,
                 owner: str | None, renew_every: float | None, on_lost: Callable[[Any], Any] | None,
                 auto_renew: bool, shared: bool = False):
        self.client = client
        self.shared = shared
        """Each acquire asks for a shared lease (any number of shared holders at once; no
        exclusive holder meanwhile); its token may read, not write, what the lock governs."""
        self.name = name
        self._check_seconds("ttl", ttl, positive=True)
        self._check_seconds("wait", wait)
        if _is_number(renew_every) and _is_number(ttl) and not 0 < renew_every < ttl:
            raise LockValueError(f"renew_every must be > 0 and < ttl ({ttl} s), got "
                                 f"{renew_every!r}", lock=name)
        self.ttl = ttl
        """Seconds each acquire asks for, and what ``reacquire()`` sets again (``extend`` does
        not change it; the current lease's TTL is ``lease.ttl``)."""
        self.wait = wait
        """Seconds ``acquire()`` and ``with`` wait by default (``None``: forever)."""
        self.owner = owner
        self.renew_every = renew_every
        self.auto_renew = auto_renew
        self._on_lost = on_lost
        self.lease = None
        """The current lease: ``None`` before the first acquire and after ``release`` (also a
        release that raised ``LeaseLostError``); a lease lost and not yet released stays here,
        with its fence, until ``release`` or the next ``acquire``."""

    def _current(self) -> Any:
        """The current lease unless released (also behind this object's back: an election's
        leader resigns by itself after a handover)."""
        lease = self.lease
        return None if lease is None or lease.state is LeaseState.RELEASED else lease

    @property
    def fence(self) -> int | None:
        """The fence of the current lease; ``None`` before acquire and after release."""
        lease = self._current()
        return lease.fence if lease is not None else None

    @property
    def token(self) -> str | None:
        """The fencing token of the current lease; ``None`` before acquire and after release.
        Raises ``LeaseLostError`` once the client knows the lease is lost: a write started with
        it now would only be refused by the fence, or, if nobody took the lock since, accepted
        although the lock may be taken at any moment. ``lock.lease.token`` still gives it (the
        explicit opt-out, for tools that leave the decision to the fence)."""
        lease = self._current()
        if lease is None:
            return None
        if lease.state is LeaseState.LOST:
            lease.check()
        return lease.token

    @property
    def lost(self) -> Any:
        """The current lease's ``lost`` event (``threading.Event``, or ``asyncio.Event`` for an
        async object): set once the lease is lost. ``None`` before acquire and after release."""
        lease = self._current()
        return lease.lost if lease is not None else None

    def _owned_locally(self) -> bool:
        return self.lease is not None and self.lease.state in _LIVE

    def _held_by(self, lease: Any, status: Any) -> bool:
        """lockd's ``status`` shows ``lease`` holding the lock: held, at this lease's fence (a
        lock never issues a fence twice, so only this lease can hold it at that fence), by this
        lease's owner label; and the lease is still live here. A shared lease carries the
        lock's write epoch, which its fellow readers share: lockd must show the lock held
        shared at that epoch with a shared holder of this owner label."""
        if not (status.held and status.fence == lease.fence and lease.state in _LIVE):
            return False
        if lease.mode == SHARED:
            return status.mode == SHARED and any(
                h.mode == SHARED and h.owner == (lease.owner or "") for h in status.holders)
        return (status.owner or "") == (lease.owner or "")

    @staticmethod
    def _is_locked(status: Any) -> bool:
        """``locked()``'s answer from the status ``_status()`` read."""
        return bool(status.held)


    def _check_seconds(self, what: str, value: Any, *, positive: bool = False) -> None:
        """``LockValueError`` for a number of seconds out of range (negative, NaN; zero too if
        ``positive``); non-numbers are left to the client's own checks (``TypeError``)."""
        if not _is_number(value):
            return
        if math.isnan(value) or value < 0 or (positive and value == 0):
            rule = "> 0" if positive else ">= 0"
            raise LockValueError(f"{what} must be {rule} seconds, got {value!r}", lock=self.name)

    def _wait_for(self, blocking: bool, timeout: float | None) -> float | None:
        if not blocking:
            if timeout is not None:
                raise LockValueError("timeout makes no sense with blocking=False (it tries once)",
                                     lock=self.name)
            return 0.0
        self._check_seconds("timeout", timeout)
        return self.wait if timeout is None else timeout

    def _check_not_owned(self) -> None:
        if self._owned_locally():
            raise LockError(f"this Lock already holds {self.name!r} (fence {self.fence}); "
                            "release it first (a Lock is not re-entrant)", lock=self.name)

    def _owned_lease(self, action: str) -> Any:
        if self.lease is None or self.lease.state is LeaseState.RELEASED:
            raise LockError(f"cannot {action} {self.name!r}: this Lock does not hold it "
                            "(never acquired, or released); acquire it first", lock=self.name)
        return self.lease

    def _released_inside(self, exc_type: Any) -> Any:
        """The lease a ``with`` block's exit releases; ``None`` when the block released it
        itself (``release()``, or ``client.release(lease)``): then ``LockError`` if the block
        ended normally (as redis-py's Lock raises), nothing if it raised (its error goes on)."""
        lease = self.lease
        if lease is not None and lease.state is not LeaseState.RELEASED:
            return lease
        self.lease = None
        if exc_type is None:
            raise LockError(f"lock {self.name!r} was released inside its with block: nothing "
                            "is left to release at its end", lock=self.name)
        return None

    def _forget(self, lease: Any, *, always: bool = False) -> None:
        """Drop ``lease`` once it is over (released or lost), or ``always`` (a ``with`` exit)."""
        if self.lease is lease and (always or lease.state in FINAL):
            self.lease = None

    def _extend_ttl(self, lease: Any, additional_time: float, replace_ttl: bool) -> float:
        """The TTL (seconds from now) that ``extend`` renews ``lease`` for; see ``Lock.extend``."""
        if not _is_number(additional_time):
            raise LockValueError(f"additional_time must be a number of seconds, got "
                                 f"{additional_time!r}", lock=self.name)
        self._check_seconds("additional_time", additional_time, positive=True)
        if math.isinf(additional_time):
            raise LockValueError("additional_time must be finite", lock=self.name)
        if replace_ttl:
            return additional_time
        # whole milliseconds (the wire's unit), rounded up: the deadline never moves by less
        return math.ceil((lease.remaining() + additional_time) * 1000) / 1000

    def _refused(self, exc: ValidationError, ttl: float, additional_time: float,
                 replace_ttl: bool) -> ValidationError:
        """lockd's 422 to an ``extend``, saying which TTL was asked and what to do instead."""
        asked = (f"a TTL of {ttl:g} s" if replace_ttl else
                 f"a TTL of {ttl:.3f} s (what was left, {ttl - additional_time:.3f} s, + "
                 f"{additional_time:g} s)")
        return ValidationError(
            f"cannot extend {self.name!r} to {asked}: lockd refused it ({exc.detail}); the lease "
            "is unchanged. Extend by less, or set the TTL with extend(ttl, replace_ttl=True)",
            status=exc.status, code=exc.code, problem=exc.problem)

    def _kw(self) -> dict[str, Any]:
        kw = {"owner": self.owner, "renew_every": self.renew_every, "on_lost": self._on_lost,
              "auto_renew": self.auto_renew}
        if self.shared:
            kw["shared"] = True
        return kw

    def __repr__(self) -> str:
        state = self.lease.state.value if self.lease is not None else "not held"
        shared = ", shared" if self.shared else ""
        return f"{type(self).__name__}({self.name!r}, ttl={self.ttl}{shared}, {state})"


class Lock(_LockBase):
    """A reusable lock of ``LockClient`` (``client.lock(name, ttl, ...)``); see the module doc."""

    lease: Lease | None

    def __init__(self, client: _Client, name: str, ttl: float, *, wait: float | None = None,
                 owner: str | None = None, renew_every: float | None = None,
                 on_lost: Callable[[Lease], Any] | None = None, auto_renew: bool = True,
                 shared: bool = False):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew, shared=shared)

    # what a kind of lock object (a semaphore, an election) asks of its client instead

    def _acquire_lease(self, wait: float | None) -> Lease | None:
        """A new lease within ``wait`` seconds (``None``: forever), or ``None`` if not granted."""
        if wait is None:
            return self.client.acquire(self.name, self.ttl, **self._kw())
        return self.client.try_acquire(self.name, self.ttl, wait=wait, **self._kw())

    def _enter_lease(self) -> Lease:
        """The lease of a ``with`` block: within the object's ``wait``, else ``AcquireTimeout``."""
        return self.client.acquire(self.name, self.ttl, wait=self.wait, **self._kw())

    def _status(self) -> Any:
        return self.client.status(self.name)

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Get a new lease: True if granted, False if the lock stayed held.

        ``blocking=False`` tries once; otherwise waits ``timeout`` seconds (default: the Lock's
        ``wait``, ``None`` = forever). Raises ``LockError`` if this object already owns the
        lock, ``LockValueError`` (a negative ``timeout``, or one with ``blocking=False``),
        ``ValidationError`` (lockd refused the name or TTL), ``ServiceUnavailable`` (lockd did
        not answer within the wait).
        """
        wait = self._wait_for(blocking, timeout)
        self._check_not_owned()
        lease = self._acquire_lease(wait)
        if lease is None:
            return False
        self.lease = lease
        return True

    def release(self) -> None:
        """Release the current lease (``LockClient.release``); ``token`` and ``fence`` are
        ``None`` after it, also when it raised ``LeaseLostError`` (the lease was lost before this
        release). ``LockError`` if this object holds nothing. A transient failure
        (``ServiceUnavailable``) keeps the lease here, so ``release()`` can be retried; its
        background renewal is stopped either way, so lockd frees the lock at its TTL."""
        lease = self._owned_lease("release")
        try:
            self.client.release(lease)
        finally:
            self._forget(lease)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lease's remaining TTL, or with
        ``replace_ttl=True`` set the TTL to ``additional_time`` seconds from now, as redis-py's
        ``Lock.extend`` does; same fence. Returns True.

        lockd's renew sets a TTL from now, so adding renews for ``remaining + additional_time``
        where ``remaining`` is the client's own view (``lease.remaining()``: time to the local
        deadline; no extra request). So the local deadline moves by ``additional_time`` (to the
        millisecond above), and lockd's expiry by the same give or take the difference of two
        requests' latencies, never before the local deadline (lockd starts a lease's clock after
        the client does). Later background renewals keep the new TTL (``lease.ttl``);
        ``reacquire()`` goes back to the Lock's ``ttl``.

        Raises ``LockError`` (this object holds nothing), ``LockValueError`` (not a positive
        finite number of seconds), ``LeaseLostError`` (the lease is no longer live),
        ``ValidationError`` (the new TTL is above lockd's maximum, ``LOCKD_MAX_TTL_MS``, 1 h by
        default: the lease is unchanged), ``ServiceUnavailable``.
        """
        lease = self._owned_lease("extend")
        ttl = self._extend_ttl(lease, additional_time, replace_ttl)
        try:
            self.client.renew(lease, ttl=ttl)
        except ValidationError as exc:
            raise self._refused(exc, ttl, additional_time, replace_ttl) from exc
        return True

    def reacquire(self) -> bool:
        """Renew the lease now for the Lock's ``ttl`` from now (undoing any ``extend``), as
        redis-py's ``Lock.reacquire`` does; same fence. Returns True. Raises ``LockError`` (this
        object holds nothing), ``LeaseLostError``, ``ServiceUnavailable``."""
        self.client.renew(self._owned_lease("reacquire"), ttl=self.ttl)
        return True

    def owned(self, check: bool = False) -> bool:
        """Does this object hold the lock?

        By default the client's own view, without a request: a lease acquired and still live
        (held, renewed, or a renewal being retried before the local deadline). With
        ``check=True`` also asks lockd (``GET /v1/locks/{name}``): True only if lockd shows the
        lock held at this lease's fence by this lease's owner label. lockd never shows lease
        ids, but a lock never issues a fence twice, so the fence names the lease. A False there
        while ``owned()`` is True means lockd ended the lease (an operator released it, or it
        expired during a pause): the next renewal will mark it lost. Raises
        ``ServiceUnavailable`` when lockd cannot answer.
        """
        lease = self.lease
        if not self._owned_locally():
            return False
        return not check or self._held_by(lease, self._status())

    def locked(self) -> bool:
        """True if anyone holds the lock now (asks lockd: ``GET /v1/locks/{name}``)."""
        return self._is_locked(self._status())

    def __enter__(self) -> Lease:
        self._check_not_owned()
        self.lease = self._enter_lease()
        return self.lease

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease = self._released_inside(exc_type)
        if lease is None:
            return
        try:
            lease.__exit__(exc_type, exc, tb)
        finally:
            self._forget(lease, always=True)


class _AskedLockd:
    """What ``AsyncLock.owned(check=True)`` returns: await it for the answer. It refuses to be
    used as a bool unawaited, where a coroutine would silently count as True."""

    __slots__ = ("_ask", "_name")

    def __init__(self, ask: Callable[[], Awaitable[bool]], name: str):
        self._ask = ask
        self._name = name

    def __await__(self) -> Generator[Any, None, bool]:
        return self._ask().__await__()

    def __bool__(self) -> bool:
        raise LockError("AsyncLock.owned(check=True) asks lockd: write "
                        "`await lock.owned(check=True)`", lock=self._name)


class AsyncLock(_LockBase):
    """The asyncio twin of ``Lock``: ``await`` ``acquire()``, ``release()``, ``extend()``,
    ``reacquire()``, ``locked()`` and ``owned(check=True)``; ``async with``. ``owned()``,
    ``fence`` and ``token`` need no request and are plain."""

    lease: AsyncLease | None

    def __init__(self, client: _AsyncClient, name: str, ttl: float, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[AsyncLease], Any] | None = None, auto_renew: bool = True,
                 shared: bool = False):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew, shared=shared)

    async def _acquire_lease(self, wait: float | None) -> AsyncLease | None:
        """See ``Lock._acquire_lease``."""
        if wait is None:
            return await self.client.acquire(self.name, self.ttl, **self._kw())
        return await self.client.try_acquire(self.name, self.ttl, wait=wait, **self._kw())

    async def _enter_lease(self) -> AsyncLease:
        return await self.client.acquire(self.name, self.ttl, wait=self.wait, **self._kw())

    async def _status(self) -> Any:
        return await self.client.status(self.name)

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """See ``Lock.acquire``."""
        wait = self._wait_for(blocking, timeout)
        self._check_not_owned()
        lease = await self._acquire_lease(wait)
        if lease is None:
            return False
        self.lease = lease
        return True

    async def release(self) -> None:
        """See ``Lock.release``."""
        lease = self._owned_lease("release")
        try:
            await self.client.release(lease)
        finally:
            self._forget(lease)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """See ``Lock.extend``."""
        lease = self._owned_lease("extend")
        ttl = self._extend_ttl(lease, additional_time, replace_ttl)
        try:
            await self.client.renew(lease, ttl=ttl)
        except ValidationError as exc:
            raise self._refused(exc, ttl, additional_time, replace_ttl) from exc
        return True

    async def reacquire(self) -> bool:
        """See ``Lock.reacquire``."""
        await self.client.renew(self._owned_lease("reacquire"), ttl=self.ttl)
        return True

    @overload
    def owned(self, check: Literal[False] = False) -> bool: ...

    @overload
    def owned(self, check: Literal[True]) -> Awaitable[bool]: ...

    def owned(self, check: bool = False) -> bool | Awaitable[bool]:
        """See ``Lock.owned``: plain by default (no request); with ``check=True`` an awaitable
        (``await lock.owned(check=True)``) that asks lockd."""
        if not check:
            return self._owned_locally()
        return _AskedLockd(self._owned_at_lockd, self.name)

    async def _owned_at_lockd(self) -> bool:
        lease = self.lease
        if not self._owned_locally():
            return False
        return self._held_by(lease, await self._status())

    async def locked(self) -> bool:
        """See ``Lock.locked``."""
        return self._is_locked(await self._status())

    async def __aenter__(self) -> AsyncLease:
        self._check_not_owned()
        self.lease = await self._enter_lease()
        return self.lease

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease = self._released_inside(exc_type)
        if lease is None:
            return
        try:
            await lease.__aexit__(exc_type, exc, tb)
        finally:
            self._forget(lease, always=True)
