"""What each row call of the HTTP contract does, free of HTTP: token -> table -> op -> policy -> store.

Order of checks for a write (the first failure answers): token present (428) and genuine (401),
table served (404), the caller's identity may write the table (403 ``forbidden_table``, with an
access file: ``access``; for a single-row write checked before the token), key and row valid
(422), the token's lock IS the row's governing lock (``policy.TableBinding``; 403
``lock_not_allowed`` naming the lock needed), then the store: fence check (409 ``stale_token``)
and the write in one transaction (404 absent row, 409 ``conflict``, 422 refused value, 503). A batch checks every op before the store sees any of
them (every fenced op must be governed by the token's lock); a failing op's problem carries its
``op_index``. A table the policy declares ``unfenced`` is written with no token and no fence
check (a token, if sent, must still be genuine).

Reads need no token; with one, the read is fenced (invariant 7): the token's lock must govern
the rows read (403 otherwise), its fence must not be stale, and the highest fence rises to it
before the rows are read (a claim for ``READ``: it never lets a row be written). A claim
(``claims``, the fence core's) is served for a lock that governs some row of a served table
(``governs``), or an object.

A write or batch with an ``Idempotency-Key`` (``keyed``) goes through the same checks, then to
the store's ``*_once`` calls, and comes back as a ``Reply`` (status and body text) that the
store recorded with the write or replayed from an earlier request (``idempotency``).

A multi-lock token (``claims.locks``: several locks, one fence each) is served as a set of
single-lock tokens: each row's governing lock must be one of its locks (else 403), and that
lock's fence is the one checked. A batch checks (and raises) the fence of EVERY lock its ops
touch, in lock-name order, in the transaction of its writes; the token's other locks are left
alone. ``_require`` is the one place that asks "does the token hold the lock this row needs";
whether it may write under it is ``lockd.common.fencerule``'s rule (``fencing.held``).

A token that holds a lock shared (a read lease, its fence the lock's read epoch) never writes
under it: ``fencing.held``, through which every fence of a write, batch op or claim is taken,
refuses a ``WRITE`` with 403 ``shared_token`` before the store is called. A fenced read under
it is a claim for ``READ``: allowed iff its fence is at
least the highest honoured (else 409 ``stale_token``), which rises to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lockd.common.fencerule import READ, WRITE, Fence, Purpose, in_lock_order
from lockd.tokens import Claims
from resource_proxy.access import allows, caller, check_table
from resource_proxy.claims import claims_of
from resource_proxy.codec import dumps
from resource_proxy.errors import (
    ForbiddenTable,
    InvalidRequest,
    NotFound,
    ProxyError,
    TokenRequired,
)
from resource_proxy.fencing import held
from resource_proxy.idempotency import DEFAULT_TTL_MS, Keyed, Reply
from resource_proxy.jwks import KeySource
from resource_proxy.policy import Binding, TableBinding
from resource_proxy.rows.tables import Catalog, Table
from resource_proxy.rows.values import coerce, parse_json_key, parse_url_key
from resource_proxy.rows.writes import OP_KINDS, OpKind, WriteOp, build_op, set_fence
from resource_proxy.store.base import Row, Store

__all__ = ["RowService", "DEFAULT_LIMIT", "MAX_LIMIT"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_OP_FIELDS = {"op", "table", "key", "row"}
_WRITE_STATUS = {"insert": 201, "upsert": 200, "update": 200, "delete": 204}


class RowService:
    """The rows' calls. ``max_batch_ops``: most ops one batch may carry (default 1000);
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

    async def claims_of(self, token: str | None) -> Claims:
        """The verified claims of ``token`` (``claims.claims_of``)."""
        return await claims_of(self.keys, token)

    async def _optional_claims(self, token: str | None) -> Claims | None:
        return await self.claims_of(token) if token else None

    def bound(self, table: Table) -> TableBinding:
        return self.binding[table.name]

    @staticmethod
    def _fence_for(claims: Claims, bound: TableBinding, needed: str, key: Any,
                   verb: str = "written") -> Fence:
        """The token's fence for lock ``needed``, for ``READ`` when ``verb`` is ``"read"`` else
        ``WRITE``; 403 (naming ``needed``) if it does not hold it, 403 ``shared_token`` for a
        write under a shared hold (``held``)."""
        purpose: Purpose = READ if verb == "read" else WRITE
        fence = held(claims, needed, purpose)
        if fence is None:
            locks: str | list[str] = (list(claims.locks) if claims.multi or claims.lock is None
                                      else claims.lock)
            raise bound.refusal(locks, needed, key, verb)
        return fence

    def _require(self, claims: Claims, bound: TableBinding, key: Any, verb: str = "written",
                 values: Mapping[str, Any] | None = None) -> Fence:
        """The token's fence for the lock that governs the row (its ``key``, or for an insert
        without one its ``values``): 403 unless the token holds that lock. A fenced table only."""
        needed = bound.lock_for_row(key, values or {})
        assert needed is not None  # bound is fenced
        return self._fence_for(claims, bound, needed, key, verb)

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
        check_table(table.name)
        bound = self.bound(table)
        claims = (await self._optional_claims(token) if bound.unfenced
                  else await self.claims_of(token))
        key = parse_url_key(table, raw_key) if raw_key is not None else None
        op = build_op(kind, table, key, row)
        fence: Fence | None = None
        if not bound.unfenced:
            assert claims is not None
            fence = self._require(claims, bound, op.key, values=op.values)
            set_fence(op, fence.fence)
        if keyed is None:
            return await self.store.write(fence, op)
        status = _WRITE_STATUS[kind]

        def render(written: Row | None) -> Reply:
            return Reply(status, "" if status == 204 else dumps(written))

        return await self.store.write_once(
            fence, op, keyed.once([fence] if fence else [], self.idempotency_ttl_ms, render))

    def _batch_op(self, raw: Any, claims: Claims | None) -> tuple[WriteOp, Fence | None]:
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
        check_table(table.name)
        bound = self.bound(table)
        key = parse_json_key(table, raw["key"]) if raw.get("key") is not None else None
        op = build_op(kind, table, key, raw.get("row"))
        if bound.unfenced:
            return op, None
        if claims is None:
            raise TokenRequired(f"table {table.name!r} is fenced: send the lock's token in "
                                "the Fencing-Token header")
        fence = self._require(claims, bound, op.key, values=op.values)
        set_fence(op, fence.fence)
        return op, fence

    async def batch(self, body: Any, token: str | None,
                    keyed: Keyed | None = None) -> dict[str, Any] | Reply:
        """``{"ops": [...]}``: one transaction, all or nothing. Every op on a fenced table must
        be governed by the token's lock (one of a multi-lock token's locks); ops on unfenced
        tables need none. The fence of every lock touched is checked and raised, in lock-name
        order, in that transaction. With ``keyed`` the ``Reply`` (recorded or replayed)."""
        claims = await self._optional_claims(token)
        ops = body.get("ops") if isinstance(body, Mapping) else None
        if not isinstance(ops, list) or not ops:
            raise InvalidRequest('the body must be {"ops": [op, ...]} with at least one op')
        if len(ops) > self.max_batch_ops:
            raise InvalidRequest(f"a batch carries at most {self.max_batch_ops} ops")
        built: list[WriteOp] = []
        touched: dict[str, Fence] = {}
        for index, raw in enumerate(ops):
            try:
                op, fence = self._batch_op(raw, claims)
            except ProxyError as exc:
                raise exc.with_extra(op_index=index) from None
            built.append(op)
            if fence is not None:
                touched[fence.lock] = fence
        checked = in_lock_order(touched.values())
        multi = claims is not None and claims.multi

        def answer(rows: list[Row | None]) -> dict[str, Any]:
            body: dict[str, Any] = {
                "results": [
                    {"op": op.kind, "table": op.table.name, "row": row}
                    for op, row in zip(built, rows, strict=True)
                ],
                "lock": checked[0].lock if checked and not multi else None,
                "fence": checked[0].fence if checked and not multi else None,
            }
            if multi:
                body["locks"] = [{"lock": f.lock, "fence": f.fence} for f in checked]
            return body

        if keyed is None:
            return answer(await self.store.batch(checked, built))
        once = keyed.once(checked, self.idempotency_ttl_ms,
                          lambda rows: Reply(200, dumps(answer(rows))))
        return await self.store.batch_once(checked, built, once)

    # -- reads ---------------------------------------------------------------------------

    async def read_row(self, table_name: str, raw_key: str, token: str | None) -> Row:
        claims = await self._optional_claims(token)
        table = self.table(table_name)
        key = parse_url_key(table, raw_key)
        bound = self.bound(table)
        fence = None
        if claims is not None and not bound.unfenced:
            check_table(table.name, "read fenced")
            fence = self._require(claims, bound, key, "read")
        return await self.store.read_row(table, key, fence)

    async def list_rows(self, table_name: str, query: Iterable[tuple[str, str]],
                        token: str | None) -> dict[str, Any]:
        """Rows whose columns equal the query's ``col=value`` pairs; ``limit`` (1..1000)."""
        claims = await self._optional_claims(token)
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
        fence = None
        if claims is not None and not bound.unfenced:
            check_table(table.name, "read fenced")
            needed = bound.lock_for_filters(filters)
            assert needed is not None  # bound is fenced
            fence = self._fence_for(claims, bound, needed, None, "read")
        return {"items": await self.store.list_rows(table, filters, limit, fence)}

    # -- claims --------------------------------------------------------------------------

    def governs(self, lock: str, claims: Claims) -> bool:
        """The rows' ``claims.Governs``: whether ``lock`` governs a row of a served table; with
        an access file, 403 ``forbidden_table`` unless the caller may write one of those tables
        (a claim does what a write to that table under ``lock`` does to the fence)."""
        if not self.binding.governs(lock):
            return False
        identity = caller()
        if identity is not None and identity.scope is not None:
            governed = sorted(n for n, b in self.binding.tables.items() if b.governs(lock))
            if not any(allows(identity, name) for name in governed):
                raise ForbiddenTable(
                    f"identity {identity.name!r} may not claim lock {lock!r}: it governs rows "
                    f"of {', '.join(governed)}, none of its tables "
                    f"({', '.join(identity.scope)})", table=governed[0],
                    identity=identity.name, lock=lock)
        return True
