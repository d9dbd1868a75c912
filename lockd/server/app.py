"""The app factory: ``create_app(settings)`` builds a lockd ASGI app with no module-level state.

Ownership: a store the caller passes in (``store=``) is the caller's to open and close (the CLI
opens it first so a busy SQLite file fails with a clear message before uvicorn starts); a store
made here from ``settings.store`` is opened and closed by the app's lifespan. Likewise the key
ring: passed in, or loaded (created on first start) from ``settings.key_dir``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI

from lockd.common.apidocs import install_docs
from lockd.server.core.base import Core
from lockd.server.core.http import install_error_handlers
from lockd.server.elections.api import create_election_router
from lockd.server.elections.service import ElectionService
from lockd.server.events import EventHub
from lockd.server.keydir import watch as watch_keys
from lockd.server.locks.api import HotPathMiddleware, create_router, is_hot_path
from lockd.server.locks.service import LockService
from lockd.server.metrics import LockdMetrics
from lockd.server.observe import ObservedStore
from lockd.server.ops_api import (
    create_ops_router,
    create_service_router,
    install_request_middleware,
    operation_id,
)
from lockd.server.semaphores.api import create_semaphore_router
from lockd.server.semaphores.service import SemaphoreService
from lockd.server.settings import Settings
from lockd.server.store import Store, open_store
from lockd.tokens import KeyRing

__all__ = ["create_app"]


class _LockdApp(FastAPI):
    """FastAPI, with lockd's hot path (``POST /v1/locks/{name}/acquire|renew|release``) served
    in front of FastAPI's middleware stack: ``RequestMiddleware`` -> ``HotPathMiddleware`` -> handler.

    The layers it skips (Starlette's app and server-error middleware, FastAPI's exception
    telemetry and body-limit middlewares) do nothing for these routes (their handlers map
    every exception to a problem themselves and bound the body while reading it) but cost a
    coroutine frame and objects each, which a queued acquire keeps for its whole wait (about
    2.5 KB per waiter, bench/notes/waiters.md). With FastAPI's native OpenTelemetry enabled,
    every request takes the full stack, so none escapes the traces."""

    _front: Callable[..., Any] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        front = self._front
        if front is not None and is_hot_path(scope) and not _telemetry_on(self):
            scope["app"] = self
            await front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _telemetry_on(app: FastAPI) -> bool:
    native = getattr(app, "_native_telemetry", None)
    return native is not None and native.enabled()


def create_app(settings: Settings | None = None, *, clock: Callable[[], float] | None = None,
               store: Store | None = None, keyring: KeyRing | None = None) -> FastAPI:
    """A lockd app. ``clock`` (wall seconds, default ``time.time``) judges expiry in a SQLite
    store made here; tests inject a fake one. After startup ``app.state.core`` is the ``Core``
    (on an ``ObservedStore``: metrics and events) and ``app.state.locks``, ``.semaphores`` and
    ``.elections`` the primitives' services; ``app.state.metrics`` and ``app.state.events``
    exist from the start."""
    settings = settings or Settings()
    metrics = LockdMetrics()
    events = EventHub(queue_size=settings.events_queue_size, on_drop=metrics.events_dropped.inc,
                      on_streams=metrics.event_streams.set)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = store is None
        the_store = open_store(settings.store, clock=clock or time.time) if owned else store
        assert the_store is not None
        ring = keyring or KeyRing.load_or_create(settings.key_dir)
        if owned:
            await the_store.open()
        observed = ObservedStore(the_store, metrics, events,
                                 skew_interval_s=settings.skew_interval_ms / 1000)
        keys_task: asyncio.Task[None] | None = None

        def _keys_changed(changed: KeyRing) -> None:
            app.state.jwks = changed.jwks()
            # an operator rotated or retired a key (``lockd keys``): in this process's trail
            app.state.audit.record("key-directory", "keys_changed", changed.kid, "ok",
                                   published=sorted(changed.kids))
        try:
            core = app.state.core = Core(observed, ring, settings)
            app.state.locks = LockService(core)
            app.state.semaphores = SemaphoreService(core)
            elections = app.state.elections = ElectionService(core, metrics)
            app.state.jwks = ring.jwks()
            waiting = core.waiting
            metrics.watch(leases_active=lambda: observed.active, acquires_waiting=waiting.total)
            metrics.watch_modes(
                holders=lambda mode: (observed.shared_active if mode == "shared"
                                      else observed.active - observed.shared_active),
                permits=lambda: observed.permits_active, waiters=waiting.by_mode)
            await observed.start()
            # a rotation or retirement reaches this process within key_reload_ms
            keys_task = asyncio.create_task(watch_keys(
                ring, settings.key_reload_ms / 1000, on_change=_keys_changed))
            yield
            events.close()
            elections.close()
            core.shutdown()
        finally:
            if keys_task is not None:
                keys_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keys_task
            await observed.stop()
            if owned:
                await the_store.close()

    app = _LockdApp(
        title="lockd",
        summary="Leases with fencing tokens",
        version="1",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        docs_url=None,  # install_docs: Swagger UI from packaged files, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.events = events
    install_error_handlers(app)
    install_docs(app, title="lockd")
    app.include_router(create_ops_router())  # first: /v1/locks/{name}/events before {name}
    app.include_router(create_router())
    app.include_router(create_service_router())
    app.include_router(create_semaphore_router())
    app.include_router(create_election_router())
    # outermost middleware: keys, request ids; the hot path gets the same in front of it
    with_middleware = install_request_middleware(app, settings, metrics)
    app._front = with_middleware(HotPathMiddleware(partial(FastAPI.__call__, app)))
    return app
