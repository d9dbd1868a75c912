"""How both servers (lockd and ``resource_proxy``) are served: every hook into uvicorn here.

::

    server.py        the uvicorn configuration and the one ``Server`` class both ``serve`` use
    connections.py   connection bounds and the disconnect watch (a uvicorn protocol subclass)
    tls_protocol.py  the ASGI TLS extension in every scope (a uvicorn protocol subclass)
    coalesce.py      one ``send`` per response (a wrapper of the protocol's transport)
    listen.py        the listening socket, bound before anything starts
    workers.py       ``--workers N``: ``SO_REUSEPORT`` sockets and forked, supervised workers

Private framework internals the project relies on. Each is used where a public API offers no
way to do the job; each use degrades or fails loudly in the tests when the internal changes,
and pyproject holds these frameworks to the minor versions the tests ran on:

uvicorn 0.55 (``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``)
    ``connections.py`` subclasses it and overrides ``connection_made``, ``data_received``,
    ``on_message_begin``, ``on_headers_complete``, ``on_message_complete``,
    ``on_response_complete``, ``connection_lost``, ``pause_writing``/``resume_writing``; it reads
    ``self.connections``, ``self.cycle`` (``response_complete``), ``self.scope``,
    ``self.transport``, ``self.loop``, ``self.client``, and swaps three attributes for lighter
    ones: ``self.pipeline`` (a deque), ``self.flow._is_writable_event`` and
    ``self.cycle.message_event`` (``asyncio.Event``s; replaced only when they are of the
    expected type, else left alone). ``tls_protocol.py`` overrides ``connection_made``,
    ``on_message_begin`` and ``shutdown`` and reads ``self.cycle``. ``coalesce.py`` hands
    ``connection_made`` a transport wrapper. ``server.py`` overrides ``uvicorn.Server``'s
    ``startup``, ``capture_signals`` and ``handle_exit`` and reads ``servers``, ``started``,
    ``should_exit``.
FastAPI 0.165 (Starlette 1.10)
    ``lockd.server.app`` and ``resource_proxy.hot`` read ``FastAPI._native_telemetry``
    (``enabled()``): with FastAPI's native OpenTelemetry on, lockd's and the proxy's hot routes
    take the full middleware stack so that every request is traced. A FastAPI without it: the attribute is absent and the hot path is used.
psycopg 3.3
    ``resource_proxy.store.watched`` overrides ``AsyncConnection.wait`` and, on an interrupted
    wait, calls ``AsyncConnection._try_cancel`` and catches ``psycopg.errors._WaitTimeout`` as
    psycopg's own wait does; it uses ``psycopg.waiting``'s ``WAIT_*``/``READY_*`` constants.
"""
