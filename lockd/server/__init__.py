"""The lock server (``lockd serve``): one slice per primitive over one core, and their stores.

::

    core/         Core: the store, the one token signer, the wait queues, the request bounds;
                  the name check; the HTTP plumbing every slice's routes share
    locks/        single locks (two modes), multi-lock leases: service, api, schemas
    semaphores/   counting semaphores: service, api, schemas, observe
    elections/    leader election: service, api, schemas, observe
    store/        the Store protocols (base) and values; sqlite/, postgres/, etcd/ backends
    app.py        create_app(settings): the app factory that wires the slices
    ops_api.py    status page, metrics, event streams, audit, keys, health, request middleware
    observe.py    ObservedStore: metrics and events around any store
    settings, errors, access, limits, metrics, audit, events, streams, keydir, keys_cli,
    status_page, cli: shared infrastructure

A slice imports the core, the store protocols and shared infrastructure, never another slice
(``tests/test_layout.py``); docs/internals.md walks through the layout. The server may import
``lockd.tokens`` and ``lockd.common``; nothing in ``lockd.client`` or ``resource_proxy``.
"""
