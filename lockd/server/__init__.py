"""The lock server (``lockd serve``): the HTTP API, the lease service and its stores.

::

    app.py          create_app(settings): the FastAPI app factory
    api.py          acquire/renew/release/state routes (and their hot-path ASGI middleware)
    ops_api.py      /metrics, /v1/events, the status page, admin force-release, API keys
    service.py      LockService: names, TTL bounds, leases, tokens (no web framework)
    waiting.py      WaitQueues: the FIFO queues of waiting acquires, one per lock name
    elections.py    ElectionService: leader election on a lock (campaign, handover, observe)
    api_elections.py  the election routes (election_schemas.py: their bodies)
    observe.py      ObservedStore: metrics and events around any store
    events.py       EventHub: lock events for the SSE streams
    metrics.py      LockdMetrics: the Prometheus metrics
    status_page.py  the live status page (GET /)
    settings.py     Settings (LOCKD_* environment variables)
    schemas.py      request and response bodies
    errors.py       LockdError and its subclasses (problem details)
    cli.py          the ``lockd`` command
    store/          the Store protocol and its SQLite, PostgreSQL and etcd implementations

It may import ``lockd.tokens`` and ``lockd.common``; nothing in ``lockd.client`` or
``resource_proxy`` (walls checked by ``tests/test_layout.py``).
"""
