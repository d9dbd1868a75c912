"""Fenced objects through the proxy (``/v1/objects``): the object calls of ``FencedSession``
and ``AsyncFencedSession``.

::

    with client.lock("reports", ttl=30) as lease, FencedSession(proxy, lease) as db:
        db.put_object("reports", "2026/q4.csv", Path("q4.csv"))   # streamed from the file
        with db.output("reports", "2026/q4.json") as out:          # the job's output file
            out.write(b"...")                                       # sent when the block ends
        data = db.get_object("reports", "2026/q4.csv")

``put_object`` takes bytes, a path (``str``/``PathLike``: streamed, with its length), a binary
file object (streamed from where it stands) or an iterable of bytes (async: also an async
iterable); it returns the object's pointer (``version``, ``etag``, ``size``, ``sha256``,
``fence``, ...). ``if_match=etag`` / ``if_none_match=True`` make it conditional
(``PreconditionFailed``, 412). Each write carries an ``Idempotency-Key`` and is resent with it
after ``outcome_unknown`` or no answer, when the body can be sent again (bytes, a path, a
seekable file; an iterator is sent once); ``put_object(..., idempotent=False)`` sends none
and never resends. A superseded lease gets ``StaleTokenError`` (and the
lease is marked lost), as for rows. Object calls do not claim first: a write is checked
against the highest fence in its own transaction, and a read with the token is itself the
claim (a fenced read).

``get_object`` returns the bytes, or streams them into ``into`` (a path or a binary file) and
returns the count; ``range=(start, end)`` (end exclusive) reads part. ``head_object`` gives
the pointer's headers, ``list_objects`` the keys (every page, or one page of ``limit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from lockd.client.errors import (
    LockClientError,
    OutcomeUnknown,
    ProtocolError,
    TransportError,
    body_or_raise,
    error_from_response,
    translate_transport_errors,
)

__all__ = ["ObjectCalls", "AsyncObjectCalls", "object_path", "CHUNK"]

CHUNK = 1 << 20
_RETRYABLE = (OutcomeUnknown, TransportError)


def object_path(bucket: str, key: str | None = None) -> str:
    """``/v1/objects/{bucket}[/{key}]``, each part percent-encoded (``/`` kept in the key)."""
    path = "/v1/objects/" + quote(bucket, safe="")
    return path if key is None else path + "/" + quote(key, safe="/")


def _headers_of(response: httpx.Response) -> dict[str, Any]:
    h = response.headers
    return {"etag": h.get("etag"), "size": int(h.get("content-length", "0")),
            "content_type": h.get("content-type"), "last_modified": h.get("last-modified"),
            "version": int(h.get("x-object-version", "0")),
            "fence": int(h.get("x-object-fence", "0"))}


def _file_chunks(file: IO[bytes]) -> Iterator[bytes]:
    while chunk := file.read(CHUNK):
        yield chunk


class _Body:
    """A body that may be sent again (``again()``), and its length if known."""

    def __init__(self, data: Any):
        self.data = data
        self.length: int | None = None
        self.replayable = True
        self._start: int | None = None
        if isinstance(data, bytes | bytearray | memoryview):
            self.length = len(data)
        elif isinstance(data, str | os.PathLike):
            self.length = os.stat(data).st_size
        elif hasattr(data, "read"):
            try:
                self._start = data.tell()
                self.length = os.fstat(data.fileno()).st_size - self._start
            except (OSError, AttributeError, ValueError):
                self.replayable = False
        else:
            self.replayable = False

    @contextlib.contextmanager
    def content(self) -> Iterator[Any]:
        data = self.data
        if isinstance(data, bytes | bytearray | memoryview):
            yield bytes(data)
        elif isinstance(data, str | os.PathLike):
            with open(data, "rb") as file:
                yield _file_chunks(file)
        elif hasattr(data, "read"):
            if self._start is not None:
                data.seek(self._start)
            yield _file_chunks(data)
        else:
            yield data

    def headers(self, content_type: str | None) -> dict[str, str]:
        out = {"Content-Type": content_type or "application/octet-stream"}
        if self.length is not None:
            out["Content-Length"] = str(self.length)
        return out


def _put_headers(base: dict[str, str], body: Any, content_type: str | None,
                 if_match: str | None, if_none_match: bool, idempotent: bool) -> dict[str, str]:
    """A PUT's headers: ``base`` (token, auth), the body's, the preconditions and, when
    ``idempotent``, a new ``Idempotency-Key``."""
    headers = {**base, **body.headers(content_type), **_conditions(if_match, if_none_match)}
    if idempotent:
        headers["Idempotency-Key"] = uuid.uuid4().hex
    return headers


def _conditions(if_match: str | None, if_none_match: bool) -> dict[str, str]:
    out = {}
    if if_match is not None:
        out["If-Match"] = if_match
    if if_none_match:
        out["If-None-Match"] = "*"
    return out


def _range(span: tuple[int, int] | None) -> dict[str, str]:
    return {} if span is None else {"Range": f"bytes={span[0]}-{span[1] - 1}"}


class PendingObject:
    """The output file of ``FencedSession.output``: write to it; sent when the block ends
    (``result``: the object's pointer then)."""

    def __init__(self, file: IO[bytes]):
        self.file = file
        self.result: dict[str, Any] | None = None

    def write(self, data: bytes) -> int:
        return self.file.write(data)


class ObjectCalls:
    """The blocking object calls (mixed into ``FencedSession``)."""

    url: str
    timeout: float
    retries: int
    lease: Any
    _http: httpx.Client
    _auth: dict[str, str]

    # and ``_failed(exc)``: the session marks a stale lease lost (``fenced._SessionBase``)

    def _object_headers(self, fenced: bool) -> dict[str, str]:
        if fenced and self.lease is not None:
            return {"Fencing-Token": self.lease.token, **self._auth}
        return dict(self._auth)

    def _checked(self, method: str, path: str, response: httpx.Response) -> Any:
        try:
            return body_or_raise(method, path, response)
        except LockClientError as exc:
            self._failed(exc)  # type: ignore[attr-defined]
            raise

    def put_object(self, bucket: str, key: str, data: Any, *, content_type: str | None = None,
                   if_match: str | None = None, if_none_match: bool = False,
                   idempotent: bool = True) -> dict[str, Any]:
        """Write the object under the lease (201 created / 200 replaced); its pointer.
        ``idempotent=False`` sends no ``Idempotency-Key`` and never resends: on PostgreSQL a
        small body's PUT is then one round trip to the database instead of several, but an
        answer lost in flight leaves its outcome to be read back (``head_object``)."""
        path = object_path(bucket, key)
        body = _Body(data)
        headers = _put_headers(self._object_headers(True), body, content_type, if_match,
                               if_none_match, idempotent)
        for attempt in range(self.retries + 1):
            try:
                with body.content() as content, translate_transport_errors(f"PUT {path}"):
                    response = self._http.put(self.url + path, content=content, headers=headers,
                                              timeout=self.timeout)
                return self._checked("PUT", path, response)
            except _RETRYABLE:
                if attempt == self.retries or not body.replayable or not idempotent:
                    raise
                time.sleep(min(1.0, 0.05 * 2 ** attempt))
        raise AssertionError("unreachable")

    def put_file(self, bucket: str, key: str, path: str | os.PathLike, *,
                 content_type: str | None = None) -> dict[str, Any]:
        """``put_object`` streamed from the file at ``path``."""
        return self.put_object(bucket, key, Path(path), content_type=content_type)

    @contextlib.contextmanager
    def output(self, bucket: str, key: str, *,
               content_type: str | None = None) -> Iterator[PendingObject]:
        """The job's output file: written locally during the block, sent (fenced) when it ends
        without an exception; nothing is sent if it raises. ``StaleTokenError`` if a newer
        holder has written since: the stale output never becomes visible."""
        with tempfile.TemporaryFile() as file:
            pending = PendingObject(file)
            yield pending
            file.flush()
            file.seek(0)
            pending.result = self.put_object(bucket, key, file, content_type=content_type)

    def get_object(self, bucket: str, key: str, *, into: Any = None,
                   range: tuple[int, int] | None = None, fenced: bool = True) -> Any:
        """The object's bytes (or, with ``into`` a path or binary file, the count streamed into
        it). With the session's lease (``fenced``), a fenced read."""
        path = object_path(bucket, key)
        headers = {**self._object_headers(fenced), **_range(range)}
        with translate_transport_errors(f"GET {path}"), \
                self._http.stream("GET", self.url + path, headers=headers,
                                  timeout=self.timeout) as response:
            if response.status_code >= 300:
                response.read()
                self._checked("GET", path, response)
            if into is None:
                return response.read()
            with contextlib.ExitStack() as stack:
                file = (stack.enter_context(open(into, "wb"))
                        if isinstance(into, str | os.PathLike) else into)
                count = 0
                for chunk in response.iter_bytes(CHUNK):
                    file.write(chunk)
                    count += len(chunk)
                return count

    def head_object(self, bucket: str, key: str) -> dict[str, Any]:
        """The object's ``etag``, ``size``, ``content_type``, ``version``, ``fence``."""
        path = object_path(bucket, key)
        with translate_transport_errors(f"HEAD {path}"):
            response = self._http.head(self.url + path, headers=self._auth, timeout=self.timeout)
        if response.status_code >= 300:
            raise error_from_response(response)
        return _headers_of(response)

    def delete_object(self, bucket: str, key: str, *, if_match: str | None = None) -> None:
        """Delete the object under the lease (``NotFoundError`` if absent)."""
        path = object_path(bucket, key)
        headers = {**self._object_headers(True), **_conditions(if_match, False)}
        with translate_transport_errors(f"DELETE {path}"):
            response = self._http.delete(self.url + path, headers=headers, timeout=self.timeout)
        self._checked("DELETE", path, response)

    def list_objects(self, bucket: str, prefix: str = "", *, after: str = "",
                     limit: int | None = None) -> list[dict[str, Any]]:
        """The objects of ``bucket`` whose key starts with ``prefix``, after ``after``, in key
        order: one page of at most ``limit``, or every page when ``limit`` is None."""
        items: list[dict[str, Any]] = []
        path = object_path(bucket)
        while True:
            params = {"prefix": prefix, "after": after, "limit": limit or 1000}
            with translate_transport_errors(f"GET {path}"):
                response = self._http.get(self.url + path, params=params, headers=self._auth,
                                          timeout=self.timeout)
            page = _page(body_or_raise("GET", path, response))
            items.extend(page["items"])
            if limit is not None or not page["next_after"]:
                return items
            after = page["next_after"]


def _page(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise ProtocolError("object listing is not {items: [...], next_after}")
    return body


async def _aiter(body: _Body) -> AsyncIterator[bytes]:
    """The body as an async stream (a path or file read in a worker thread)."""
    data = body.data
    if isinstance(data, bytes | bytearray | memoryview):
        yield bytes(data)
        return
    if hasattr(data, "__aiter__"):
        async for chunk in data:
            yield chunk
        return
    with contextlib.ExitStack() as stack:
        if isinstance(data, str | os.PathLike):
            file = stack.enter_context(open(data, "rb"))
        elif hasattr(data, "read"):
            file = data
            if body._start is not None:
                file.seek(body._start)
        else:
            for chunk in data:
                yield chunk
            return
        while chunk := await asyncio.to_thread(file.read, CHUNK):
            yield chunk


class AsyncObjectCalls:
    """The asyncio object calls (mixed into ``AsyncFencedSession``); see ``ObjectCalls``."""

    url: str
    timeout: float
    retries: int
    lease: Any
    _http: httpx.AsyncClient
    _auth: dict[str, str]

    _object_headers = ObjectCalls._object_headers
    _checked = ObjectCalls._checked

    async def put_object(self, bucket: str, key: str, data: Any, *,
                         content_type: str | None = None, if_match: str | None = None,
                         if_none_match: bool = False, idempotent: bool = True) -> dict[str, Any]:
        path = object_path(bucket, key)
        body = _Body(data)
        headers = _put_headers(self._object_headers(True), body, content_type, if_match,
                               if_none_match, idempotent)
        for attempt in range(self.retries + 1):
            try:
                with translate_transport_errors(f"PUT {path}"):
                    response = await self._http.put(self.url + path, content=_aiter(body),
                                                    headers=headers, timeout=self.timeout)
                return self._checked("PUT", path, response)
            except _RETRYABLE:
                if attempt == self.retries or not body.replayable or not idempotent:
                    raise
                await asyncio.sleep(min(1.0, 0.05 * 2 ** attempt))
        raise AssertionError("unreachable")

    async def get_object(self, bucket: str, key: str, *, into: Any = None,
                         range: tuple[int, int] | None = None, fenced: bool = True) -> Any:
        path = object_path(bucket, key)
        headers = {**self._object_headers(fenced), **_range(range)}
        with translate_transport_errors(f"GET {path}"):
            async with self._http.stream("GET", self.url + path, headers=headers,
                                         timeout=self.timeout) as response:
                if response.status_code >= 300:
                    await response.aread()
                    self._checked("GET", path, response)
                if into is None:
                    return await response.aread()
                with contextlib.ExitStack() as stack:
                    file = (stack.enter_context(open(into, "wb"))
                            if isinstance(into, str | os.PathLike) else into)
                    count = 0
                    async for chunk in response.aiter_bytes(CHUNK):
                        await asyncio.to_thread(file.write, chunk)
                        count += len(chunk)
                    return count

    async def delete_object(self, bucket: str, key: str, *, if_match: str | None = None) -> None:
        path = object_path(bucket, key)
        headers = {**self._object_headers(True), **_conditions(if_match, False)}
        with translate_transport_errors(f"DELETE {path}"):
            response = await self._http.delete(self.url + path, headers=headers,
                                               timeout=self.timeout)
        self._checked("DELETE", path, response)

    async def list_objects(self, bucket: str, prefix: str = "", *, after: str = "",
                           limit: int | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        path = object_path(bucket)
        while True:
            params = {"prefix": prefix, "after": after, "limit": limit or 1000}
            with translate_transport_errors(f"GET {path}"):
                response = await self._http.get(self.url + path, params=params,
                                                headers=self._auth, timeout=self.timeout)
            page = _page(body_or_raise("GET", path, response))
            items.extend(page["items"])
            if limit is not None or not page["next_after"]:
                return items
            after = page["next_after"]
