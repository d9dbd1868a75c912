"""A TCP relay in front of PostgreSQL that cuts connections at a chosen protocol message."""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["PgRelay"]


class PgRelay:
    """A TCP relay on loopback between a client and PostgreSQL that can cut connections at a
    chosen point of the PostgreSQL wire protocol, for tests of what a client sees then.

    ``cut_after(b"COMMIT")`` arms it: the next client message that carries SQL text containing
    the pattern (a simple ``Query`` or an extended ``Parse``) is forwarded to the server, the
    server's answer is read and thrown away (so the server has acted on the message), then both
    sides of that connection are closed; ``cut_done`` is set. ``refuse()`` closes every
    connection and every new one at once (the server is never reached); ``restore()`` undoes
    it. Use ``sslmode=disable`` in the client's DSN: the relay reads plaintext messages.
    """

    _SSL_CODES = (80877103, 80877104)  # SSLRequest, GSSENCRequest: startup continues after them

    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._pattern: bytes | None = None
        self._refusing = False
        self._closed = False
        self.cut_done = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, pattern: bytes) -> None:
        with self._lock:
            self._pattern = pattern.upper()
            self.cut_done.clear()

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            self._close(sock)

    def restore(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        self._closed = True
        self.refuse()
        self._close(self._listener)

    def __enter__(self) -> PgRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _close(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                self._close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                self._close(client)
                continue
            with self._lock:  # refuse() may have run while this one was connecting
                refusing = self._refusing
                if not refusing:
                    self._sockets |= {client, server}
                    self.connections += 1
            if refusing:
                self._close(client)
                self._close(server)
                continue
            swallow = threading.Event()
            answered = threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, swallow, answered),
                             daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, swallow, answered),
                             daemon=True).start()

    def _downstream(self, server: socket.socket, client: socket.socket, swallow: threading.Event,
                    answered: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if swallow.is_set():
                    answered.set()
                    continue
                client.sendall(data)
        except OSError:
            pass
        finally:
            answered.set()
            self._close(client)

    def _matches(self, message: bytes) -> bool:
        if message[:1] not in (b"Q", b"P"):
            return False
        with self._lock:
            if self._pattern is None or self._pattern not in message.upper():
                return False
            self._pattern = None  # one cut per arming
            return True

    def _upstream(self, client: socket.socket, server: socket.socket, swallow: threading.Event,
                  answered: threading.Event) -> None:
        buffer, startup = b"", True
        try:
            while data := client.recv(65536):
                buffer += data
                out, cut = b"", False
                while True:
                    if startup:  # untyped: int32 length (itself included), int32 code, ...
                        if len(buffer) < 8 or len(buffer) < int.from_bytes(buffer[:4], "big"):
                            break
                        size = int.from_bytes(buffer[:4], "big")
                        startup = int.from_bytes(buffer[4:8], "big") in self._SSL_CODES
                    else:  # typed: 1 byte type, int32 length (itself included), payload
                        if len(buffer) < 5 or len(buffer) < 1 + int.from_bytes(buffer[1:5], "big"):
                            break
                        size = 1 + int.from_bytes(buffer[1:5], "big")
                        cut = cut or self._matches(buffer[:size])
                    out, buffer = out + buffer[:size], buffer[size:]
                if cut:
                    swallow.set()
                    server.sendall(out + buffer)
                    answered.wait(10)
                    self.cut_done.set()
                    return
                server.sendall(out)
        except OSError:
            pass
        finally:
            self._close(server)
            self._close(client)
