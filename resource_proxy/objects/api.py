"""HTTP routes of fenced objects (``/v1/objects``); errors leave through ``api``'s one problem
mapping, as the tables' do.

- ``PUT /v1/objects/{bucket}/{key}``: the body streamed (any ``Content-Type``, kept and sent
  back), ``Fencing-Token``, optional ``If-Match`` (the current ETag, or ``*``), ``If-None-Match:
  *`` and ``Idempotency-Key``: 201 created / 200 replaced, the pointer as JSON and ``ETag``.
- ``GET`` (streamed; ``ETag``, ``Last-Modified``, ``Content-Length``, ``Accept-Ranges``; one
  ``Range`` -> 206 with ``Content-Range``, ``If-Range``; ``If-None-Match`` /
  ``If-Modified-Since`` -> 304), ``HEAD`` (the same headers), ``DELETE`` (fenced; 204).
- ``GET /v1/objects/{bucket}?prefix=&after=&limit=``: the listing.

Bucket and key are taken from the raw path (still percent-encoded) and decoded strictly
(``names``); a proxy started without ``--objects-dir`` (or an S3 endpoint) answers 404.
"""

from __future__ import annotations

import email.utils

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from resource_proxy.activity import record
from resource_proxy.api import keyed, query_pairs, token_of
from resource_proxy.codec import dumps, loads
from resource_proxy.errors import InvalidRequest, NotFound
from resource_proxy.idempotency import Reply
from resource_proxy.objects.service import ObjectService, not_modified
from resource_proxy.objects.store import Pointer, Preconditions

__all__ = ["object_routes"]

_PREFIX = "/v1/objects/"


def _service(request: Request) -> ObjectService:
    service = getattr(request.app.state, "objects", None)
    if service is None:
        raise NotFound("this proxy serves no objects: start it with --objects-dir DIR (or an "
                       "S3 endpoint)")
    return service


def _parts(request: Request) -> tuple[str, str]:
    """(bucket, key) as sent: the raw path after ``/v1/objects/``, split at the first ``/``."""
    raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    rest = raw[raw.find(_PREFIX) + len(_PREFIX):] if _PREFIX in raw else ""
    bucket, _, key = rest.partition("/")
    return bucket, key


def _conditions(request: Request) -> Preconditions:
    if_match = request.headers.get("if-match")
    if_none_match = request.headers.get("if-none-match")
    if if_none_match is not None and if_none_match.strip() != "*":
        raise InvalidRequest("a write takes If-None-Match: * only (the object must not exist)")
    tags = (tuple(t.strip() for t in if_match.split(",") if t.strip())
            if if_match is not None else None)
    return Preconditions(tags, if_none_match is not None)


def _length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
        raise InvalidRequest("Content-Length must be a non-negative integer")
    return int(raw)


def _answer(request: Request, call: str, reply: Reply) -> Response:
    record(request, call, reply.status)
    headers = {"Idempotency-Replayed": "true"} if reply.replayed else {}
    if reply.status == 204:
        return Response(status_code=204, headers=headers)
    etag = loads(reply.body).get("etag")
    if etag:
        headers["ETag"] = etag
    return Response(reply.body, status_code=reply.status, media_type="application/json",
                    headers=headers)


def _headers(pointer: Pointer) -> dict[str, str]:
    return {"ETag": pointer.etag, "Accept-Ranges": "bytes",
            "Last-Modified": email.utils.formatdate(pointer.modified_ms / 1000, usegmt=True),
            "Content-Type": pointer.content_type, "X-Object-Version": str(pointer.version),
            "X-Object-Fence": str(pointer.fence)}


async def put_object(request: Request) -> Response:
    bucket, key = _parts(request)
    reply = await _service(request).put(
        bucket, key, request.stream(), _length(request), request.headers.get("content-type"),
        token_of(request), _conditions(request), keyed(request, b""))
    return _answer(request, "object_put", reply)


async def delete_object(request: Request) -> Response:
    bucket, key = _parts(request)
    reply = await _service(request).delete(bucket, key, token_of(request), _conditions(request),
                                           keyed(request, b""))
    return _answer(request, "object_delete", reply)


async def get_object(request: Request) -> Response:
    service = _service(request)
    bucket, key = _parts(request)
    headers = request.headers
    if request.method == "HEAD":
        pointer = await service.head(bucket, key, token_of(request))
        record(request, "object_head", 200)
        return Response(status_code=200, headers={**_headers(pointer),
                                                  "Content-Length": str(pointer.size)})
    pointer = await service.head(bucket, key, token_of(request))
    if not_modified(pointer, headers.get("if-none-match"), headers.get("if-modified-since")):
        record(request, "object_get", 304)
        return Response(status_code=304, headers={"ETag": pointer.etag,
                                                  "Last-Modified": _headers(pointer)["Last-Modified"]})
    opened = await service.open(bucket, key, None, headers.get("range"), headers.get("if-range"))
    out = _headers(opened.pointer)
    out["Content-Length"] = str(opened.end - opened.start)
    status = 200
    if opened.partial:
        status = 206
        out["Content-Range"] = f"bytes {opened.start}-{opened.end - 1}/{opened.pointer.size}"
    record(request, "object_get", status)
    return StreamingResponse(opened.chunks, status_code=status, headers=out,
                             media_type=opened.pointer.content_type)


async def list_objects(request: Request) -> Response:
    query = dict(query_pairs(request))
    bucket = request.path_params["bucket"]
    result = await _service(request).list(bucket, query)
    record(request, "object_list", 200)
    return Response(dumps(result), media_type="application/json")


object_routes = [
    Route("/v1/objects/{bucket}", list_objects, methods=["GET"]),
    Route("/v1/objects/{bucket}/{key:path}", put_object, methods=["PUT"]),
    Route("/v1/objects/{bucket}/{key:path}", get_object, methods=["GET", "HEAD"]),
    Route("/v1/objects/{bucket}/{key:path}", delete_object, methods=["DELETE"]),
]
