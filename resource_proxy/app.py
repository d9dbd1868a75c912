"""The app factory: ``create_app(settings)`` builds one proxy with no module-level state.

The policy file is read at once (a bad policy fails here, before any socket is opened). At
startup the lifespan prepares the database (fence table, reflection, whether the database's fence
triggers protect the tables too; a missing allow-listed table or an unreachable database fails
the start), opens the store, and loads the key set:
a ``--jwks-file`` must yield at least one key; lockd may still be starting, so with
``--lockd-url`` an empty set is fetched again on the first token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
from fastapi import FastAPI

from lockd.common.access import AccessFile
from lockd.common.apidocs import install_docs
from lockd.common.keys import KeySet, load_keys
from lockd.common.middleware import RequestMiddleware
from lockd.common.tls import CertRoles
from resource_proxy.access import AccessMiddleware, load_table_access
from resource_proxy.activity import Activity, activity_routes
from resource_proxy.api import install_problem_handlers, routes
from resource_proxy.claims import ClaimService
from resource_proxy.hot import HotPathMiddleware, ProxyApp
from resource_proxy.jwks import KeySource, file_loader, lockd_loader, lockd_verify
from resource_proxy.metrics import ProxyMetrics
from resource_proxy.objects.api import object_routes
from resource_proxy.objects.setup import start_objects, sweep_forever
from resource_proxy.openapi import OPEN_PATHS, build_openapi
from resource_proxy.policy import Binding, Policy, describe_unfenced, load_policy
from resource_proxy.rows.api import row_routes
from resource_proxy.rows.service import RowService
from resource_proxy.settings import Settings
from resource_proxy.store import open_store, prepare

__all__ = ["create_app"]

log = logging.getLogger("resource_proxy")


def create_app(settings: Settings, *, policy: Policy | None = None,
               binding: Binding | None = None, access: AccessFile | None = None,
               announce: bool = True) -> FastAPI:
    """A FastAPI app serving ``settings``; raises ``PolicyError`` for a bad policy file,
    ``OSError``/``ValueError`` for an unreadable API key file or a key under 8 characters.

    Besides the API: ``/`` (status page), ``/v1/activity``, ``/metrics`` (prometheus-client),
    ``/openapi.json`` (``openapi``), ``/docs`` (Swagger UI, ``lockd.common.apidocs``), and ``lockd.common.middleware.RequestMiddleware`` outermost (API keys
    from ``settings.api_keys``/``api_keys_file``; ``/``, ``/healthz``, ``/metrics`` and
    ``/openapi.json``, ``/docs`` stay open; request ids; header bound).

    ``policy``/``binding``: already loaded and prepared (the CLI does that before it starts the
    server, to fail with one clear line); by default the policy is read here and the database
    prepared at startup. ``access``: the identities of ``settings.access_file``, already
    read (by default read here: ``AccessFileError``, a ``ValueError``, for a bad file).
    ``announce``: log whether the database protects the fenced tables too (the CLI's workers
    leave it to the parent, which said it once).
    """
    if policy is None:
        policy = load_policy(settings.policy)
    if access is None and settings.access_file is not None:
        access = load_table_access(settings.access_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bound = binding
        if bound is None:
            bound = await asyncio.to_thread(
                partial(prepare, settings.database_url, settings.tables, policy,
                        require_db_fencing=settings.require_db_fencing, announce=announce))
        tables = bound.catalog
        store = open_store(settings, tables)
        await store.open()
        http: httpx.AsyncClient | None = None
        if settings.lockd_url is not None:
            http = httpx.AsyncClient(timeout=2.0, verify=lockd_verify(settings))
            loader = lockd_loader(settings.lockd_url, http)
        else:
            assert settings.jwks_file is not None
            loader = file_loader(settings.jwks_file)
        source = (settings.lockd_url.rstrip("/") + "/v1/keys" if settings.lockd_url is not None
                  else str(settings.jwks_file))
        keys = KeySource(loader, min_interval_s=settings.jwks_refetch_interval_ms / 1000,
                         max_age_s=settings.jwks_max_age_ms / 1000, source=source)
        await keys.reload(force=True)
        if settings.jwks_file is not None and not keys.kids:
            raise RuntimeError(f"no usable Ed25519 key in {settings.jwks_file}")
        # the fence core, and each resource kind a slice over it
        claims = app.state.claims = ClaimService(keys, store)
        rows = app.state.rows = RowService(bound, keys, store,
                                           max_batch_ops=settings.max_batch_ops,
                                           idempotency_ttl_ms=settings.idempotency_ttl_ms)
        claims.add_kind(rows.governs)
        log.info("serving %d table(s): %s%s", len(tables), ", ".join(sorted(tables)) or "(none)",
                 describe_unfenced(bound.unfenced))
        sweeper = None
        if settings.serves_objects:
            app.state.objects = await start_objects(settings, policy, keys, store)
            claims.add_kind(app.state.objects.governs)
            sweeper = asyncio.get_running_loop().create_task(
                sweep_forever(app.state.objects, settings.objects_sweep_interval_ms / 1000))
        try:
            yield
        finally:
            if sweeper is not None:
                sweeper.cancel()
                await asyncio.gather(sweeper, return_exceptions=True)
                await app.state.objects.settle()  # replaced blobs still being deleted
                await app.state.objects.blobs.close()
            await store.close()
            if http is not None:
                await http.aclose()

    app = ProxyApp(title="resource-proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    metrics = app.state.metrics = ProxyMetrics()
    app.state.activity = Activity()
    metrics.watch_jwks_loads(
        lambda: app.state.claims.keys.loads if hasattr(app.state, "claims") else 0)
    metrics.watch_blob_deletes(
        lambda: app.state.objects.retiring if hasattr(app.state, "objects") else 0)
    app.router.routes.extend(routes)
    app.router.routes.extend(row_routes)
    app.router.routes.extend(activity_routes)
    app.router.routes.extend(object_routes)
    install_problem_handlers(app)
    install_docs(app, title="resource-proxy")
    app.openapi = lambda: build_openapi(  # type: ignore[method-assign]
        app.state.rows.catalog, objects=hasattr(app.state, "objects"))
    keys = load_keys([k.get_secret_value() for k in settings.api_keys], settings.api_keys_file)
    options: dict[str, Any] = dict(
        api_keys=KeySet(keys), admin_keys=KeySet(), open_paths=OPEN_PATHS,
        max_header_bytes=settings.max_header_bytes,
        on_auth_failure=lambda reason: metrics.auth_failures[reason].inc(),
        logger=logging.getLogger("resource_proxy.http"),
        cert_roles=CertRoles(settings.cert_clients), identities=access,
        server="resource-proxy")
    if access is not None:  # its identities authenticate like API keys, scoped by tables
        app.add_middleware(AccessMiddleware)
    app.add_middleware(RequestMiddleware, **options)
    # the hot path (resource_proxy.hot) behind the same request and access middlewares
    hot: Any = HotPathMiddleware(partial(FastAPI.__call__, app))
    if access is not None:
        hot = AccessMiddleware(hot)
    app._front = RequestMiddleware(hot, **options)
    return app
