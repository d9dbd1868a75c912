"""``AsyncLockClient``: the asyncio client of lockd (same API as ``LockClient``, ``await`` everywhere).

Only the I/O is here: sending requests, sleeping, the renewal tasks. Every rule (retries,
renewal timing, release) is in ``lockd.client.core``; the leases in ``lockd.client.lease``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx

from lockd.client.core import ClientCore, Listing, Sleep, StepRun, Steps
from lockd.client.errors import body_or_raise, translate_transport_errors
from lockd.client.lease import AsyncLease, AsyncMultiLease, LeaseRef, LockStatus
from lockd.client.lock import AsyncLock
from lockd.client.wire import DEFAULT_URL, Clock, lock_path
from lockd.common.tls import CertTypes, VerifyTypes, client_context

__all__ = ["AsyncLockClient"]

T = TypeVar("T")


class AsyncLockClient(ClientCore):
    """The asyncio twin of ``LockClient`` (same arguments, ``await`` everywhere).

    Background renewal runs as an asyncio task on the loop that acquired the lease;
    ``lease.lost`` is an ``asyncio.Event``. ``async with client.lock(...) as lease:``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: Clock = time.monotonic, http_client: httpx.AsyncClient | None = None,
                 api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None):
        super().__init__(url, timeout, owner, clock, api_key)
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout,
                                                verify=client_context(verify, cert))
        self._renewals: dict[AsyncLease, tuple[asyncio.Task[None], asyncio.Event]] = {}

    async def _request(self, method: str, path: str, *, json: Any = None, params: Any = None,
                       timeout: float | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}"):
            response = await self._http.request(method, self.url + path, json=json,
                                                params=params, headers=self._headers,
                                                timeout=self.timeout if timeout is None else timeout)
        return body_or_raise(method, path, response)

    async def _run(self, steps: Steps[T],
                   sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> T:
        """Run a rule of ``lockd.client.core``: send its requests, ``sleep`` its pauses."""
        run = StepRun(steps)
        for step in run:
            try:
                if isinstance(step, Sleep):
                    await sleep(step.seconds)
                else:
                    run.answer(await self._request(step.method, step.path, json=step.json,
                                                   params=step.params, timeout=step.timeout))
            except Exception as exc:
                run.fail(exc)
        return run.result  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Stop every lease's renewals (without releasing) and close the HTTP pool."""
        for lease in list(self._renewals):
            await self._stop_renewal(lease)
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
        lease = await self._acquire(None, ttl, wait, owner, client_id, auto_renew,
                                    renew_every, on_lost, raise_timeout=True, locks=locks)
        assert isinstance(lease, AsyncMultiLease)
        return lease

    async def try_acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                               wait: float = 0.0, owner: str | None = None,
                               client_id: str | None = None, auto_renew: bool = True,
                               renew_every: float | None = None,
                               on_lost: Callable[[AsyncLease], Any] | None = None
                               ) -> AsyncMultiLease | None:
        """See ``LockClient.try_acquire_many`` (``None`` if not granted within ``wait``)."""
        lease = await self._acquire(None, ttl, wait, owner, client_id, auto_renew,
                                    renew_every, on_lost, raise_timeout=False, locks=locks)
        assert lease is None or isinstance(lease, AsyncMultiLease)
        return lease

    async def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every,
                       on_lost, *, raise_timeout: bool, locks: Any = None) -> AsyncLease | None:
        grant = await self._run(self._acquire_steps(name, ttl, wait, owner, client_id,
                                                    renew_every, raise_timeout=raise_timeout,
                                                    locks=locks))
        if grant is None:
            return None
        sent, body = grant
        lease = (AsyncLease if locks is None else AsyncMultiLease)(self, body, sent_at=sent,
                                                                   renew_every=renew_every)
        if on_lost is not None:
            lease.on_lost(on_lost)
        if auto_renew:
            self._start_renewal(lease, sent)
        return lease

    def _start_renewal(self, lease: AsyncLease, sent: float) -> None:
        """Keep ``lease`` renewed in a task of the running loop (``ClientCore._renewal_steps``)."""
        stop = asyncio.Event()

        async def pause(seconds: float) -> None:  # ends early when the renewal is stopped
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)

        steps = self._renewal_steps(lease, sent, stop.is_set)
        task = asyncio.create_task(self._run(steps, pause), name=f"lockd-renew:{lease.lock}")
        self._renewals[lease] = (task, stop)

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
        sent, body = await self._run(self._renew_steps(lease, ttl))
        return AsyncLease(self, body, sent_at=sent) if isinstance(lease, LeaseRef) else lease

    async def release(self, lease: AsyncLease | LeaseRef) -> None:
        """See ``LockClient.release``."""
        if not isinstance(lease, LeaseRef):
            await self._stop_renewal(lease)
        await self._run(self._release_steps(lease))

    async def _stop_renewal(self, lease: AsyncLease) -> None:
        task, stop = self._renewals.pop(lease, (None, None))
        if task is None or stop is None:
            return
        stop.set()
        if task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def status(self, name: str) -> LockStatus:
        """See ``LockClient.status``."""
        return LockStatus.from_json(await self._request("GET", lock_path(name)))

    async def locks(self, prefix: str = "", *, limit: int | None = None,
                    page_size: int = 100) -> AsyncIterator[LockStatus]:
        """See ``LockClient.locks`` (an async iterator)."""
        listing = Listing(prefix, limit, page_size)
        while (page := listing.next_page()) is not None:
            for status in listing.take(await self._request(page.method, page.path,
                                                           params=page.params)):
                yield status
