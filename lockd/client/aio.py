"""``AsyncLockClient``: the asyncio client of lockd (same API as ``LockClient``, ``await`` everywhere).

Leases, their states and the renewal monitor are in ``lockd.client.lease``."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from lockd.client.errors import (
    LeaseLostError,
    LockClientError,
    LockNotAcquired,
    ProtocolError,
    ServiceUnavailable,
    body_or_raise,
    translate_transport_errors,
)
from lockd.client.lease import (
    DEFAULT_URL,
    AsyncLease,
    AsyncMultiLease,
    LeaseRef,
    LeaseState,
    LockStatus,
    _AsyncMonitor,
    _ClientBase,
    _Clock,
    _left,
    _lock_path,
    _ms,
    _validate_renew_every,
    log,
    multi_names,
    new_client_id,
)
from lockd.client.lock import AsyncLock
from lockd.common.tls import CertTypes, VerifyTypes, client_context

__all__ = ["AsyncLockClient"]


class AsyncLockClient(_ClientBase):
    """The asyncio twin of ``LockClient`` (same arguments, ``await`` everywhere).

    Background renewal runs as an asyncio task on the loop that acquired the lease;
    ``lease.lost`` is an ``asyncio.Event``. ``async with client.lock(...) as lease:``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: _Clock = time.monotonic, http_client: httpx.AsyncClient | None = None,
                 api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None):
        super().__init__(url, timeout, owner, clock, api_key)
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout,
                                                verify=client_context(verify, cert))
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
        return await self._post_renew_at(_lock_path(name) + "/renew", lease_id, ttl,
                                        timeout=timeout)

    async def _post_renew_at(self, path: str, lease_id: str, ttl: float | None, *,
                       timeout: float | None = None) -> Any:
        body: dict[str, Any] = {"lease_id": lease_id}
        if ttl is not None:
            body["ttl_ms"] = _ms(ttl, "ttl")
        t = self.timeout if timeout is None else min(self.timeout, timeout)
        return await self._request("POST", path, json=body, timeout=t)

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

    async def acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                           wait: float | None = None, owner: str | None = None,
                           client_id: str | None = None, auto_renew: bool = True,
                           renew_every: float | None = None,
                           on_lost: Callable[[AsyncLease], Any] | None = None
                           ) -> AsyncMultiLease:
        """See ``LockClient.acquire_many`` (an ``AsyncMultiLease``; ``async with``)."""
        names = multi_names(locks)
        lease = await self._acquire(",".join(names), ttl, wait, owner, client_id, auto_renew,
                                    renew_every, on_lost, raise_timeout=True, locks=names)
        assert isinstance(lease, AsyncMultiLease)
        return lease

    async def try_acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                               wait: float = 0.0, owner: str | None = None,
                               client_id: str | None = None, auto_renew: bool = True,
                               renew_every: float | None = None,
                               on_lost: Callable[[AsyncLease], Any] | None = None
                               ) -> AsyncMultiLease | None:
        """See ``LockClient.try_acquire_many`` (``None`` if not granted within ``wait``)."""
        names = multi_names(locks)
        lease = await self._acquire(",".join(names), ttl, wait, owner, client_id, auto_renew,
                                    renew_every, on_lost, raise_timeout=False, locks=names)
        assert lease is None or isinstance(lease, AsyncMultiLease)
        return lease

    async def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every,
                       on_lost, *, raise_timeout: bool,
                       locks: list[str] | None = None) -> AsyncLease | None:
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
                body = await self._request(
                    "POST", path, json={**self._acquire_json(ttl_ms, wait_ms, owner, client_id), **extra},
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
                renewed = await self._renew_fresh_grant(body, ttl, sent, multi=locks is not None)
                if renewed is None:
                    continue
                sent, body = renewed
            return self._start_lease(body, sent, auto_renew, renew_every, on_lost,
                                     cls=AsyncLease if locks is None else AsyncMultiLease)
        if not raise_timeout:
            return None
        raise self._timeout_error(name, wait, started, self._clock(), last)

    async def _renew_fresh_grant(self, body: Any, ttl: float, granted_sent: float, *,
                           multi: bool = False
                           ) -> tuple[float, Any] | None:
        """See ``LockClient._renew_fresh_grant``."""
        sent = self._clock()
        try:
            path = "/v1/leases/renew" if multi else _lock_path(body["lock"]) + "/renew"
            return sent, await self._post_renew_at(path, body["lease_id"], ttl)
        except LeaseLostError:
            return None
        except ServiceUnavailable:
            return granted_sent, body

    def _start_lease(self, body: Any, sent: float, auto_renew: bool, renew_every: float | None,
                     on_lost: Callable[[AsyncLease], Any] | None, *, cls: type[AsyncLease] = AsyncLease) -> AsyncLease:
        lease = cls(self, body, sent_at=sent, renew_every=renew_every)
        if on_lost is not None:
            lease.on_lost(on_lost)
        if auto_renew:
            monitor = _AsyncMonitor(self, lease, sent)
            lease._task = asyncio.create_task(monitor.run(), name=f"lockd-renew:{lease.lock}")
            self._leases.add(lease)
        return lease

    def lock(self, name: str, ttl: float, *, wait: float | None = None,
             owner: str | None = None, renew_every: float | None = None,
             on_lost: Callable[[AsyncLease], Any] | None = None,
             auto_renew: bool = True) -> AsyncLock:
        """A reusable ``AsyncLock`` (``await lock.acquire()`` ...); ``async with
        client.lock(name, ttl=30, wait=60) as lease:`` as before; see ``LockClient.lock``."""
        return AsyncLock(self, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)

    async def renew(self, lease: AsyncLease | LeaseRef, *, ttl: float | None = None) -> AsyncLease:
        """See ``LockClient.renew``."""
        if isinstance(lease, LeaseRef):
            sent = self._clock()
            body = await self._post_renew(lease.lock, lease.lease_id, ttl)
            return AsyncLease(self, body, sent_at=sent)
        lease.check()
        sent = self._clock()
        try:
            body = await self._post_renew_at(lease._path("renew"), lease.lease_id,
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
            await self._request("POST", lease._path("release"),
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

