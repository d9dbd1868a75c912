"""Blocking facades over ``LockClient`` and ``AsyncLockClient`` so that ONE behavioural suite runs
against both.

``AsyncApi`` runs an asyncio event loop in a thread of its own; every call is submitted to it with
``run_coroutine_threadsafe`` and waited for, so renewal tasks, ``asyncio.Event``\\ s and
callbacks all live on that loop exactly as they would in an asyncio program. Both facades count
the HTTP requests their client sends (real ``httpx`` event hooks), keyed by method and path; a
background renewal sent within ``POST /v1/leases/renew-each`` counts as the lease's own
``POST /v1/locks/{name}/renew`` too (``renew_count``: renewals, batched or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections import Counter
from typing import Any

import httpx

from lockd import AsyncFencedSession, AsyncLockClient, FencedSession, LockClient

__all__ = ["SyncApi", "AsyncApi", "SyncLockApi", "AsyncLockApi"]


def _count_request(requests: Counter[tuple[str, str]], request: httpx.Request) -> None:
    requests[(request.method, request.url.path)] += 1
    if request.url.path == "/v1/leases/renew-each":
        for item in json.loads(request.content)["leases"]:
            requests[("POST", f"/v1/locks/{item['lock']}/renew")] += 1


class SyncApi:
    kind = "sync"

    def __init__(self, url: str, **client_kw: Any):
        self.requests: Counter[tuple[str, str]] = Counter()
        self._http = httpx.Client(event_hooks={"request": [self._count]})
        self.client = LockClient(url, http_client=self._http, **client_kw)
        self._sessions: list[FencedSession] = []

    def _count(self, request: httpx.Request) -> None:
        _count_request(self.requests, request)

    def renew_count(self, name: str) -> int:
        return self.requests[("POST", f"/v1/locks/{name}/renew")]

    def try_acquire(self, *a: Any, **kw: Any):
        return self.client.try_acquire(*a, **kw)

    def acquire(self, *a: Any, **kw: Any):
        return self.client.acquire(*a, **kw)

    def renew(self, *a: Any, **kw: Any):
        return self.client.renew(*a, **kw)

    def release(self, *a: Any, **kw: Any):
        return self.client.release(*a, **kw)

    def status(self, *a: Any, **kw: Any):
        return self.client.status(*a, **kw)

    def locks(self, *a: Any, **kw: Any):
        return list(self.client.locks(*a, **kw))

    def lock(self, *a: Any, **kw: Any):
        return self.client.lock(*a, **kw)

    def lock_object(self, *a: Any, **kw: Any) -> Any:
        """A ``Lock`` (``client.lock(...)``), its methods called as they are."""
        return self.client.lock(*a, **kw)

    def wait_lost(self, lease: Any, timeout: float) -> bool:
        return lease.lost.wait(timeout)

    def session(self, proxy_url: str, lease: Any) -> FencedSession:
        session = FencedSession(proxy_url, lease)
        self._sessions.append(session)
        return session

    def close(self) -> None:
        for s in self._sessions:
            s.close()
        self.client.close()
        self._http.close()


class _AsyncFacade:
    """Blocking view of an async object: coroutine methods are run on the facade's loop."""

    def __init__(self, api: AsyncApi, target: Any):
        self._api = api
        self._target = target

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if inspect.iscoroutinefunction(value):
            return lambda *a, **kw: self._api.run(value(*a, **kw))
        return value

    def __enter__(self) -> Any:  # ``with facade:`` is ``async with target:`` on the loop
        return self._api.run(self._target.__aenter__())

    def __exit__(self, *exc: Any) -> Any:
        return self._api.run(self._target.__aexit__(*exc))


class AsyncApi:
    kind = "async"

    def __init__(self, url: str, **client_kw: Any):
        self.requests: Counter[tuple[str, str]] = Counter()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="async-api", daemon=True)
        self._thread.start()
        self._sessions: list[AsyncFencedSession] = []

        async def make() -> tuple[httpx.AsyncClient, AsyncLockClient]:
            http = httpx.AsyncClient(event_hooks={"request": [self._count]})
            return http, AsyncLockClient(url, http_client=http, **client_kw)

        self._http, self.client = self.run(make())

    async def _count(self, request: httpx.Request) -> None:
        _count_request(self.requests, request)

    def renew_count(self, name: str) -> int:
        return self.requests[("POST", f"/v1/locks/{name}/renew")]

    def run(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def try_acquire(self, *a: Any, **kw: Any):
        return self.run(self.client.try_acquire(*a, **kw))

    def acquire(self, *a: Any, **kw: Any):
        return self.run(self.client.acquire(*a, **kw))

    def renew(self, *a: Any, **kw: Any):
        return self.run(self.client.renew(*a, **kw))

    def release(self, *a: Any, **kw: Any):
        return self.run(self.client.release(*a, **kw))

    def status(self, *a: Any, **kw: Any):
        return self.run(self.client.status(*a, **kw))

    def locks(self, *a: Any, **kw: Any):
        async def collect() -> list[Any]:
            return [s async for s in self.client.locks(*a, **kw)]

        return self.run(collect())

    @contextlib.contextmanager
    def lock(self, *a: Any, **kw: Any):
        cm = self.client.lock(*a, **kw)
        lease = self.run(cm.__aenter__())
        try:
            yield lease
        except BaseException as exc:
            if not self.run(cm.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.run(cm.__aexit__(None, None, None))

    def lock_object(self, *a: Any, **kw: Any) -> Any:
        """An ``AsyncLock`` (``client.lock(...)``) whose coroutine methods run on the loop."""
        return _AsyncFacade(self, self.client.lock(*a, **kw))

    def wait_lost(self, lease: Any, timeout: float) -> bool:
        async def wait() -> bool:
            try:
                await asyncio.wait_for(lease.lost.wait(), timeout)
                return True
            except TimeoutError:
                return False

        return self.run(wait(), timeout + 10)

    def session(self, proxy_url: str, lease: Any) -> Any:
        async def make() -> AsyncFencedSession:
            return AsyncFencedSession(proxy_url, lease)

        session = self.run(make())
        self._sessions.append(session)
        return _AsyncFacade(self, session)

    def close(self) -> None:
        async def shutdown() -> None:
            for s in self._sessions:
                await s.aclose()
            await self.client.aclose()
            await self._http.aclose()

        try:
            self.run(shutdown(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


class _ThroughLockObjects:
    """The lease calls of the suite (``try_acquire``, ``acquire``, ``renew``, ``release``) made
    through the reusable ``Lock`` / ``AsyncLock`` object instead of the client's lease API, so
    the same behavioural suite judges it: ``try_acquire`` is ``lock.acquire(blocking=wait > 0,
    timeout=wait)``; ``acquire`` is ``lock.acquire()`` when waiting forever, else the ``with``
    entry (which raises ``AcquireTimeout``); ``renew`` is ``lock.extend(ttl, replace_ttl=True)``
    (without a ttl: the lease's own TTL); ``release`` is ``lock.release()``. Leases not made here
    (a ``LeaseRef``) go to the client."""

    lock_object: Any
    client: Any

    def _locks(self) -> dict[int, Any]:
        if not hasattr(self, "_by_lease"):
            self._by_lease: dict[int, Any] = {}
        return self._by_lease

    def _new(self, name: str, ttl: float, wait: float | None, kw: dict[str, Any]) -> Any:
        kw.pop("client_id", None)  # per-acquire secret: the Lock makes its own
        return self.lock_object(name, ttl, wait=wait, **kw)

    def _keep(self, lk: Any) -> Any:
        self._locks()[id(lk.lease)] = lk
        return lk.lease

    def try_acquire(self, name: str, ttl: float, *, wait: float = 0.0, **kw: Any):
        lk = self._new(name, ttl, None, kw)
        ok = lk.acquire(blocking=True, timeout=wait) if wait > 0 else lk.acquire(blocking=False)
        return self._keep(lk) if ok else None

    def acquire(self, name: str, ttl: float, *, wait: float | None = None, **kw: Any):
        lk = self._new(name, ttl, wait, kw)
        if wait is None:
            assert lk.acquire() is True
        else:
            self._enter(lk)
        return self._keep(lk)

    def renew(self, lease: Any, *, ttl: float | None = None):
        lk = self._locks().get(id(lease))
        if lk is None:
            return super().renew(lease, ttl=ttl)  # type: ignore[misc]
        lease_ttl = lk.lease.ttl if lk.lease is not None else lk.ttl
        lk.extend(lease_ttl if ttl is None else ttl, replace_ttl=True)
        return lk.lease

    def release(self, lease: Any):
        lk = self._locks().get(id(lease))
        if lk is None:
            return super().release(lease)  # type: ignore[misc]
        return lk.release()


class SyncLockApi(_ThroughLockObjects, SyncApi):
    kind = "sync-lock"

    def _enter(self, lk: Any) -> None:
        lk.__enter__()


class AsyncLockApi(_ThroughLockObjects, AsyncApi):
    kind = "async-lock"

    def _enter(self, lk: Any) -> None:
        self.run(lk._target.__aenter__())
