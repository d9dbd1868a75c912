"""The leases of the lockd clients (``Lease``, ``AsyncLease`` and their multi-lock kinds), their
states, and the other values the clients return (``LeaseRef``, ``LockStatus``). No I/O here:
a lease asks the client that made it to renew or release it, and the rule that renews it in
the background lives with the clients' other rules in ``lockd.client.core``.

Durations in this API are **seconds as float** (``ttl=30``, ``wait=0.5``); on the wire they are
converted to integer milliseconds (``ttl_ms``, ``wait_ms``) as the HTTP contract requires.

::

    client = LockClient("http://127.0.0.1:7070")
    with client.lock("jobs/nightly", ttl=30, wait=60) as lease:   # raises if not acquired
        session = FencedSession("http://127.0.0.1:7071", lease)
        session.upsert("reports", 7, {"id": 7, "state": "done"})  # fenced by lease.token
    # released here, also when the block raised

Leases and why the client gives up early
----------------------------------------
A lease is renewed in the background every ``ttl/3`` (``renew_every``). Its ``state`` is one of
``held`` (just acquired), ``renewed``, ``unknown`` (the last renewal failed for a transient reason,
503 or no answer, and is being retried) and ``lost``; ``released`` once you released it. It becomes
``lost`` when lockd answers 410, or when the **local deadline** passes without a successful
renewal. The deadline is ``t0 + ttl`` where ``t0`` is read from ``time.monotonic()`` *before* the
acquire or renew request that set it was sent: lockd started the lease's clock at or after ``t0``,
so the client always believes it has lost the lease no later than lockd expires it (clock rates
being equal), and never trusts a clock other than its own monotonic one.

Timeline of why ``lost`` alone is not enough, and why ``FencedSession`` exists::

    t=0   A acquires (fence 7); t0=0, ttl=10 s; A's deadline is 10
    t=1   A freezes (GC pause, SIGSTOP, swap storm) for 20 s
    t=10  lockd expires A's lease;  B acquires (fence 8) and writes through the proxy
    t=21  A wakes: its monitor sees the deadline passed and sets lease.lost, but A's main
          thread may already be sending the write it prepared at t=1
    t=21  the proxy compares fences: 7 < 8, rejects A's write with 409 -> StaleTokenError

``lost`` tells a holder to stop as early as it can; the fence is what makes a late write harmless.

Errors are the ``lockd.client.errors`` hierarchy; every ``httpx`` error is translated at the boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from lockd.client.errors import (
    LeaseLostError,
    LockClientError,
    ProtocolError,
    ServiceUnavailable,
)
from lockd.client.wire import (
    EXCLUSIVE,
    Clock,
    check_lease_body,
    check_multi_body,
    election_path,
    lock_path,
    sem_path,
)

__all__ = [
    "LeaseState",
    "LeaseRef",
    "HolderInfo",
    "LockStatus",
    "Lease",
    "AsyncLease",
    "MultiLease",
    "AsyncMultiLease",
    "FINAL",
    "SyncLeaseClient",
    "AsyncLeaseClient",
    "releasing_at_exit",
]

log = logging.getLogger("lockd.client")


class LeaseState(StrEnum):
    """Where a lease stands, as far as this client can tell."""

    HELD = "held"
    """Acquired; no renewal yet."""
    RENEWED = "renewed"
    """The last renewal succeeded."""
    UNKNOWN = "unknown"
    """The last renewal failed for a transient reason (503, no answer); retrying until the deadline."""
    LOST = "lost"
    """lockd answered 410, or the local deadline passed unrenewed. Final."""
    RELEASED = "released"
    """Released by this client. Final."""


FINAL = (LeaseState.LOST, LeaseState.RELEASED)
"""The states a lease never leaves."""


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """A lease known only by name and lease id (e.g. printed by ``lockctl acquire``).

    ``renew`` and ``release`` accept it where they accept a ``Lease``. ``kind`` says what
    ``lock`` names: ``"lock"`` (default), ``"semaphore"`` (a permit of that semaphore; release
    frees the permit) or ``"election"`` (a leader's lease; release resigns).
    """

    lock: str
    lease_id: str
    kind: str = "lock"

    def __post_init__(self) -> None:
        if self.kind not in REF_PATHS:
            raise ValueError(f"kind must be one of {', '.join(REF_PATHS)}, got {self.kind!r}")

    def path(self, op: str) -> str:
        """The URL path of ``op`` (``renew`` or ``release``) of this lease."""
        root, ops = REF_PATHS[self.kind]
        return root(self.lock) + "/" + ops.get(op, op)

    def __repr__(self) -> str:  # never show the secret
        kind = "" if self.kind == "lock" else f", kind={self.kind!r}"
        return f"LeaseRef(lock={self.lock!r}, lease_id=<hidden>{kind})"


REF_PATHS: dict[str, tuple[Callable[[str], str], dict[str, str]]] = {
    "lock": (lock_path, {}),
    "semaphore": (sem_path, {}),
    "election": (election_path, {"release": "resign"}),
}
"""Per ``LeaseRef.kind``: the URL path of the name, and the route of each op where it differs."""


@dataclass(frozen=True, slots=True)
class HolderInfo:
    """One live lease of a lock as ``GET /v1/locks/{name}`` shows it (never its lease id):
    ``owner``, ``ttl`` (seconds left), ``mode`` (``exclusive`` or ``shared``)."""

    owner: str
    ttl: float
    mode: str


@dataclass(frozen=True, slots=True)
class LockStatus:
    """``GET /v1/locks/{name}``: ``ttl`` is the holder's remaining lease in seconds (0 if free),
    ``fence`` the last fence issued (0: never), ``owner`` ``None`` when not held."""

    lock: str
    held: bool
    fence: int
    owner: str | None
    ttl: float
    waiters: int
    waiting_owners: tuple[str, ...] | None = None  # status(name) only: head first, this lockd's
    mode: str | None = None
    """``exclusive`` or ``shared`` while held (``None``: free, or a lockd without modes)."""
    holders: tuple[HolderInfo, ...] = ()
    """status(name) only: every live lease, in grant order (shared: several)."""

    @classmethod
    def from_json(cls, body: Any) -> LockStatus:
        try:
            owners = body.get("waiting_owners")
            holders = tuple(HolderInfo(owner=str(h.get("owner") or ""),
                                       ttl=int(h.get("ttl_ms") or 0) / 1000,
                                       mode=str(h.get("mode") or EXCLUSIVE))
                            for h in body.get("holders") or ())
            mode = body.get("mode")
            return cls(lock=str(body["lock"]), held=bool(body["held"]), fence=int(body["fence"]),
                       owner=body.get("owner"), ttl=int(body.get("ttl_ms") or 0) / 1000,
                       waiters=int(body.get("waiters") or 0),
                       waiting_owners=None if owners is None else tuple(map(str, owners)),
                       mode=None if mode is None else str(mode), holders=holders)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed lock status: {exc!r}") from exc

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``ttl_ms`` in milliseconds)."""
        doc = {"lock": self.lock, "held": self.held, "fence": self.fence, "owner": self.owner,
               "ttl_ms": round(self.ttl * 1000), "waiters": self.waiters}
        if self.waiting_owners is not None:
            doc["waiting_owners"] = list(self.waiting_owners)
        if self.mode is not None:
            doc["mode"] = self.mode
        if self.holders:
            doc["holders"] = [{"owner": h.owner, "ttl_ms": round(h.ttl * 1000), "mode": h.mode}
                              for h in self.holders]
        return doc


def _lost_by_deadline(lock: str) -> LeaseLostError:
    return LeaseLostError(f"lease of {lock!r} lost: local deadline passed without a renewal",
                          lock=lock, code="local_deadline")


class SyncLeaseClient(Protocol):
    """What a ``Lease`` asks of the client that made it (``LockClient`` is one)."""

    _clock: Clock

    def renew(self, lease: Any, *, ttl: float | None = None) -> Any: ...

    def release(self, lease: Any) -> None: ...


class AsyncLeaseClient(Protocol):
    """What an ``AsyncLease`` asks of the client that made it (``AsyncLockClient`` is one)."""

    _clock: Clock

    async def renew(self, lease: Any, *, ttl: float | None = None) -> Any: ...

    async def release(self, lease: Any) -> None: ...


@contextlib.contextmanager
def releasing_at_exit(lock: str, *, failed: bool) -> Iterator[None]:
    """The errors rule of the release that ends a ``with`` block holding a lease of ``lock``.

    If the block finished normally (``failed`` False), a lost lease raises ``LeaseLostError``
    (the block's work may have run unprotected) and a release refused for another reason
    raises, but ``ServiceUnavailable`` is only logged: lockd frees the lock when its TTL runs
    out. If the block raised, its exception is the one that matters: release errors are logged.
    """
    try:
        yield
    except LeaseLostError:
        if not failed:
            raise
    except LockClientError as exc:
        if failed:
            log.warning("release of %r after an error failed: %s", lock, exc.detail)
        elif isinstance(exc, ServiceUnavailable):
            log.warning("release of %r failed (%s); lockd frees it at TTL", lock, exc.detail)
        else:
            raise


# --------------------------------------------------------------------------- leases


class _LeaseBase:
    """State shared by ``Lease`` and ``AsyncLease``; see the module docstring for the states."""

    lost: Any
    _parse = staticmethod(check_lease_body)

    def __init__(self, body: Mapping[str, Any], *, sent_at: float, clock: Clock,
                 renew_every: float | None):
        data = self._parse(body)
        self.lock: str = data["lock"]
        self.lease_id: str = data["lease_id"]
        """The secret that renew and release take. Never logged, never in ``repr``."""
        self.fence: int = data["fence"]
        self.token: str = data["token"]
        """The signed fencing token (compact JWS) to hand to the protected resource."""
        self.owner: str = data["owner"]
        self.mode: str = data["mode"]
        """``exclusive`` (the default) or ``shared`` (``client.lock(name, shared=True)``): a
        shared lease's fence is the lock's write epoch, and its token may read, not write."""
        self.ttl: float = data["ttl_ms"] / 1000
        """The TTL (seconds) granted by the last acquire or renew."""
        self.renew_every = renew_every
        self.last_error: LockClientError | None = None
        """The last transient renewal error (while ``state`` is ``unknown``)."""
        self._clock = clock
        self._deadline = sent_at + self.ttl
        self._ttl_sent_at = sent_at  # when the request that granted ``ttl`` was sent
        self._asking: float | None = None  # the TTL of an explicit renew in flight
        self._state = LeaseState.HELD
        self._lost_reason: LeaseLostError | None = None
        self._callbacks: list[Callable[[Any], Any]] = []
        self._mutex = threading.Lock()

    # -- public, read-only view

    @property
    def state(self) -> LeaseState:
        """The current ``LeaseState``; reading it also applies a passed local deadline."""
        self._check_deadline()
        return self._state

    @property
    def deadline(self) -> float:
        """The local deadline on the client's monotonic clock (``time.monotonic()`` seconds)."""
        return self._deadline

    def remaining(self) -> float:
        """Seconds left before the local deadline (0 when passed or no longer held)."""
        if self._state in FINAL:
            return 0.0
        return max(0.0, self._deadline - self._clock())

    @property
    def lost_reason(self) -> LeaseLostError | None:
        """Why the lease was lost (``None`` while not lost)."""
        return self._lost_reason

    def is_lost(self) -> bool:
        return self.state is LeaseState.LOST

    def check(self) -> None:
        """Raise ``LeaseLostError`` unless the lease is (as far as the client knows) still held."""
        state = self.state
        if state is LeaseState.LOST:
            assert self._lost_reason is not None
            raise self._lost_reason
        if state is LeaseState.RELEASED:
            raise LeaseLostError(f"lease of {self.lock!r} was released", lock=self.lock,
                                 code="released")

    def as_dict(self) -> dict[str, Any]:
        """The lease in the contract's shape (includes the secret ``lease_id``)."""
        doc = {"lock": self.lock, "lease_id": self.lease_id, "fence": self.fence,
               "token": self.token, "ttl_ms": round(self.ttl * 1000), "owner": self.owner}
        if self.mode != EXCLUSIVE:
            doc["mode"] = self.mode
        return doc

    def ref(self) -> LeaseRef:
        return LeaseRef(self.lock, self.lease_id)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lock={self.lock!r}, fence={self.fence}, "
                f"state={self._state.value!r}, ttl={self.ttl})")

    # -- transitions (called by the clients and the renewal rule)

    def _check_deadline(self) -> None:
        if self._state not in FINAL and self._clock() >= self._deadline:
            self._mark_lost(_lost_by_deadline(self.lock))

    def _ttl_to_ask(self) -> float:
        """The TTL (seconds) a background renewal asks for: that of an explicit renew in flight
        (so whichever of the two lockd serves last leaves the lease at it), else ``ttl``."""
        asking = self._asking
        return self.ttl if asking is None else asking

    def _path(self, op: str) -> str:
        """The URL path of this lease's ``renew`` or ``release``."""
        return lock_path(self.lock) + "/" + op

    def _on_renewed(self, sent_at: float, body: Mapping[str, Any]) -> None:
        data = self._parse(body)
        with self._mutex:
            if self._state in FINAL:
                return  # a lost lease never comes back, even if a late renewal succeeded
            ttl = data["ttl_ms"] / 1000
            # an answer to an earlier request (a background renewal that crossed an explicit
            # renew, extend or reacquire) moves the deadline if later, never the TTL back
            if sent_at >= self._ttl_sent_at:
                self.ttl, self._ttl_sent_at = ttl, sent_at
            self.token = data["token"] or self.token
            self._deadline = max(self._deadline, sent_at + ttl)
            self._state = LeaseState.RENEWED
            self.last_error = None
        self._check_deadline()

    def _on_transient(self, exc: LockClientError) -> None:
        with self._mutex:
            if self._state in FINAL:
                return
            self._state = LeaseState.UNKNOWN
            self.last_error = exc

    def _mark_released(self) -> None:
        with self._mutex:
            if self._state not in FINAL:
                self._state = LeaseState.RELEASED

    def _mark_lost(self, reason: LeaseLostError) -> bool:
        """Enter ``lost`` (once): set the event, call the callbacks. False if already final."""
        with self._mutex:
            if self._state in FINAL:
                return False
            self._state = LeaseState.LOST
            self._lost_reason = reason
            callbacks = list(self._callbacks)
        cause = reason.detail.removeprefix(f"lease of {self.lock!r} lost: ")
        log.warning("lease of %r (fence %d) lost: %s", self.lock, self.fence, cause)
        self._signal_lost(callbacks)
        return True

    def _signal_lost(self, callbacks: list[Callable[[Any], Any]]) -> None:
        raise NotImplementedError


class Lease(_LeaseBase):
    """A lease from ``LockClient``: ``lock``, ``fence``, ``token``, ``ttl`` (s), ``state``.

    ``lost`` is a ``threading.Event`` set once when the lease is lost (check it or ``wait()`` on
    it); ``on_lost`` callbacks get the lease as their argument, are called exactly once, from the
    renewal thread (or from whatever call discovered the loss). Use as a context manager to
    release on exit.
    """

    def __init__(self, client: SyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(body, sent_at=sent_at, clock=client._clock, renew_every=renew_every)
        self._client = client
        self.lost = threading.Event()

    def on_lost(self, callback: Callable[[Lease], Any]) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once if it already is)."""
        with self._mutex:
            if self._state is not LeaseState.LOST:
                self._callbacks.append(callback)
                return
        _call_quietly(callback, self)

    def _signal_lost(self, callbacks: list[Callable[[Any], Any]]) -> None:
        self.lost.set()
        for cb in callbacks:
            _call_quietly(cb, self)

    def renew(self, ttl: float | None = None) -> Lease:
        """Renew now (``LockClient.renew``)."""
        return self._client.renew(self, ttl=ttl)

    def release(self) -> None:
        """Release (``LockClient.release``)."""
        self._client.release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        with releasing_at_exit(self.lock, failed=exc_type is not None):
            self.release()


def _call_quietly(callback: Callable[..., Any], *args: Any) -> Any:
    try:
        return callback(*args)
    except Exception:
        log.exception("on_lost callback %r raised", callback)
        return None


class AsyncLease(_LeaseBase):
    """A lease from ``AsyncLockClient``; like ``Lease`` but ``lost`` is an ``asyncio.Event``.

    ``on_lost`` callbacks may be plain functions or coroutine functions (run as a task).
    """

    def __init__(self, client: AsyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(body, sent_at=sent_at, clock=client._clock, renew_every=renew_every)
        self._client = client
        self.lost = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[Any]] = set()

    def on_lost(self, callback: Callable[[AsyncLease], Any]) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once if it already is)."""
        with self._mutex:
            if self._state is not LeaseState.LOST:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def _run_callback(self, callback: Callable[[Any], Any]) -> None:
        result = _call_quietly(callback, self)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(_await_quietly(result, callback))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _signal_lost(self, callbacks: list[Callable[[Any], Any]]) -> None:
        # asyncio.Event is not thread-safe: a loss noticed from another thread (reading
        # ``state`` there) is signalled on the lease's own loop.
        try:
            in_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            in_loop = False
        if not in_loop:
            self._loop.call_soon_threadsafe(self._signal_lost, callbacks)
            return
        self.lost.set()
        for cb in callbacks:
            self._run_callback(cb)

    async def renew(self, ttl: float | None = None) -> AsyncLease:
        """Renew now (``AsyncLockClient.renew``)."""
        return await self._client.renew(self, ttl=ttl)

    async def release(self) -> None:
        """Release (``AsyncLockClient.release``)."""
        await self._client.release(self)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        with releasing_at_exit(self.lock, failed=exc_type is not None):
            await self.release()


async def _await_quietly(awaitable: Awaitable[Any], callback: Any) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("on_lost callback %r raised", callback)


class _MultiLockLease:
    """What a multi-lock lease adds to ``Lease``/``AsyncLease``: ``locks`` (names, in name
    order), ``fences`` (name -> its own fence) and the ``/v1/leases/...`` endpoints. ``token``
    carries every fence (claim ``locks``); ``lock`` is the names joined with ``,`` (for
    messages), ``fence`` the highest of the fences."""

    _parse = staticmethod(check_multi_body)
    locks: tuple[str, ...]
    fences: dict[str, int]

    def _init_multi(self, body: Mapping[str, Any]) -> None:
        data = check_multi_body(body)
        self.fences = data["fences"]
        self.locks = tuple(self.fences)
        self.modes: dict[str, str] = data["modes"]
        """Each lock's mode (``exclusive``, or ``shared`` for those asked ``shared=[...]``)."""

    @staticmethod
    def _path(op: str) -> str:
        return "/v1/leases/" + op

    def as_dict(self) -> dict[str, Any]:
        """The lease in the contract's shape (includes the secret ``lease_id``)."""
        base: Any = self
        doc = {"lease_id": base.lease_id,
               "locks": [{"lock": n, "fence": f} for n, f in self.fences.items()],
               "token": base.token, "ttl_ms": round(base.ttl * 1000), "owner": base.owner}
        if any(mode != EXCLUSIVE for mode in self.modes.values()):
            doc["modes"] = dict(self.modes)
        return doc

    def __repr__(self) -> str:
        base: Any = self
        return (f"{type(self).__name__}(locks={self.locks!r}, fences={self.fences!r}, "
                f"state={base._state.value!r}, ttl={base.ttl})")


class MultiLease(_MultiLockLease, Lease):
    """A multi-lock lease from ``LockClient.acquire_many``: a ``Lease`` (same states, renewal
    thread, ``lost`` event, ``renew()``, ``release()``, context manager) over several locks."""

    def __init__(self, client: SyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_multi(body)

    def __enter__(self) -> MultiLease:
        return self


class AsyncMultiLease(_MultiLockLease, AsyncLease):
    """The ``AsyncLease`` twin of ``MultiLease`` (``AsyncLockClient.acquire_many``)."""

    def __init__(self, client: AsyncLeaseClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_multi(body)

    async def __aenter__(self) -> AsyncMultiLease:
        return self
