"""The etcd store: ``etcd://host:port,host:port,…[/prefix][?timeout=2.5]`` (etcd v3, Raft).

TLS (etcd started with ``--cert-file/--key-file``, and ``--client-cert-auth
--trusted-ca-file`` for client certificates) rides on the URL's query, like ``timeout``:
``etcd://h1:2379,h2:2379/lockd?ca=/etc/lockd/etcd-ca.pem&cert=/etc/lockd/etcd.pem&key=/etc/lockd/etcd.key``.
``ca`` (the CA that signed the members' certificates; default: the system's CAs), ``cert`` and
``key`` (lockd's client certificate, both or neither); any of them switches every endpoint to
https, ``tls=1`` alone does too. The hot-path keep-alive client and the watch stream share one
``ssl.SSLContext``; the members' certificates must name the host used in the URL.

Talks to etcd's v3 JSON gateway (on the client port) with ``httpx``. Why not a client library:
``etcd3`` (gRPC) last released in 2020; ``etcd3gw`` speaks this same gateway but synchronously
(it would block lockd's event loop); ``aetcd`` (asyncio gRPC) would bring ``grpcio`` and
``protobuf`` into lockd for about ten calls. The gateway needs nothing beyond the ``httpx``
lockd already uses, is async, works with etcd ≥ 3.4, and every call is one small JSON POST
(the watch is one streaming POST). The unary calls go through ``lockd.server.store.etcd_http`` (a lean
keep-alive client: httpx cost ~1 ms of CPU per request, most of lockd's time on etcd); the
watch stream through httpx. Keys and values travel base64-encoded; 64-bit ids and revisions come back as
strings, and fields equal to zero/false are omitted.

Layout under the prefix (default ``lockd``)::

    <prefix>/locks/<name>   the live lease: value JSON {lease_id, owner, client_id, ttl_s, ttl_ms},
                            bound to an etcd lease, so etcd deletes it when that lease expires
    <prefix>/fences/<name>  written in the same transaction as every grant: its mod_revision
                            is the last fence issued for <name> (kept after release; tiny)
    <prefix>/leases/<id>    a multi-lock lease: JSON {locks, owner, client_id, ttl_ms}, bound
                            to the same etcd lease as its lock keys

Multi-lock leases: ONE etcd lease for the whole set and ONE transaction ``if create_revision
== 0 for every lock key: put every lock key and fence key, and the lease key; else range every
lock key``: all or none, and every lock's fence is that transaction's revision (higher than any
earlier one). Renew keeps the one etcd lease alive (a new TTL moves every key to a new etcd
lease in one guarded transaction; the lease key is put just before the grant transaction, bound
to the same etcd lease, so the grant stays within etcd's default ``--max-txn-ops`` of 128 for 64
locks); release revokes it, which deletes every key of the set
atomically (the watch sees a delete per lock); expiry does the same.

How each operation maps onto etcd:

* **acquire** (2 calls, like etcd's own lock API: grant + lock): grant an etcd lease, then ONE
  transaction ``if create_revision(lock key) == 0: put lock key (bound to that lease) and put
  fence key; else range lock key``. The fence is the
  transaction's revision (= the key's ``create_revision``): etcd's store-wide revision only ever
  grows, across leader changes and restarts, so every grant of a lock gets a higher fence than
  any earlier one (invariant 1) even though the lock key is deleted on release. A refused
  acquire revokes its unused etcd lease (in the background). Same non-empty ``client_id`` as the holder: the
  holder's lease is renewed and returned.
* **renew**: keep the etcd lease alive (etcd refuses to keep an expired lease alive, even one not
  yet reaped: invariant 3). Which etcd lease: the per-process lease cache
  (``lockd.server.store.etcd_cache``) knows it for a lease this process granted, moved or renewed
  before, so that renew is ONE keep-alive; otherwise (or if that keep-alive fails) read the lock
  key and check it holds this ``lease_id`` first. etcd cannot change a lease's TTL, so a renew
  with a NEW ``ttl_ms`` keeps the old lease alive, grants a new one and moves the key to it with
  a put guarded on the key's ``mod_revision`` (a put keeps ``create_revision``, hence the fence),
  then revokes the old one before it answers. A renew without ``ttl_ms`` keeps the lease's own
  TTL (``ttl_ms`` in the value: the last one granted or renewed with), so it is a plain
  keep-alive.
* **release**: revoke the etcd lease that holds the key (ONE call with a cache hit; a read of the
  key and a check of ``lease_id`` first otherwise): the key goes in the same step. An etcd lease
  holds one lease's key and nothing else, and every path that takes the key off an etcd lease
  revokes that etcd lease before it answers, which is what makes a cached keep-alive or revoke
  trustworthy: see ``etcd_cache``.
* **expiry** is etcd's own lease expiry (its leader's clock; checked about every 500 ms).
* **subscribe**: ONE watch stream per store on the lock-key prefix, delete events only (release
  and expiry both delete the key). On errors it reconnects, to the next endpoint, resuming at the
  revision after the last event it delivered, so no release is missed; if etcd has compacted that
  revision away, it resumes from the oldest one kept and calls the listeners for every lock that
  is free, so waiters whose release fell into the gap retry.

TTL rounding: etcd leases are whole seconds, so the etcd lease is ``ceil(ttl_ms / 1000)`` s, and
never shorter than etcd's minimum lease TTL (``ceil(1.5 × election timeout)``: 2 s with etcd's
default flags). The effective TTL may therefore be LONGER than asked; ``Grant.ttl_ms`` reports
the TTL etcd granted (never less than asked). etcd reports a holder's remaining time in whole
seconds, truncated, so ``Holder.ttl_ms`` and ``LockState.ttl_ms`` round it up to the next second
(capped at the granted TTL): a waiter's fallback timer then fires after the expiry, not before.

Availability: requests carry ``hasleader`` metadata so a member without a leader fails fast
instead of queueing; connection errors and "no leader" answers move on to the next endpoint; the
whole call is bounded by ``timeout`` (default 2.5 s), after which ``StoreUnavailable`` is raised
(no quorum → 503 in about that time, nothing granted). Reads are linearizable (etcd's default).
Every request may be replayed on another endpoint when its answer was lost, and every write is
written so that a replay is recognised: see ``_post``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import json
import logging
import math
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from lockd.common.tls import client_context
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.base import (
    MULTI_PREFIX,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
)
from lockd.server.store.etcd_cache import DEFAULT_SIZE, CachedLease, LeaseCache
from lockd.server.store.etcd_http import GatewayError, GatewayPool

__all__ = ["EtcdStore", "etcd_tls", "parse_etcd_url", "cache_size", "DEFAULT_TIMEOUT_S",
           "DEFAULT_PREFIX"]

log = logging.getLogger("lockd.server.store.etcd")

DEFAULT_PREFIX = "lockd"
DEFAULT_TIMEOUT_S = 2.5
DEFAULT_PORT = 2379
_RETRY_PAUSE_S = 0.05
# Answers that mean "this member cannot serve now; another one (or a moment later) may".
_RETRYABLE = ("no leader", "leader changed", "not capable", "timed out", "deadline exceeded",
              "too many requests", "stopped", "not started")
_HEADERS = {"Grpc-Metadata-hasleader": "true"}


def etcd_tls(url: str) -> ssl.SSLContext | None:
    """The client ``SSLContext`` the URL's ``ca``/``cert``/``key``/``tls`` ask for, or ``None``
    (plain http). Raises ``ValueError`` for a lone ``cert`` or ``key`` or an unreadable file."""
    query = parse_qs(urlsplit(url).query)
    ca, cert, key = (query.get(k, [None])[0] for k in ("ca", "cert", "key"))
    tls = query.get("tls", ["0"])[0].lower() in ("1", "true", "yes", "on")
    if (cert is None) != (key is None):
        raise ValueError("etcd store URL: give both cert= and key=, or neither")
    if not (tls or ca or cert):
        return None
    try:
        context = client_context(ca or True, (cert, key) if cert and key else None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"etcd store URL: cannot use its TLS files: {exc}") from None
    return context if isinstance(context, ssl.SSLContext) else ssl.create_default_context()


def parse_etcd_url(url: str) -> tuple[list[str], str, float]:
    """``etcd://h:p,h:p/prefix?timeout=2.5`` → (base URLs, key prefix, timeout in seconds).

    Port defaults to 2379, prefix to ``lockd``. Base URLs are ``https://`` when the query asks
    for TLS (``ca``, ``cert``/``key`` or ``tls=1``; see ``etcd_tls``). Raises ``ValueError`` on
    a malformed URL.
    """
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.netloc:
        raise ValueError(f"not an etcd store URL (etcd://host:port,…): {url!r}")
    query = parse_qs(parts.query)
    secure = any(k in query for k in ("ca", "cert", "key")) or \
        query.get("tls", ["0"])[0].lower() in ("1", "true", "yes", "on")
    scheme = "https" if secure else "http"
    endpoints = []
    for host in parts.netloc.split(","):
        host = host.strip()
        if not host:
            continue
        if ":" not in host.rsplit("]", 1)[-1]:
            host = f"{host}:{DEFAULT_PORT}"
        endpoints.append(f"{scheme}://{host}")
    if not endpoints:
        raise ValueError(f"etcd store URL names no endpoint: {url!r}")
    prefix = parts.path.strip("/") or DEFAULT_PREFIX
    timeout = DEFAULT_TIMEOUT_S
    if "timeout" in query:
        try:
            timeout = float(query["timeout"][0])
        except ValueError:
            raise ValueError(f"etcd store URL: bad timeout {query['timeout'][0]!r}") from None
        if not 0.1 <= timeout <= 60:
            raise ValueError("etcd store URL: timeout must be within 0.1..60 seconds")
    return endpoints, prefix, timeout


def cache_size(url: str) -> int:
    """The URL's ``cache`` (entries of the lease cache, 0..10,000,000; 0 disables it), default
    ``etcd_cache.DEFAULT_SIZE``. Raises ``ValueError`` for anything else."""
    values = parse_qs(urlsplit(url).query).get("cache")
    if not values:
        return DEFAULT_SIZE
    try:
        size = int(values[0])
    except ValueError:
        raise ValueError(f"etcd store URL: bad cache size {values[0]!r}") from None
    if not 0 <= size <= 10_000_000:
        raise ValueError("etcd store URL: cache must be within 0..10000000 entries")
    return size


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def _int(value: Any) -> int:
    """etcd's JSON gateway sends 64-bit integers as strings and omits zeros."""
    return int(value or 0)


def _prefix_end(key: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``key`` (etcd's range_end)."""
    stripped = key.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else b"\x00"


def _json_object(data: bytes) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object, or None."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _secs(ttl_ms: int) -> int:
    return max(1, math.ceil(ttl_ms / 1000))


@dataclass(frozen=True, slots=True)
class _Held:
    """A lock key as read from etcd."""

    name: str
    lease_id: str
    owner: str
    client_id: str | None
    ttl_s: int  # the TTL asked for, in seconds (the etcd lease may have been granted more)
    ttl_ms: int  # the TTL asked for, in milliseconds: what a renew without one keeps
    etcd_lease: int
    fence: int  # create_revision
    mod_revision: int

    @classmethod
    def parse(cls, name: str, kv: dict[str, Any]) -> _Held:
        value = json.loads(_unb64(kv.get("value")))
        return cls(name=name, lease_id=value["lease_id"], owner=value.get("owner", ""),
                   client_id=value.get("client_id"), ttl_s=int(value.get("ttl_s", 0)),
                   ttl_ms=int(value.get("ttl_ms") or int(value.get("ttl_s", 0)) * 1000),
                   etcd_lease=_int(kv.get("lease")), fence=_int(kv.get("create_revision")),
                   mod_revision=_int(kv.get("mod_revision")))


def _value(lease_id: str, owner: str, client_id: str | None, ttl_ms: int) -> str:
    doc = {"lease_id": lease_id, "owner": owner, "client_id": client_id,
           "ttl_s": _secs(ttl_ms), "ttl_ms": ttl_ms}
    return _b64(json.dumps(doc, separators=(",", ":")).encode())


class _EtcdError(StoreUnavailable):
    """An error answer from etcd that is not an outage (e.g. lease not found): callers that
    expect one catch it; anywhere else it surfaces as ``StoreUnavailable``."""


class EtcdStore:
    """A lock ``Store`` on an etcd v3 cluster. See the module docstring for the mapping.

    ``url``: ``etcd://host:port,host:port,…[/prefix][?timeout=seconds][&cache=entries]``.
    ``timeout`` bounds every store call (all endpoint retries included) before
    ``StoreUnavailable``; ``cache`` sizes the lease cache (``etcd_cache``; 0 turns it off).
    """

    def __init__(self, url: str, *, timeout: float | None = None):
        self._endpoints, self._prefix, url_timeout = parse_etcd_url(url)
        self._cache = LeaseCache(cache_size(url))
        self._ssl = etcd_tls(url)  # None: plain http
        self._timeout = timeout if timeout is not None else url_timeout
        # One attempt may hang when etcd dropped the request with its leader (a follower's
        # forwarded proposal is lost when the leader dies); give up on it early and replay.
        self._attempt_timeout = max(0.5, self._timeout * 0.4)
        self._locks = f"{self._prefix}/locks/".encode()
        self._fences = f"{self._prefix}/fences/".encode()
        self._current = 0  # index of the endpoint that answered last
        self._http: httpx.AsyncClient | None = None  # the watch stream
        self._pool: GatewayPool | None = None  # every other call
        self._listeners: list[ReleaseListener] = []
        self._watch_task: asyncio.Task | None = None
        self._watch_created = asyncio.Event()
        self._gap = False  # the watch resumed after compacted history: wake every free lock
        self._resume_at = 0  # the revision the watch resumes from after a break
        self._background: set[asyncio.Task] = set()  # revokes in flight

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (a linearizable read must succeed) and start the watch stream."""
        if self._http is None:
            self._http = httpx.AsyncClient(
                headers=_HEADERS, limits=httpx.Limits(max_connections=4,
                                                      max_keepalive_connections=2),
                verify=self._ssl if self._ssl is not None else True)
            self._pool = GatewayPool(_HEADERS, max_connections=64, max_idle=32, ssl=self._ssl)
        try:
            revision = await self._ping()
        except BaseException:
            await self.close()
            raise
        if self._watch_task is None:
            self._watch_created = asyncio.Event()
            self._watch_task = asyncio.create_task(self._watch_loop(revision + 1),
                                                   name="lockd-etcd-watch")

    async def close(self) -> None:
        """Stop the watch, finish pending revokes, close every connection; idempotent."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=self._timeout)
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    async def wait_watching(self, timeout: float = 5.0) -> None:
        """Until the watch stream is established (tests use it to avoid a startup race)."""
        await asyncio.wait_for(self._watch_created.wait(), timeout)

    # -- transport -----------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the current endpoint; on failure move on to the next, within ``timeout``.

        Replaying is safe for every request this store sends, which is why a request whose
        answer was lost is retried elsewhere: reads and keep-alive are idempotent; a replayed
        revoke finds nothing, and its caller reads the key (a lock it did free then answers
        ``LeaseLost``: conservative, never a false success); a replayed grant leaves an unused
        etcd lease that expires on its own; every other write is a transaction guarded on the
        lock key (``create_revision == 0`` or ``mod_revision``) whose caller recognises its own
        earlier success when the guard fails (the key holds the etcd lease it just granted).
        Raises ``StoreUnavailable`` when no member answered usefully in time, ``_EtcdError``
        for any other error answer.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("etcd store is not open")
        payload = json.dumps(body, separators=(",", ":")).encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        n = len(self._endpoints)
        index = self._current
        failures = 0
        last = "no answer"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0.01:
                raise StoreUnavailable(
                    f"etcd did not answer within {self._timeout:g}s "
                    f"(endpoints {', '.join(self._endpoints)}): {last}")
            endpoint = self._endpoints[index % n]
            try:
                attempt = min(remaining, self._attempt_timeout)
                status, data = await pool.post(endpoint, path, payload, attempt)
            except GatewayError as exc:  # refused, reset, timed out: try another member
                last = f"{endpoint}: {exc}"
            else:
                doc = _json_object(data) if status == 200 else None
                if doc is not None:
                    self._current = index % n
                    return doc
                if status == 200:  # a truncated or garbled answer: try another member
                    last = f"{endpoint}: malformed answer"
                else:
                    code, message = self._error_of(status, data)
                    if not (code == 14 or status == 503
                            or any(marker in message for marker in _RETRYABLE)):
                        raise _EtcdError(f"etcd refused the request: {message}")
                    last = f"{endpoint}: {message}"
            index += 1
            failures += 1
            if failures % n == 0:  # every member failed once: give the cluster a moment
                await asyncio.sleep(min(_RETRY_PAUSE_S * (failures // n),
                                        max(0.0, deadline - loop.time() - 0.01), 0.25))

    @staticmethod
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
        return _int(code), str(doc.get("message") or doc.get("error") or status)

    # -- keys and small etcd calls ----------------------------------------------------------

    def _lock_key(self, lock: str) -> bytes:
        return self._locks + lock.encode()

    def _lease_key(self, lease_id: str) -> bytes:
        return f"{self._prefix}/leases/{lease_id}".encode()

    def _fence_key(self, lock: str) -> bytes:
        return self._fences + lock.encode()

    async def _ping(self) -> int:
        """A linearizable read (needs a quorum); returns the store revision."""
        doc = await self._post("/v3/kv/range", {"key": _b64(self._fences), "count_only": True})
        return _int(doc["header"].get("revision"))

    async def _grant(self, ttl_s: int) -> tuple[int, int]:
        """A new etcd lease of ``ttl_s`` seconds → (id, granted TTL in seconds)."""
        doc = await self._post("/v3/lease/grant", {"TTL": ttl_s})
        if doc.get("error"):
            raise StoreUnavailable(f"etcd refused a lease: {doc['error']}")
        return _int(doc["ID"]), _int(doc["TTL"])

    async def _keepalive(self, etcd_lease: int) -> int:
        """Refresh an etcd lease; its granted TTL in seconds, 0 if it is gone or expired."""
        doc = await self._post("/v3/lease/keepalive", {"ID": str(etcd_lease)})
        return _int(doc.get("result", {}).get("TTL"))

    def _revoke_soon(self, etcd_lease: int) -> None:
        """Revoke an etcd lease that holds no lock key (any more) without waiting for it."""
        task = asyncio.get_running_loop().create_task(self._revoke(etcd_lease))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _revoke(self, etcd_lease: int) -> None:
        """Revoke an etcd lease (deleting its keys); best effort: it expires anyway."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(etcd_lease)})
        except StoreUnavailable as exc:  # not found, or unreachable: its TTL ends it
            log.debug("revoke of an etcd lease failed: %s", exc)

    async def _revoke_now(self, etcd_lease: int) -> bool:
        """Revoke an etcd lease (its keys are deleted in the same step) and wait for it: True,
        or False if etcd has no such lease (expired, or revoked by someone else; also our own
        revoke replayed after its answer was lost). Raises ``StoreUnavailable``."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(etcd_lease)})
        except _EtcdError as exc:
            if "lease not found" in str(exc.detail):
                return False
            raise
        return True

    async def _remaining_ms(self, etcd_lease: int) -> int:
        """Upper bound of an etcd lease's time left (etcd reports truncated whole seconds):
        0 if it is gone."""
        doc = await self._post("/v3/lease/timetolive", {"ID": str(etcd_lease)})
        ttl = _int(doc.get("TTL"))
        if ttl < 0:
            return 0
        return min((ttl + 1) * 1000, _int(doc.get("grantedTTL")) * 1000)

    async def _txn(self, compare: list, success: list, failure: list) -> dict[str, Any]:
        return await self._post("/v3/kv/txn",
                                {"compare": compare, "success": success, "failure": failure})

    async def _read_lock(self, lock: str) -> _Held | None:
        doc = await self._post("/v3/kv/range", {"key": _b64(self._lock_key(lock))})
        kvs = doc.get("kvs") or []
        return _Held.parse(lock, kvs[0]) if kvs else None

    @staticmethod
    def _range_kv(doc: dict[str, Any], index: int = 0) -> dict[str, Any] | None:
        """The first kv of the ``index``-th range response of a transaction answer."""
        responses = doc.get("responses") or []
        kvs = responses[index].get("response_range", {}).get("kvs") if index < len(responses) else None
        return kvs[0] if kvs else None

    # -- Store protocol ----------------------------------------------------------------------

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None
    ) -> Grant | Holder:
        """Grant ``lock`` if its key is absent (one guarded transaction); see the module doc."""
        key = _b64(self._lock_key(lock))
        ttl_s = _secs(ttl_ms)
        for _ in range(3):
            etcd_lease, granted = await self._grant(ttl_s)
            keep = False
            try:
                doc = await self._txn(
                    [{"key": key, "target": "CREATE", "create_revision": "0"}],
                    [{"request_put": {"key": key, "lease": str(etcd_lease),
                                      "value": _value(lease_id, owner, client_id, ttl_ms)}},
                     {"request_put": {"key": _b64(self._fence_key(lock)), "value": ""}}],
                    [{"request_range": {"key": key}}])
                if doc.get("succeeded"):
                    keep = True
                    fence = _int(doc["header"]["revision"])
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms, fence, owner))
                    return Grant(lock, lease_id, fence, granted * 1000, owner)
                kv = self._range_kv(doc)
                if kv is None:
                    continue  # cannot happen (the range is in the same transaction); retry
                holder = _Held.parse(lock, kv)
                if holder.etcd_lease == etcd_lease:  # a replay of our own successful put
                    keep = True
                    self._cache.put(lease_id, CachedLease(lock, etcd_lease, ttl_ms, holder.fence,
                                                          owner))
                    return Grant(lock, lease_id, holder.fence, granted * 1000, owner)
            finally:
                if not keep:
                    self._revoke_soon(etcd_lease)
            if client_id and holder.client_id == client_id:
                try:
                    return await self._extend(holder, ttl_ms)
                except (LeaseLost, _Moved):
                    continue  # it lapsed or changed meanwhile: try again from the start
            remaining = await self._remaining_ms(holder.etcd_lease)
            if remaining == 0:
                continue  # the holder's lease is gone: its key went with it
            return Holder(lock, holder.owner, remaining, holder.fence)
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing hands; try again")

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many`` and the module docstring: one guarded transaction."""
        keys = [_b64(self._lock_key(lock)) for lock in locks]
        ttl_s = _secs(ttl_ms)
        lease_value = _b64(json.dumps({"locks": list(locks), "owner": owner,
                                       "client_id": client_id, "ttl_ms": ttl_ms,
                                       "ttl_s": ttl_s}, separators=(",", ":")).encode())
        for _ in range(3):
            etcd_lease, granted = await self._grant(ttl_s)
            keep = False
            try:
                success: list[dict[str, Any]] = []
                for lock, key in zip(locks, keys, strict=True):
                    success.append({"request_put": {"key": key, "lease": str(etcd_lease),
                                                    "value": _value(lease_id, owner, None,
                                                                    ttl_ms)}})
                    success.append({"request_put": {"key": _b64(self._fence_key(lock)),
                                                    "value": ""}})
                # The lease record first, on its own (bound to the new etcd lease, so a refused
                # grant's revoke removes it): the grant then has 2 operations a lock, 128 for
                # 64 locks, within etcd's default --max-txn-ops.
                await self._post("/v3/kv/put", {"key": _b64(self._lease_key(lease_id)),
                                                "lease": str(etcd_lease), "value": lease_value})
                doc = await self._txn(
                    [{"key": key, "target": "CREATE", "create_revision": "0"} for key in keys],
                    success, [{"request_range": {"key": key}} for key in keys])
                if doc.get("succeeded"):
                    keep = True
                    fence = _int(doc["header"]["revision"])
                    return MultiGrant(lease_id, {lock: fence for lock in locks},
                                      granted * 1000, owner)
                held = [_Held.parse(lock, kv) for i, lock in enumerate(locks)
                        if (kv := self._range_kv(doc, i)) is not None]
                if len(held) == len(locks) and all(h.etcd_lease == etcd_lease for h in held):
                    keep = True  # a replay of our own successful transaction
                    return MultiGrant(lease_id, {h.name: h.fence for h in held},
                                      granted * 1000, owner)
            finally:
                if not keep:
                    self._revoke_soon(etcd_lease)
            if not held:
                continue  # freed in between: try again
            if (client_id and len(held) == len(locks)
                    and len({h.lease_id for h in held}) == 1):
                theirs = await self._read_lease(held[0].lease_id)
                if (theirs is not None and theirs[0].get("client_id") == client_id
                        and theirs[0].get("locks") == list(locks)):
                    try:
                        return await self.renew_many(held[0].lease_id, ttl_ms)
                    except LeaseLost:
                        continue
            remaining = {lease: await self._remaining_ms(lease)
                         for lease in {h.etcd_lease for h in held}}
            holders = [Holder(h.name, h.owner, remaining[h.etcd_lease], h.fence)
                       for h in held if remaining[h.etcd_lease] > 0]
            if holders:
                return holders
        raise StoreUnavailable("etcd: the locks kept changing hands; try again")

    async def _read_lease(self, lease_id: str) -> tuple[dict[str, Any], int, int] | None:
        """A multi-lock lease's record: (value, etcd lease, mod_revision), or None."""
        doc = await self._post("/v3/kv/range", {"key": _b64(self._lease_key(lease_id))})
        kvs = doc.get("kvs") or []
        if not kvs:
            return None
        return (json.loads(_unb64(kvs[0].get("value"))), _int(kvs[0].get("lease")),
                _int(kvs[0].get("mod_revision")))

    async def _read_set(self, lease_id: str) -> tuple[dict[str, Any], int, int, list[_Held]]:
        """The lease record and its lock keys still held by it; ``LeaseLost`` if none is."""
        record = await self._read_lease(lease_id)
        if record is None:
            raise LeaseLost("no live multi-lock lease with that id")
        value, etcd_lease, _ = record
        doc = await self._txn([], [{"request_range": {"key": _b64(self._lock_key(n))}}
                                   for n in value["locks"]], [])
        held = [h for i, name in enumerate(value["locks"])
                if (kv := self._range_kv(doc, i)) is not None
                and (h := _Held.parse(name, kv)).lease_id == lease_id]
        return value, etcd_lease, record[2], held

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """Keep the set's etcd lease alive (or move every key to a new one for a new TTL)."""
        for _ in range(3):
            value, etcd_lease, lease_rev, held = await self._read_set(lease_id)
            names = value["locks"]
            if len(held) != len(names):
                raise LeaseLost("a lock of the multi-lock lease is no longer held by it")
            new_ttl = int(value.get("ttl_ms") or 0) if ttl_ms is None else ttl_ms
            granted = await self._keepalive(etcd_lease)
            if granted <= 0:
                raise LeaseLost("the multi-lock lease expired")
            fences = {h.name: h.fence for h in held}
            owner = value.get("owner", "")
            if _secs(new_ttl) == int(value.get("ttl_s") or 0):
                return MultiGrant(lease_id, fences, granted * 1000, owner)
            new_lease, new_granted = await self._grant(_secs(new_ttl))
            lease_key = _b64(self._lease_key(lease_id))
            compare = [{"key": lease_key, "target": "MOD", "mod_revision": str(lease_rev)}]
            success = [{"request_put": {"key": lease_key, "lease": str(new_lease), "value": _b64(
                json.dumps({**value, "ttl_ms": new_ttl, "ttl_s": _secs(new_ttl)},
                           separators=(",", ":")).encode())}}]
            for h in held:
                key = _b64(self._lock_key(h.name))
                compare.append({"key": key, "target": "MOD", "mod_revision": str(h.mod_revision)})
                success.append({"request_put": {"key": key, "lease": str(new_lease), "value":
                                                _value(lease_id, h.owner, None, new_ttl)}})
            moved = False
            try:
                doc = await self._txn(compare, success, [{"request_range": {"key": lease_key}}])
                kv = None if doc.get("succeeded") else self._range_kv(doc)
                moved = bool(doc.get("succeeded")) or (
                    kv is not None and _int(kv.get("lease")) == new_lease)
            finally:
                if not moved:
                    self._revoke_soon(new_lease)
            if moved:
                if not await self._old_lease_revoked(etcd_lease, new_lease):
                    raise LeaseLost("the multi-lock lease was released while it was renewed")
                return MultiGrant(lease_id, fences, new_granted * 1000, owner)
        raise StoreUnavailable("etcd: the multi-lock lease kept changing; try again")

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """Revoke the set's etcd lease: every key of it goes in one atomic step. If etcd no
        longer has that etcd lease (it expired, or a concurrent renew moved the set to a new
        one), read the set again: ``LeaseLost`` if it is gone."""
        for _ in range(3):
            value, etcd_lease, _, held = await self._read_set(lease_id)
            if await self._revoke_now(etcd_lease):
                if len(held) != len(value["locks"]):
                    raise LeaseLost("a lock of the multi-lock lease was no longer held by it")
                return tuple(h.name for h in held)
        raise StoreUnavailable("etcd: the multi-lock lease kept changing; try again")

    async def _old_lease_revoked(self, old: int, new: int) -> bool:
        """After a move of keys from etcd lease ``old`` to ``new``: revoke ``old`` before the
        renew answers (the lease cache's invariant: see ``etcd_cache``). False if etcd no
        longer had ``old``: a release (or force-release) revoked it after our keep-alive, and
        that revoke missed the keys we had just moved, so finish that release by revoking
        ``new`` (its keys go with it); the renew then answers ``LeaseLost``. (Also when ``old``
        expired in between, or our revoke was replayed: a spurious 410, never a false success.)
        """
        try:
            if await self._revoke_now(old):
                return True
        except StoreUnavailable:
            self._revoke_soon(old)  # best effort; until then it lives at most its TTL
            raise
        await self._revoke_now(new)
        return False

    async def _extend(self, held: _Held, ttl_ms: int | None) -> Grant:
        """Push ``held``'s expiry to ``ttl_ms`` from now (``None``: its own TTL); same fence.

        Raises ``LeaseLost``.
        """
        if ttl_ms is None:
            ttl_ms = held.ttl_ms
        ttl_s = _secs(ttl_ms)
        granted = await self._keepalive(held.etcd_lease)
        if granted <= 0:
            raise LeaseLost(f"lease on {held.name!r} expired", lock=held.name)
        if ttl_s == held.ttl_s:  # (a new ttl_ms within the same second is not recorded)
            self._cache.put(held.lease_id, CachedLease(held.name, held.etcd_lease, held.ttl_ms,
                                                       held.fence, held.owner))
            return Grant(held.name, held.lease_id, held.fence, granted * 1000, held.owner)
        # A different TTL: etcd leases cannot change theirs. Move the key to a new lease; the
        # keep-alive above ensures the old one is live, so nothing lapsed is brought back.
        new_lease, new_granted = await self._grant(ttl_s)
        key = _b64(self._lock_key(held.name))
        moved = False
        try:
            doc = await self._txn(
                [{"key": key, "target": "MOD", "mod_revision": str(held.mod_revision)}],
                [{"request_put": {"key": key, "lease": str(new_lease), "value": _value(
                    held.lease_id, held.owner, held.client_id, ttl_ms)}}],
                [{"request_range": {"key": key}}])
            kv = None if doc.get("succeeded") else self._range_kv(doc)
            moved = doc.get("succeeded") or (kv is not None and _int(kv.get("lease")) == new_lease)
        finally:
            if not moved:
                self._revoke_soon(new_lease)
        if not moved:
            raise _Moved
        if not await self._old_lease_revoked(held.etcd_lease, new_lease):
            self._cache.drop(held.lease_id)
            raise LeaseLost(f"lease on {held.name!r} was released while it was renewed",
                            lock=held.name)
        self._cache.put(held.lease_id, CachedLease(held.name, new_lease, ttl_ms, held.fence,
                                                   held.owner))
        return Grant(held.name, held.lease_id, held.fence, new_granted * 1000, held.owner)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """Keep this lease's etcd lease alive (or move it to a new TTL; ``None``: keep its own).

        A lease this process granted, moved or renewed before (the lease cache) is ONE
        keep-alive of its etcd lease when the TTL stays; a keep-alive that fails (the etcd lease
        is gone: released, moved or expired elsewhere) or a miss reads the key. Raises
        ``LeaseLost``.
        """
        entry = self._cache.get(lease_id, lock)
        if entry is not None and (ttl_ms is None or _secs(ttl_ms) == _secs(entry.ttl_ms)):
            granted = await self._keepalive(entry.etcd_lease)
            if granted > 0:
                return Grant(lock, lease_id, entry.fence, granted * 1000, entry.owner)
            self._cache.drop(lease_id, entry.etcd_lease)
        for _ in range(3):
            held = await self._read_lock(lock)
            if held is None or held.lease_id != lease_id:
                self._cache.drop(lease_id)
                raise LeaseLost(f"no live lease on {lock!r} with that id", lock=lock)
            try:
                return await self._extend(held, ttl_ms)
            except _Moved:
                continue  # changed under us (a concurrent renew of the same lease): re-read
            except LeaseLost:
                # Its etcd lease is gone. Lost, unless a concurrent renew of this same lease
                # just moved the key to a new etcd lease.
                again = await self._read_lock(lock)
                if again is None or again.lease_id != lease_id or again.etcd_lease == held.etcd_lease:
                    raise
        raise StoreUnavailable(f"etcd: lease on {lock!r} kept changing; try again")

    async def release(self, lock: str, lease_id: str) -> None:
        """Revoke the etcd lease that holds the lock key for this lease (the key goes in the
        same step): ONE call when the lease cache knows it, else a read of the key first.

        The etcd lease holds nothing but this key (see ``etcd_cache``). If etcd no longer has
        it, the key expired, was released, or moved to a new etcd lease by a renew: read the
        key again. If a renew moved it after our read but before our revoke, that renew finds
        its old etcd lease revoked and finishes the release (``_old_lease_revoked``). A revoke
        replayed after its answer was lost finds nothing and answers ``LeaseLost`` (the lock
        is free either way). Raises ``LeaseLost``.
        """
        entry = self._cache.get(lease_id, lock)
        etcd_lease = entry.etcd_lease if entry is not None else None
        self._cache.drop(lease_id)
        for _ in range(3):
            if etcd_lease is None:
                held = await self._read_lock(lock)
                if held is None or held.lease_id != lease_id:
                    raise LeaseLost(f"no live lease on {lock!r} with that id", lock=lock)
                etcd_lease = held.etcd_lease
            if await self._revoke_now(etcd_lease):
                return
            etcd_lease = None  # gone (expired, released, moved): read the key again
        raise StoreUnavailable(f"etcd: lease on {lock!r} kept changing; try again")

    async def force_release(self, lock: str) -> Holder | None:
        """Free the lock whoever holds it; the watch tells every listener. ``None`` if the lock
        was not held. A single lease: revoke its etcd lease (the key goes with it; a keep-alive
        from any replica's lease cache fails from then on), as ``release`` does. A lock of a
        multi-lock lease: delete only its key (guarded on its ``mod_revision``; the set's etcd
        lease is shared with the other locks, and its renew sees the missing key)."""
        for _ in range(3):
            held = await self._read_lock(lock)
            if held is None:
                return None
            remaining = await self._remaining_ms(held.etcd_lease)
            if not held.lease_id.startswith(MULTI_PREFIX):
                self._cache.drop(held.lease_id)
                if await self._revoke_now(held.etcd_lease):
                    return Holder(lock, held.owner, remaining, held.fence)
                continue  # gone meanwhile (expired, released, moved): read again
            key = _b64(self._lock_key(lock))
            doc = await self._txn(
                [{"key": key, "target": "MOD", "mod_revision": str(held.mod_revision)}],
                [{"request_delete_range": {"key": key}}],
                [{"request_range": {"key": key}}])
            if doc.get("succeeded"):
                return Holder(lock, held.owner, remaining, held.fence)
            if self._range_kv(doc) is None:
                return None  # released or expired meanwhile
        raise StoreUnavailable(f"etcd: lock {lock!r} kept changing; try again")

    async def clock_offset(self) -> float | None:
        """etcd's wall clock (the HTTP ``Date`` header of a gateway answer, whole seconds, so
        within about ±0.5 s) minus lockd's; ``None`` if no member sends one. Informational:
        etcd expires leases on its leader's monotonic timer, so wall-clock skew moves no expiry.
        """
        if self._http is None:
            raise StoreUnavailable("etcd store is not open")
        endpoint = self._endpoints[self._current % len(self._endpoints)]
        sent = time.time()
        try:
            response = await self._http.post(endpoint + "/v3/maintenance/status", json={},
                                             timeout=httpx.Timeout(self._timeout))
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

    async def get(self, lock: str) -> LockState:
        """Lock key and fence key in one linearizable read; the holder's time left if held."""
        doc = await self._txn([], [{"request_range": {"key": _b64(self._lock_key(lock))}},
                                   {"request_range": {"key": _b64(self._fence_key(lock))}}], [])
        lock_kv, fence_kv = self._range_kv(doc, 0), self._range_kv(doc, 1)
        fence = _int(fence_kv.get("mod_revision")) if fence_kv else 0
        if lock_kv is None:
            return LockState(lock, False, fence, None, 0)
        held = _Held.parse(lock, lock_kv)
        return await self._state(held, max(fence, held.fence))

    async def _state(self, held: _Held, fence: int) -> LockState:
        remaining = await self._remaining_ms(held.etcd_lease)
        if remaining == 0:
            return LockState(held.name, False, fence, None, 0)
        return LockState(held.name, True, fence, held.owner, remaining)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """Locks ever acquired (they have a fence key) named ``prefix…`` after ``after``."""
        if limit <= 0:
            return []
        start = prefix if after is None or after < prefix else after + "\x00"
        end_f = _b64(_prefix_end(self._fences + prefix.encode()))
        end_l = _b64(_prefix_end(self._locks + prefix.encode()))
        # Held locks are a subset of fenced ones (both keys are put by the same transaction),
        # so the first ``limit`` held names after ``start`` cover every held name on the page.
        doc = await self._txn([], [
            {"request_range": {"key": _b64(self._fences + start.encode()), "range_end": end_f,
                               "limit": str(limit), "keys_only": True}},
            {"request_range": {"key": _b64(self._locks + start.encode()), "range_end": end_l,
                               "limit": str(limit)}},
        ], [])
        responses = doc.get("responses") or [{}, {}]
        fence_kvs = responses[0].get("response_range", {}).get("kvs") or []
        lock_kvs = responses[1].get("response_range", {}).get("kvs") or []
        held = {}
        for kv in lock_kvs:
            name = _unb64(kv["key"])[len(self._locks):].decode()
            held[name] = _Held.parse(name, kv)
        names = [(_unb64(kv["key"])[len(self._fences):].decode(), _int(kv.get("mod_revision")))
                 for kv in fence_kvs]
        states = await asyncio.gather(*(
            self._state(held[name], max(fence, held[name].fence)) if name in held
            else _resolved(LockState(name, False, fence, None, 0))
            for name, fence in names))
        return list(states)

    def subscribe(self, listener: ReleaseListener) -> None:
        """Register ``listener``; the store's single watch stream calls it on every delete."""
        self._listeners.append(listener)

    async def ping(self) -> None:
        """A linearizable read: raises ``StoreUnavailable`` without a quorum."""
        await self._ping()

    # -- watch ---------------------------------------------------------------------------

    def _notify(self, name: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception:  # a listener's bug must not stop the watch
                log.exception("release listener failed for %r", name)

    async def _watch_loop(self, start_revision: int) -> None:
        """Keep one watch stream open; deliver delete events; resume after errors."""
        self._resume_at = start_revision
        index = self._current
        failures = 0
        self._gap = False
        while True:
            endpoint = self._endpoints[index % len(self._endpoints)]
            request = {"create_request": {
                "key": _b64(self._locks), "range_end": _b64(_prefix_end(self._locks)),
                "filters": ["NOPUT"], "start_revision": str(self._resume_at),
                "progress_notify": True}}
            try:
                assert self._http is not None
                async with self._http.stream(
                        "POST", endpoint + "/v3/watch", json=request,
                        timeout=httpx.Timeout(None, connect=1.0)) as response:
                    if response.status_code != 200:
                        raise _WatchBroken(f"HTTP {response.status_code}")
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        self._on_watch_message(json.loads(line))
                        failures = 0
                        if self._gap and self._watch_created.is_set():
                            self._gap = False
                            await self._notify_free_locks()
                raise _WatchBroken("stream ended")
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, _WatchBroken, ValueError, KeyError) as exc:
                failures += 1
                index += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("etcd watch on %s broke (%s); reconnecting", endpoint, exc)
                await asyncio.sleep(min(0.05 * failures, 1.0))

    async def _keys(self, prefix: bytes) -> list[str]:
        """Every key name under ``prefix`` (prefix stripped), in pages of 1000."""
        names: list[str] = []
        start, end = prefix, _b64(_prefix_end(prefix))
        while True:
            doc = await self._post("/v3/kv/range", {"key": _b64(start), "range_end": end,
                                                    "limit": "1000", "keys_only": True})
            kvs = doc.get("kvs") or []
            names += [_unb64(kv["key"])[len(prefix):].decode() for kv in kvs]
            if not doc.get("more") or not kvs:
                return names
            start = _unb64(kvs[-1]["key"]) + b"\x00"

    async def _notify_free_locks(self) -> None:
        """After a gap in the watch history (compaction): call listeners for every lock that
        is free now, so any waiter for a release we could not see retries (rare; one read of
        the names of all locks ever used)."""
        try:
            fenced = await self._keys(self._fences)
            held = set(await self._keys(self._locks))
        except StoreUnavailable as exc:
            log.warning("etcd watch: could not list locks after a gap: %s", exc.detail)
            return
        for lock in fenced:
            if lock not in held:
                self._notify(lock)

    def _on_watch_message(self, msg: dict[str, Any]) -> None:
        """Handle one watch message; keep ``_resume_at``, the revision to resume from."""
        if "error" in msg:
            raise _WatchBroken(str(msg["error"].get("message", msg["error"])))
        result = msg["result"]
        if result.get("created"):
            self._watch_created.set()
        if result.get("canceled"):
            compacted = _int(result.get("compact_revision"))
            if compacted:  # the deletes before it are gone: resume there, then wake all
                log.warning("etcd watch: revision %d compacted; resuming at %d",
                            self._resume_at, compacted)
                self._resume_at = compacted
                self._gap = True
                self._watch_created.clear()
            raise _WatchBroken(result.get("cancel_reason") or "watch canceled")
        events = result.get("events") or []
        for event in events:
            kv = event.get("kv", {})
            self._resume_at = max(self._resume_at, _int(kv.get("mod_revision")) + 1)
            if event.get("type") == "DELETE":
                self._notify(_unb64(kv.get("key"))[len(self._locks):].decode())
        if not events and not result.get("created"):  # progress notification: all sent
            self._resume_at = max(self._resume_at, _int(result["header"].get("revision")) + 1)


class _Moved(Exception):
    """The lock key changed between our read and our guarded write."""


class _WatchBroken(Exception):
    """The watch stream failed or ended; reconnect."""


async def _resolved(value: LockState) -> LockState:
    return value
