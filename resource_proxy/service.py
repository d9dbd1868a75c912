"""What each call of the HTTP contract does, free of HTTP: token -> table -> op -> policy -> store.

Order of checks for a write (the first failure answers): token present (428) and genuine (401),
table served (404), key and row valid (422), the token's lock IS the row's governing lock
(``policy.TableBinding``; 403 ``lock_not_allowed`` naming the lock needed), then the store:
fence check (409 ``stale_token``) and the write in one transaction (404 absent row, 409
``conflict``, 422 refused value, 503). A batch checks every op before the store sees any of
them (every fenced op must be governed by the token's lock); a failing op's problem carries its
``op_index``. A table the policy declares ``unfenced`` is written with no token and no fence
check (a token, if sent, must still be genuine).

Reads need no token; with one, the read is fenced (invariant 7): the token's lock must govern
the rows read (403 otherwise), its fence must not be stale, and the highest fence rises to it
before the rows are read. A claim is for a lock that governs some row of a served table.

A write or batch with an ``Idempotency-Key`` (``keyed``) goes through the same checks, then to
the store's ``*_once`` calls, and comes back as a ``Reply`` (status and body text) that the
store recorded with the write or replayed from an earlier request (``idempotency``).

Where a token will carry several locks (multi-lock leases), ``_require`` is the one place that
asks "does the token hold the lock this row needs".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from resource_proxy.errors import (
    InvalidRequest,
    InvalidTokenError,
    LockNotAllowed,
    NotFound,
    ProxyError,
    TokenRequired,
)
from resource_proxy.fencing import Fence, validate_lock_name
from resource_proxy.idempotency import DEFAULT_TTL_MS, Keyed, Reply
from resource_proxy.jwks import KeySource
from resource_proxy.ops import OP_KINDS, OpKind, WriteOp, build_op
from resource_proxy.policy import Binding, TableBinding
from resource_proxy.store.base import Row, Store
from resource_proxy.tables import Catalog, Table, coerce, dumps, parse_json_key, parse_url_key

__all__ = ["ProxyService", "DEFAULT_LIMIT", "MAX_LIMIT"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_OP_FIELDS = {"op", "table", "key", "row"}
_WRITE_STATUS = {"insert": 201, "upsert": 200, "update": 200, "delete": 204}


class ProxyService:
    """The proxy's calls. ``max_batch_ops``: most ops one batch may carry (default 1000);
    ``idempotency_ttl_ms``: how long an Idempotency-Key's answer is kept (default 24 h)."""

    def __init__(self, binding: Binding, keys: KeySource, store: Store,
                 *, max_batch_ops: int = 1000, idempotency_ttl_ms: int = DEFAULT_TTL_MS):
        self.binding = binding
        self.catalog: Catalog = binding.catalog
        self.keys = keys
        self.store = store
        self.max_batch_ops = max_batch_ops
        self.idempotency_ttl_ms = idempotency_ttl_ms

    # -- pieces --------------------------------------------------------------------------

    def table(self, name: Any) -> Table:
        table = self.catalog.get(name) if isinstance(name, str) else None
        if table is None:
            raise NotFound(f"no table {name!r} is served by this proxy: tables are reflected when "
                           f"it starts (restart it after creating one) and must be in --tables / "
                           f"PROXY_TABLES if that is set; GET /v1/tables lists them",
                           table=str(name)[:255])
        return table

    async def fence_of(self, token: str | None) -> Fence:
        """The verified fence of ``token`` (``TokenRequired``, ``InvalidTokenError``)."""
        if not token:
            raise TokenRequired("send the lock's token in the Fencing-Token header")
        claims = await self.keys.verify(token.strip())
        if claims.lock is None or claims.fence is None:  # a multi-lock token (not served yet)
            raise InvalidTokenError("multi-lock tokens are not accepted by this proxy")
        return Fence(claims.lock, claims.fence)

    async def _optional_fence(self, token: str | None) -> Fence | None:
        return await self.fence_of(token) if token else None

    def bound(self, table: Table) -> TableBinding:
        return self.binding[table.name]

    @staticmethod
    def _require(fence: Fence, bound: TableBinding, key: Any, verb: str = "written",
                 values: Mapping[str, Any] | None = None) -> None:
        """403 unless the token's lock is the one that governs the row (``bound.require``)."""
        bound.require(fence.lock, key, verb=verb, values=values)

    # -- the binding -----------------------------------------------------------------------

    def lock_of(self, table_name: str, raw_key: str | None) -> dict[str, Any]:
        """``GET /v1/tables/{table}/lock?key=``: the lock that governs the row with ``key``."""
        table = self.table(table_name)
        bound = self.bound(table)
        key = parse_url_key(table, raw_key) if raw_key is not None else None
        lock = bound.lock_for(key)
        return {"table": table.name, "lock": lock,
                "template": bound.template.text if bound.template else None,
                "unfenced": bound.unfenced}

    def tables(self) -> dict[str, Any]:
        """``GET /v1/tables``: every served table with its lock template (or unfenced)."""
        return {"items": self.binding.describe()}

    # -- writes --------------------------------------------------------------------------

    async def write(self, kind: OpKind, table_name: str, raw_key: str | None, row: Any,
                    token: str | None, keyed: Keyed | None = None) -> Row | None | Reply:
        """One row write (``insert``/``upsert``/``update``/``delete``), fenced unless the table
        is unfenced: the row written (None for a delete), or with ``keyed`` the ``Reply``
        (recorded or replayed)."""
        table = self.table(table_name)
        bound = self.bound(table)
        fence = await self._optional_fence(token) if bound.unfenced else await self.fence_of(token)
        key = parse_url_key(table, raw_key) if raw_key is not None else None
        op = build_op(kind, table, key, row, fence.fence if fence else 0)
        if bound.unfenced:
            fence = None
        else:
            assert fence is not None
            self._require(fence, bound, op.key, values=op.values)
        if keyed is None:
            return await self.store.write(fence, op)
        status = _WRITE_STATUS[kind]

        def render(written: Row | None) -> Reply:
            return Reply(status, "" if status == 204 else dumps(written))

        return await self.store.write_once(
            fence, op, keyed.once(fence.lock if fence else "", self.idempotency_ttl_ms, render))

    def _batch_op(self, raw: Any, fence: Fence | None) -> WriteOp:
        if not isinstance(raw, Mapping):
            raise InvalidRequest("each op must be an object with op, table, key, row")
        unknown = set(raw) - _OP_FIELDS
        if unknown:
            raise InvalidRequest(f"unknown op field(s) {sorted(map(str, unknown))}")
        kind, name = raw.get("op"), raw.get("table")
        if kind not in OP_KINDS:
            raise InvalidRequest(f"op must be one of {list(OP_KINDS)}")
        if not isinstance(name, str):
            raise InvalidRequest("each op names its table")
        table = self.table(name)
        bound = self.bound(table)
        key = parse_json_key(table, raw["key"]) if raw.get("key") is not None else None
        op = build_op(kind, table, key, raw.get("row"), fence.fence if fence else 0)
        if not bound.unfenced:
            if fence is None:
                raise TokenRequired(f"table {table.name!r} is fenced: send the lock's token in "
                                    "the Fencing-Token header")
            self._require(fence, bound, op.key, values=op.values)
        return op

    async def batch(self, body: Any, token: str | None,
                    keyed: Keyed | None = None) -> dict[str, Any] | Reply:
        """``{"ops": [...]}``: one fence check, one transaction, all or nothing. Every op on a
        fenced table must be governed by the token's lock; ops on unfenced tables need none.
        With ``keyed`` the ``Reply`` (recorded or replayed)."""
        fence = await self._optional_fence(token)
        ops = body.get("ops") if isinstance(body, Mapping) else None
        if not isinstance(ops, list) or not ops:
            raise InvalidRequest('the body must be {"ops": [op, ...]} with at least one op')
        if len(ops) > self.max_batch_ops:
            raise InvalidRequest(f"a batch carries at most {self.max_batch_ops} ops")
        built: list[WriteOp] = []
        for index, raw in enumerate(ops):
            try:
                built.append(self._batch_op(raw, fence))
            except ProxyError as exc:
                raise exc.with_extra(op_index=index) from None
        fenced = any(not self.bound(op.table).unfenced for op in built)
        checked = fence if fenced else None

        def answer(rows: list[Row | None]) -> dict[str, Any]:
            return {
                "results": [
                    {"op": op.kind, "table": op.table.name, "row": row}
                    for op, row in zip(built, rows, strict=True)
                ],
                "lock": checked.lock if checked else None,
                "fence": checked.fence if checked else None,
            }

        if keyed is None:
            return answer(await self.store.batch(checked, built))
        once = keyed.once(checked.lock if checked else "", self.idempotency_ttl_ms,
                          lambda rows: Reply(200, dumps(answer(rows))))
        return await self.store.batch_once(checked, built, once)

    # -- reads ---------------------------------------------------------------------------

    async def read_row(self, table_name: str, raw_key: str, token: str | None) -> Row:
        fence = await self._optional_fence(token)
        table = self.table(table_name)
        key = parse_url_key(table, raw_key)
        bound = self.bound(table)
        if fence is not None and bound.unfenced:
            fence = None
        if fence is not None:
            self._require(fence, bound, key, "read")
        return await self.store.read_row(table, key, fence)

    async def list_rows(self, table_name: str, query: Iterable[tuple[str, str]],
                        token: str | None) -> dict[str, Any]:
        """Rows whose columns equal the query's ``col=value`` pairs; ``limit`` (1..1000)."""
        fence = await self._optional_fence(token)
        table = self.table(table_name)
        limit = DEFAULT_LIMIT
        filters: dict[str, Any] = {}
        for name, value in query:
            if name == "limit":
                # ASCII digits only: "²" passes isdigit() but not int(); "٣" passes both
                if not (value.isascii() and value.isdigit() and len(value) <= 4
                        and 1 <= int(value) <= MAX_LIMIT):
                    raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}")
                limit = int(value)
                continue
            column = table.columns.get(name)
            if column is None:
                raise InvalidRequest(f"table {table.name!r} has no column {name!r}", column=name)
            if name in filters:
                raise InvalidRequest(f"column {name!r} is filtered twice", column=name)
            filters[name] = coerce(column, value, from_text=True)
        bound = self.bound(table)
        if fence is not None and bound.unfenced:
            fence = None
        if fence is not None:
            needed = bound.lock_for_filters(filters)
            if needed != fence.lock:
                raise bound.refusal(fence.lock, str(needed), None, "read")
        return {"items": await self.store.list_rows(table, filters, limit, fence)}

    # -- fences --------------------------------------------------------------------------

    async def claim(self, lock: str, token: str | None) -> dict[str, Any]:
        """Raise the highest fence of ``lock`` to the token's, writing no data."""
        validate_lock_name(lock)
        fence = await self.fence_of(token)
        if fence.lock != lock:
            raise LockNotAllowed(f"the token is for lock {fence.lock!r}, not {lock!r}", lock=lock,
                                 token_lock=fence.lock)
        if not self.binding.governs(lock):
            raise LockNotAllowed(f"lock {lock!r} governs no row of any table this proxy serves "
                                 "(GET /v1/tables/{table}/lock?key= names the lock of a row)",
                                 lock=lock, token_lock=fence.lock)
        return {"lock": lock, "highest": await self.store.claim(fence)}

    async def fence(self, lock: str) -> dict[str, Any]:
        validate_lock_name(lock)
        return {"lock": lock, "highest": await self.store.highest(lock)}
