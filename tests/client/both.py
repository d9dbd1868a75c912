"""One test body for ``LockClient`` and ``AsyncLockClient``: ``Both(api)`` calls a client method
(awaited on the facade's loop for the async client) and wraps the objects the clients return
(``Semaphore`` / ``AsyncSemaphore``, ``Election`` / ``AsyncElection``, ...) so their coroutine
methods run there too. ``api`` is a ``tests.client.adapters`` facade (``make_api``)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from tests.client.adapters import _AsyncFacade

__all__ = ["Both"]


class Both:
    def __init__(self, api: Any):
        self.api = api
        self.is_async = api.kind.startswith("async")

    def __call__(self, method: str, *a: Any, **kw: Any) -> Any:
        """``client.method(*a, **kw)``, awaited when it is a coroutine."""
        return self.wait(getattr(self.api.client, method)(*a, **kw))

    def wait(self, value: Any) -> Any:
        """``value``, or its result when it is awaitable (run on the async facade's loop)."""
        if inspect.iscoroutine(value):
            return self.api.run(value)
        if inspect.isawaitable(value):
            async def awaited() -> Any:
                return await value

            return self.api.run(awaited())
        return value

    def obj(self, target: Any) -> Any:
        """``target`` with its coroutine methods blocking (``with`` = ``async with``)."""
        return _AsyncFacade(self.api, target) if self.is_async else target

    def make(self, method: str, *a: Any, **kw: Any) -> Any:
        """An object a client method builds (``client.semaphore(...)``), wrapped by ``obj``."""
        return self.obj(getattr(self.api.client, method)(*a, **kw))

    def is_set(self, event: Any) -> bool:
        return event.is_set()

    def wait_event(self, event: Any, timeout: float) -> bool:
        """Wait for a ``threading.Event`` or an ``asyncio.Event`` (of the facade's loop)."""
        if not self.is_async:
            return event.wait(timeout)

        async def wait() -> bool:
            try:
                await asyncio.wait_for(event.wait(), timeout)
                return True
            except TimeoutError:
                return False

        return self.api.run(wait(), timeout + 10)

    def collect(self, iterator: Any, count: int, timeout: float = 20.0,
                into: list[Any] | None = None) -> list[Any]:
        """The first ``count`` items of a (sync or async) iterator, then close it. ``into``:
        a list to append to as items arrive (another thread can wait on the first one)."""
        if not self.is_async:
            out = [] if into is None else into
            for item in iterator:
                out.append(item)
                if len(out) >= count:
                    break
            iterator.close()
            return out

        async def take() -> list[Any]:
            out = [] if into is None else into
            async for item in iterator:
                out.append(item)
                if len(out) >= count:
                    break
            await iterator.aclose()
            return out

        return self.api.run(asyncio.wait_for(take(), timeout), timeout + 10)
