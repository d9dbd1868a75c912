"""A TCP relay with injectable latency: the proxy reaches its database through it.

``Relay(upstream_host, upstream_port).start()`` listens on a free loopback port (``port``);
every accepted connection is paired with a new one to the upstream, and two threads pump bytes
both ways. ``delay`` (seconds, default 0) holds each chunk that long before forwarding it, in
both directions, so every statement round trip of the proxy takes at least ``2 x delay``:
a check-then-act window in the proxy (check in one round trip, write in the next) stays open
for that long, long enough for a newer holder's claim to land inside it. ``close()`` stops
listening and cuts every relayed connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

__all__ = ["Relay"]


class Relay:
    """Loopback TCP relay to ``host:port`` with a settable per-chunk ``delay`` (seconds)."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._mutex = threading.Lock()
        self._closed = False

    def start(self) -> Relay:
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._mutex:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self.delay > 0:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._mutex:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()
            self._socks.clear()
