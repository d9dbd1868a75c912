"""A lean HTTP/1.1 keep-alive client for etcd's JSON gateway: the etcd store's hot path.

Why not httpx here: every lock operation on etcd is two to four small POSTs, and measured on a
2-core machine httpx (httpcore + anyio + h11) cost about 1 ms of lockd CPU per request and sent
headers and body as two writes; lockd on etcd spent ~70 % of its time inside httpx. This client
writes each request in ONE write on a pooled connection and parses the answer with a few bytes
operations (``Content-Length`` or chunked, trailer fields skipped: etcd's gateway sends one after
an error answer's last chunk). httpx is still used for the long-lived watch stream.

Failure model: any transport problem (refused, reset, closed mid-answer, malformed answer,
timeout) raises ``GatewayError``; the connection is then dropped (its state is unknown). A pooled
connection that the server closed while idle fails on first use: that one request is retried
once on a fresh connection (every request the store sends may be replayed: see ``transport``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from urllib.parse import urlsplit

__all__ = ["GatewayError", "GatewayPool"]

_MAX_HEADER = 64 * 1024


class GatewayError(Exception):
    """The request got no usable HTTP answer (connection or protocol failure, timeout)."""


class _Conn:
    __slots__ = ("reader", "writer", "answered")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.answered = False  # got at least one byte of an answer on this connection

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def roundtrip(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send ``request``; return (status, body, keep_alive)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.answered = True
        if len(head) > _MAX_HEADER or not head.startswith(b"HTTP/1."):
            raise GatewayError("malformed HTTP answer from etcd")
        lines = head[:-4].split(b"\r\n")
        status = int(lines[0][9:12])
        length: int | None = None
        chunked = False
        keep = not head.startswith(b"HTTP/1.0")
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = b"close" not in value.lower()
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:  # the last chunk; then trailer fields (etcd sends one on a
                    # gRPC error), then an empty line
                    while len(await self.reader.readuntil(b"\r\n")) > 2:
                        pass
                    break
                parts.append((await self.reader.readexactly(size + 2))[:-2])
            return status, b"".join(parts), keep
        if length is None:  # body runs to the end of the connection
            return status, await self.reader.read(), False
        return status, await self.reader.readexactly(length), keep


class GatewayPool:
    """Keep-alive connections per endpoint (``http://host:port``, or ``https://`` with ``ssl``,
    the client ``SSLContext``: a TLS handshake is paid once per pooled connection); at most
    ``max_connections`` requests in flight, ``max_idle`` idle connections kept per endpoint."""

    def __init__(self, headers: dict[str, str] | None = None, *, max_connections: int = 64,
                 max_idle: int = 32, ssl: ssl_module.SSLContext | None = None):
        self._ssl = ssl
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: dict[str, list[_Conn]] = {}
        self._where: dict[str, tuple[str, int, str]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._max_idle = max_idle
        self._closed = False

    def _address(self, endpoint: str) -> tuple[str, int, str]:
        where = self._where.get(endpoint)
        if where is None:
            parts = urlsplit(endpoint)
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if parts.scheme == "https" else 80)
            where = self._where[endpoint] = (host, port, parts.netloc)
        return where

    async def post(self, endpoint: str, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``endpoint + path`` within ``timeout`` seconds.

        Returns (status, body). Raises ``GatewayError`` on any transport failure or timeout.
        """
        if self._closed:
            raise GatewayError("client is closed")
        host, port, netloc = self._address(endpoint)
        request = (f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\nContent-Type: application/json\r\n"
                   f"{self._extra}Content-Length: {len(body)}\r\n\r\n").encode() + body
        try:
            async with asyncio.timeout(timeout), self._slots:
                idle = self._idle.get(endpoint)
                conn = idle.pop() if idle else None
                if conn is not None:
                    try:
                        return await self._finish(endpoint, conn, request)
                    except (OSError, asyncio.IncompleteReadError, GatewayError):
                        if conn.answered:
                            raise
                        # closed by the server while idle: once more on a fresh connection
                tls = self._ssl if endpoint.startswith("https:") else None
                reader, writer = await asyncio.open_connection(
                    host, port, limit=_MAX_HEADER, ssl=tls,
                    server_hostname=host if tls is not None else None)
                return await self._finish(endpoint, _Conn(reader, writer), request)
        except TimeoutError:
            raise GatewayError(f"no answer within {timeout:.3g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:
            raise GatewayError(f"{type(exc).__name__}: {exc}".strip()) from None

    async def _finish(self, endpoint: str, conn: _Conn, request: bytes) -> tuple[int, bytes]:
        conn.answered = False
        try:
            status, data, keep = await conn.roundtrip(request)
        except BaseException:
            conn.close()  # unknown state (error, timeout or cancellation): never reuse
            raise
        idle = self._idle.setdefault(endpoint, [])
        if keep and not self._closed and len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()
        return status, data

    async def aclose(self) -> None:
        """Close every idle connection; later requests fail with ``GatewayError``."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
