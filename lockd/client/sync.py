"""``LockClient``: the blocking client of lockd (threads; one ``httpx.Client`` pool).

Leases, their states and the renewal monitor are in ``lockd.client.lease``."""

from __future__ import annotations

import json as json_module
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from lockd.client.errors import (
    LeaseLostError,
    LockClientError,
    LockNotAcquired,
    ProtocolError,
    ServiceUnavailable,
    body_or_raise,
    error_from_response,
    translate_transport_errors,
)
from lockd.client.lease import (
    DEFAULT_URL,
    Lease,
    LeaseRef,
    LeaseState,
    LockStatus,
    MultiLease,
    _ClientBase,
    _Clock,
    _left,
    _lock_path,
    _Monitor,
    _ms,
    _validate_renew_every,
    log,
    multi_names,
    new_client_id,
)
from lockd.client.lock import Lock
from lockd.common.tls import CertTypes, VerifyTypes, client_context

__all__ = ["LockClient"]


class LockClient(_ClientBase):
    """Blocking client of lockd at ``url`` (thread-safe; one ``httpx.Client`` connection pool).

    ``timeout`` (seconds, default 10) bounds each request; a waiting acquire adds its wait.
    ``owner`` is the default human label sent with acquires. ``clock`` (default
    ``time.monotonic``) measures lease deadlines; inject another for tests. ``http_client`` lets
    you pass your own ``httpx.Client`` (its base URL is ignored; the client is not closed by us).
    ``api_key``: sent as ``Authorization: Bearer`` with every request (lockd's ``LOCKD_API_KEYS``).
    TLS (an ``https://`` url): ``verify`` is a CA bundle file, an ``ssl.SSLContext``, ``True``
    (default: the system's CAs) or ``False`` (no check; tests only); ``cert`` is ``(cert_file,
    key_file)`` or one PEM file with both, presented when lockd asks (mTLS). Both are ignored
    when you pass ``http_client``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: _Clock = time.monotonic, http_client: httpx.Client | None = None,
                 api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None):
        super().__init__(url, timeout, owner, clock, api_key)
        self._own_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout,
                                                verify=client_context(verify, cert))
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
        return self._post_renew_at(_lock_path(name) + "/renew", lease_id, ttl,
                                        timeout=timeout)

    def _post_renew_at(self, path: str, lease_id: str, ttl: float | None, *,
                       timeout: float | None = None) -> Any:
        body: dict[str, Any] = {"lease_id": lease_id}
        if ttl is not None:
            body["ttl_ms"] = _ms(ttl, "ttl")
        t = self.timeout if timeout is None else min(self.timeout, timeout)
        return self._request("POST", path, json=body, timeout=t)

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
        lost. ``client_id`` makes retries idempotent: a per-attempt secret (whoever
        sends it while the lease is live gets the lease), 128 random bits made per call if
        omitted; pass your own only from ``secrets.token_urlsafe(16)`` or alike. Raises
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

    def acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                     wait: float | None = None, owner: str | None = None,
                     client_id: str | None = None, auto_renew: bool = True,
                     renew_every: float | None = None,
                     on_lost: Callable[[Lease], Any] | None = None) -> MultiLease:
        """Acquire ALL of ``locks`` (1-64 distinct names) in one atomic grant, or none: a
        ``MultiLease`` with ``locks``, ``fences`` (name -> fence) and one ``token`` carrying
        them all. While waiting nothing is held, so two callers naming the same locks in any
        order cannot deadlock. Otherwise exactly like ``acquire`` (``wait`` None: forever;
        renewals, ``lost``, ``on_lost``; ``AcquireTimeout`` names every held lock's holder in
        its ``problem``). ``with client.acquire_many([...], ttl=10) as lease:`` releases the
        whole set on exit."""
        names = multi_names(locks)
        lease = self._acquire(",".join(names), ttl, wait, owner, client_id, auto_renew,
                              renew_every, on_lost, raise_timeout=True, locks=names)
        assert isinstance(lease, MultiLease)
        return lease

    def try_acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                         wait: float = 0.0, owner: str | None = None,
                         client_id: str | None = None, auto_renew: bool = True,
                         renew_every: float | None = None,
                         on_lost: Callable[[Lease], Any] | None = None) -> MultiLease | None:
        """Like ``acquire_many`` but ``wait`` defaults to 0 (try once) and not getting the locks
        returns ``None``."""
        names = multi_names(locks)
        lease = self._acquire(",".join(names), ttl, wait, owner, client_id, auto_renew,
                              renew_every, on_lost, raise_timeout=False, locks=names)
        assert lease is None or isinstance(lease, MultiLease)
        return lease

    def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every,
                 on_lost, *, raise_timeout: bool,
                 locks: list[str] | None = None) -> Lease | None:
        ttl_ms = _ms(ttl, "ttl")
        if wait is not None:
            _ms(wait, "wait")
        _validate_renew_every(renew_every, ttl)
        path = _lock_path(name) + "/acquire" if locks is None else "/v1/leases/acquire"
        extra = {} if locks is None else {"locks": locks}
        client_id = client_id or new_client_id()
        started = self._clock()
        deadline = None if wait is None or wait == math.inf else started + wait
        last: LockNotAcquired | None = None
        backoff = 0.05
        while True:
            wait_ms = self._wait_ms(deadline)
            sent = self._clock()
            try:
                body = self._request("POST", path,
                                     json={**self._acquire_json(ttl_ms, wait_ms, owner, client_id), **extra},
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
                renewed = self._renew_fresh_grant(body, ttl, sent, multi=locks is not None)
                if renewed is None:
                    continue  # lost before we could renew: ask again within the wait
                sent, body = renewed
            return self._start_lease(body, sent, auto_renew, renew_every, on_lost,
                                     cls=Lease if locks is None else MultiLease)
        if not raise_timeout:
            return None
        raise self._timeout_error(name, wait, started, self._clock(), last)

    def _renew_fresh_grant(self, body: Any, ttl: float, granted_sent: float, *,
                           multi: bool = False
                           ) -> tuple[float, Any] | None:
        """Renew a just-granted lease at once: ``(sent, body)``, or None if lockd says it is gone.

        A transient failure keeps the grant with its original, conservative send time
        ``granted_sent`` (its monitor retries until that deadline).
        """
        sent = self._clock()
        try:
            path = "/v1/leases/renew" if multi else _lock_path(body["lock"]) + "/renew"
            return sent, self._post_renew_at(path, body["lease_id"], ttl)
        except LeaseLostError:
            return None
        except ServiceUnavailable:
            return granted_sent, body

    def _start_lease(self, body: Any, sent: float, auto_renew: bool, renew_every: float | None,
                     on_lost: Callable[[Lease], Any] | None, *, cls: type[Lease] = Lease) -> Lease:
        lease = cls(self, body, sent_at=sent, renew_every=renew_every)
        if on_lost is not None:
            lease.on_lost(on_lost)
        if auto_renew:
            lease._monitor = _Monitor(self, lease, sent)
            with self._leases_mutex:
                self._leases.add(lease)
            lease._monitor.start()
        return lease

    def lock(self, name: str, ttl: float, *, wait: float | None = None, owner: str | None = None,
             renew_every: float | None = None,
             on_lost: Callable[[Lease], Any] | None = None, auto_renew: bool = True) -> Lock:
        """A reusable ``Lock`` of ``name`` (``lockd.client.lock``): ``acquire(blocking, timeout)
        -> bool``, ``release()``, ``locked()``, ``owned()``, ``extend(ttl)``, ``fence``, ``token``.
        No request until you acquire.

        ``with client.lock(name, ttl=30, wait=60) as lease:`` holds ``name`` while the block
        runs and yields the ``Lease``. It acquires (``acquire``: raises ``AcquireTimeout`` and
        never runs the block if not granted within ``wait`` seconds; ``None`` waits forever),
        renews in the background every ttl/3 and releases on exit, exceptions included. If the
        block finished normally but the lease was lost meanwhile, exit raises
        ``LeaseLostError``: the block's work may have run unprotected (the fenced resource
        rejected whatever came too late). If the block raised, its exception propagates
        unchanged. A transient failure of the final release is only logged: lockd frees the
        lock when its TTL runs out.
        """
        return Lock(self, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                    on_lost=on_lost, auto_renew=auto_renew)

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
            body = self._post_renew_at(lease._path("renew"), lease.lease_id,
                                       lease.ttl if ttl is None else ttl)
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
            self._request("POST", lease._path("release"),
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
        client fell behind and lost events. Ends when lockd closes the stream: it stops, or
        this client fell ``LOCKD_EVENTS_QUEUE_SIZE`` events behind (then the last event is an
        overflow: re-read the lock states, or watch again).
        Events are those the lockd process at ``url`` saw (see ``lockd.server.events``).
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


