"""One etcd gateway call with retries and failover across the cluster's members.

``Transport.post`` sends a request to the member that answered last and, on a transport failure
or an answer that means "this member cannot serve now" (no leader, leader changed, 503, …),
moves on to the next one, pausing briefly once every member has failed, until ``timeout`` (all
attempts included) runs out: then ``StoreUnavailable``. Replaying a request on another member
is safe only because every request the store sends is written so that a replay is recognised:
see docs/stores/etcd.md ("Availability and replays").

Unary calls use the lean ``GatewayPool``; the watch stream and the clock reading use httpx.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import ssl
import time
from typing import Any

import httpx

from lockd.server.errors import StoreUnavailable
from lockd.server.store.etcd.gateway import GatewayError, GatewayPool
from lockd.server.store.etcd.wire import json_object, to_int

__all__ = ["EtcdError", "Transport"]

_RETRY_PAUSE_S = 0.05
# Answers that mean "this member cannot serve now; another one (or a moment later) may".
_RETRYABLE = ("no leader", "leader changed", "not capable", "timed out", "deadline exceeded",
              "too many requests", "stopped", "not started")
# A member without a leader fails fast instead of queueing the request.
_HEADERS = {"Grpc-Metadata-hasleader": "true"}


class EtcdError(StoreUnavailable):
    """An error answer from etcd that is not an outage (e.g. lease not found): callers that
    expect one catch it; anywhere else it surfaces as ``StoreUnavailable``."""


class Transport:
    """The cluster's ``endpoints`` (base URLs), each call bounded by ``timeout`` seconds.

    One attempt on one member is bounded by 40 % of ``timeout`` (at least 0.5 s): a request may
    hang when etcd dropped it with its leader (a follower's forwarded proposal is lost when the
    leader dies), so it is given up early and replayed elsewhere. ``ssl``: the client context
    for ``https://`` endpoints (``None``: plain http).
    """

    def __init__(self, endpoints: list[str], timeout: float, ssl: ssl.SSLContext | None):
        self.endpoints = endpoints
        self.timeout = timeout
        self._attempt_timeout = max(0.5, timeout * 0.4)
        self._ssl = ssl
        self.current = 0  # index of the endpoint that answered last
        self.http: httpx.AsyncClient | None = None  # the watch stream and the clock reading
        self._pool: GatewayPool | None = None  # every other call

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    def open(self) -> None:
        """Create the connection pools (connections are made on first use)."""
        if self.http is None:
            self.http = httpx.AsyncClient(
                headers=_HEADERS, limits=httpx.Limits(max_connections=4,
                                                      max_keepalive_connections=2),
                verify=self._ssl if self._ssl is not None else True)
            self._pool = GatewayPool(_HEADERS, max_connections=64, max_idle=32, ssl=self._ssl)

    async def aclose(self) -> None:
        """Close every connection; idempotent. Later calls raise ``StoreUnavailable``."""
        http, self.http = self.http, None
        if http is not None:
            await http.aclose()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the current member; on failure move on to the next,
        within ``timeout``.

        Raises ``StoreUnavailable`` when no member answered usefully in time, ``EtcdError`` for
        any other error answer.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("etcd store is not open")
        payload = json.dumps(body, separators=(",", ":")).encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        n = len(self.endpoints)
        index = self.current
        failures = 0
        last = "no answer"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0.01:
                raise StoreUnavailable(
                    f"etcd did not answer within {self.timeout:g}s "
                    f"(endpoints {', '.join(self.endpoints)}): {last}")
            endpoint = self.endpoints[index % n]
            try:
                attempt = min(remaining, self._attempt_timeout)
                status, data = await pool.post(endpoint, path, payload, attempt)
            except GatewayError as exc:  # refused, reset, timed out: try another member
                last = f"{endpoint}: {exc}"
            else:
                doc = json_object(data) if status == 200 else None
                if doc is not None:
                    self.current = index % n
                    return doc
                if status == 200:  # a truncated or garbled answer: try another member
                    last = f"{endpoint}: malformed answer"
                else:
                    code, message = _error_of(status, data)
                    if not (code == 14 or status == 503
                            or any(marker in message for marker in _RETRYABLE)):
                        raise EtcdError(f"etcd refused the request: {message}")
                    last = f"{endpoint}: {message}"
            index += 1
            failures += 1
            if failures % n == 0:  # every member failed once: give the cluster a moment
                await asyncio.sleep(min(_RETRY_PAUSE_S * (failures // n),
                                        max(0.0, deadline - loop.time() - 0.01), 0.25))

    async def txn(self, compare: list, success: list, failure: list) -> dict[str, Any]:
        """One etcd transaction: ``if all(compare): success else failure``."""
        return await self.post("/v3/kv/txn",
                               {"compare": compare, "success": success, "failure": failure})

    async def clock_offset(self) -> float | None:
        """The current member's wall clock (its HTTP ``Date`` header: whole seconds, so within
        about ±0.5 s) minus ours, in seconds; ``None`` if it sends none. Raises
        ``StoreUnavailable``."""
        if self.http is None:
            raise StoreUnavailable("etcd store is not open")
        endpoint = self.endpoints[self.current % len(self.endpoints)]
        sent = time.time()
        try:
            response = await self.http.post(endpoint + "/v3/maintenance/status", json={},
                                            timeout=httpx.Timeout(self.timeout))
        except httpx.HTTPError as exc:
            raise StoreUnavailable(f"etcd did not answer: {type(exc).__name__}") from exc
        answered = time.time()
        date = response.headers.get("date")
        if not date:
            return None
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp() + 0.5
        except (TypeError, ValueError):
            return None
        return server - (sent + answered) / 2


def _error_of(status: int, data: bytes) -> tuple[int, str]:
    """(gRPC code, message) of an error answer with HTTP ``status`` and body ``data``."""
    try:
        doc = json.loads(data)
    except ValueError:
        return 0, f"HTTP {status}"
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):  # streaming shape
        doc = doc["error"]
    if not isinstance(doc, dict):
        return 0, f"HTTP {status}"
    code = doc.get("code", doc.get("grpc_code", 0))
    return to_int(code), str(doc.get("message") or doc.get("error") or status)
