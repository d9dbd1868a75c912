"""The app factory: ``create_app(settings)`` builds one proxy with no module-level state.

The policy file is read at once (a bad policy fails here, before any socket is opened). At
startup the lifespan prepares the database (fence table, reflection; a missing allow-listed
table or an unreachable database fails the start), opens the store, and loads the key set:
a ``--jwks-file`` must yield at least one key; lockd may still be starting, so with
``--lockd-url`` an empty set is fetched again on the first token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from resource_proxy.api import install_problem_handlers, routes
from resource_proxy.jwks import KeySource, file_loader, lockd_loader
from resource_proxy.metrics import Metrics
from resource_proxy.policy import Policy, load_policy
from resource_proxy.service import ProxyService
from resource_proxy.settings import Settings
from resource_proxy.store import open_store, prepare
from resource_proxy.tables import Catalog

__all__ = ["create_app"]

log = logging.getLogger("resource_proxy")


def create_app(settings: Settings, *, policy: Policy | None = None,
               catalog: Catalog | None = None) -> FastAPI:
    """A FastAPI app serving ``settings``; raises ``PolicyError`` for a bad policy file.

    ``policy``/``catalog``: already loaded and prepared (the CLI does that before it starts the
    server, to fail with one clear line); by default the policy is read here and the database
    prepared at startup.
    """
    if policy is None:
        policy = load_policy(settings.policy)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tables = catalog
        if tables is None:
            tables = await asyncio.to_thread(prepare, settings.database_url, settings.tables, policy)
        store = open_store(settings, tables)
        await store.open()
        http: httpx.AsyncClient | None = None
        if settings.lockd_url is not None:
            http = httpx.AsyncClient(timeout=2.0)
            loader = lockd_loader(settings.lockd_url, http)
        else:
            assert settings.jwks_file is not None
            loader = file_loader(settings.jwks_file)
        keys = KeySource(loader, min_interval_s=settings.jwks_refetch_interval_ms / 1000)
        await keys.reload(force=True)
        if settings.jwks_file is not None and not keys.kids:
            raise RuntimeError(f"no usable Ed25519 key in {settings.jwks_file}")
        app.state.service = ProxyService(tables, policy, keys, store,
                                         max_batch_ops=settings.max_batch_ops)
        log.info("serving %d table(s): %s", len(tables), ", ".join(sorted(tables)) or "(none)")
        try:
            yield
        finally:
            await store.close()
            if http is not None:
                await http.aclose()

    app = FastAPI(title="resource-proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.router.routes.extend(routes)
    install_problem_handlers(app)
    return app
