"""Leases of the lockd clients (``Lease``, ``AsyncLease``), their renewal monitors and the clients' shared part.

The clients themselves are ``lockd.client.sync.LockClient`` (threads) and
``lockd.client.aio.AsyncLockClient`` (asyncio), both on httpx.

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
import math
import secrets
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from lockd.client.errors import (
    AcquireTimeout,
    LeaseLostError,
    LockClientError,
    LockNotAcquired,
    ProtocolError,
    ValidationError,
)
from lockd.common.names import LOCK_NAME_RULE, bad_segment

if TYPE_CHECKING:  # the clients import this module, not the other way round
    from lockd.client.aio import AsyncLockClient
    from lockd.client.sync import LockClient

__all__ = [
    "DEFAULT_URL",
    "MAX_WAIT",
    "LeaseState",
    "LeaseRef",
    "LockStatus",
    "Lease",
    "AsyncLease",
    "MultiLease",
    "AsyncMultiLease",
]

log = logging.getLogger("lockd.client")
log.addHandler(logging.NullHandler())  # a library: silent unless the program configures logging

DEFAULT_URL = "http://127.0.0.1:7070"
MAX_WAIT = 300.0
"""lockd caps one request's ``wait_ms`` at 300 000 ms; longer waits are split into several requests."""

_MAX_WAIT_MS = int(MAX_WAIT * 1000)
_Clock = Callable[[], float]


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


_FINAL = (LeaseState.LOST, LeaseState.RELEASED)


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """A lease known only by lock name and lease id (e.g. printed by ``lockctl acquire``).

    ``renew`` and ``release`` accept it where they accept a ``Lease``.
    """

    lock: str
    lease_id: str

    def __repr__(self) -> str:  # never show the secret
        return f"LeaseRef(lock={self.lock!r}, lease_id=<hidden>)"


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

    @classmethod
    def from_json(cls, body: Any) -> LockStatus:
        try:
            owners = body.get("waiting_owners")
            return cls(lock=str(body["lock"]), held=bool(body["held"]), fence=int(body["fence"]),
                       owner=body.get("owner"), ttl=int(body.get("ttl_ms") or 0) / 1000,
                       waiters=int(body.get("waiters") or 0),
                       waiting_owners=None if owners is None else tuple(map(str, owners)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed lock status: {exc!r}") from exc

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``ttl_ms`` in milliseconds)."""
        doc = {"lock": self.lock, "held": self.held, "fence": self.fence, "owner": self.owner,
               "ttl_ms": round(self.ttl * 1000), "waiters": self.waiters}
        if self.waiting_owners is not None:
            doc["waiting_owners"] = list(self.waiting_owners)
        return doc


# --------------------------------------------------------------------------- private helpers


def _ms(seconds: float, what: str) -> int:
    """Seconds (float) -> integer milliseconds for the wire; negative is a programming error."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise TypeError(f"{what} must be a number of seconds, got {seconds!r}")
    if seconds < 0:
        raise ValueError(f"{what} must be >= 0 seconds, got {seconds!r}")
    return round(seconds * 1000) if seconds != math.inf else _MAX_WAIT_MS


def new_client_id() -> str:
    """A fresh acquire ``client_id``: 128 random bits as 22 URL-safe characters (lockd refuses
    shorter ones). It is a per-attempt secret: every retry of one acquire call reuses it (so a
    retry after a lost answer gets the same lease), no two calls share one."""
    return secrets.token_urlsafe(16)


def check_segments(name: str) -> str:
    """``name``, unless it has an empty, ``.`` or ``..`` segment (``a//b``, ``a/../b``, a leading
    or trailing ``/``): such a name is refused here with ``ValidationError`` before any request,
    because HTTP clients rewrite it in the URL (``a/../b`` would reach the server as ``b``) and
    lockd and the proxy answer 422 to it anyway (``lockd.common.names``)."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a string, got {name!r}")
    if bad_segment(name):
        raise ValidationError(f"{LOCK_NAME_RULE} (got {name[:300]!r})", code="invalid_request")
    return name


def _lock_path(name: str) -> str:
    """The URL path of lock ``name``. Allowed names are URL-safe as they are ("/" separates
    segments and lockd routes on the full path); other characters are percent-encoded so lockd
    answers 422 instead of routing somewhere unexpected. Segment errors: see ``check_segments``."""
    segments = [quote(seg, safe=":") for seg in check_segments(name).split("/")]
    return "/v1/locks/" + "/".join(segments)


def _left(deadline: float | None, now: float) -> float:
    return math.inf if deadline is None else max(0.0, deadline - now)


def _retry_delay(interval: float) -> float:
    """Pause between retries of a failed renewal: a quarter interval, 50 ms .. 500 ms."""
    return min(max(interval / 4, 0.05), 0.5)


def _check_lease_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise ProtocolError("lease body is not an object")
    try:
        out = {"lock": str(body["lock"]), "lease_id": str(body["lease_id"]),
               "fence": int(body["fence"]), "token": str(body["token"]),
               "ttl_ms": int(body["ttl_ms"]), "owner": str(body.get("owner") or "")}
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed lease body: missing or bad {exc}") from exc
    return out


def _check_multi_body(body: Any) -> dict[str, Any]:
    """A multi-lock lease body, in the shape ``_LeaseBase`` keeps (plus ``fences``)."""
    if not isinstance(body, Mapping):
        raise ProtocolError("lease body is not an object")
    try:
        fences = {str(item["lock"]): int(item["fence"]) for item in body["locks"]}
        if not fences:
            raise ValueError("locks is empty")
        out = {"lock": ",".join(fences), "lease_id": str(body["lease_id"]),
               "fence": max(fences.values()), "token": str(body["token"]),
               "ttl_ms": int(body["ttl_ms"]), "owner": str(body.get("owner") or ""),
               "fences": fences}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed multi-lock lease body: missing or bad {exc}") from exc
    return out


def multi_names(locks: Any) -> list[str]:
    """The lock names of an ``acquire_many`` call, checked (``ValidationError`` for none, a
    duplicate or a bad name: before any request)."""
    if isinstance(locks, str) or not isinstance(locks, list | tuple):
        raise TypeError(f"locks must be a list of lock names, got {locks!r}")
    names = [check_segments(name) for name in locks]
    if not names:
        raise ValidationError("locks must name at least one lock", code="invalid_request")
    if len(set(names)) != len(names):
        raise ValidationError(f"locks must be distinct (got {names!r})", code="invalid_request")
    return names


def _lost_by_deadline(lock: str) -> LeaseLostError:
    return LeaseLostError(f"lease of {lock!r} lost: local deadline passed without a renewal",
                          lock=lock, code="local_deadline")


def _renew_interval(ttl: float, renew_every: float | None) -> float:
    return renew_every if renew_every is not None else ttl / 3


def _validate_renew_every(renew_every: float | None, ttl: float) -> None:
    if renew_every is None:
        return
    if not renew_every > 0 or renew_every >= ttl:
        raise ValueError(f"renew_every must be > 0 and < ttl ({ttl} s), got {renew_every!r}")


# --------------------------------------------------------------------------- leases


class _LeaseBase:
    """State shared by ``Lease`` and ``AsyncLease``; see the module docstring for the states."""

    lost: Any
    _parse = staticmethod(_check_lease_body)

    def __init__(self, body: Mapping[str, Any], *, sent_at: float, clock: _Clock,
                 renew_every: float | None):
        data = self._parse(body)
        self.lock: str = data["lock"]
        self.lease_id: str = data["lease_id"]
        """The secret that renew and release take. Never logged, never in ``repr``."""
        self.fence: int = data["fence"]
        self.token: str = data["token"]
        """The signed fencing token (compact JWS) to hand to the protected resource."""
        self.owner: str = data["owner"]
        self.ttl: float = data["ttl_ms"] / 1000
        """The TTL (seconds) granted by the last acquire or renew."""
        self.renew_every = renew_every
        self.last_error: LockClientError | None = None
        """The last transient renewal error (while ``state`` is ``unknown``)."""
        self._clock = clock
        self._deadline = sent_at + self.ttl
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
        if self._state in _FINAL:
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
        return {"lock": self.lock, "lease_id": self.lease_id, "fence": self.fence,
                "token": self.token, "ttl_ms": round(self.ttl * 1000), "owner": self.owner}

    def ref(self) -> LeaseRef:
        return LeaseRef(self.lock, self.lease_id)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lock={self.lock!r}, fence={self.fence}, "
                f"state={self._state.value!r}, ttl={self.ttl})")

    # -- transitions (called by the clients and the monitor)

    def _check_deadline(self) -> None:
        if self._state not in _FINAL and self._clock() >= self._deadline:
            self._mark_lost(_lost_by_deadline(self.lock))

    def _path(self, op: str) -> str:
        """The URL path of this lease's ``renew`` or ``release``."""
        return _lock_path(self.lock) + "/" + op

    def _on_renewed(self, sent_at: float, body: Mapping[str, Any]) -> None:
        data = self._parse(body)
        with self._mutex:
            if self._state in _FINAL:
                return  # a lost lease never comes back, even if a late renewal succeeded
            self.ttl = data["ttl_ms"] / 1000
            self.token = data["token"] or self.token
            self._deadline = max(self._deadline, sent_at + self.ttl)
            self._state = LeaseState.RENEWED
            self.last_error = None
        self._check_deadline()

    def _on_transient(self, exc: LockClientError) -> None:
        with self._mutex:
            if self._state in _FINAL:
                return
            self._state = LeaseState.UNKNOWN
            self.last_error = exc

    def _mark_released(self) -> None:
        with self._mutex:
            if self._state not in _FINAL:
                self._state = LeaseState.RELEASED

    def _mark_lost(self, reason: LeaseLostError) -> bool:
        """Enter ``lost`` (once): set the event, call the callbacks. False if already final."""
        with self._mutex:
            if self._state in _FINAL:
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

    def __init__(self, client: LockClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(body, sent_at=sent_at, clock=client._clock, renew_every=renew_every)
        self._client = client
        self.lost = threading.Event()
        self._monitor: _Monitor | None = None

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
        self._client._release_at_exit(self, failed=exc_type is not None)


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

    def __init__(self, client: AsyncLockClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(body, sent_at=sent_at, clock=client._clock, renew_every=renew_every)
        self._client = client
        self.lost = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
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
        await self._client._release_at_exit(self, failed=exc_type is not None)


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

    _parse = staticmethod(_check_multi_body)
    locks: tuple[str, ...]
    fences: dict[str, int]

    def _init_multi(self, body: Mapping[str, Any]) -> None:
        fences = _check_multi_body(body)["fences"]
        self.fences = fences
        self.locks = tuple(fences)

    @staticmethod
    def _path(op: str) -> str:
        return "/v1/leases/" + op

    def as_dict(self) -> dict[str, Any]:
        """The lease in the contract's shape (includes the secret ``lease_id``)."""
        base: Any = self
        return {"lease_id": base.lease_id,
                "locks": [{"lock": n, "fence": f} for n, f in self.fences.items()],
                "token": base.token, "ttl_ms": round(base.ttl * 1000), "owner": base.owner}

    def __repr__(self) -> str:
        base: Any = self
        return (f"{type(self).__name__}(locks={self.locks!r}, fences={self.fences!r}, "
                f"state={base._state.value!r}, ttl={base.ttl})")


class MultiLease(_MultiLockLease, Lease):
    """A multi-lock lease from ``LockClient.acquire_many``: a ``Lease`` (same states, renewal
    thread, ``lost`` event, ``renew()``, ``release()``, context manager) over several locks."""

    def __init__(self, client: LockClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_multi(body)

    def __enter__(self) -> MultiLease:
        return self


class AsyncMultiLease(_MultiLockLease, AsyncLease):
    """The ``AsyncLease`` twin of ``MultiLease`` (``AsyncLockClient.acquire_many``)."""

    def __init__(self, client: AsyncLockClient, body: Mapping[str, Any], *, sent_at: float,
                 renew_every: float | None = None):
        super().__init__(client, body, sent_at=sent_at, renew_every=renew_every)
        self._init_multi(body)

    async def __aenter__(self) -> AsyncMultiLease:
        return self


# --------------------------------------------------------------------------- renewal monitors


class _Monitor:
    """The background renewal thread of one ``Lease``.

    Renews every ``renew_every`` seconds (default ttl/3) measured from when the previous request
    was sent; on a transient failure the state becomes ``unknown`` and the renewal is retried
    every ``_retry_delay`` until the local deadline; 410 or a passed deadline make it ``lost``.
    Each request's timeout is capped by the time left before the deadline, so a hung lockd
    cannot keep the thread from declaring the loss on time.
    """

    def __init__(self, client: LockClient, lease: Lease, sent_at: float):
        self.client = client
        self.lease = lease
        self.stop = threading.Event()
        self.next_at = sent_at + _renew_interval(lease.ttl, lease.renew_every)
        self.thread = threading.Thread(target=self._run, name=f"lockd-renew:{lease.lock}",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        if threading.current_thread() is not self.thread:
            self.thread.join()

    def _run(self) -> None:
        lease, clock = self.lease, self.client._clock
        while not self.stop.is_set():
            lease._check_deadline()
            if lease._state in _FINAL:
                return
            now = clock()
            pause = min(self.next_at, lease.deadline) - now
            if pause > 0:
                self.stop.wait(pause)
                continue
            interval = _renew_interval(lease.ttl, lease.renew_every)
            sent = clock()
            try:
                body = self.client._post_renew_at(lease._path("renew"), lease.lease_id,
                                                  lease.ttl,
                                                  timeout=max(0.01, lease.deadline - sent))
            except LeaseLostError as exc:
                lease._mark_lost(exc)
                return
            except LockClientError as exc:
                # Anything but 410 is not proof of loss: retry until the deadline decides.
                log.info("renewal of %r failed (%s); retrying", lease.lock, exc.detail)
                lease._on_transient(exc)
                self.next_at = clock() + _retry_delay(interval)
                continue
            except Exception as exc:  # a bug must not silently stop the renewals
                log.exception("renewal of %r crashed", lease.lock)
                lease._on_transient(ProtocolError(f"renewal crashed: {exc!r}"))
                self.next_at = clock() + _retry_delay(interval)
                continue
            lease._on_renewed(sent, body)
            self.next_at = sent + interval


class _AsyncMonitor:
    """The asyncio-task twin of ``_Monitor`` (same schedule and rules)."""

    def __init__(self, client: AsyncLockClient, lease: AsyncLease, sent_at: float):
        self.client = client
        self.lease = lease
        self.next_at = sent_at + _renew_interval(lease.ttl, lease.renew_every)

    async def run(self) -> None:
        lease, clock = self.lease, self.client._clock
        while not lease._stop.is_set():
            lease._check_deadline()
            if lease._state in _FINAL:
                return
            pause = min(self.next_at, lease.deadline) - clock()
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lease._stop.wait(), pause)
                continue
            interval = _renew_interval(lease.ttl, lease.renew_every)
            sent = clock()
            try:
                body = await self.client._post_renew_at(lease._path("renew"), lease.lease_id,
                                                        lease.ttl,
                                                        timeout=max(0.01, lease.deadline - sent))
            except LeaseLostError as exc:
                lease._mark_lost(exc)
                return
            except LockClientError as exc:
                log.info("renewal of %r failed (%s); retrying", lease.lock, exc.detail)
                lease._on_transient(exc)
                self.next_at = clock() + _retry_delay(interval)
                continue
            except Exception as exc:
                log.exception("renewal of %r crashed", lease.lock)
                lease._on_transient(ProtocolError(f"renewal crashed: {exc!r}"))
                self.next_at = clock() + _retry_delay(interval)
                continue
            lease._on_renewed(sent, body)
            self.next_at = sent + interval


# --------------------------------------------------------------------------- clients


class _ClientBase:
    def __init__(self, url: str, timeout: float, owner: str, clock: _Clock,
                 api_key: str | None = None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.owner = owner
        self._clock = clock
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    def _acquire_json(self, ttl_ms: int, wait_ms: int, owner: str | None,
                      client_id: str) -> dict[str, Any]:
        return {"ttl_ms": ttl_ms, "wait_ms": wait_ms, "owner": self.owner if owner is None else owner,
                "client_id": client_id}

    def _wait_ms(self, deadline: float | None) -> int:
        if deadline is None:
            return _MAX_WAIT_MS
        return max(0, min(_MAX_WAIT_MS, int((deadline - self._clock()) * 1000)))

    @staticmethod
    def _timeout_error(name: str, wait: float | None, started: float, now: float,
                       last: LockNotAcquired | None) -> AcquireTimeout:
        owner = last.owner if last else None
        left = f", {last.ttl_ms / 1000:g} s left" if last and last.ttl_ms is not None else ""
        held = last.problem.get("held") if last else None
        if isinstance(held, list):  # a multi-lock acquire: name every holder
            listed = ", ".join(f"{h.get('lock')!r} (owner {h.get('owner')!r})" for h in held
                               if isinstance(h, dict)) or "none (waiters queued ahead)"
            message = f"locks {name} not acquired within {wait:g} s; held: {listed}"
        else:
            message = f"lock {name!r} is held (owner {owner!r}{left}); not acquired within {wait:g} s"
        return AcquireTimeout(
            message,
            waited=now - started, lock=name, owner=owner,
            ttl_ms=last.ttl_ms if last else None, retry_after=last.retry_after if last else None,
            status=409, code="held", problem=last.problem if last else None)
