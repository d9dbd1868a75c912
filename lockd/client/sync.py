"""``LockClient``: the blocking client of lockd (threads; one ``httpx.Client`` pool).

Only the I/O is here: sending requests, sleeping, the renewal threads. Every rule (retries,
renewal timing, release) is in ``lockd.client.core``; the leases in ``lockd.client.lease``."""

from __future__ import annotations

import json as json_module
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, TypeVar

import httpx

from lockd.client.core import Listing, Sleep, StepRun, Steps
from lockd.client.election import Election
from lockd.client.errors import (
    ProtocolError,
    ServiceUnavailable,
    body_or_raise,
    error_from_response,
    translate_transport_errors,
    wrong_server,
)
from lockd.client.leadership import (
    DEFAULT_HANDOVER_GRACE,
    ElectionEvent,
    ElectionStatus,
    LeaderLease,
)
from lockd.client.lease import Lease, LeaseRef, LockStatus, MultiLease
from lockd.client.lock import Lock
from lockd.client.permits import PermitLease, SemaphoreStatus
from lockd.client.primitives import ObserveCursor, PrimitivesCore
from lockd.client.renewals import RenewalBatcher
from lockd.client.semaphore import Semaphore
from lockd.client.wire import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_URL,
    Clock,
    SseParser,
    election_path,
    lock_path,
    request_timeout,
    sem_path,
)
from lockd.common.tls import CertTypes, VerifyTypes, client_context

__all__ = ["LockClient"]

T = TypeVar("T")
L = TypeVar("L", bound=Lease)


def _handover_setup(on_handover: Callable[..., Any] | None,
                    grace: float) -> Callable[[LeaderLease], None]:
    def setup(lease: LeaderLease) -> None:
        lease.handover_grace = grace
        if on_handover is not None:
            lease.on_handover(on_handover)
    return setup


class LockClient(PrimitivesCore):
    """Blocking client of lockd at ``url`` (thread-safe; one ``httpx.Client`` connection pool).

    ``timeout`` (seconds, default 10) bounds each request; a waiting acquire adds its wait.
    ``owner`` is the default human label sent with acquires. ``clock`` (default
    ``time.monotonic``) measures lease deadlines; inject another for tests. ``http_client`` lets
    you pass your own ``httpx.Client`` (its base URL is ignored; the client is not closed by us).
    ``api_key``: sent as ``Authorization: Bearer`` with every request (lockd's ``LOCKD_API_KEYS``).
    TLS (an ``https://`` url): ``verify`` is a CA bundle file, an ``ssl.SSLContext``, ``True``
    (default: the system's CAs) or ``False`` (no check; tests only); ``cert`` is ``(cert_file,
    key_file)`` or one PEM file with both, presented when lockd asks (mTLS). Both are ignored
    when you pass ``http_client``. ``connect_timeout`` (seconds, default 5): a lockd that cannot
    be connected to (stopped, wrong URL) raises ``TransportError`` after this long, a waiting
    acquire's too; ``None`` keeps retrying while the call may wait.
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: Clock = time.monotonic, http_client: httpx.Client | None = None,
                 api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None,
                 connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT):
        super().__init__(url, timeout, owner, clock, api_key, connect_timeout)
        self._own_http = http_client is None
        self._has_cert = cert is not None  # for the message of a TLS refusal
        self._http = http_client or httpx.Client(timeout=timeout,
                                                verify=client_context(verify, cert))
        self._renewals: dict[Lease, _Renewal] = {}
        self._renewals_mutex = threading.Lock()
        self._batcher = RenewalBatcher(self._run)  # background renewals, one request a tick

    # -- plumbing

    def _request(self, method: str, path: str, *, json: Any = None, params: Any = None,
                 timeout: float | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}", has_cert=self._has_cert):
            response = self._http.request(method, self.url + path, json=json, params=params,
                                          headers=self._headers,
                                          timeout=request_timeout(
                                              self.timeout if timeout is None else timeout,
                                              self.connect_timeout))
        return body_or_raise(method, path, response, "lockd")

    def _run(self, steps: Steps[T], sleep: Callable[[float], Any] | None = None) -> T:
        """Run a rule of ``lockd.client.core``: send its requests, ``sleep`` its pauses
        (default: ``time.sleep`` as it is when called, so a process that replaces it is heard)."""
        sleep = sleep or time.sleep
        run = StepRun(steps)
        for step in run:
            try:
                if isinstance(step, Sleep):
                    sleep(step.seconds)
                elif step.batch is not None:
                    run.answer(self._batcher.renew(step))
                else:
                    run.answer(self._request(step.method, step.path, json=step.json,
                                             params=step.params, timeout=step.timeout))
            except Exception as exc:
                run.fail(exc)
        return run.result  # type: ignore[return-value]

    def close(self) -> None:
        """Stop every lease's renewals (without releasing) and close the HTTP pool."""
        with self._renewals_mutex:
            renewals = list(self._renewals.values())
            self._renewals.clear()
        for renewal in renewals:
            renewal.halt()
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
                    on_lost: Callable[[Lease], Any] | None = None,
                    shared: bool = False) -> Lease | None:
        """Acquire ``name`` for ``ttl`` seconds, waiting at most ``wait`` seconds (default 0:
        try once); return the ``Lease``, or ``None`` if the lock stayed held.

        ``auto_renew`` (default on) renews every ``renew_every`` seconds (default ttl/3) in a
        background thread until released. ``on_lost(lease)`` is called once if the lease is
        lost. ``client_id`` makes retries idempotent: a per-attempt secret (whoever
        sends it while the lease is live gets the lease), 128 random bits made per call if
        omitted; pass your own only from ``secrets.token_urlsafe(16)`` or alike. ``shared``
        asks for a shared (read) lease: it coexists with other shared ones, waits while an
        exclusive one is held or queued ahead, carries the lock's current fence (its write
        epoch, 0 if never written) and a token the proxy lets read, never write
        (``SharedTokenError``). Raises ``ValidationError`` (bad name, TTL out of lockd's
        bounds), ``ServiceUnavailable``.
        """
        return self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                             on_lost, raise_timeout=False, shared=shared)

    def acquire(self, name: str, ttl: float, *, wait: float | None = None,
                owner: str | None = None, client_id: str | None = None, auto_renew: bool = True,
                renew_every: float | None = None,
                on_lost: Callable[[Lease], Any] | None = None, shared: bool = False) -> Lease:
        """Like ``try_acquire`` but ``wait`` defaults to forever (``None``) and failing to get
        the lock within ``wait`` seconds raises ``AcquireTimeout``.

        Waits longer than ``MAX_WAIT`` (300 s, lockd's cap) are split into several requests.
        Transient errors (503, no answer) are retried within the wait; when the wait runs out
        during an outage the last ``ServiceUnavailable`` is raised.
        """
        lease = self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                              on_lost, raise_timeout=True, shared=shared)
        assert lease is not None
        return lease

    def acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                     wait: float | None = None, owner: str | None = None,
                     client_id: str | None = None, auto_renew: bool = True,
                     renew_every: float | None = None,
                     on_lost: Callable[[Lease], Any] | None = None,
                     shared: Collection[str] = ()) -> MultiLease:
        """Acquire ALL of ``locks`` (1-64 distinct names) in one atomic grant, or none: a
        ``MultiLease`` with ``locks``, ``fences`` (name -> fence) and one ``token`` carrying
        them all. While waiting nothing is held, so two callers naming the same locks in any
        order cannot deadlock. Otherwise exactly like ``acquire`` (``wait`` None: forever;
        renewals, ``lost``, ``on_lost``; ``AcquireTimeout`` names every held lock's holder in
        its ``problem``). ``with client.acquire_many([...], ttl=10) as lease:`` releases the
        whole set on exit. ``shared``: those of ``locks`` to hold shared (``lease.modes``)."""
        lease = self._acquire(None, ttl, wait, owner, client_id, auto_renew, renew_every,
                              on_lost, raise_timeout=True, locks=locks, shared=shared)
        assert isinstance(lease, MultiLease)
        return lease

    def try_acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                         wait: float = 0.0, owner: str | None = None,
                         client_id: str | None = None, auto_renew: bool = True,
                         renew_every: float | None = None,
                         on_lost: Callable[[Lease], Any] | None = None,
                         shared: Collection[str] = ()) -> MultiLease | None:
        """Like ``acquire_many`` but ``wait`` defaults to 0 (try once) and not getting the locks
        returns ``None``."""
        lease = self._acquire(None, ttl, wait, owner, client_id, auto_renew, renew_every,
                              on_lost, raise_timeout=False, locks=locks, shared=shared)
        assert lease is None or isinstance(lease, MultiLease)
        return lease

    def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every,
                 on_lost, *, raise_timeout: bool, locks: Any = None,
                 shared: bool = False) -> Lease | None:
        grant = self._run(self._acquire_steps(name, ttl, wait, owner, client_id, renew_every,
                                              raise_timeout=raise_timeout, locks=locks,
                                              shared=shared))
        return self._lease(grant, Lease if locks is None else MultiLease, renew_every, on_lost,
                           auto_renew)

    def _lease(self, grant: tuple[float, Any] | None, cls: type[L], renew_every: float | None,
               on_lost: Callable[[Any], Any] | None, auto_renew: bool,
               setup: Callable[[L], Any] | None = None) -> L | None:
        """The lease of ``cls`` made of an acquire's ``grant`` (``None``: not granted), its
        ``on_lost`` callback set and its background renewal started."""
        if grant is None:
            return None
        sent, body = grant
        lease = cls(self, body, sent_at=sent, renew_every=renew_every)
        if setup is not None:
            setup(lease)
        if on_lost is not None:
            lease.on_lost(on_lost)
        if auto_renew:
            renewal = _Renewal(self, lease, sent)
            with self._renewals_mutex:
                self._renewals[lease] = renewal
            renewal.thread.start()
        return lease

    def lock(self, name: str, ttl: float, *, wait: float | None = None, owner: str | None = None,
             renew_every: float | None = None,
             on_lost: Callable[[Lease], Any] | None = None, auto_renew: bool = True,
             shared: bool = False) -> Lock:
        """A reusable ``Lock`` of ``name`` (``lockd.client.lock``): ``acquire(blocking, timeout)
        -> bool``, ``release()``, ``locked()``, ``owned()``, ``extend(additional_time,
        replace_ttl=False)``, ``reacquire()``, ``fence``, ``token``.
        No request until you acquire.

        ``with client.lock(name, ttl=30, wait=60) as lease:`` holds ``name`` while the block
        runs and yields the ``Lease``. It acquires (``acquire``: raises ``AcquireTimeout`` and
        never runs the block if not granted within ``wait`` seconds; ``None`` waits forever),
        renews in the background every ttl/3 and releases on exit, exceptions included. If the
        block finished normally but the lease was lost meanwhile, exit raises
        ``LeaseLostError``: the block's work may have run unprotected (the fenced resource
        rejected whatever came too late). If the block raised, its exception propagates
        unchanged. A transient failure of the final release is only logged: lockd frees the
        lock when its TTL runs out. ``shared=True``: every acquire asks for a shared (read)
        lease (see ``try_acquire``).
        """
        return Lock(self, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                    on_lost=on_lost, auto_renew=auto_renew, shared=shared)

    # -- semaphores

    def try_acquire_permit(self, name: str, limit: int, ttl: float, *, wait: float = 0.0,
                           owner: str | None = None, client_id: str | None = None,
                           auto_renew: bool = True, renew_every: float | None = None,
                           on_lost: Callable[[PermitLease], Any] | None = None
                           ) -> PermitLease | None:
        """One permit of semaphore ``name`` (at most ``limit`` live permits, 1-10000) for ``ttl``
        seconds, waiting at most ``wait`` seconds (default 0: try once; waiters are served in
        FIFO order): a ``PermitLease`` (``slot``, ``fence``, ``token`` naming lock
        ``sem/{name}/{slot}``), or ``None`` while all are taken. Renewal, ``lost``,
        ``client_id``: as ``try_acquire``. Raises ``LimitMismatch`` if the permits held were
        granted under another ``limit`` (its ``limit`` says which)."""
        grant = self._run(self._permit_steps(name, limit, ttl, wait, owner, client_id,
                                             renew_every, raise_timeout=False))
        return self._lease(grant, PermitLease, renew_every, on_lost, auto_renew)

    def acquire_permit(self, name: str, limit: int, ttl: float, *, wait: float | None = None,
                       owner: str | None = None, client_id: str | None = None,
                       auto_renew: bool = True, renew_every: float | None = None,
                       on_lost: Callable[[PermitLease], Any] | None = None) -> PermitLease:
        """Like ``try_acquire_permit`` but ``wait`` defaults to forever and not getting a permit
        within it raises ``AcquireTimeout`` (naming the permits' owners)."""
        grant = self._run(self._permit_steps(name, limit, ttl, wait, owner, client_id,
                                             renew_every, raise_timeout=True))
        lease = self._lease(grant, PermitLease, renew_every, on_lost, auto_renew)
        assert lease is not None
        return lease

    def semaphore(self, name: str, limit: int, ttl: float, *, wait: float | None = None,
                  owner: str | None = None, renew_every: float | None = None,
                  on_lost: Callable[[PermitLease], Any] | None = None,
                  auto_renew: bool = True) -> Semaphore:
        """A reusable ``Semaphore`` object (``lockd.client.semaphore``) of ``limit`` permits:
        ``acquire(blocking, timeout)``, ``release()``, ``locked()`` (no permit free), ``owned()``,
        ``slot``, ``fence``, ``token``; ``with client.semaphore(name, 4, ttl=30) as permit:``."""
        return Semaphore(self, name, limit, ttl, wait=wait, owner=owner,
                         renew_every=renew_every, on_lost=on_lost, auto_renew=auto_renew)

    def semaphore_status(self, name: str) -> SemaphoreStatus:
        """``GET /v1/semaphores/{name}``: limit, last fence, live permits, waiters."""
        return SemaphoreStatus.from_json(self._request("GET", sem_path(name)))

    # -- elections

    def try_campaign(self, name: str, value: str = "", ttl: float = 10.0, *, wait: float = 0.0,
                     owner: str | None = None, client_id: str | None = None,
                     auto_renew: bool = True, renew_every: float | None = None,
                     on_lost: Callable[[LeaderLease], Any] | None = None,
                     on_handover: Callable[[LeaderLease, str], Any] | None = None,
                     handover_grace: float = DEFAULT_HANDOVER_GRACE) -> LeaderLease | None:
        """Campaign to lead election ``name`` with ``value`` (a str, at most 4096 UTF-8 bytes)
        for ``ttl`` seconds (default 10), waiting at most ``wait`` seconds (default 0: once;
        candidates are served in FIFO order): a ``LeaderLease`` whose fence is above every
        earlier leader's, or ``None`` while another leads. Renewal, ``lost``, ``client_id``: as
        ``try_acquire``. ``on_handover(lease, target)`` is called when lockd asks this leader to
        hand over; it resigns when the callback returns or after ``handover_grace`` seconds."""
        grant = self._run(self._campaign_steps(name, value, ttl, wait, owner, client_id,
                                               renew_every, raise_timeout=False))
        return self._lease(grant, LeaderLease, renew_every, on_lost, auto_renew,
                           _handover_setup(on_handover, handover_grace))

    def campaign(self, name: str, value: str = "", ttl: float = 10.0, *,
                 wait: float | None = None, owner: str | None = None,
                 client_id: str | None = None, auto_renew: bool = True,
                 renew_every: float | None = None,
                 on_lost: Callable[[LeaderLease], Any] | None = None,
                 on_handover: Callable[[LeaderLease, str], Any] | None = None,
                 handover_grace: float = DEFAULT_HANDOVER_GRACE) -> LeaderLease:
        """Like ``try_campaign`` but ``wait`` defaults to forever (blocks until leading) and not
        leading within it raises ``AcquireTimeout``."""
        grant = self._run(self._campaign_steps(name, value, ttl, wait, owner, client_id,
                                               renew_every, raise_timeout=True))
        lease = self._lease(grant, LeaderLease, renew_every, on_lost, auto_renew,
                            _handover_setup(on_handover, handover_grace))
        assert lease is not None
        return lease

    def resign(self, lease: LeaderLease | LeaseRef) -> None:
        """Give up the lead (``release`` of the leader's lease: the next candidate leads)."""
        self.release(lease)

    def proclaim(self, lease: LeaderLease, value: str) -> int:
        """Set the leader's value without a new term (same lease and fence); returns the change's
        ``seq``. Raises ``LeaseLostError`` if ``lease`` no longer leads."""
        body = self._run(self._proclaim_steps(lease, value))
        return int(body.get("seq") or 0) if isinstance(body, dict) else 0

    def leader(self, name: str) -> ElectionStatus:
        """``GET /v1/elections/{name}``: the leader's owner label, value, fence, time left."""
        return ElectionStatus.from_json(self._request("GET", election_path(name)))

    def handover(self, name: str, target: str = "next", *,
                 lease: LeaderLease | None = None) -> str | None:
        """Ask the leader of ``name`` to hand over to ``target`` (an owner label, or ``"next"``:
        the head of the queue) at its next renewal; returns the target lockd recorded. Needs
        an admin key, unless ``lease`` is the leader's own. Raises ``NoLeader`` (nobody leads)."""
        step = self._handover_send(name, target, None if lease is None else lease.lease_id)
        body = self._request(step.method, step.path, json=step.json)
        return body.get("handover_to") if isinstance(body, dict) else None

    def election(self, name: str, value: str = "", ttl: float = 10.0, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[LeaderLease], Any] | None = None,
                 on_handover: Callable[[LeaderLease, str], Any] | None = None,
                 handover_grace: float = DEFAULT_HANDOVER_GRACE,
                 auto_renew: bool = True) -> Election:
        """A reusable ``Election`` object (``lockd.client.election``): ``campaign()``,
        ``proclaim(value)``, ``resign()``, ``leader()``, ``observe()``, ``is_leader``, ``fence``,
        ``token``; ``with client.election(name, value=...).lead():`` leads while the block runs."""
        return Election(self, name, value, ttl, wait=wait, owner=owner, renew_every=renew_every,
                        on_lost=on_lost, on_handover=on_handover,
                        handover_grace=handover_grace, auto_renew=auto_renew)

    def observe(self, name: str, *, last_event_id: int | None = None,
                reconnect: bool = True) -> Iterator[ElectionEvent]:
        """The changes of election ``name`` as they happen (lockd's SSE stream), in ``seq``
        order: first its ``state``, then each ``leader``, ``proclaim`` and ``resign``
        (``ElectionEvent``). When the stream ends or breaks it reconnects (``reconnect``) with
        ``Last-Event-ID`` and goes on after the last ``seq`` seen, without repeats; it starts
        after ``last_event_id`` if given (then without ``state``). Stop by leaving the loop.
        Raises ``PermissionDenied``, ``ValidationError``; ``ServiceUnavailable`` only when not
        ``reconnect``."""
        cursor = ObserveCursor(name, last_event_id)
        while True:
            try:
                yield from self._observe_once(cursor)
            except ServiceUnavailable:
                if not reconnect:
                    raise
            if not reconnect:
                return
            time.sleep(cursor.pause())

    def _observe_once(self, cursor: ObserveCursor) -> Iterator[ElectionEvent]:
        headers = {**(self._headers or {}), **cursor.headers()}
        with translate_transport_errors(f"GET {cursor.path}"), self._http.stream(
                "GET", self.url + cursor.path, headers=headers,
                timeout=httpx.Timeout(self.timeout, read=None)) as response:
            if response.status_code != 200:
                response.read()
                raise wrong_server(response, "lockd") or error_from_response(response)
            parser = SseParser()
            for line in response.iter_lines():
                sse = parser.feed(line)
                if sse is not None and (event := cursor.take(sse)) is not None:
                    yield event

    # -- renew / release

    def renew(self, lease: Lease | LeaseRef, *, ttl: float | None = None) -> Lease:
        """Renew now for ``ttl`` seconds (default: the lease's current TTL); same fence.

        With a ``Lease``: updates its deadline and state and returns it; a lease already lost
        or released raises ``LeaseLostError`` without asking lockd (a lost lease never comes
        back). With a ``LeaseRef``: returns a new ``Lease`` without background renewal.
        Raises ``LeaseLostError`` (410), ``ServiceUnavailable``.
        """
        sent, body = self._run(self._renew_steps(lease, ttl))
        if isinstance(lease, LeaseRef):
            cls = {"semaphore": PermitLease, "election": LeaderLease}.get(lease.kind, Lease)
            return cls(self, body, sent_at=sent)
        return lease

    def release(self, lease: Lease | LeaseRef) -> None:
        """Release the lease so others can acquire at once; stops its background renewal.

        Idempotent for a lease this client already released. Raises ``LeaseLostError`` if the
        lease was lost before it was released (lockd answered 410 or the local deadline had
        passed; lockd is still asked, in case it can free the lock early), ``ServiceUnavailable``
        when lockd could not answer (retry, or let the TTL run out).
        """
        if not isinstance(lease, LeaseRef):
            with self._renewals_mutex:
                renewal = self._renewals.pop(lease, None)
            if renewal is not None:
                renewal.halt()
        self._run(self._release_steps(lease))

    # -- reads

    def status(self, name: str) -> LockStatus:
        """The lock's current state (``GET /v1/locks/{name}``); an unknown lock is not held."""
        return LockStatus.from_json(self._request("GET", lock_path(name)))

    def locks(self, prefix: str = "", *, limit: int | None = None,
              page_size: int = 100) -> Iterator[LockStatus]:
        """Every lock whose name starts with ``prefix``, in name order, following cursors
        (``page_size`` per request, at most 1000); stops after ``limit`` items if given."""
        listing = Listing(prefix, limit, page_size)
        while (page := listing.next_page()) is not None:
            yield from listing.take(self._request(page.method, page.path, params=page.params))

    def watch(self, name: str | None = None, *, prefix: str = "",
              history: int = 0) -> Iterator[dict[str, Any]]:
        """Lock events as they happen (lockd's SSE stream): of lock ``name``, or of every lock
        whose name starts with ``prefix``; ``history`` recent ones first (0-256).

        Yields ``{id, type, lock, fence, owner, ttl_ms, at}`` with ``type`` ``acquired``,
        ``released`` or ``expired``, and ``{"type": "overflow", "dropped": n}`` when this
        client fell behind and lost events. Ends when lockd closes the stream: it stops, or
        this client fell ``LOCKD_EVENTS_QUEUE_SIZE`` events behind (then the last event is an
        overflow: re-read the lock states, or watch again).
        Events are those the lockd process at ``url`` saw (see ``lockd.server.events``).
        """
        path = lock_path(name) + "/events" if name is not None else "/v1/events"
        params: dict[str, Any] = {"history": history}
        if name is None:
            params["prefix"] = prefix
        with translate_transport_errors(f"GET {path}"), self._http.stream(
                "GET", self.url + path, params=params, headers=self._headers,
                timeout=httpx.Timeout(self.timeout, read=None)) as response:
            if response.status_code != 200:
                response.read()
                raise wrong_server(response, "lockd") or error_from_response(response)
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


class _Renewal:
    """The background thread that keeps one lease renewed (``ClientCore._renewal_steps``)."""

    def __init__(self, client: LockClient, lease: Lease, sent_at: float):
        self.stop = threading.Event()
        steps = client._renewal_steps(lease, sent_at, self.stop.is_set)
        self.thread = threading.Thread(target=client._run, args=(steps, self.stop.wait),
                                       name=f"lockd-renew:{lease.lock}", daemon=True)

    def halt(self) -> None:
        self.stop.set()
        if threading.current_thread() is not self.thread:
            self.thread.join()
