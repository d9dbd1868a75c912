"""HTTP routes of the rows (``/v1/tables``, ``/v1/batch``): thin over ``rows.service``.

Row keys are taken from the *raw* request path, so a percent-encoded ``,`` (``%2C``) or ``/``
(``%2F``) inside a key value is not mistaken for a separator. Writes and batches take an
optional ``Idempotency-Key``; errors leave through ``api``'s one problem mapping.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.routing import Route

from resource_proxy.api import keyed, parse, query_pairs, raw_body, reply, route, token_of
from resource_proxy.rows.service import RowService
from resource_proxy.rows.writes import OpKind

__all__ = ["row_routes", "put_row", "patch_row", "batch"]

row_routes: list[Route] = []


def _service(request: Request) -> RowService:
    return request.app.state.rows


async def _write(request: Request, kind: OpKind, table: str, key: str | None) -> Any:
    """A row write: the row written (None for a delete), or a ``Reply`` when the request has
    an ``Idempotency-Key`` (whose digest covers the raw body bytes)."""
    raw = b"" if kind == "delete" else await raw_body(request)
    row = None if kind == "delete" else parse(raw)
    return await _service(request).write(kind, table, key, row, token_of(request),
                                         keyed(request, raw))


def _path(request: Request) -> tuple[str, str]:
    """(table, key) of a row route; the key as sent (still percent-encoded), after ``/rows/``."""
    params = request.path_params
    raw = request.scope.get("raw_path")
    if raw:
        parts = raw.decode("latin-1").split("/", 5)
        if len(parts) == 6:
            return params["table"], parts[5]
    return params["table"], params["key"].replace("%", "%25")


def _raw_query(request: Request, name: str) -> str | None:
    """The query parameter ``name`` as sent (still percent-encoded; ``+`` is a plus sign)."""
    for pair in request.scope.get("query_string", b"").decode("latin-1").split("&"):
        field, sep, value = pair.partition("=")
        if field == name and sep:
            return value
    return None


# -- the binding (which lock governs a row) ----------------------------------------------------

@route(row_routes, "/v1/tables", "GET")
async def list_tables(request: Request) -> Response:
    return reply(request, "tables", _service(request).tables())


@route(row_routes, "/v1/tables/{table}/lock", "GET")
async def table_lock(request: Request) -> Response:
    """``?key=`` in the form of a row URL's key (values joined by ``,``, each percent-encoded)."""
    result = _service(request).lock_of(request.path_params["table"], _raw_query(request, "key"))
    return reply(request, "lock", result)


# -- rows --------------------------------------------------------------------------------------

@route(row_routes, "/v1/tables/{table}/rows", "POST")
async def insert_row(request: Request) -> Response:
    row = await _write(request, "insert", request.path_params["table"], None)
    return reply(request, "insert", row, 201)


@route(row_routes, "/v1/tables/{table}/rows/{key:path}", "PUT")
async def put_row(request: Request) -> Response:
    row = await _write(request, "upsert", *_path(request))
    return reply(request, "upsert", row)


@route(row_routes, "/v1/tables/{table}/rows/{key:path}", "PATCH")
async def patch_row(request: Request) -> Response:
    row = await _write(request, "update", *_path(request))
    return reply(request, "update", row)


@route(row_routes, "/v1/tables/{table}/rows/{key:path}", "DELETE")
async def delete_row(request: Request) -> Response:
    result = await _write(request, "delete", *_path(request))
    return reply(request, "delete", result, 204)


@route(row_routes, "/v1/tables/{table}/rows/{key:path}", "GET")
async def get_row(request: Request) -> Response:
    table, key = _path(request)
    row = await _service(request).read_row(table, key, token_of(request))
    return reply(request, "read", row)


@route(row_routes, "/v1/tables/{table}/rows", "GET")
async def list_rows(request: Request) -> Response:
    table = request.path_params["table"]
    result = await _service(request).list_rows(table, query_pairs(request), token_of(request))
    return reply(request, "list", result)


@route(row_routes, "/v1/batch", "POST")
async def batch(request: Request) -> Response:
    raw = await raw_body(request)
    result = await _service(request).batch(parse(raw), token_of(request), keyed(request, raw))
    return reply(request, "batch", result)
