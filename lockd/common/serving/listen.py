"""The listening socket of both servers, bound before anything else starts.

uvicorn binds only after the application's start-up has run, so a port in use used to show up
after "Application startup complete", with exit status 3 on lockd and 1 on the proxy. Binding
first gives one line naming the address and the same exit status (1, "cannot start") for both.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["ListenError", "bind_listener", "listen_failure"]


class ListenError(OSError):
    """The address cannot be bound (in use, not local, no permission); the message is one line
    naming it, e.g. ``cannot listen on 127.0.0.1:7070: address already in use (is another
    server running on it? choose another port with --port)``."""


def listen_failure(host: str, port: int, exc: OSError) -> str:
    """The one line for ``exc``, raised binding ``host:port``: the address, the reason, and for
    a port in use what to do about it."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    reason = (exc.strerror or str(exc)).lower()
    if exc.errno == errno.EADDRINUSE:
        reason += " (is another server running on it? choose another port with --port)"
    return f"cannot listen on {shown}: {reason}"


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``SO_REUSEADDR``, as uvicorn does), to hand to
    uvicorn's ``serve(sockets=[...])``. Raises ``ListenError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    try:
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {shown}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenError(listen_failure(host, port, exc)) from None
    sock.set_inheritable(True)
    return sock
