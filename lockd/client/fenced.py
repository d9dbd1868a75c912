"""Reads and writes through the fencing proxy with a lease's token: ``FencedSession`` (blocking)
and ``AsyncFencedSession`` (asyncio), both on httpx.

::

    db = FencedSession("http://127.0.0.1:7071")          # no lease yet
    lock = db.lock_for("accounts", 42)                    # the proxy names the row's lock
    with client.lock(lock, ttl=10) as lease, db.using(lease):
        row = db.get("accounts", 42)                      # claims the fence first, then reads
        db.update("accounts", 42, {"balance": row["balance"] - 5})

One row, one lock: the proxy writes each row under exactly ONE lock name, computed from the table
and the row's canonical key (``accounts/42``; ``accounts/1.0`` is not a name of row 1 of a numeric
key, it is ``accounts/1``). Never build lock names by hand: ``lock_for(table, key)`` asks the
proxy (``GET /v1/tables/{table}/lock?key=``), works without a lease (so before acquiring), and
caches the answer for the session. A write under another lock is ``LockNotAllowed`` (403) whose
``problem["lock"]`` names the lock needed. ``FencedSession(url, lease)`` still binds a lease at
once; ``using(lease)`` (a context manager that also returns the session) binds one later, and
``lease`` can be rebound for the next lease (the next call claims again).

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

Multi-lock leases (``client.acquire_many``): any lease object with ``.token`` and ``.fences``
(lock name -> fence) is served too. The first call claims ALL its locks in one request (``POST
/v1/fences/claim``, one transaction at the proxy), so every row it then reads or writes is
fenced; ``batch`` can write rows of several of its locks in one transaction (a transfer between
``accounts/1`` and ``accounts/2``), each op under its row's lock. A ``StaleTokenError`` then
carries ``problem["stale"]``: every stale lock with ``presented`` and ``highest``.

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

Fenced objects (``/v1/objects``): ``put_object``, ``put_file``, ``output`` (the job's output
file), ``get_object``, ``head_object``, ``delete_object``, ``list_objects``
(``lockd.client.objects``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
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
from lockd.client.lease import AsyncLease, Lease, LeaseState
from lockd.client.objects import AsyncObjectCalls, ObjectCalls
from lockd.client.wire import DEFAULT_CONNECT_TIMEOUT, check_segments, request_timeout
from lockd.common.tls import CertTypes, VerifyTypes, client_context

__all__ = ["FencedSession", "AsyncFencedSession", "encode_key"]

Key = Any  # scalar, or a sequence of scalars in primary-key order
_SERVER = "resource-proxy"  # who must answer (a lockd URL given by mistake is named)
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


def _fences_of(lease: Any) -> Mapping[str, int] | None:
    """A multi-lock lease's ``fences`` (lock -> fence); None for a single-lock lease."""
    fences = getattr(lease, "fences", None)
    return fences if isinstance(fences, Mapping) else None


def _stale(lease: Any, exc: LockClientError) -> None:
    if lease is None or not isinstance(exc, StaleTokenError):
        return
    mark = getattr(lease, "_mark_lost", None)
    if mark is None:
        return
    fences = _fences_of(lease)
    if fences is not None:
        mark(LeaseLostError(f"multi-lock lease of {sorted(fences)} is stale at the proxy: "
                            f"{exc.detail}", lock=exc.lock, code="stale_token"))
        return
    mark(LeaseLostError(
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


def _lock_answer(body: Any) -> str | None:
    if not isinstance(body, Mapping) or "lock" not in body:
        raise ProtocolError("lock answer is not {table, lock, unfenced}")
    lock = body["lock"]
    if lock is not None and not isinstance(lock, str):
        raise ProtocolError("lock answer's lock is not a string")
    return lock


class _SessionBase:
    def __init__(self, proxy_url: str, lease: Lease | AsyncLease | None, timeout: float,
                 api_key: str | None = None, retries: int = 3,
                 connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
                 refuse_lost: bool = True):
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.url = proxy_url.rstrip("/")
        self.lease = lease
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.refuse_lost = refuse_lost
        """Refuse (``LeaseLostError``, nothing sent) every call under a lease the client knows
        is lost; ``False`` leaves the decision to the proxy's fence alone."""
        self.retries = retries
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.highest: int | None = None
        """The proxy's highest fence for the lock after this session's claim (single-lock
        leases; see ``highests`` for a multi-lock lease)."""
        self.highests: dict[str, int] = {}
        """The proxy's highest fence of each lock after this session's claim."""
        self._claimed: str | None = None  # the token claimed
        self._locks: dict[tuple[str, str | None], str | None] = {}

    def _timeout(self) -> Any:
        return request_timeout(self.timeout, self.connect_timeout)

    @property
    def claimed(self) -> bool:
        """Whether the lease's fence (every fence of a multi-lock lease) has been claimed at the
        proxy by this session."""
        lease = self.lease
        return lease is not None and self._claimed == lease.token

    def _held(self) -> Lease | AsyncLease:
        if self.lease is None:
            raise LockClientError("this session has no lease: FencedSession(url, lease) or "
                                  "session.using(lease)", code="no_lease")
        return self.lease

    def _failed(self, exc: LockClientError) -> None:
        """A refusal of an object call: a stale token marks the lease lost, as for rows."""
        _stale(self.lease, exc)

    def _headers(self, idempotency_key: str | None = None) -> dict[str, str]:
        lease = self._held()
        if self.refuse_lost and getattr(lease, "state", None) is LeaseState.LOST:
            lease.check()  # known lost: refuse before sending anything
        headers = {"Fencing-Token": lease.token, **self._auth}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return headers

    def _lock_path(self, table: str, key: Key | None) -> str:
        query = "" if key is None else "?key=" + encode_key(key)
        return f"/v1/tables/{_table(table)}/lock{query}"

    @staticmethod
    def _select_params(where: Mapping[str, Any] | None, limit: int | None) -> dict[str, Any]:
        params = {k: _scalar(v) for k, v in (where or {}).items()}
        if limit is not None:
            params["limit"] = int(limit)
        return params

    def _claim_path(self) -> str:
        lease = self._held()
        if _fences_of(lease) is not None:
            return "/v1/fences/claim"
        return "/v1/fences/" + quote(check_segments(lease.lock), safe="/:") + "/claim"

    def _after_claim(self, body: Any) -> int | dict[str, int]:
        lease = self._held()
        try:
            if _fences_of(lease) is not None:
                highests = {str(x["lock"]): int(x["highest"]) for x in body["locks"]}
            else:
                highests = {lease.lock: int(body["highest"])}
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError("claim answer is not {lock, highest} or {locks: [...]}") from exc
        self._claimed = lease.token
        self.highests = highests
        if _fences_of(lease) is not None:
            self.highest = None
            return highests
        self.highest = highests[lease.lock]
        return self.highest


class FencedSession(ObjectCalls, _SessionBase):
    """Blocking reads and writes through the proxy at ``proxy_url`` under ``lease``'s token.

    ``timeout`` (seconds, default 10) bounds each request. ``http_client`` lets you share an
    ``httpx.Client`` (not closed by the session). ``api_key``: the proxy's API key
    (``PROXY_API_KEYS``), sent as ``Authorization: Bearer``. ``verify``/``cert``: TLS to an
    ``https://`` proxy, as for ``LockClient`` (CA file or ``SSLContext``; client certificate for
    mTLS). ``retries``: how many times an insert, update or batch is resent with its
    Idempotency-Key after ``outcome_unknown`` or no answer (default 3). ``connect_timeout``
    (seconds, default 5) bounds each request's connect phase: a proxy that is not there raises
    ``TransportError`` at once (``None``: only ``timeout`` bounds it). ``refuse_lost`` (default
    on): a lease the client knows is lost raises ``LeaseLostError`` before any
    request; ``False`` leaves the decision to the proxy's fence. Use as a context manager or
    call ``close()``.
    """

    def __init__(self, proxy_url: str, lease: Lease | None = None, *, timeout: float = 10.0,
                 http_client: httpx.Client | None = None, api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None, retries: int = 3,
                 connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
                 refuse_lost: bool = True):
        super().__init__(proxy_url, lease, timeout, api_key, retries, connect_timeout,
                         refuse_lost)
        self._own_http = http_client is None
        self._has_cert = cert is not None  # for the message of a TLS refusal
        self._http = http_client or httpx.Client(timeout=timeout,
                                                verify=client_context(verify, cert))

    def lock_for(self, table: str, key: Key | None = None) -> str | None:
        """The ONE lock that may write the row of ``table`` with ``key`` (``None`` for a table
        the proxy writes unfenced), as the proxy computes it; no lease needed. ``key`` may be
        left out for a table under a literal lock. ``ValidationError`` (422) if the table's
        template needs the key, ``NotFoundError`` for a table the proxy does not serve."""
        cache = (table, None if key is None else encode_key(key))
        if cache not in self._locks:
            path = self._lock_path(table, key)
            with translate_transport_errors(f"GET {path}", has_cert=self._has_cert):
                response = self._http.get(self.url + path, headers=self._auth, timeout=self._timeout())
            self._locks[cache] = _lock_answer(body_or_raise("GET", path, response, _SERVER))
        return self._locks[cache]

    @contextlib.contextmanager
    def using(self, lease: Lease) -> Iterator[FencedSession]:
        """Bind ``lease`` for the block (``with client.lock(...) as lease, db.using(lease):``);
        the first call claims its fence. The previous lease (if any) is bound again on exit."""
        previous, self.lease = self.lease, lease
        try:
            yield self
        finally:
            self.lease = previous

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> FencedSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, method: str, path: str, *, json: Any = None, params: Any = None,
              idempotency_key: str | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}", has_cert=self._has_cert):
            response = self._http.request(method, self.url + path, json=json, params=params,
                                          headers=self._headers(idempotency_key),
                                          timeout=self._timeout())
        try:
            return body_or_raise(method, path, response, _SERVER)
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

    def claim(self) -> int | dict[str, int]:
        """Raise the proxy's highest fence for the lock to this lease's (writes nothing); return
        the highest (a multi-lock lease: every lock's, in one transaction, as a dict). Done
        automatically before the first fenced call. Raises ``StaleTokenError``."""
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
        in one transaction under one fence check (one per lock touched, for a multi-lock
        lease), all or nothing; return the per-op results
        (``{"op", "table", "row"}``). A failing op's index is ``error.problem["op_index"]``."""
        return _batch_results(self._write("POST", "/v1/batch", json={"ops": [dict(o) for o in ops]}))


class AsyncFencedSession(AsyncObjectCalls, _SessionBase):
    """The asyncio twin of ``FencedSession`` (same methods, ``await`` them)."""

    def __init__(self, proxy_url: str, lease: AsyncLease | None = None, *, timeout: float = 10.0,
                 http_client: httpx.AsyncClient | None = None, api_key: str | None = None,
                 verify: VerifyTypes = True, cert: CertTypes = None, retries: int = 3,
                 connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
                 refuse_lost: bool = True):
        super().__init__(proxy_url, lease, timeout, api_key, retries, connect_timeout,
                         refuse_lost)
        self._own_http = http_client is None
        self._has_cert = cert is not None  # for the message of a TLS refusal
        self._http = http_client or httpx.AsyncClient(timeout=timeout,
                                                verify=client_context(verify, cert))

    async def lock_for(self, table: str, key: Key | None = None) -> str | None:
        """See ``FencedSession.lock_for``."""
        cache = (table, None if key is None else encode_key(key))
        if cache not in self._locks:
            path = self._lock_path(table, key)
            with translate_transport_errors(f"GET {path}", has_cert=self._has_cert):
                response = await self._http.get(self.url + path, headers=self._auth,
                                                timeout=self._timeout())
            self._locks[cache] = _lock_answer(body_or_raise("GET", path, response, _SERVER))
        return self._locks[cache]

    @contextlib.asynccontextmanager
    async def using(self, lease: AsyncLease) -> AsyncIterator[AsyncFencedSession]:
        """See ``FencedSession.using``."""
        previous, self.lease = self.lease, lease
        try:
            yield self
        finally:
            self.lease = previous

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncFencedSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, *, json: Any = None, params: Any = None,
                    idempotency_key: str | None = None) -> Any:
        with translate_transport_errors(f"{method} {path}", has_cert=self._has_cert):
            response = await self._http.request(method, self.url + path, json=json,
                                                params=params,
                                                headers=self._headers(idempotency_key),
                                                timeout=self._timeout())
        try:
            return body_or_raise(method, path, response, _SERVER)
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

    async def claim(self) -> int | dict[str, int]:
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
