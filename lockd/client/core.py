"""Every rule of the lockd clients that does no I/O, written once for ``LockClient`` (threads,
``lockd.client.sync``) and ``AsyncLockClient`` (asyncio, ``lockd.client.aio``).

As in httpx's ``BaseClient``, the two clients differ only where they send, receive and sleep.
A rule that talks to lockd is a generator of *steps*: it yields ``Send`` (a request) and gets
back the decoded JSON body, or has the request's ``LockClientError`` thrown in at the ``yield``;
it yields ``Sleep`` and is resumed after that many seconds; its return value is the rule's
result. A client runs the steps with its own I/O (``StepRun``)::

    run = StepRun(core._acquire_steps(...))
    for step in run:
        try:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)                    # or: await asyncio.sleep(...)
            else:
                run.answer(client._request(step.method, step.path, ...))
        except Exception as exc:
            run.fail(exc)
    grant = run.result

The rules: acquire (retries within the wait, splits waits over ``MAX_WAIT``, backs off during
an outage, renews a grant that came late in a long wait), renew, release, and the background
renewal of a lease (every ``renew_every``, default ttl/3, from when the previous request was
sent; retried while lockd cannot answer, until the local deadline decides). The lease states
they drive are described in ``lockd.client.lease``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lockd.client.errors import (
    AcquireTimeout,
    LeaseLostError,
    LockClientError,
    LockNotAcquired,
    ProtocolError,
    ServiceUnavailable,
    TransportError,
)
from lockd.client.lease import FINAL, LeaseRef, LeaseState, LockStatus
from lockd.client.wire import (
    DEFAULT_CONNECT_TIMEOUT,
    MAX_WAIT_MS,
    SHARED,
    Clock,
    lock_path,
    ms,
    multi_names,
    new_client_id,
    shared_modes,
)

__all__ = ["Send", "Sleep", "Step", "Steps", "StepRun", "Listing", "Route", "ClientCore"]

log = logging.getLogger("lockd.client")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Send:
    """Step: send this request to lockd; the answer is its JSON body, or its error thrown in."""

    method: str
    path: str
    json: Any = None
    params: Any = None
    timeout: float | None = None
    """Seconds for this request; ``None``: the client's ``timeout``."""
    batch: tuple[str, str, int | Callable[[], int], float] | None = None
    """A lock lease's background renewal: (lock, lease id, ttl_ms, window seconds). The client
    may hold it up to ``window`` to send it with others in one ``POST /v1/leases/renew-each``
    (``lockd.client.renewals``); the answer is the same as the single renew's."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Step: resume after ``seconds`` (sooner if the lease's renewal is being stopped)."""

    seconds: float


Step = Send | Sleep
Steps = Generator[Step, Any, T]


class StepRun(Generic[T]):
    """Walks the steps of one rule for a client that does the I/O.

    Iterate it for the next step; after a ``Send`` call ``answer(body)`` or ``fail(exc)`` (the
    error is thrown into the rule at its ``yield``: the rule catches it, or it propagates out of
    the iteration). ``result`` is the rule's return value once the iteration ends.
    """

    def __init__(self, steps: Steps[T]):
        self._steps = steps
        self._reply: Any = None
        self._error: BaseException | None = None
        self.result: T | None = None

    def __iter__(self) -> StepRun[T]:
        return self

    def __next__(self) -> Step:
        reply, error = self._reply, self._error
        self._reply = self._error = None
        try:
            return self._steps.send(reply) if error is None else self._steps.throw(error)
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    def answer(self, body: Any) -> None:
        self._reply = body

    def fail(self, exc: BaseException) -> None:
        self._error = exc


@dataclass(frozen=True, slots=True)
class Route:
    """Where an acquire that is not a plain lock's goes (a semaphore permit, a campaign):
    ``acquire`` and ``renew`` paths, ``body`` (fields the acquire adds to ``ttl_ms``,
    ``wait_ms``, ``owner``, ``client_id``); ``what`` names it in errors (``semaphore 'x'``),
    ``held_by`` says what its holder does (``led by``)."""

    acquire: str
    renew: str
    body: Mapping[str, Any]
    what: str
    held_by: str = "held by"


class Listing:
    """The paging rule of ``locks()``: ``next_page()`` is the next request (``None`` when done),
    ``take(page)`` its items, at most ``limit`` in all (``None``: no limit)."""

    def __init__(self, prefix: str, limit: int | None, page_size: int):
        self.prefix = prefix
        self.limit = limit
        self.page_size = page_size
        self._cursor: str | None = None
        self._count = 0
        self._done = False

    def next_page(self) -> Send | None:
        if self._done:
            return None
        params: dict[str, Any] = {"prefix": self.prefix, "limit": self.page_size}
        if self._cursor:
            params["cursor"] = self._cursor
        return Send("GET", "/v1/locks", params=params)

    def take(self, page: Any) -> list[LockStatus]:
        if not isinstance(page, Mapping) or not isinstance(page.get("items"), list):
            raise ProtocolError("lock list is not {items: [...]}")
        items = page["items"]
        if self.limit is not None and len(items) > self.limit - self._count:
            items = items[: max(0, self.limit - self._count)]
            self._done = True
        self._count += len(items)
        self._cursor = page.get("next_cursor")
        self._done = self._done or not self._cursor
        return [LockStatus.from_json(item) for item in items]


def renew_interval(ttl: float, renew_every: float | None) -> float:
    """Seconds between renewals: ``renew_every``, or a third of the TTL."""
    return renew_every if renew_every is not None else ttl / 3


def retry_delay(interval: float) -> float:
    """Pause between retries of a failed renewal: a quarter interval, 50 ms .. 500 ms."""
    return min(max(interval / 4, 0.05), 0.5)


def check_renew_every(renew_every: float | None, ttl: float) -> None:
    """``ValueError`` unless ``renew_every`` is ``None`` or between 0 and ``ttl`` (exclusive)."""
    if renew_every is None:
        return
    if not renew_every > 0 or renew_every >= ttl:
        raise ValueError(f"renew_every must be > 0 and < ttl ({ttl} s), got {renew_every!r}")


def _left(deadline: float | None, now: float) -> float:
    return math.inf if deadline is None else max(0.0, deadline - now)


class ClientCore:
    """The settings and the I/O-free rules both clients share (see the module docstring).

    ``url`` without a trailing ``/``; ``timeout`` (seconds) bounds each request; ``owner`` is the
    default label of acquires; ``clock`` measures lease deadlines; ``api_key`` is sent as
    ``Authorization: Bearer``; ``connect_timeout`` (seconds, default ``DEFAULT_CONNECT_TIMEOUT``,
    5) is how long a call keeps retrying a server it cannot connect to before it raises
    ``TransportError`` (``None``: retry for as long as the call may wait).
    """

    def __init__(self, url: str, timeout: float, owner: str, clock: Clock,
                 api_key: str | None = None,
                 connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT):
        if connect_timeout is not None and not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 or None, got {connect_timeout!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.owner = owner
        self._clock = clock
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    # -- acquire

    def _acquire_steps(self, name: str | None, ttl: float, wait: float | None,
                       owner: str | None, client_id: str | None, renew_every: float | None, *,
                       raise_timeout: bool, locks: Any = None, shared: Any = False,
                       route: Route | None = None) -> Steps[tuple[float, Any] | None]:
        """Acquire lock ``name`` (or all of ``locks``, then ``name`` is ignored) within ``wait``
        seconds (``None``: forever): returns ``(sent, body)`` of the grant, where ``sent`` is
        the clock reading before the request that set the lease's deadline; ``None`` if the
        lock stayed held and not ``raise_timeout`` (else ``AcquireTimeout``).

        ``shared`` asks for lock ``name`` in shared mode (with ``locks``: the names of those
        of them to hold shared); ``route`` sends the acquire elsewhere
        (a semaphore permit, a campaign: ``name`` is then only for messages).

        ``LockNotAcquired`` before the deadline asks again (after 50 ms if lockd answered
        early); ``ServiceUnavailable`` is retried with a doubling pause up to 1 s, and raised
        once the wait is over, or once lockd could not be connected to for ``connect_timeout``
        seconds in a row (``TransportError``: fail fast on a wrong URL or a stopped lockd). ``client_id`` is the same for every request of the call.
        """
        names = None if locks is None else multi_names(locks)
        if names is not None:
            name = ",".join(names)
        assert name is not None
        ttl_ms = ms(ttl, "ttl")
        if wait is not None:
            ms(wait, "wait")
        check_renew_every(renew_every, ttl)
        path = lock_path(name) + "/acquire" if names is None else "/v1/leases/acquire"
        extra: dict[str, Any] = {} if names is None else {"locks": names}
        if names is not None and shared:
            extra["modes"] = shared_modes(names, shared)
        elif shared:
            extra["mode"] = SHARED
        if route is not None:
            path, extra = route.acquire, dict(route.body)
        client_id = client_id or new_client_id()
        started = self._clock()
        deadline = None if wait is None or wait == math.inf else started + wait
        last: LockNotAcquired | None = None
        backoff = 0.05
        unreachable_since: float | None = None  # first of the failed connects in a row
        while True:
            wait_ms = self._wait_ms(deadline)
            sent = self._clock()
            try:
                body = yield Send("POST", path,
                                  json={**self._acquire_json(ttl_ms, wait_ms, owner, client_id),
                                        **extra},
                                  timeout=self.timeout + wait_ms / 1000)
            except LockNotAcquired as exc:
                last, unreachable_since = exc, None
                now = self._clock()
                if deadline is not None and deadline - now < 0.001:
                    break
                if now - sent < wait_ms / 2000:  # answered early: do not spin
                    yield Sleep(min(0.05, _left(deadline, now)))
                continue
            except ServiceUnavailable as exc:
                now = self._clock()
                if deadline is not None and deadline - now < 0.001:
                    raise
                budget_left = math.inf
                if isinstance(exc, TransportError) and exc.unreachable:
                    unreachable_since = sent if unreachable_since is None else unreachable_since
                    if self.connect_timeout is not None:
                        budget_left = unreachable_since + self.connect_timeout - now
                        if budget_left < 0.001:
                            raise
                else:
                    unreachable_since = None
                yield Sleep(min(backoff, _left(deadline, now), budget_left))
                backoff = min(backoff * 2, 1.0)
                continue
            if self._clock() - sent >= ttl / 3:
                # A waited grant may have happened anywhere in the wait, so the conservative
                # deadline (sent + ttl) can be near or past: renew now, from a fresh send time.
                renew_path = ("/v1/leases/renew" if names is not None else route.renew
                              if route is not None else lock_path(body["lock"]) + "/renew")
                renewed = yield from self._renew_fresh_grant(body, ttl, sent, renew_path)
                if renewed is None:
                    continue  # lost before we could renew: ask again within the wait
                sent, body = renewed
            return sent, body
        if not raise_timeout:
            return None
        raise self._timeout_error(name, wait, started, self._clock(), last,
                                  route=route)

    def _renew_fresh_grant(self, body: Any, ttl: float, granted_sent: float,
                           path: str) -> Steps[tuple[float, Any] | None]:
        """Renew a just-granted lease at once: ``(sent, body)``, or None if lockd says it is gone.

        A transient failure keeps the grant with its original, conservative send time
        ``granted_sent`` (its renewal retries until that deadline).
        """
        sent = self._clock()
        try:
            return sent, (yield self._renew_send(path, body["lease_id"], ttl))
        except LeaseLostError:
            return None
        except ServiceUnavailable:
            return granted_sent, body

    def _acquire_json(self, ttl_ms: int, wait_ms: int, owner: str | None,
                      client_id: str) -> dict[str, Any]:
        return {"ttl_ms": ttl_ms, "wait_ms": wait_ms,
                "owner": self.owner if owner is None else owner, "client_id": client_id}

    def _wait_ms(self, deadline: float | None) -> int:
        if deadline is None:
            return MAX_WAIT_MS
        return max(0, min(MAX_WAIT_MS, int((deadline - self._clock()) * 1000)))

    @staticmethod
    def _timeout_error(name: str, wait: float | None, started: float, now: float,
                       last: LockNotAcquired | None, route: Route | None = None
                       ) -> AcquireTimeout:
        owner = last.owner if last else None
        left = f", {last.ttl_ms / 1000:g} s left" if last and last.ttl_ms is not None else ""
        held = last.problem.get("held") if last else None
        owners = last.problem.get("owners") if last else None
        what = route.what if route is not None else None
        if isinstance(owners, list):  # a semaphore: every permit is taken
            limit = last.problem.get("limit") if last else None
            message = (f"{what or name} is full ({limit} permits, held by "
                       f"{', '.join(map(repr, owners)) or 'nobody'}{left}); not acquired "
                       f"within {wait:g} s")
        elif route is not None:
            lasting = f" ({left[2:]})" if left else ""
            message = (f"{route.what} is {route.held_by} {owner!r}{lasting}; not acquired "
                       f"within {wait:g} s")
        elif isinstance(held, list):  # a multi-lock acquire: name every holder
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

    # -- renew / release

    def _renew_send(self, path: str, lease_id: str, ttl: float | None, *,
                    cap: float | None = None, lock: str | None = None,
                    interval: float = 0.0, ttl_now: Callable[[], float] | None = None) -> Send:
        """The renew request; its timeout is the client's, or ``cap`` seconds if shorter.
        ``lock``: a lock lease's background renewal every ``interval`` seconds, which may wait
        a tenth of that (1 s at most) for others to batch with (``Send.batch``); ``ttl_now``
        gives the TTL when the batch is sent, so an explicit renewal made while it waited
        (``extend``, ``reacquire``) is not undone by it."""
        body: dict[str, Any] = {"lease_id": lease_id}
        if ttl is not None:
            body["ttl_ms"] = ms(ttl, "ttl")
        timeout = self.timeout if cap is None else min(self.timeout, cap)
        ttl_ms = (lambda: ms(ttl_now(), "ttl")) if ttl_now is not None else body.get("ttl_ms")
        batch = ((lock, lease_id, ttl_ms, min(interval / 10, 1.0))
                 if lock is not None and ttl is not None and path == lock_path(lock) + "/renew"
                 else None)
        return Send("POST", path, json=body, timeout=timeout, batch=batch)

    def _renew_steps(self, lease: Any, ttl: float | None) -> Steps[tuple[float, Any]]:
        """Renew now for ``ttl`` seconds (``None``: the lease's TTL): ``(sent, body)``.

        A ``LeaseRef`` is only asked about (the caller makes a lease of the answer); a lease
        already lost or released raises ``LeaseLostError`` without a request, and one lockd
        answers 410 for is marked lost before the error propagates.
        """
        if isinstance(lease, LeaseRef):
            sent = self._clock()
            body = yield self._renew_send(lease.path("renew"), lease.lease_id, ttl)
            return sent, body
        lease.check()
        sent = self._clock()
        asking = lease.ttl if ttl is None else ttl
        lease._asking = asking  # a background renewal sent meanwhile asks the same TTL
        try:
            body = yield self._renew_send(lease._path("renew"), lease.lease_id, asking)
        except LeaseLostError as exc:
            lease._mark_lost(exc)
            raise
        finally:
            if lease._asking == asking:
                lease._asking = None
        lease._on_renewed(sent, body)
        lease.check()
        return sent, body

    def _release_steps(self, lease: Any) -> Steps[None]:
        """Release ``lease`` (its background renewal already stopped by the caller).

        Idempotent once released. A lease lost before (410, or the local deadline passed) is
        still released at lockd, briefly (2 s at most), then raises ``LeaseLostError``; a
        transient error of a live lease's release propagates (the caller may retry).
        """
        if isinstance(lease, LeaseRef):
            yield Send("POST", lease.path("release"), json={"lease_id": lease.lease_id})
            return
        if lease._state is LeaseState.RELEASED:
            return
        lease._check_deadline()
        was_lost = lease._state is LeaseState.LOST
        try:
            yield Send("POST", lease._path("release"), json={"lease_id": lease.lease_id},
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

    # -- background renewal

    def _renewal_steps(self, lease: Any, sent_at: float,
                       stopped: Callable[[], bool]) -> Steps[None]:
        """Keep ``lease`` renewed until ``stopped()`` or it is lost or released.

        Renews every ``renew_every`` seconds (default ttl/3) measured from when the previous
        request was sent; on a transient failure the state becomes ``unknown`` and the renewal
        is retried every ``retry_delay`` until the local deadline; 410 or a passed deadline
        make it ``lost``. Each request's timeout is capped by the time left before the
        deadline, so a hung lockd cannot keep the client from declaring the loss on time. A
        ``Sleep`` here should end early when the renewal is stopped.
        """
        clock = self._clock
        next_at = sent_at + renew_interval(lease.ttl, lease.renew_every)
        while not stopped():
            lease._check_deadline()
            if lease._state in FINAL:
                return
            pause = min(next_at, lease.deadline) - clock()
            if pause > 0:
                yield Sleep(pause)
                continue
            interval = renew_interval(lease.ttl, lease.renew_every)
            sent = clock()
            try:
                body = yield self._renew_send(lease._path("renew"), lease.lease_id,
                                              lease._ttl_to_ask(),
                                              cap=max(0.01, lease.deadline - sent),
                                              lock=lease.lock, interval=interval,
                                              ttl_now=lease._ttl_to_ask)
            except LeaseLostError as exc:
                lease._mark_lost(exc)
                return
            except LockClientError as exc:
                # Anything but 410 is not proof of loss: retry until the deadline decides.
                log.info("renewal of %r failed (%s); retrying", lease.lock, exc.detail)
                lease._on_transient(exc)
                next_at = clock() + retry_delay(interval)
                continue
            except Exception as exc:  # a bug must not silently stop the renewals
                log.error("renewal of %r crashed", lease.lock, exc_info=exc)
                lease._on_transient(ProtocolError(f"renewal crashed: {exc!r}"))
                next_at = clock() + retry_delay(interval)
                continue
            lease._on_renewed(sent, body)
            next_at = sent + interval
