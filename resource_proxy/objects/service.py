"""What each object call does, free of HTTP: names -> token -> lock -> blob -> ONE transaction.

Order of checks for a write (the first failure answers, and nothing is stored before the token
is judged): bucket and key valid (422), token present (428) and genuine (401), the token holds
the object's ONE lock (``names.Buckets``; 403 ``lock_not_allowed`` naming it) exclusively
(``fencing.held``, the tables' one write rule: 403 ``shared_token`` for a shared hold), then the
body is streamed to a new blob (413 past ``max_object_bytes``, nothing kept) -- or, if it is
at most ``inline_max`` bytes, kept in memory to be stored in the pointer row itself -- then ONE
transaction of the proxy's database checks and raises the lock's fence and moves the object's
pointer (``store.Pointers``). The transaction's statements run while the blob is being made
durable (fsync, rename, fsync of its directory: ``blobs.Staged``); its COMMIT waits for that. If that transaction did not commit (409 ``stale_token``,
412 ``precondition_failed``, 503, or an Idempotency-Key replay) the new blob is deleted at once;
only when the outcome is unknown (502: the COMMIT may have happened) is it left to the sweeper,
which deletes it unless a pointer names it. After a commit the replaced version's blob is
deleted once the answer is on its way (``_retire``: a task of its own, so the PUT's latency
does not include the unlink; a crash before that leaves an orphan for the sweeper too).

A small body kept inline (``inline_max``, default 16 KiB; 0: never) costs one flush, the
transaction's own, where a blob costs three on one disk (the file's fsync, its directory's, the
WAL's): the database still decides, in the same transaction, and the answers (ETag, digest,
Range, conditional GET, listing) are those of a blob-backed object. An inline object has no
blob, so there is nothing to make durable first, to abandon or for the sweeper to find.

A read needs no token; with one it is fenced as a row read is (the fence claimed for ``READ``
before the pointer is read: 409 if stale). A read whose blob was replaced (and deleted) between
reading the pointer and opening the blob reads the pointer again.

``sweep`` removes orphans: unfinished uploads and complete blobs last written more than
``grace_s`` ago that no pointer names. The app runs it at start and every ``sweep_interval``.
A blob is written, renamed and committed within one request, so a blob older than the grace
(default 10 minutes, far above any database timeout) that no pointer names never will be.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lockd.common.fencerule import READ, WRITE, Fence
from resource_proxy.access import allows_bucket, caller, check_bucket
from resource_proxy.claims import claims_of
from resource_proxy.codec import dumps
from resource_proxy.errors import (
    InvalidRequest,
    LockNotAllowed,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    RangeNotSatisfiable,
)
from resource_proxy.fencing import held
from resource_proxy.idempotency import DEFAULT_TTL_MS, Keyed, Reply
from resource_proxy.objects.blobs import BlobMissing, BlobStore, Staged, Stored, new_name
from resource_proxy.objects.names import Buckets, check_key, parse_bucket, parse_key
from resource_proxy.objects.store import Pointer, Pointers, Preconditions

__all__ = ["ObjectService", "Opened", "DEFAULT_MAX_OBJECT_BYTES", "DEFAULT_INLINE_MAX"]

log = logging.getLogger("resource_proxy.objects")

DEFAULT_MAX_OBJECT_BYTES = 1 << 30
DEFAULT_INLINE_MAX = 16 * 1024
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
_READ_ATTEMPTS = 3
_SWEEP_BATCH = 1000


@dataclass
class Opened:
    """A GET's answer: the pointer, the byte range sent (``start``..``end`` exclusive;
    ``partial`` for a 206) and the body's chunks."""

    pointer: Pointer
    start: int
    end: int
    partial: bool
    chunks: AsyncIterator[bytes]


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range of a ``Range`` header (None: the whole object, also for a multi-range
    or unit other than bytes, which RFC 9110 allows a server to ignore); 416 if unsatisfiable."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first or last) or not all(p.isascii() and p.isdigit()
                                                  for p in (first, last) if p):
        return None
    if not first:  # the last N bytes
        count = int(last)
        if count == 0 or size == 0:
            raise RangeNotSatisfiable(f"the object is {size} bytes long", size=size)
        return max(0, size - count), size
    start = int(first)
    if start >= size:
        raise RangeNotSatisfiable(f"the object is {size} bytes long", size=size)
    end = min(size, int(last) + 1) if last else size
    if end <= start:
        return None
    return start, end


def _etags(header: str | None) -> tuple[str, ...] | None:
    if header is None:
        return None
    return tuple(t.strip() for t in header.split(",") if t.strip())


def not_modified(pointer: Pointer, if_none_match: str | None, if_modified_since: str | None) -> bool:
    """Whether a conditional GET is answered 304 (If-None-Match first, RFC 9110 13.2.2)."""
    tags = _etags(if_none_match)
    if tags is not None:
        weak = [t.removeprefix("W/") for t in tags]
        return "*" in weak or pointer.etag in weak
    if if_modified_since:
        try:
            since = email.utils.parsedate_to_datetime(if_modified_since).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return False
        return pointer.modified_ms // 1000 <= since
    return False


class ObjectService:
    """The object calls. ``keys``: the proxy's ``KeySource``; ``pointers`` on the row store;
    ``blobs`` the backend; ``buckets`` their locks; ``max_object_bytes`` the largest body (413
    above); ``inline_max`` the largest body kept in its pointer row (bytes; 0: none);
    ``grace_s`` the sweeper's grace."""

    def __init__(self, keys: Any, pointers: Pointers, blobs: BlobStore, buckets: Buckets, *,
                 max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
                 idempotency_ttl_ms: int = DEFAULT_TTL_MS, grace_s: float = 600.0,
                 inline_max: int = DEFAULT_INLINE_MAX):
        self.keys = keys
        self.pointers = pointers
        self.blobs = blobs
        self.buckets = buckets
        self.max_object_bytes = max_object_bytes
        self.inline_max = min(inline_max, max_object_bytes)
        self.idempotency_ttl_ms = idempotency_ttl_ms
        self.grace_s = grace_s
        self._retiring: set[asyncio.Task] = set()

    async def _fence(self, token: str | None, bucket: str, lock: str, purpose: Any) -> Fence:
        check_bucket(bucket, "write" if purpose is WRITE else "read fenced")
        claims = await claims_of(self.keys, token)
        fence = held(claims, lock, purpose)  # the one write rule: a shared hold never writes
        if fence is None:
            holds = ({"token_locks": sorted(claims.locks)} if claims.multi or claims.lock is None
                     else {"token_lock": claims.lock})
            raise LockNotAllowed(f"this object is governed by lock {lock!r}, which the token "
                                 "does not hold", lock=lock, **holds)
        return fence

    def governs(self, lock: str, claims: Any) -> bool:
        """The objects' ``claims.Governs``: whether ``lock`` governs objects of some bucket;
        with an access file, 403 ``forbidden_bucket`` unless the caller may write one of those
        buckets (a claim does to the fence what a write under ``lock`` does)."""
        buckets = self.buckets.governing(lock)
        if not buckets:
            return False
        identity = caller()
        if not any(allows_bucket(identity, bucket) for bucket in buckets):
            check_bucket(buckets[0], "claim the lock of")
        return True

    def _named(self, raw_bucket: str, raw_key: str) -> tuple[str, str, str]:
        bucket, key = parse_bucket(raw_bucket), parse_key(raw_key)
        return bucket, key, self.buckets.lock_for(bucket, key)

    # -- writes -----------------------------------------------------------------------------

    async def put(self, raw_bucket: str, raw_key: str, chunks: AsyncIterator[bytes],
                  length: int | None, content_type: str | None, token: str | None,
                  conditions: Preconditions, keyed: Keyed | None) -> Reply:
        """Store the body and move the object's pointer to it: ``Reply`` 201 (created) or 200
        (replaced) with the pointer's JSON; with ``keyed`` (its ``body`` empty: the digest
        covers the body's sha256 and content type instead) recorded or replayed."""
        bucket, key, lock = self._named(raw_bucket, raw_key)
        fence = await self._fence(token, bucket, lock, WRITE)
        if length is not None and length > self.max_object_bytes:
            raise PayloadTooLarge(f"the object exceeds the largest this proxy stores "
                                  f"({self.max_object_bytes} bytes)", limit=self.max_object_bytes)
        ctype = (content_type or "application/octet-stream").strip()
        if len(ctype) > 255 or not ctype.isprintable():
            raise InvalidRequest("Content-Type must be at most 255 printable characters")
        body, rest = await self._small(chunks, length)
        staged = (await self.blobs.stage(rest, self.max_object_bytes) if body is None
                  else _inline(body))
        stored = staged.stored
        if length is not None and stored.size != length:  # the server bounds it; belt and braces
            await staged.abandon()
            raise InvalidRequest("the body is shorter than its Content-Length")
        once = None
        if keyed is not None:
            keyed = Keyed(keyed.key, keyed.method, keyed.path,
                          f"{stored.sha256}\n{ctype}".encode())
            once = keyed.once([fence], self.idempotency_ttl_ms, _render_put)
        replaced: list[str] = []
        result = await self._commit(staged, self.pointers.put(
            fence, bucket, key, stored, ctype, conditions, once, replaced, staged.durable, body))
        if isinstance(result, Reply) and result.replayed:
            await staged.abandon()  # the recorded write's blob is the one kept
        self._retire(replaced)
        return result if isinstance(result, Reply) else _render_put(result)

    async def _small(self, chunks: AsyncIterator[bytes], length: int | None
                     ) -> tuple[bytes | None, AsyncIterator[bytes]]:
        """(the body, if it ends within ``inline_max`` bytes, else None; the stream to store
        as a blob: what was read of it first, then the rest). A ``Content-Length`` above the
        threshold goes straight to the blob store."""
        if self.inline_max <= 0 or (length is not None and length > self.inline_max):
            return None, chunks
        stream = chunks.__aiter__()
        pieces: list[bytes] = []
        size = 0
        async for chunk in stream:
            pieces.append(chunk)
            size += len(chunk)
            if size > self.inline_max:
                return None, _prepend(pieces, stream)
        return b"".join(pieces), stream

    async def _commit(self, staged: Staged, transaction: Any) -> Any:
        """Await the transaction; delete the new blob unless it committed or might have."""
        try:
            return await transaction
        except OutcomeUnknown:
            raise  # it may have committed: the sweeper decides, by the pointers
        except BaseException:
            await staged.abandon()
            raise

    async def delete(self, raw_bucket: str, raw_key: str, token: str | None,
                     conditions: Preconditions, keyed: Keyed | None) -> Reply:
        """Remove the object (204; 404 if absent), fenced like a write."""
        bucket, key, lock = self._named(raw_bucket, raw_key)
        fence = await self._fence(token, bucket, lock, WRITE)
        once = (keyed.once([fence], self.idempotency_ttl_ms, lambda _: Reply(204, ""))
                if keyed is not None else None)
        replaced: list[str] = []
        result = await self.pointers.delete(fence, bucket, key, conditions, once, replaced)
        self._retire(replaced)
        return result if isinstance(result, Reply) else Reply(204, "")

    def _retire(self, names: list[str]) -> None:
        """Delete the blobs of committed-away versions AFTER the answer: in a task of its own
        (``retiring`` counts them; ``settle()`` waits for them). No pointer names them any more,
        so a process that dies first leaves orphans that the sweeper removes after its grace;
        a read that opened one meanwhile reads its pointer again (``open``)."""
        if not names:
            return
        task = asyncio.get_running_loop().create_task(self._delete_blobs(names))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _delete_blobs(self, names: list[str]) -> None:
        for name in names:
            try:
                await self.blobs.delete(name)
            except Exception as exc:  # the sweeper finds it again after its grace
                log.warning("could not delete the replaced blob %s: %s", name, exc)

    @property
    def retiring(self) -> int:
        """Deletes of replaced blobs begun and not yet done."""
        return len(self._retiring)

    async def settle(self) -> None:
        """Wait for every delete of a replaced blob begun so far (at shutdown)."""
        while self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    # -- reads ------------------------------------------------------------------------------

    async def head(self, raw_bucket: str, raw_key: str, token: str | None) -> Pointer:
        bucket, key, lock = self._named(raw_bucket, raw_key)
        fence = await self._fence(token, bucket, lock, READ) if token else None
        pointer = await self.pointers.get(bucket, key, fence)
        if pointer is None:
            raise NotFound(f"no object {key!r} in bucket {bucket!r}", bucket=bucket)
        return pointer

    async def open(self, raw_bucket: str, raw_key: str, token: str | None,
                   range_header: str | None, if_range: str | None) -> Opened:
        """The object's body (a ``Range`` of it: 206), opened before the answer starts."""
        pointer = await self.head(raw_bucket, raw_key, token)
        for _ in range(_READ_ATTEMPTS):
            span = parse_range(range_header, pointer.size)
            if if_range is not None and if_range.strip() != pointer.etag:
                span = None
            start, end = span if span is not None else (0, pointer.size)
            if pointer.body is not None:  # inline: read with its pointer, nothing can go
                return Opened(pointer, start, end, span is not None,
                              _prepend([pointer.body[start:end]], _nothing()))
            chunks = self.blobs.read(pointer.blob, start, end).__aiter__()
            try:
                first = await anext(chunks)
            except StopAsyncIteration:
                first = b""
            except BlobMissing:  # replaced meanwhile: read the pointer again
                pointer = await self.head(raw_bucket, raw_key, None)
                continue
            return Opened(pointer, start, end, span is not None, _prepend([first], chunks))
        raise NotFound("the object changed while it was being read; try again")

    async def list(self, raw_bucket: str, query: dict[str, str]) -> dict[str, Any]:
        """``{items: [pointer...], next_after}``: keys of ``bucket`` after ``after`` (byte
        order) that start with ``prefix``, at most ``limit`` (1-1000, default 100)."""
        bucket = parse_bucket(raw_bucket)
        unknown = set(query) - {"prefix", "after", "limit"}
        if unknown:
            raise InvalidRequest(f"unknown query parameter(s) {sorted(unknown)} (takes prefix, "
                                 "after, limit)")
        prefix, after = query.get("prefix", ""), query.get("after", "")
        for name, value in (("prefix", prefix), ("after", after)):
            if len(value.encode()) > 1024 or "\x00" in value:
                raise InvalidRequest(f"{name} must be at most 1024 bytes, without NUL")
        raw = query.get("limit", str(DEFAULT_LIMIT))
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and 1 <= int(raw) <= MAX_LIMIT):
            raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}")
        limit = int(raw)
        items = await self.pointers.list(bucket, prefix, after, limit)
        return {"items": [p.json() for p in items],
                "next_after": items[-1].key if len(items) == limit else None}

    # -- orphans ----------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Delete the orphan blobs (see the module doc); how many were deleted."""
        names = await self.blobs.older_than(self.grace_s)
        deleted = 0
        for index in range(0, len(names), _SWEEP_BATCH):
            batch = names[index:index + _SWEEP_BATCH]
            kept = await self.pointers.referenced(batch)
            for name in batch:
                if name not in kept:
                    await self.blobs.delete(name)
                    deleted += 1
        if deleted:
            log.info("sweeper: deleted %d orphan blob(s)", deleted)
        return deleted


def _render_put(result: tuple[bool, Pointer]) -> Reply:
    created, pointer = result
    return Reply(201 if created else 200, dumps(pointer.json()))


def _inline(body: bytes) -> Staged:
    """A body kept in its pointer row, as a ``Staged`` with no blob behind it: nothing to wait
    for, nothing to delete (its name is the ETag's only)."""
    return Staged(Stored(new_name(), len(body), hashlib.sha256(body).hexdigest()), None,
                  _keep)


async def _keep(name: str) -> None:
    return None


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


async def _prepend(first: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for piece in first:
        if piece:
            yield piece
    async for chunk in rest:
        yield chunk


__all__ += ["check_key", "parse_range", "not_modified"]
