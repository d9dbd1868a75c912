"""The uvicorn server both ``serve`` commands run: its configuration and one ``Server`` class.

``uvicorn_config`` gives uvicorn the servers' HTTP protocol, built from the inside out:
uvicorn's httptools protocol with the connection bounds (``connections``), the ASGI TLS
extension when TLS is on (``tls_protocol``), and one ``send`` per response (``coalesce``).
``Server`` is uvicorn's server with a ready line once the socket listens, a "stopping" line at the
first stop signal, and a clean stop:
uvicorn re-raises a caught SIGTERM after its graceful shutdown (the process would then die *by*
the signal); ``Server`` returns instead, so the ``serve`` commands exit 0. Each command passes
what differs (its logger, its ready line, what to do first on a stop signal) as arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from lockd.common.serving.coalesce import coalescing_protocol
from lockd.common.serving.connections import (
    ConnectionBounds,
    bounded_protocol,
    descriptor_warning,
)
from lockd.common.serving.tls_protocol import tls_http_protocol
from lockd.common.tls import server_context

__all__ = ["Server", "install_http_protocol", "uvicorn_config", "uvicorn_tls_options"]


def uvicorn_tls_options(settings: Any) -> dict[str, Any]:
    """``uvicorn.Config`` options for TLS: our own context (TLS >= 1.2, mTLS with a client CA);
    none without ``tls_cert``."""
    if settings.tls_cert is None:
        return {}
    context = server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    return {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key),
            "ssl_context_factory": lambda config, default: context}


def install_http_protocol(config: Any, settings: Any) -> str | None:
    """Give ``config`` (a ``uvicorn.Config``) the servers' HTTP protocol: uvicorn's httptools
    protocol bounded by the settings' connection bounds, with the ASGI TLS extension on top
    when TLS is on. Returns a warning when ``max_connections`` does not fit under the process's
    descriptor limit (``None`` otherwise)."""
    protocol = bounded_protocol(ConnectionBounds(
        settings.request_timeout_ms / 1000, settings.max_connections,
        settings.write_timeout_ms / 1000))
    config.http = tls_http_protocol(protocol) if settings.tls_cert is not None else protocol
    return descriptor_warning(settings.max_connections)


def uvicorn_config(app: Any, settings: Any, *, name: str, logger: logging.Logger,
                   **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` on ``settings.host:port``: the servers' HTTP protocol
    (``install_http_protocol``) writing each response in one ``send`` (``coalesce``), TLS from
    the settings, no access log, uvicorn's logging left to ours, no ``X-Forwarded-*`` rewriting
    of the client's address (neither server reads it; uvicorn's middleware for it parsed every
    request's headers). ``options``: more
    ``uvicorn.Config`` arguments (a server's graceful-shutdown timeout, its server header).
    A descriptor warning is logged to ``logger`` as ``"{name}: ..."``."""
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None,
                            access_log=False, proxy_headers=False, lifespan="on", **options,
                            **uvicorn_tls_options(settings))
    warning = install_http_protocol(config, settings)
    config.http = coalescing_protocol(config.http)
    if warning:
        logger.warning("%s: %s", name, warning)
    return config


class Server(uvicorn.Server):
    """uvicorn's server with a ready line and a clean exit on SIGTERM/SIGINT (see the module).

    ``ready(port)``: the line logged (INFO, to ``logger``) once the socket listens; it runs after
    the app's start-up, so it may describe what the start-up found. ``on_stop(signal_name)``:
    run on the event loop at the first stop signal, before the graceful shutdown waits for the
    requests in flight (lockd answers its queued acquires there), after the line
    ``{name} stopping (signal SIGTERM)`` (INFO) is logged.
    """

    def __init__(self, config: uvicorn.Config, *, logger: logging.Logger, name: str,
                 ready: Callable[[int], str],
                 on_stop: Callable[[str], None] | None = None) -> None:
        super().__init__(config)
        self._log = logger
        self._name = name
        self._ready = ready
        self._on_stop = on_stop
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            port = self.servers[0].sockets[0].getsockname()[1]
            self._log.info("%s", self._ready(port))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        self._loop = asyncio.get_running_loop()
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self._loop is not None:  # not in the signal handler: on the loop
            self._loop.call_soon_threadsafe(self._stopping, signal.Signals(sig).name)

    def _stopping(self, signal_name: str) -> None:
        self._log.info("%s stopping (signal %s)", self._name, signal_name)
        if self._on_stop is not None:
            self._on_stop(signal_name)
