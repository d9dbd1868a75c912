"""Python clients of lockd: ``LockClient`` (threads) and ``AsyncLockClient`` (asyncio), both on httpx.

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

Errors are the ``lockd.client_errors`` hierarchy; every ``httpx`` error is translated at the boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json as json_module
import logging
import math
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote

import httpx

from lockd.client_errors import (
    AcquireTimeout,
    LeaseLostError,
    LockClientError,
    LockNotAcquired,
    ProtocolError,
    ServiceUnavailable,
    body_or_raise,
    error_from_response,
    translate_transport_errors,
)

__all__ = [
    "DEFAULT_URL",
    "MAX_WAIT",
    "LeaseState",
    "LeaseRef",
    "LockStatus",
    "Lease",
    "AsyncLease",
    "LockClient",
    "AsyncLockClient",
]

log = logging.getLogger("lockd.client")

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

    @classmethod
    def from_json(cls, body: Any) -> LockStatus:
        try:
            return cls(lock=str(body["lock"]), held=bool(body["held"]), fence=int(body["fence"]),
                       owner=body.get("owner"), ttl=int(body.get("ttl_ms") or 0) / 1000,
                       waiters=int(body.get("waiters") or 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed lock status: {exc!r}") from exc

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``ttl_ms`` in milliseconds)."""
        return {"lock": self.lock, "held": self.held, "fence": self.fence, "owner": self.owner,
                "ttl_ms": round(self.ttl * 1000), "waiters": self.waiters}


# --------------------------------------------------------------------------- private helpers


def _ms(seconds: float, what: str) -> int:
    """Seconds (float) -> integer milliseconds for the wire; negative is a programming error."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise TypeError(f"{what} must be a number of seconds, got {seconds!r}")
    if seconds < 0:
        raise ValueError(f"{what} must be >= 0 seconds, got {seconds!r}")
    return round(seconds * 1000) if seconds != math.inf else _MAX_WAIT_MS


def _lock_path(name: str) -> str:
    """The URL path of lock ``name``. Allowed names are URL-safe as they are ("/" separates
    segments and lockd routes on the full path); anything else is percent-encoded so lockd
    answers 422 instead of routing somewhere unexpected."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a string, got {name!r}")
    segments = [quote(seg, safe=":") for seg in name.split("/")]
    segments = [seg.replace(".", "%2E") if seg in (".", "..") else seg for seg in segments]
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

    def __init__(self, body: Mapping[str, Any], *, sent_at: float, clock: _Clock,
                 renew_every: float | None):
        data = _check_lease_body(body)
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

    def _on_renewed(self, sent_at: float, body: Mapping[str, Any]) -> None:
        data = _check_lease_body(body)
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
        log.warning("lease of %r (fence %d) lost: %s", self.lock, self.fence, reason.detail)
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
                body = self.client._post_renew(lease.lock, lease.lease_id, lease.ttl,
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
                body = await self.client._post_renew(lease.lock, lease.lease_id, lease.ttl,
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
        return AcquireTimeout(
            f"lock {name!r} is held (owner {owner!r}{left}); not acquired within {wait:g} s",
            waited=now - started, lock=name, owner=owner,
            ttl_ms=last.ttl_ms if last else None, retry_after=last.retry_after if last else None,
            status=409, code="held", problem=last.problem if last else None)


class LockClient(_ClientBase):
    """Blocking client of lockd at ``url`` (thread-safe; one ``httpx.Client`` connection pool).

    ``timeout`` (seconds, default 10) bounds each request; a waiting acquire adds its wait.
    ``owner`` is the default human label sent with acquires. ``clock`` (default
    ``time.monotonic``) measures lease deadlines; inject another for tests. ``http_client`` lets
    you pass your own ``httpx.Client`` (its base URL is ignored; the client is not closed by us).
    ``api_key``: sent as ``Authorization: Bearer`` with every request (lockd's ``LOCKD_API_KEYS``).
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: _Clock = time.monotonic, http_client: httpx.Client | None = None,
                 api_key: str | None = None):
        super().__init__(url, timeout, owner, clock, api_key)
        self._own_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)
        self._leases: set[Lease] = set()
        self._leases_mutex = threading.Lock()

    # -- plumbing

    def _request(self, method: str, path: str, *, json: Any = None, params: Any = None,
                 timeout: float | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}"):
            response = self._http.request(method, self.url + path, json=json, params=params,
                                          headers=self._headers,
                                          timeout=self.timeout if timeout is None else timeout)
        return body_or_raise(method, path, response)

    def _post_renew(self, name: str, lease_id: str, ttl: float | None, *,
                    timeout: float | None = None) -> Any:
        body: dict[str, Any] = {"lease_id": lease_id}
        if ttl is not None:
            body["ttl_ms"] = _ms(ttl, "ttl")
        t = self.timeout if timeout is None else min(self.timeout, timeout)
        return self._request("POST", _lock_path(name) + "/renew", json=body, timeout=t)

    def close(self) -> None:
        """Stop every lease's renewals (without releasing) and close the HTTP pool."""
        with self._leases_mutex:
            leases = list(self._leases)
            self._leases.clear()
        for lease in leases:
            if lease._monitor:
                lease._monitor.halt()
        if self._own_http:
            self._http.close()

    def __enter__(self) -> LockClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- acquire

    def try_acquire(self, name: str, ttl: float, *, wait: float = 0.0, owner: str | None = None,
                    client_id: str | None = None, auto_renew: bool = True,
                    renew_every: float | None = None,
                    on_lost: Callable[[Lease], Any] | None = None) -> Lease | None:
        """Acquire ``name`` for ``ttl`` seconds, waiting at most ``wait`` seconds (default 0:
        try once); return the ``Lease``, or ``None`` if the lock stayed held.

        ``auto_renew`` (default on) renews every ``renew_every`` seconds (default ttl/3) in a
        background thread until released. ``on_lost(lease)`` is called once if the lease is
        lost. ``client_id`` makes retries idempotent (generated per call if omitted). Raises
        ``ValidationError`` (bad name, TTL out of lockd's bounds), ``ServiceUnavailable``.
        """
        return self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                             on_lost, raise_timeout=False)

    def acquire(self, name: str, ttl: float, *, wait: float | None = None,
                owner: str | None = None, client_id: str | None = None, auto_renew: bool = True,
                renew_every: float | None = None,
                on_lost: Callable[[Lease], Any] | None = None) -> Lease:
        """Like ``try_acquire`` but ``wait`` defaults to forever (``None``) and failing to get
        the lock within ``wait`` seconds raises ``AcquireTimeout``.

        Waits longer than ``MAX_WAIT`` (300 s, lockd's cap) are split into several requests.
        Transient errors (503, no answer) are retried within the wait; when the wait runs out
        during an outage the last ``ServiceUnavailable`` is raised.
        """
        lease = self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                              on_lost, raise_timeout=True)
        assert lease is not None
        return lease

    def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every, on_lost, *,
                 raise_timeout: bool) -> Lease | None:
        ttl_ms = _ms(ttl, "ttl")
        if wait is not None:
            _ms(wait, "wait")
        _validate_renew_every(renew_every, ttl)
        path = _lock_path(name) + "/acquire"
        client_id = client_id or secrets.token_urlsafe(16)
        started = self._clock()
        deadline = None if wait is None or wait == math.inf else started + wait
        last: LockNotAcquired | None = None
        backoff = 0.05
        while True:
            wait_ms = self._wait_ms(deadline)
            sent = self._clock()
            try:
                body = self._request("POST", path,
                                     json=self._acquire_json(ttl_ms, wait_ms, owner, client_id),
                                     timeout=self.timeout + wait_ms / 1000)
            except LockNotAcquired as exc:
                last = exc
                now = self._clock()
                if deadline is not None and deadline - now < 0.001:
                    break
                if now - sent < wait_ms / 2000:  # answered early: do not spin
                    time.sleep(min(0.05, _left(deadline, now)))
                continue
            except ServiceUnavailable:
                now = self._clock()
                if deadline is not None and deadline - now < 0.001:
                    raise
                time.sleep(min(backoff, _left(deadline, now)))
                backoff = min(backoff * 2, 1.0)
                continue
            if self._clock() - sent >= ttl / 3:
                # A waited grant may have happened anywhere in the wait, so the conservative
                # deadline (sent + ttl) can be near or past: renew now, from a fresh send time.
                renewed = self._renew_fresh_grant(body, ttl, sent)
                if renewed is None:
                    continue  # lost before we could renew: ask again within the wait
                sent, body = renewed
            return self._start_lease(body, sent, auto_renew, renew_every, on_lost)
        if not raise_timeout:
            return None
        raise self._timeout_error(name, wait, started, self._clock(), last)

    def _renew_fresh_grant(self, body: Any, ttl: float, granted_sent: float
                           ) -> tuple[float, Any] | None:
        """Renew a just-granted lease at once: ``(sent, body)``, or None if lockd says it is gone.

        A transient failure keeps the grant with its original, conservative send time
        ``granted_sent`` (its monitor retries until that deadline).
        """
        sent = self._clock()
        try:
            return sent, self._post_renew(body["lock"], body["lease_id"], ttl)
        except LeaseLostError:
            return None
        except ServiceUnavailable:
            return granted_sent, body

    def _start_lease(self, body: Any, sent: float, auto_renew: bool, renew_every: float | None,
                     on_lost: Callable[[Lease], Any] | None) -> Lease:
        lease = Lease(self, body, sent_at=sent, renew_every=renew_every)
        if on_lost is not None:
            lease.on_lost(on_lost)
        if auto_renew:
            lease._monitor = _Monitor(self, lease, sent)
            with self._leases_mutex:
                self._leases.add(lease)
            lease._monitor.start()
        return lease

    @contextlib.contextmanager
    def lock(self, name: str, ttl: float, *, wait: float | None = None, owner: str | None = None,
             renew_every: float | None = None,
             on_lost: Callable[[Lease], Any] | None = None) -> Iterator[Lease]:
        """``with client.lock(name, ttl=30, wait=60) as lease:`` hold ``name`` while the block runs.

        Acquires (``acquire``: raises ``AcquireTimeout`` and never runs the block if not
        granted within ``wait`` seconds; ``None`` waits forever), renews in the background
        every ttl/3 and releases on exit, exceptions included. If the block finished normally
        but the lease was lost meanwhile, exit raises ``LeaseLostError``: the block's work may
        have run unprotected (the fenced resource rejected whatever came too late). If the
        block raised, its exception propagates unchanged. A transient failure of the final
        release is only logged: lockd frees the lock when its TTL runs out.
        """
        lease = self.acquire(name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                             on_lost=on_lost)
        try:
            yield lease
        except BaseException:
            self._release_at_exit(lease, failed=True)
            raise
        self._release_at_exit(lease, failed=False)

    # -- renew / release

    def renew(self, lease: Lease | LeaseRef, *, ttl: float | None = None) -> Lease:
        """Renew now for ``ttl`` seconds (default: the lease's current TTL); same fence.

        With a ``Lease``: updates its deadline and state and returns it; a lease already lost
        or released raises ``LeaseLostError`` without asking lockd (a lost lease never comes
        back). With a ``LeaseRef``: returns a new ``Lease`` without background renewal.
        Raises ``LeaseLostError`` (410), ``ServiceUnavailable``.
        """
        if isinstance(lease, LeaseRef):
            sent = self._clock()
            body = self._post_renew(lease.lock, lease.lease_id, ttl)
            return Lease(self, body, sent_at=sent)
        lease.check()
        sent = self._clock()
        try:
            body = self._post_renew(lease.lock, lease.lease_id, lease.ttl if ttl is None else ttl)
        except LeaseLostError as exc:
            lease._mark_lost(exc)
            raise
        lease._on_renewed(sent, body)
        lease.check()
        return lease

    def release(self, lease: Lease | LeaseRef) -> None:
        """Release the lease so others can acquire at once; stops its background renewal.

        Idempotent for a lease this client already released. Raises ``LeaseLostError`` if the
        lease was lost before it was released (lockd answered 410 or the local deadline had
        passed; lockd is still asked, in case it can free the lock early), ``ServiceUnavailable``
        when lockd could not answer (retry, or let the TTL run out).
        """
        if isinstance(lease, LeaseRef):
            self._request("POST", _lock_path(lease.lock) + "/release",
                          json={"lease_id": lease.lease_id})
            return
        self._stop_monitor(lease)
        if lease._state is LeaseState.RELEASED:
            return
        lease._check_deadline()
        was_lost = lease._state is LeaseState.LOST
        try:
            self._request("POST", _lock_path(lease.lock) + "/release",
                          json={"lease_id": lease.lease_id},
                          timeout=min(self.timeout, 2.0) if was_lost else None)
        except LeaseLostError as exc:
            lease._mark_lost(exc)
            lease.check()
        except LockClientError:
            if not was_lost:
                raise  # still ours as far as we know: the caller may retry
        if was_lost:
            lease.check()
        lease._mark_released()

    def _stop_monitor(self, lease: Lease) -> None:
        if lease._monitor is not None:
            lease._monitor.halt()
            with self._leases_mutex:
                self._leases.discard(lease)

    def _release_at_exit(self, lease: Lease, *, failed: bool) -> None:
        try:
            self.release(lease)
        except LeaseLostError:
            if not failed:
                raise
        except LockClientError as exc:
            if not failed and isinstance(exc, ServiceUnavailable):
                log.warning("release of %r failed (%s); lockd frees it at TTL", lease.lock,
                            exc.detail)
            elif not failed:
                raise
            else:
                log.warning("release of %r after an error failed: %s", lease.lock, exc.detail)

    # -- reads

    def status(self, name: str) -> LockStatus:
        """The lock's current state (``GET /v1/locks/{name}``); an unknown lock is not held."""
        return LockStatus.from_json(self._request("GET", _lock_path(name)))

    def locks(self, prefix: str = "", *, limit: int | None = None,
              page_size: int = 100) -> Iterator[LockStatus]:
        """Every lock whose name starts with ``prefix``, in name order, following cursors
        (``page_size`` per request, at most 1000); stops after ``limit`` items if given."""
        cursor: str | None = None
        count = 0
        while True:
            params: dict[str, Any] = {"prefix": prefix, "limit": page_size}
            if cursor:
                params["cursor"] = cursor
            page = self._request("GET", "/v1/locks", params=params)
            if not isinstance(page, Mapping) or not isinstance(page.get("items"), list):
                raise ProtocolError("lock list is not {items: [...]}")
            for item in page["items"]:
                if limit is not None and count >= limit:
                    return
                count += 1
                yield LockStatus.from_json(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def watch(self, name: str | None = None, *, prefix: str = "",
              history: int = 0) -> Iterator[dict[str, Any]]:
        """Lock events as they happen (lockd's SSE stream): of lock ``name``, or of every lock
        whose name starts with ``prefix``; ``history`` recent ones first (0-256).

        Yields ``{id, type, lock, fence, owner, ttl_ms, at}`` with ``type`` ``acquired``,
        ``released`` or ``expired``, and ``{"type": "overflow", "dropped": n}`` when this
        client fell behind and lost events. Ends when lockd closes the stream (it stops).
        Events are those the lockd process at ``url`` saw (see ``lockd.events``).
        """
        path = _lock_path(name) + "/events" if name is not None else "/v1/events"
        params: dict[str, Any] = {"history": history}
        if name is None:
            params["prefix"] = prefix
        with translate_transport_errors(f"GET {path}"), self._http.stream(
                "GET", self.url + path, params=params, headers=self._headers,
                timeout=httpx.Timeout(self.timeout, read=None)) as response:
            if response.status_code != 200:
                response.read()
                raise error_from_response(response)
            kind, data = "message", ""
            for line in response.iter_lines():
                if not line:
                    if data:
                        try:
                            event = json_module.loads(data)
                        except ValueError as exc:
                            raise ProtocolError("event data is not JSON") from exc
                        yield {**event, "type": kind} if isinstance(event, dict) else {"type": kind}
                    kind, data = "message", ""
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].lstrip(" ")


class AsyncLockClient(_ClientBase):
    """The asyncio twin of ``LockClient`` (same arguments, ``await`` everywhere).

    Background renewal runs as an asyncio task on the loop that acquired the lease;
    ``lease.lost`` is an ``asyncio.Event``. ``async with client.lock(...) as lease:``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: _Clock = time.monotonic, http_client: httpx.AsyncClient | None = None,
                 api_key: str | None = None):
        super().__init__(url, timeout, owner, clock, api_key)
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._leases: set[AsyncLease] = set()

    async def _request(self, method: str, path: str, *, json: Any = None, params: Any = None,
                       timeout: float | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}"):
            response = await self._http.request(method, self.url + path, json=json,
                                                params=params, headers=self._headers,
                                                timeout=self.timeout if timeout is None else timeout)
        return body_or_raise(method, path, response)

    async def _post_renew(self, name: str, lease_id: str, ttl: float | None, *,
                          timeout: float | None = None) -> Any:
        body: dict[str, Any] = {"lease_id": lease_id}
        if ttl is not None:
            body["ttl_ms"] = _ms(ttl, "ttl")
        t = self.timeout if timeout is None else min(self.timeout, timeout)
        return await self._request("POST", _lock_path(name) + "/renew", json=body, timeout=t)

    async def aclose(self) -> None:
        """Stop every lease's renewals (without releasing) and close the HTTP pool."""
        leases, self._leases = list(self._leases), set()
        for lease in leases:
            await self._stop_monitor(lease)
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLockClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def try_acquire(self, name: str, ttl: float, *, wait: float = 0.0,
                          owner: str | None = None, client_id: str | None = None,
                          auto_renew: bool = True, renew_every: float | None = None,
                          on_lost: Callable[[AsyncLease], Any] | None = None) -> AsyncLease | None:
        """See ``LockClient.try_acquire`` (seconds; ``None`` if the lock stayed held)."""
        return await self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                                   on_lost, raise_timeout=False)

    async def acquire(self, name: str, ttl: float, *, wait: float | None = None,
                      owner: str | None = None, client_id: str | None = None,
                      auto_renew: bool = True, renew_every: float | None = None,
                      on_lost: Callable[[AsyncLease], Any] | None = None) -> AsyncLease:
        """See ``LockClient.acquire`` (seconds; raises ``AcquireTimeout``)."""
        lease = await self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                                    on_lost, raise_timeout=True)
        assert lease is not None
        return lease

    async def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every,
                       on_lost, *, raise_timeout: bool) -> AsyncLease | None:
        ttl_ms = _ms(ttl, "ttl")
        if wait is not None:
            _ms(wait, "wait")
        _validate_renew_every(renew_every, ttl)
        path = _lock_path(name) + "/acquire"
        client_id = client_id or secrets.token_urlsafe(16)
        started = self._clock()
        deadline = None if wait is None or wait == math.inf else started + wait
        last: LockNotAcquired | None = None
        backoff = 0.05
        while True:
            wait_ms = self._wait_ms(deadline)
            sent = self._clock()
            try:
                body = await self._request(
                    "POST", path, json=self._acquire_json(ttl_ms, wait_ms, owner, client_id),
                    timeout=self.timeout + wait_ms / 1000)
            except LockNotAcquired as exc:
                last = exc
                now = self._clock()
                if deadline is not None and deadline - now < 0.001:
                    break
                if now - sent < wait_ms / 2000:
                    await asyncio.sleep(min(0.05, _left(deadline, now)))
                continue
            except ServiceUnavailable:
                now = self._clock()
                if deadline is not None and deadline - now < 0.001:
                    raise
                await asyncio.sleep(min(backoff, _left(deadline, now)))
                backoff = min(backoff * 2, 1.0)
                continue
            if self._clock() - sent >= ttl / 3:
                renewed = await self._renew_fresh_grant(body, ttl, sent)
                if renewed is None:
                    continue
                sent, body = renewed
            return self._start_lease(body, sent, auto_renew, renew_every, on_lost)
        if not raise_timeout:
            return None
        raise self._timeout_error(name, wait, started, self._clock(), last)

    async def _renew_fresh_grant(self, body: Any, ttl: float, granted_sent: float
                           ) -> tuple[float, Any] | None:
        """See ``LockClient._renew_fresh_grant``."""
        sent = self._clock()
        try:
            return sent, await self._post_renew(body["lock"], body["lease_id"], ttl)
        except LeaseLostError:
            return None
        except ServiceUnavailable:
            return granted_sent, body

    def _start_lease(self, body: Any, sent: float, auto_renew: bool, renew_every: float | None,
                     on_lost: Callable[[AsyncLease], Any] | None) -> AsyncLease:
        lease = AsyncLease(self, body, sent_at=sent, renew_every=renew_every)
        if on_lost is not None:
            lease.on_lost(on_lost)
        if auto_renew:
            monitor = _AsyncMonitor(self, lease, sent)
            lease._task = asyncio.create_task(monitor.run(), name=f"lockd-renew:{lease.lock}")
            self._leases.add(lease)
        return lease

    @contextlib.asynccontextmanager
    async def lock(self, name: str, ttl: float, *, wait: float | None = None,
                   owner: str | None = None, renew_every: float | None = None,
                   on_lost: Callable[[AsyncLease], Any] | None = None) -> AsyncIterator[AsyncLease]:
        """``async with client.lock(name, ttl=30, wait=60) as lease:``; see ``LockClient.lock``."""
        lease = await self.acquire(name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                                   on_lost=on_lost)
        try:
            yield lease
        except BaseException:
            await self._release_at_exit(lease, failed=True)
            raise
        await self._release_at_exit(lease, failed=False)

    async def renew(self, lease: AsyncLease | LeaseRef, *, ttl: float | None = None) -> AsyncLease:
        """See ``LockClient.renew``."""
        if isinstance(lease, LeaseRef):
            sent = self._clock()
            body = await self._post_renew(lease.lock, lease.lease_id, ttl)
            return AsyncLease(self, body, sent_at=sent)
        lease.check()
        sent = self._clock()
        try:
            body = await self._post_renew(lease.lock, lease.lease_id,
                                          lease.ttl if ttl is None else ttl)
        except LeaseLostError as exc:
            lease._mark_lost(exc)
            raise
        lease._on_renewed(sent, body)
        lease.check()
        return lease

    async def release(self, lease: AsyncLease | LeaseRef) -> None:
        """See ``LockClient.release``."""
        if isinstance(lease, LeaseRef):
            await self._request("POST", _lock_path(lease.lock) + "/release",
                                json={"lease_id": lease.lease_id})
            return
        await self._stop_monitor(lease)
        if lease._state is LeaseState.RELEASED:
            return
        lease._check_deadline()
        was_lost = lease._state is LeaseState.LOST
        try:
            await self._request("POST", _lock_path(lease.lock) + "/release",
                                json={"lease_id": lease.lease_id},
                                timeout=min(self.timeout, 2.0) if was_lost else None)
        except LeaseLostError as exc:
            lease._mark_lost(exc)
            lease.check()
        except LockClientError:
            if not was_lost:
                raise  # still ours as far as we know: the caller may retry
        if was_lost:
            lease.check()
        lease._mark_released()

    async def _stop_monitor(self, lease: AsyncLease) -> None:
        task = lease._task
        if task is None:
            return
        lease._stop.set()
        self._leases.discard(lease)
        if task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _release_at_exit(self, lease: AsyncLease, *, failed: bool) -> None:
        try:
            await self.release(lease)
        except LeaseLostError:
            if not failed:
                raise
        except LockClientError as exc:
            if not failed and isinstance(exc, ServiceUnavailable):
                log.warning("release of %r failed (%s); lockd frees it at TTL", lease.lock,
                            exc.detail)
            elif not failed:
                raise
            else:
                log.warning("release of %r after an error failed: %s", lease.lock, exc.detail)

    async def status(self, name: str) -> LockStatus:
        """See ``LockClient.status``."""
        return LockStatus.from_json(await self._request("GET", _lock_path(name)))

    async def locks(self, prefix: str = "", *, limit: int | None = None,
                    page_size: int = 100) -> AsyncIterator[LockStatus]:
        """See ``LockClient.locks`` (an async iterator)."""
        cursor: str | None = None
        count = 0
        while True:
            params: dict[str, Any] = {"prefix": prefix, "limit": page_size}
            if cursor:
                params["cursor"] = cursor
            page = await self._request("GET", "/v1/locks", params=params)
            if not isinstance(page, Mapping) or not isinstance(page.get("items"), list):
                raise ProtocolError("lock list is not {items: [...]}")
            for item in page["items"]:
                if limit is not None and count >= limit:
                    return
                count += 1
                yield LockStatus.from_json(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return
