"""``AsyncLockClient``: the asyncio client of lockd (same API as ``LockClient``, ``await`` everywhere).

Only the I/O is here: sending requests, sleeping, the renewal tasks. Every rule (retries,
renewal timing, release) is in ``lockd.client.core``; the leases in ``lockd.client.lease``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, TypeVar

import httpx

from lockd.client.core import Listing, Sleep, StepRun, Steps
from lockd.client.election import AsyncElection
from lockd.client.errors import (
    ServiceUnavailable,
    body_or_raise,
    error_from_response,
    translate_transport_errors,
    wrong_server,
)
from lockd.client.leadership import (
    DEFAULT_HANDOVER_GRACE,
    AsyncLeaderLease,
    ElectionEvent,
    ElectionStatus,
)
from lockd.client.lease import AsyncLease, AsyncMultiLease, LeaseRef, LockStatus
from lockd.client.lock import AsyncLock
from lockd.client.permits import AsyncPermitLease, SemaphoreStatus
from lockd.client.primitives import ObserveCursor, PrimitivesCore
from lockd.client.renewals import AsyncRenewalBatcher
from lockd.client.semaphore import AsyncSemaphore
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

__all__ = ["AsyncLockClient"]

T = TypeVar("T")
L = TypeVar("L", bound=AsyncLease)


def _handover_setup(on_handover: Callable[..., Any] | None,
                    grace: float) -> Callable[[AsyncLeaderLease], None]:
    def setup(lease: AsyncLeaderLease) -> None:
        lease.handover_grace = grace
        if on_handover is not None:
            lease.on_handover(on_handover)
    return setup


class AsyncLockClient(PrimitivesCore):
    """The asyncio twin of ``LockClient`` (same arguments, ``await`` everywhere).

    Background renewal runs as an asyncio task on the loop that acquired the lease;
    ``lease.lost`` is an ``asyncio.Event``. ``async with client.lock(...) as lease:``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, owner: str = "",
                 clock: Clock = time.monotonic, http_client: httpx.AsyncClient | None = None,
                 api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None,
                 connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT):
        super().__init__(url, timeout, owner, clock, api_key, connect_timeout)
        self._own_http = http_client is None
        self._has_cert = cert is not None  # for the message of a TLS refusal
        self._http = http_client or httpx.AsyncClient(timeout=timeout,
                                                verify=client_context(verify, cert))
        self._renewals: dict[AsyncLease, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._batcher = AsyncRenewalBatcher(self._run)  # background renewals, batched

    async def _request(self, method: str, path: str, *, json: Any = None, params: Any = None,
                       timeout: float | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}", has_cert=self._has_cert):
            response = await self._http.request(method, self.url + path, json=json,
                                                params=params, headers=self._headers,
                                                timeout=request_timeout(
                                              self.timeout if timeout is None else timeout,
                                              self.connect_timeout))
        return body_or_raise(method, path, response, "lockd")

    async def _run(self, steps: Steps[T],
                   sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> T:
        """Run a rule of ``lockd.client.core``: send its requests, ``sleep`` its pauses."""
        run = StepRun(steps)
        for step in run:
            try:
                if isinstance(step, Sleep):
                    await sleep(step.seconds)
                elif step.batch is not None:
                    run.answer(await self._batcher.renew(step))
                else:
                    run.answer(await self._request(step.method, step.path, json=step.json,
                                                   params=step.params, timeout=step.timeout))
            except Exception as exc:
                run.fail(exc)
        return run.result  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Stop every lease's renewals (without releasing), and a batch of them in flight, then
        close the HTTP pool."""
        for lease in list(self._renewals):
            await self._stop_renewal(lease)
        await self._batcher.aclose()
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLockClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def try_acquire(self, name: str, ttl: float, *, wait: float = 0.0,
                          owner: str | None = None, client_id: str | None = None,
                          auto_renew: bool = True, renew_every: float | None = None,
                          on_lost: Callable[[AsyncLease], Any] | None = None,
                          shared: bool = False) -> AsyncLease | None:
        """See ``LockClient.try_acquire`` (seconds; ``None`` if the lock stayed held)."""
        return await self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                                   on_lost, raise_timeout=False, shared=shared)

    async def acquire(self, name: str, ttl: float, *, wait: float | None = None,
                      owner: str | None = None, client_id: str | None = None,
                      auto_renew: bool = True, renew_every: float | None = None,
                      on_lost: Callable[[AsyncLease], Any] | None = None,
                      shared: bool = False) -> AsyncLease:
        """See ``LockClient.acquire`` (seconds; raises ``AcquireTimeout``)."""
        lease = await self._acquire(name, ttl, wait, owner, client_id, auto_renew, renew_every,
                                    on_lost, raise_timeout=True, shared=shared)
        assert lease is not None
        return lease

    async def acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                           wait: float | None = None, owner: str | None = None,
                           client_id: str | None = None, auto_renew: bool = True,
                           renew_every: float | None = None,
                           on_lost: Callable[[AsyncLease], Any] | None = None,
                           shared: Collection[str] = ()) -> AsyncMultiLease:
        """See ``LockClient.acquire_many`` (an ``AsyncMultiLease``; ``async with``)."""
        lease = await self._acquire(None, ttl, wait, owner, client_id, auto_renew,
                                    renew_every, on_lost, raise_timeout=True, locks=locks,
                                    shared=shared)
        assert isinstance(lease, AsyncMultiLease)
        return lease

    async def try_acquire_many(self, locks: list[str] | tuple[str, ...], ttl: float, *,
                               wait: float = 0.0, owner: str | None = None,
                               client_id: str | None = None, auto_renew: bool = True,
                               renew_every: float | None = None,
                               on_lost: Callable[[AsyncLease], Any] | None = None,
                               shared: Collection[str] = ()) -> AsyncMultiLease | None:
        """See ``LockClient.try_acquire_many`` (``None`` if not granted within ``wait``)."""
        lease = await self._acquire(None, ttl, wait, owner, client_id, auto_renew,
                                    renew_every, on_lost, raise_timeout=False, locks=locks,
                                    shared=shared)
        assert lease is None or isinstance(lease, AsyncMultiLease)
        return lease

    async def _acquire(self, name, ttl, wait, owner, client_id, auto_renew, renew_every,
                       on_lost, *, raise_timeout: bool, locks: Any = None,
                       shared: bool = False) -> AsyncLease | None:
        grant = await self._run(self._acquire_steps(name, ttl, wait, owner, client_id,
                                                    renew_every, raise_timeout=raise_timeout,
                                                    locks=locks, shared=shared))
        return self._lease(grant, AsyncLease if locks is None else AsyncMultiLease,
                           renew_every, on_lost, auto_renew)

    def _lease(self, grant: tuple[float, Any] | None, cls: type[L], renew_every: float | None,
               on_lost: Callable[[Any], Any] | None, auto_renew: bool,
               setup: Callable[[L], Any] | None = None) -> L | None:
        """See ``LockClient._lease``."""
        if grant is None:
            return None
        sent, body = grant
        lease = cls(self, body, sent_at=sent, renew_every=renew_every)
        if setup is not None:
            setup(lease)
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
             auto_renew: bool = True, shared: bool = False) -> AsyncLock:
        """A reusable ``AsyncLock`` (``await lock.acquire()`` ...); ``async with
        client.lock(name, ttl=30, wait=60) as lease:`` as before; see ``LockClient.lock``."""
        return AsyncLock(self, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew, shared=shared)

    # -- semaphores

    async def try_acquire_permit(self, name: str, limit: int, ttl: float, *,
                                 wait: float = 0.0, owner: str | None = None,
                                 client_id: str | None = None, auto_renew: bool = True,
                                 renew_every: float | None = None,
                                 on_lost: Callable[[AsyncPermitLease], Any] | None = None
                                 ) -> AsyncPermitLease | None:
        """See ``LockClient.try_acquire_permit``."""
        grant = await self._run(self._permit_steps(name, limit, ttl, wait, owner, client_id,
                                                   renew_every, raise_timeout=False))
        return self._lease(grant, AsyncPermitLease, renew_every, on_lost, auto_renew)

    async def acquire_permit(self, name: str, limit: int, ttl: float, *,
                             wait: float | None = None, owner: str | None = None,
                             client_id: str | None = None, auto_renew: bool = True,
                             renew_every: float | None = None,
                             on_lost: Callable[[AsyncPermitLease], Any] | None = None
                             ) -> AsyncPermitLease:
        """See ``LockClient.acquire_permit``."""
        grant = await self._run(self._permit_steps(name, limit, ttl, wait, owner, client_id,
                                                   renew_every, raise_timeout=True))
        lease = self._lease(grant, AsyncPermitLease, renew_every, on_lost, auto_renew)
        assert lease is not None
        return lease

    def semaphore(self, name: str, limit: int, ttl: float, *, wait: float | None = None,
                  owner: str | None = None, renew_every: float | None = None,
                  on_lost: Callable[[AsyncPermitLease], Any] | None = None,
                  auto_renew: bool = True) -> AsyncSemaphore:
        """See ``LockClient.semaphore`` (an ``AsyncSemaphore``)."""
        return AsyncSemaphore(self, name, limit, ttl, wait=wait, owner=owner,
                              renew_every=renew_every, on_lost=on_lost, auto_renew=auto_renew)

    async def semaphore_status(self, name: str) -> SemaphoreStatus:
        """See ``LockClient.semaphore_status``."""
        return SemaphoreStatus.from_json(await self._request("GET", sem_path(name)))

    # -- elections

    async def try_campaign(self, name: str, value: str = "", ttl: float = 10.0, *,
                           wait: float = 0.0, owner: str | None = None,
                           client_id: str | None = None, auto_renew: bool = True,
                           renew_every: float | None = None,
                           on_lost: Callable[[AsyncLeaderLease], Any] | None = None,
                           on_handover: Callable[[AsyncLeaderLease, str], Any] | None = None,
                           handover_grace: float = DEFAULT_HANDOVER_GRACE
                           ) -> AsyncLeaderLease | None:
        """See ``LockClient.try_campaign`` (``on_handover`` may be a coroutine function)."""
        grant = await self._run(self._campaign_steps(name, value, ttl, wait, owner, client_id,
                                                     renew_every, raise_timeout=False))
        return self._lease(grant, AsyncLeaderLease, renew_every, on_lost, auto_renew,
                           _handover_setup(on_handover, handover_grace))

    async def campaign(self, name: str, value: str = "", ttl: float = 10.0, *,
                       wait: float | None = None, owner: str | None = None,
                       client_id: str | None = None, auto_renew: bool = True,
                       renew_every: float | None = None,
                       on_lost: Callable[[AsyncLeaderLease], Any] | None = None,
                       on_handover: Callable[[AsyncLeaderLease, str], Any] | None = None,
                       handover_grace: float = DEFAULT_HANDOVER_GRACE) -> AsyncLeaderLease:
        """See ``LockClient.campaign``."""
        grant = await self._run(self._campaign_steps(name, value, ttl, wait, owner, client_id,
                                                     renew_every, raise_timeout=True))
        lease = self._lease(grant, AsyncLeaderLease, renew_every, on_lost, auto_renew,
                            _handover_setup(on_handover, handover_grace))
        assert lease is not None
        return lease

    async def resign(self, lease: AsyncLeaderLease | LeaseRef) -> None:
        """See ``LockClient.resign``."""
        await self.release(lease)

    async def proclaim(self, lease: AsyncLeaderLease, value: str) -> int:
        """See ``LockClient.proclaim``."""
        body = await self._run(self._proclaim_steps(lease, value))
        return int(body.get("seq") or 0) if isinstance(body, dict) else 0

    async def leader(self, name: str) -> ElectionStatus:
        """See ``LockClient.leader``."""
        return ElectionStatus.from_json(await self._request("GET", election_path(name)))

    async def handover(self, name: str, target: str = "next", *,
                       lease: AsyncLeaderLease | None = None) -> str | None:
        """See ``LockClient.handover``."""
        step = self._handover_send(name, target, None if lease is None else lease.lease_id)
        body = await self._request(step.method, step.path, json=step.json)
        return body.get("handover_to") if isinstance(body, dict) else None

    def election(self, name: str, value: str = "", ttl: float = 10.0, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[AsyncLeaderLease], Any] | None = None,
                 on_handover: Callable[[AsyncLeaderLease, str], Any] | None = None,
                 handover_grace: float = DEFAULT_HANDOVER_GRACE,
                 auto_renew: bool = True) -> AsyncElection:
        """See ``LockClient.election`` (an ``AsyncElection``)."""
        return AsyncElection(self, name, value, ttl, wait=wait, owner=owner,
                             renew_every=renew_every, on_lost=on_lost, on_handover=on_handover,
                             handover_grace=handover_grace, auto_renew=auto_renew)

    async def observe(self, name: str, *, last_event_id: int | None = None,
                      reconnect: bool = True) -> AsyncIterator[ElectionEvent]:
        """See ``LockClient.observe`` (an async iterator)."""
        cursor = ObserveCursor(name, last_event_id)
        while True:
            try:
                async for event in self._observe_once(cursor):
                    yield event
            except ServiceUnavailable:
                if not reconnect:
                    raise
            if not reconnect:
                return
            await asyncio.sleep(cursor.pause())

    async def _observe_once(self, cursor: ObserveCursor) -> AsyncIterator[ElectionEvent]:
        headers = {**(self._headers or {}), **cursor.headers()}
        with translate_transport_errors(f"GET {cursor.path}"):
            async with self._http.stream("GET", self.url + cursor.path, headers=headers,
                                         timeout=httpx.Timeout(self.timeout, read=None)
                                         ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise wrong_server(response, "lockd") or error_from_response(response)
                parser = SseParser()
                async for line in response.aiter_lines():
                    sse = parser.feed(line)
                    if sse is not None and (event := cursor.take(sse)) is not None:
                        yield event

    async def renew(self, lease: AsyncLease | LeaseRef, *, ttl: float | None = None) -> AsyncLease:
        """See ``LockClient.renew``."""
        sent, body = await self._run(self._renew_steps(lease, ttl))
        if isinstance(lease, LeaseRef):
            cls = {"semaphore": AsyncPermitLease, "election": AsyncLeaderLease}.get(lease.kind,
                                                                                    AsyncLease)
            return cls(self, body, sent_at=sent)
        return lease

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
