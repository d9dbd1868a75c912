"""The proxy's OpenAPI 3.1 document, built from the served tables (``GET /openapi.json``).

The proxy's routes are plain Starlette routes (no FastAPI parameter solving on the hot path),
so FastAPI cannot describe them; this module does, by hand. Each allow-listed table gets its
own paths (``/v1/tables/accounts/rows…``) with a row schema from its reflected columns, so a
client (or a fuzzer such as schemathesis) knows what a valid row looks like. Every failure is
documented with its status and the ``Problem`` schema; ``Fencing-Token`` is an optional header
(its absence is the documented 428 of a write).
"""

from __future__ import annotations

import re
from typing import Any

from lockd.common.apidocs import DOCS_PATHS
from lockd.common.problems import PROBLEM_JSON
from resource_proxy.rows.tables import Catalog, Column, Kind, Table

__all__ = ["build_openapi", "OPEN_PATHS"]

OPEN_PATHS = frozenset({"/", "/healthz", "/metrics", "/openapi.json", *DOCS_PATHS})
_PROBLEM = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                   "status": {"type": "integer"}, "detail": {"type": "string"},
                   "code": {"type": "string"}},
    "additionalProperties": True,
}
_TITLES = {401: "Missing or wrong API key, or invalid fencing token", 403: "Lock not allowed, or a shared (read-lock) token's write (shared_token)",
           404: "Not found (also: a path with a control character matches no route)", 409: "Stale fencing token or constraint conflict",
           413: "Payload too large", 422: "Invalid request", 428: "Fencing token required",
           412: "Precondition failed (If-Match / If-None-Match of an object write)",
           416: "Range not satisfiable",
           431: "Request headers too large",
           502: "Outcome unknown: the database connection broke while the write was committing",
           503: "Database unavailable (database_unavailable, lock_timeout: a lock stayed "
                "held by another transaction): nothing was committed, safe to retry"}
_TOKEN = {"name": "Fencing-Token", "in": "header", "required": False,
          "description": "the lock's compact JWS from lockd", "schema": {"type": "string",
                                                                          "maxLength": 4096}}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": "a retry with the same key gets the original answer (kept 24 h by default)",
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"}}
_ROW_OUT = {"type": "object", "additionalProperties": True}
_BATCH_RESULT = {"type": "object", "required": ["op", "table"],
                 "properties": {"op": {"enum": ["insert", "upsert", "update", "delete"]},
                                "table": {"type": "string"},
                                "row": {"type": ["object", "null"]}}}
_TABLE_ITEM = {"type": "object", "required": ["table", "lock", "unfenced"],
               "properties": {"table": {"type": "string"}, "lock": {"type": ["string", "null"]},
                              "unfenced": {"type": "boolean"}}}
_SCALAR_KINDS = {
    Kind.INTEGER: {"type": "integer"}, Kind.NUMERIC: {"type": ["number", "string"]},
    Kind.FLOAT: {"type": "number"}, Kind.TEXT: {"type": "string"},
    Kind.BOOLEAN: {"type": "boolean"}, Kind.TIMESTAMP: {"type": "string"},
    Kind.TIMESTAMPTZ: {"type": "string"}, Kind.DATE: {"type": "string", "format": "date"},
    Kind.TIME: {"type": "string"}, Kind.UUID: {"type": "string", "format": "uuid"},
    Kind.BYTES: {"type": "string", "contentEncoding": "base64"}, Kind.JSON: {},
    Kind.ANY: {"type": ["string", "number", "boolean"]},
}


def _column_schema(column: Column) -> dict[str, Any]:
    if column.kind is Kind.ENUM:
        schema: dict[str, Any] = {"type": "string", "enum": list(column.labels)}
    elif column.kind is Kind.ARRAY and column.item is not None:
        schema = {"type": "array", "items": _column_schema(column.item)}
    else:
        schema = dict(_SCALAR_KINDS.get(column.kind, {}))
    if column.kind is Kind.TEXT and column.length is not None:
        schema["maxLength"] = column.length
    if column.kind is Kind.INTEGER and column.int_bits:
        schema["minimum"] = -(2 ** (column.int_bits - 1))
        schema["maximum"] = 2 ** (column.int_bits - 1) - 1
    if column.nullable and schema:
        types = schema.get("type")
        if isinstance(types, str):
            schema["type"] = [types, "null"]
        elif isinstance(types, list):
            schema["type"] = [*types, "null"]
    return schema


def _row_in(table: Table, *, partial: bool) -> dict[str, Any]:
    columns = [c for c in table.columns.values()
               if not c.generated and c.name != table.fence_column]
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False,
                              "properties": {c.name: _column_schema(c) for c in columns}}
    if not partial:
        required = [c.name for c in columns if not c.nullable]
        if required:
            schema["required"] = required
    return schema


def _problems(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": _TITLES[s], "content": {
        PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}} for s in statuses}


def _json(description: str, schema: dict[str, Any], status: int = 200) -> dict[str, Any]:
    return {str(status): {"description": description,
                          "content": {"application/json": {"schema": schema}}}}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_WRITE_FAILURES = (401, 403, 404, 409, 413, 422, 428, 502, 503)
_READ_FAILURES = (401, 403, 404, 409, 422, 503)
_KEY = {"name": "key", "in": "path", "required": True,
        "description": "primary key values in key order, joined by ',', each percent-encoded",
        "schema": {"type": "string", "minLength": 1, "maxLength": 1024}}
_LOCK = {"name": "lock", "in": "path", "required": True,
         "schema": {"type": "string", "minLength": 1, "maxLength": 255}}


def _table_paths(table: Table) -> dict[str, Any]:
    rows = f"/v1/tables/{table.name}/rows"
    out = _json("a row", _ROW_OUT)
    return {
        rows: {
            "post": {"summary": f"insert a row into {table.name} (fenced)",
                     "parameters": [_TOKEN, _IDEMPOTENCY_KEY],
                     "requestBody": _body(_row_in(table, partial=False)),
                     "responses": {**_json("the stored row", _ROW_OUT, 201),
                                   **_problems(*_WRITE_FAILURES)}},
            "get": {"summary": f"rows of {table.name} whose columns equal the query's values",
                    "parameters": [_TOKEN, {"name": "limit", "in": "query", "required": False,
                                            "schema": {"type": "integer", "minimum": 1,
                                                       "maximum": 1000}}],
                    "responses": {**_json("rows", {"type": "object", "required": ["items"],
                                                   "properties": {"items": {
                                                       "type": "array", "items": _ROW_OUT}}}),
                                  **_problems(*_READ_FAILURES)}},
        },
        rows + "/{key}": {
            "get": {"summary": "one row (fenced when a token is sent)",
                    "parameters": [_KEY, _TOKEN],
                    "responses": {**out, **_problems(*_READ_FAILURES)}},
            "put": {"summary": "insert or replace the row (fenced)",
                    "parameters": [_KEY, _TOKEN, _IDEMPOTENCY_KEY],
                    "requestBody": _body(_row_in(table, partial=False)),
                    "responses": {**out, **_problems(*_WRITE_FAILURES)}},
            "patch": {"summary": "update the given columns (fenced)",
                      "parameters": [_KEY, _TOKEN, _IDEMPOTENCY_KEY],
                      "requestBody": _body(_row_in(table, partial=True)),
                      "responses": {**out, **_problems(*_WRITE_FAILURES)}},
            "delete": {"summary": "delete the row (fenced)",
                       "parameters": [_KEY, _TOKEN, _IDEMPOTENCY_KEY],
                       "responses": {"204": {"description": "deleted"},
                                     **_problems(*_WRITE_FAILURES)}},
        },
    }


_OBJECT = {"type": "object", "required": ["bucket", "key", "version", "etag", "size", "sha256",
                                           "content_type", "lock", "fence", "modified"],
           "properties": {"bucket": {"type": "string"}, "key": {"type": "string"},
                          "version": {"type": "integer"}, "etag": {"type": "string"},
                          "size": {"type": "integer"}, "sha256": {"type": "string"},
                          "content_type": {"type": "string"}, "lock": {"type": "string"},
                          "fence": {"type": "integer"}, "modified": {"type": "string"}}}
_BUCKET = {"name": "bucket", "in": "path", "required": True, "schema": {"type": "string"}}
_OBJECT_KEY = {"name": "key", "in": "path", "required": True, "schema": {"type": "string"},
               "description": "the object's key ('/'-separated segments, percent-encoded)"}


def _header(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {"type": "string"}}


def _object_paths() -> dict[str, Any]:
    """The fenced objects' paths (``resource_proxy.objects``)."""
    body = {"description": "the object's bytes", "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
    return {
        "/v1/objects/{bucket}/{key}": {
            "put": {"operationId": "putObject",
                    "summary": "write an object under its lock's fence (body streamed)",
                    "parameters": [_BUCKET, _OBJECT_KEY, _TOKEN, _IDEMPOTENCY_KEY,
                                   _header("If-Match", "the current ETag (or *)"),
                                   _header("If-None-Match", "* : only if it does not exist")],
                    "requestBody": {"required": True, "content": {
                        "*/*": {"schema": {"type": "string", "format": "binary"}}}},
                    "responses": {**_json("replaced", _OBJECT), **_json("created", _OBJECT, 201),
                                  **_problems(*_WRITE_FAILURES, 412)}},
            "get": {"operationId": "getObject",
                    "summary": "the object's bytes (Range, If-None-Match, If-Modified-Since; "
                               "with a token, a fenced read)",
                    "parameters": [_BUCKET, _OBJECT_KEY, _TOKEN, _header("Range", "bytes=a-b"),
                                   _header("If-None-Match", "ETags"),
                                   _header("If-Modified-Since", "an HTTP date")],
                    "responses": {"200": body, "206": body,
                                  "304": {"description": "not modified"},
                                  **_problems(401, 403, 404, 409, 416, 422, 503)}},
            "delete": {"operationId": "deleteObject", "summary": "delete an object (fenced)",
                       "parameters": [_BUCKET, _OBJECT_KEY, _TOKEN, _IDEMPOTENCY_KEY,
                                      _header("If-Match", "the current ETag")],
                       "responses": {"204": {"description": "deleted"},
                                     **_problems(*_WRITE_FAILURES, 412)}}},
        "/v1/objects/{bucket}": {"get": {
            "operationId": "listObjects", "summary": "the objects of a bucket, in key order",
            "parameters": [_BUCKET] + [{"name": n, "in": "query", "required": False,
                                        "schema": {"type": "string"}}
                                       for n in ("prefix", "after", "limit")],
            "responses": {**_json("a page of objects", {
                "type": "object", "required": ["items", "next_after"],
                "properties": {"items": {"type": "array", "items": _OBJECT},
                               "next_after": {"type": ["string", "null"]}}}),
                **_problems(404, 422, 503)}}},
    }


def build_openapi(catalog: Catalog, *, version: str = "1", objects: bool = False
                  ) -> dict[str, Any]:
    """The OpenAPI document of a proxy serving ``catalog`` (and fenced objects: ``objects``)."""
    tables = sorted(catalog)
    op_schema = {"type": "object", "required": ["op", "table"], "additionalProperties": False,
                 "properties": {"op": {"enum": ["insert", "upsert", "update", "delete"]},
                                "table": {"type": "string", "enum": tables} if tables
                                else {"type": "string"},
                                "key": {}, "row": {"type": "object"}}}
    paths: dict[str, Any] = {}
    for name in tables:
        paths.update(_table_paths(catalog[name]))
    fence = {"type": "object", "required": ["lock", "highest"],
             "properties": {"lock": {"type": "string"}, "highest": {"type": "integer"}}}
    binding = {"type": "object", "required": ["table", "lock", "unfenced"],
               "properties": {"table": {"type": "string"}, "lock": {"type": ["string", "null"]},
                              "template": {"type": ["string", "null"]},
                              "unfenced": {"type": "boolean"}}}
    paths.update({
        "/v1/tables": {"get": {
            "summary": "every served table and the lock template that governs its rows",
            "responses": {**_json("tables", {
                "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "items": _TABLE_ITEM}}}),
                          **_problems(503)}}},
        "/v1/tables/{table}/lock": {"get": {
            "summary": "the ONE lock that may write (and fence reads of) the row with ?key=",
            "parameters": [{"name": "table", "in": "path", "required": True,
                            "schema": {"type": "string"}},
                           {**_KEY, "in": "query", "required": False,
                            "description": "the row's key as in a row URL (values joined by "
                                           "',', each percent-encoded); not needed for a "
                                           "table under a literal lock"}],
            "responses": {**_json("the governing lock (null: unfenced)", binding),
                          **_problems(404, 422)}}},
        "/v1/batch": {"post": {
            "summary": "several writes under one fence check, in one transaction",
            "parameters": [_TOKEN, _IDEMPOTENCY_KEY],
            "requestBody": _body({"type": "object", "required": ["ops"],
                                  "additionalProperties": False,
                                  "properties": {"ops": {"type": "array", "minItems": 1,
                                                         "items": op_schema}}}),
            "responses": {**_json("per-op results", {
                "type": "object", "required": ["results", "lock", "fence"],
                "properties": {"results": {"type": "array", "items": _BATCH_RESULT},
                               "lock": {"type": ["string", "null"]},
                               "fence": {"type": ["integer", "null"]},
                               "locks": {"type": "array", "description": "a multi-lock token: "
                                         "each lock the batch touched and its fence",
                                         "items": {"type": "object",
                                                   "required": ["lock", "fence"],
                                                   "properties": {
                                                       "lock": {"type": "string"},
                                                       "fence": {"type": "integer"}}}}}}),
                **_problems(*_WRITE_FAILURES)}}},
        "/v1/fences/{lock}": {"get": {
            "summary": "the highest fence honoured for a lock", "parameters": [_LOCK],
            "responses": {**_json("the highest fence (0: never fenced)", fence),
                          **_problems(404, 422, 503)}}},
        "/v1/fences/{lock}/claim": {"post": {
            "summary": "raise the highest fence to the token's, writing no data (a token "
                       "holding the lock shared: a claim-for-read, raised to its epoch alike)",
            "parameters": [_LOCK, _TOKEN],
            "responses": {**_json("the highest fence", fence),
                          **_problems(401, 403, 404, 409, 422, 428, 503)}}},
        "/v1/fences/claim": {"post": {
            "operationId": "claimAll",
            "summary": "raise the highest fence of every lock of the token (a multi-lock "
                       "token's several) in one transaction, writing no data (403 "
                       "shared_token if the token holds any of them shared)",
            "parameters": [_TOKEN],
            "responses": {**_json("the highest fence of each lock, in lock-name order", {
                "type": "object", "required": ["locks"],
                "properties": {"locks": {"type": "array", "items": fence}}}),
                **_problems(401, 403, 409, 428, 503)}}},
        "/v1/activity": {"get": {
            "summary": "this proxy's recent fences and rejections (the status page's data)",
            "responses": _json("activity", {
                "type": "object", "required": ["fences", "rejections"],
                "properties": {"fences": {"type": "array", "items": {"type": "object"}},
                               "rejections": {"type": "array", "items": {"type": "object"}},
                               "stale_total": {"type": "integer"},
                               "writes_ok_total": {"type": "integer"}}})}},
        "/healthz": {"get": {"summary": "200 when the database answers",
                             "responses": {**_json("ok", {"type": "object"}),
                                           **_problems(503)}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
            "description": "text exposition",
            "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    })
    if objects:
        paths.update(_object_paths())
    schemas: dict[str, Any] = {"Problem": _PROBLEM}
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation["responses"]
            responses.update(_problems(431))
            if path not in OPEN_PATHS:
                responses.update(_problems(401))
                operation["security"] = [{"bearer": []}, {}]
            else:
                operation["security"] = []  # open on purpose, also with API keys
            operation.setdefault("operationId", _operation_id(path, method, tables))
            _name_schemas(operation, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "resource-proxy", "version": version,
                 "summary": "Fenced writes to database tables",
                 "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}},
        "servers": [{"url": "/", "description": "this proxy"}],
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


_OPERATION_IDS = {
    ("/v1/tables", "get"): "listTables", ("/v1/tables/{table}/lock", "get"): "getRowLock",
    ("/v1/batch", "post"): "batch", ("/v1/fences/{lock}", "get"): "getFence",
    ("/v1/fences/{lock}/claim", "post"): "claimFence", ("/v1/fences/claim", "post"): "claimAll",
    ("/v1/activity", "get"): "getActivity",
    ("/healthz", "get"): "healthz", ("/metrics", "get"): "metrics",
}
_ROW_OPERATIONS = {("rows", "post"): "insertRow", ("rows", "get"): "listRows",
                   ("rows/{key}", "get"): "getRow", ("rows/{key}", "put"): "putRow",
                   ("rows/{key}", "patch"): "updateRow", ("rows/{key}", "delete"): "deleteRow"}


# (operation, where) -> component name; per-table request rows are named "<table>.Row".
_SCHEMA_NAMES = {
    ("insertRow", "request"): "Row", ("putRow", "request"): "Row",
    ("updateRow", "request"): "RowPatch", ("listRows", "response"): "RowList",
    ("insertRow", "response"): "StoredRow", ("getRow", "response"): "StoredRow",
    ("putRow", "response"): "StoredRow", ("updateRow", "response"): "StoredRow",
    ("listTables", "response"): "TableList", ("getRowLock", "response"): "RowLock",
    ("batch", "request"): "BatchRequest", ("batch", "response"): "BatchResponse",
    ("getFence", "response"): "Fence", ("claimFence", "response"): "Fence",
    ("getActivity", "response"): "Activity", ("healthz", "response"): "Health",
}


def _name_schemas(operation: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Move the operation's JSON request and success schemas into ``components.schemas`` under
    short names (``Fence``, ``accounts.Row``), so generated clients get short type names; one
    name per distinct schema (a table's own when two tables' schemas differ)."""
    table, _, op = operation["operationId"].rpartition(".")
    places = [("request", operation.get("requestBody", {}))]
    places += [("response", r) for status, r in operation["responses"].items()
               if status.startswith("2")]
    for where, holder in places:
        content = holder.get("content", {}).get("application/json")
        base = _SCHEMA_NAMES.get((op, where))
        if content is None or base is None or "$ref" in content["schema"]:
            continue
        name = f"{table}.{base}" if table and base in ("Row", "RowPatch") else base
        if schemas.get(name, content["schema"]) != content["schema"]:
            name = f"{table}.{base}"
        schemas[name] = content["schema"]
        content["schema"] = {"$ref": f"#/components/schemas/{name}"}


def _operation_id(path: str, method: str, tables: list[str]) -> str:
    """A short, unique operationId: ``insertRow`` etc. prefixed with the table
    (``accounts.insertRow``: every table has its own paths), ``listTables``, ``batch``, ..."""
    if (path, method) in _OPERATION_IDS:
        return _OPERATION_IDS[(path, method)]
    for table in tables:
        prefix = f"/v1/tables/{table}/"
        if path.startswith(prefix) and (path[len(prefix):], method) in _ROW_OPERATIONS:
            safe = re.sub(r"[^A-Za-z0-9_-]", "_", table)
            return f"{safe}.{_ROW_OPERATIONS[(path[len(prefix):], method)]}"
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{method}{path}").strip("_")
