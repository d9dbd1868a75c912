"""Reads and writes through the fencing proxy with a lease's token: ``FencedSession`` (blocking)
and ``AsyncFencedSession`` (asyncio), both on httpx.

::

    with client.lock("accounts/42", ttl=10) as lease:
        db = FencedSession("http://127.0.0.1:7071", lease)
        row = db.get("accounts", 42)                      # claims the fence first, then reads
        db.update("accounts", 42, {"balance": row["balance"] - 5})

Why claim before the first read (invariant 7): fencing only writes leaves a lost-update window::

    t=0  A holds fence 7, freezes;  lockd expires A;  B acquires fence 8
    t=1  B reads balance=100 (unfenced read: the proxy's highest is still 7)
    t=2  A wakes and writes balance=50 with fence 7: accepted, since 7 >= highest 7
    t=3  B writes balance=95 with fence 8: accepted, and A's write is silently lost

So the session claims the lock's fence at the proxy (``POST /v1/fences/{lock}/claim``) before the
first request it sends for a lease, and every read it sends carries the token too (a *fenced*
read). After B's claim at t=1, A's write at t=2 is rejected with ``StaleTokenError``.

The session does not refuse to send when ``lease.lost`` is set: the proxy's fence check is the
authority (a local check would be racy anyway). Check ``lease.lost`` to stop early. A
``StaleTokenError`` proves a newer grant exists, so it also marks the lease lost (firing
``on_lost`` if nothing else had).

Non-idempotent writes are retried safely: ``insert`` (POST), ``update`` (PATCH) and ``batch``
carry an ``Idempotency-Key`` (128 random bits, one per call), and when the answer is 502
``outcome_unknown`` (the proxy lost the database while committing) or no answer at all
(``TransportError``: reset, timeout), the session sends the same request with the same key again,
up to ``retries`` times (default 3; waits 0.05, 0.1, 0.2 s ... between attempts). The proxy
answers a retry of a write that did commit with the original answer, so a row is never inserted
twice. When the retries run out the last error is raised (``OutcomeUnknown`` or
``TransportError``: the write may or may not have committed). ``upsert`` (PUT) and ``delete``
are idempotent (sending one twice leaves the same rows) and go without a key; their errors are
raised at once. A 503 (nothing committed) is raised at once too: retrying it is the caller's
choice, and safe.

Keys: a scalar for a one-column primary key, a tuple/list in primary-key column order for a
composite one (percent-encoded and joined with ``,`` in the URL, as the proxy expects). Errors are
the ``lockd.client.errors`` hierarchy: ``StaleTokenError`` (409, ``presented``/``highest``),
``TokenRequired``, ``InvalidToken``, ``LockNotAllowed``, ``NotFoundError``, ``ValidationError``
(``problem.get("op_index")`` names a failing batch op), ``ServiceUnavailable`` (nothing written),
``OutcomeUnknown`` (see above).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from lockd.client.errors import (
    LeaseLostError,
    LockClientError,
    OutcomeUnknown,
    ProtocolError,
    StaleTokenError,
    TransportError,
    body_or_raise,
    translate_transport_errors,
)
from lockd.client.lease import AsyncLease, Lease

__all__ = ["FencedSession", "AsyncFencedSession", "encode_key"]

Key = Any  # scalar, or a sequence of scalars in primary-key order
_RETRYABLE = (OutcomeUnknown, TransportError)  # the write may have committed: resend, same key


def _retry_delay(attempt: int) -> float:
    """Seconds before retry ``attempt`` (0-based) of a keyed write: 0.05, 0.1, 0.2 ... <= 1."""
    return min(1.0, 0.05 * 2 ** attempt)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise ValueError("a primary key value cannot be None")
    return str(value)


def encode_key(key: Key) -> str:
    """The URL form of a row key: each value percent-encoded (a literal ``,`` is ``%2C``), joined
    by ``,`` in primary-key order. A ``str`` or number is a one-column key."""
    if isinstance(key, Sequence) and not isinstance(key, str | bytes):
        if not key:
            raise ValueError("an empty key")
        return ",".join(quote(_scalar(v), safe="") for v in key)
    return quote(_scalar(key), safe="")


def _table(table: str) -> str:
    return quote(table, safe="")


def _stale(lease: Lease | AsyncLease, exc: LockClientError) -> None:
    if isinstance(exc, StaleTokenError):
        lease._mark_lost(LeaseLostError(
            f"lease of {lease.lock!r} (fence {lease.fence}) is stale at the proxy: "
            f"highest fence is {exc.highest}", lock=lease.lock, code="stale_token"))


def _batch_results(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, Mapping) or not isinstance(body.get("results"), list):
        raise ProtocolError("batch answer is not {results: [...]}")
    return body["results"]


def _items(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, Mapping) or not isinstance(body.get("items"), list):
        raise ProtocolError("rows answer is not {items: [...]}")
    return body["items"]


class _SessionBase:
    def __init__(self, proxy_url: str, lease: Lease | AsyncLease, timeout: float,
                 api_key: str | None = None, retries: int = 3):
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.url = proxy_url.rstrip("/")
        self.lease = lease
        self.timeout = timeout
        self.retries = retries
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.highest: int | None = None
        """The proxy's highest fence for the lock after this session's claim."""
        self._claimed_fence: int | None = None

    @property
    def claimed(self) -> bool:
        """Whether the lease's fence has been claimed at the proxy by this session."""
        return self._claimed_fence == self.lease.fence

    def _headers(self, idempotency_key: str | None = None) -> dict[str, str]:
        headers = {"Fencing-Token": self.lease.token, **self._auth}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return headers

    @staticmethod
    def _select_params(where: Mapping[str, Any] | None, limit: int | None) -> dict[str, Any]:
        params = {k: _scalar(v) for k, v in (where or {}).items()}
        if limit is not None:
            params["limit"] = int(limit)
        return params

    def _claim_path(self) -> str:
        return "/v1/fences/" + quote(self.lease.lock, safe="/:") + "/claim"

    def _after_claim(self, body: Any) -> int:
        try:
            highest = int(body["highest"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError("claim answer is not {lock, highest}") from exc
        self._claimed_fence = self.lease.fence
        self.highest = highest
        return highest


class FencedSession(_SessionBase):
    """Blocking reads and writes through the proxy at ``proxy_url`` under ``lease``'s token.

    ``timeout`` (seconds, default 10) bounds each request. ``http_client`` lets you share an
    ``httpx.Client`` (not closed by the session). ``api_key``: the proxy's API key
    (``PROXY_API_KEYS``), sent as ``Authorization: Bearer``. ``retries``: how many times an insert,
    update or batch is resent with its Idempotency-Key after ``outcome_unknown`` or no answer
    (default 3). Use as a context manager or call ``close()``.
    """

    def __init__(self, proxy_url: str, lease: Lease, *, timeout: float = 10.0,
                 http_client: httpx.Client | None = None, api_key: str | None = None,
                 retries: int = 3):
        super().__init__(proxy_url, lease, timeout, api_key, retries)
        self._own_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> FencedSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, method: str, path: str, *, json: Any = None, params: Any = None,
              idempotency_key: str | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}"):
            response = self._http.request(method, self.url + path, json=json, params=params,
                                          headers=self._headers(idempotency_key),
                                          timeout=self.timeout)
        try:
            return body_or_raise(method, path, response)
        except LockClientError as exc:
            _stale(self.lease, exc)
            raise

    def _fenced(self, method: str, path: str, **kw: Any) -> Any:
        if not self.claimed:
            self.claim()
        return self._send(method, path, **kw)

    def _write(self, method: str, path: str, **kw: Any) -> Any:
        """A fenced write with an Idempotency-Key, resent with it after an unknown outcome."""
        key = uuid.uuid4().hex
        for attempt in range(self.retries + 1):
            try:
                return self._fenced(method, path, idempotency_key=key, **kw)
            except _RETRYABLE:
                if attempt == self.retries:
                    raise
                time.sleep(_retry_delay(attempt))
        raise AssertionError("unreachable")

    def claim(self) -> int:
        """Raise the proxy's highest fence for the lock to this lease's (writes nothing); return
        the highest. Done automatically before the first fenced call. Raises ``StaleTokenError``."""
        return self._after_claim(self._send("POST", self._claim_path()))

    def insert(self, table: str, row: Mapping[str, Any]) -> dict[str, Any]:
        """Insert ``row``; return the stored row (201). A duplicate key is ``ValidationError``
        or a 409 problem as the proxy reports it."""
        return self._write("POST", f"/v1/tables/{_table(table)}/rows", json=dict(row))

    def upsert(self, table: str, key: Key, row: Mapping[str, Any]) -> dict[str, Any]:
        """Insert or replace the row at ``key``; return it."""
        return self._fenced("PUT", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}",
                            json=dict(row))

    def update(self, table: str, key: Key, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Set the given columns of the row at ``key``; return it. ``NotFoundError`` if absent."""
        return self._write("PATCH", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}",
                            json=dict(changes))

    def delete(self, table: str, key: Key) -> None:
        """Delete the row at ``key``. ``NotFoundError`` if absent."""
        self._fenced("DELETE", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}")

    def get(self, table: str, key: Key) -> dict[str, Any]:
        """Fenced read of the row at ``key``. ``NotFoundError`` if absent."""
        return self._fenced("GET", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}")

    def select(self, table: str, where: Mapping[str, Any] | None = None, *,
               limit: int | None = None) -> list[dict[str, Any]]:
        """Fenced read of the rows whose columns equal ``where``'s values (at most ``limit``)."""
        return _items(self._fenced("GET", f"/v1/tables/{_table(table)}/rows",
                                   params=self._select_params(where, limit)))

    def batch(self, ops: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Apply ``ops`` (``{"op": "insert"|"upsert"|"update"|"delete", "table", "key", "row"}``)
        in one transaction under one fence check, all or nothing; return the per-op results
        (``{"op", "table", "row"}``). A failing op's index is ``error.problem["op_index"]``."""
        return _batch_results(self._write("POST", "/v1/batch", json={"ops": [dict(o) for o in ops]}))


class AsyncFencedSession(_SessionBase):
    """The asyncio twin of ``FencedSession`` (same methods, ``await`` them)."""

    def __init__(self, proxy_url: str, lease: AsyncLease, *, timeout: float = 10.0,
                 http_client: httpx.AsyncClient | None = None, api_key: str | None = None,
                 retries: int = 3):
        super().__init__(proxy_url, lease, timeout, api_key, retries)
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncFencedSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, *, json: Any = None, params: Any = None,
                    idempotency_key: str | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}"):
            response = await self._http.request(method, self.url + path, json=json,
                                                params=params,
                                                headers=self._headers(idempotency_key),
                                                timeout=self.timeout)
        try:
            return body_or_raise(method, path, response)
        except LockClientError as exc:
            _stale(self.lease, exc)
            raise

    async def _fenced(self, method: str, path: str, **kw: Any) -> Any:
        if not self.claimed:
            await self.claim()
        return await self._send(method, path, **kw)

    async def _write(self, method: str, path: str, **kw: Any) -> Any:
        """See ``FencedSession._write``."""
        key = uuid.uuid4().hex
        for attempt in range(self.retries + 1):
            try:
                return await self._fenced(method, path, idempotency_key=key, **kw)
            except _RETRYABLE:
                if attempt == self.retries:
                    raise
                await asyncio.sleep(_retry_delay(attempt))
        raise AssertionError("unreachable")

    async def claim(self) -> int:
        """See ``FencedSession.claim``."""
        return self._after_claim(await self._send("POST", self._claim_path()))

    async def insert(self, table: str, row: Mapping[str, Any]) -> dict[str, Any]:
        return await self._write("POST", f"/v1/tables/{_table(table)}/rows", json=dict(row))

    async def upsert(self, table: str, key: Key, row: Mapping[str, Any]) -> dict[str, Any]:
        return await self._fenced("PUT", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}",
                                  json=dict(row))

    async def update(self, table: str, key: Key, changes: Mapping[str, Any]) -> dict[str, Any]:
        return await self._write("PATCH", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}",
                                  json=dict(changes))

    async def delete(self, table: str, key: Key) -> None:
        await self._fenced("DELETE", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}")

    async def get(self, table: str, key: Key) -> dict[str, Any]:
        return await self._fenced("GET", f"/v1/tables/{_table(table)}/rows/{encode_key(key)}")

    async def select(self, table: str, where: Mapping[str, Any] | None = None, *,
                     limit: int | None = None) -> list[dict[str, Any]]:
        return _items(await self._fenced("GET", f"/v1/tables/{_table(table)}/rows",
                                         params=self._select_params(where, limit)))

    async def batch(self, ops: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return _batch_results(await self._write("POST", "/v1/batch",
                                                 json={"ops": [dict(o) for o in ops]}))
