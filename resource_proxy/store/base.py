"""The ``Store`` protocol: the protected database as the proxy uses it.

A store owns the connections and runs every fence check in the same transaction as what it
fences. Rows come back as JSON-ready dicts (``values.decode_row``).

Errors (nothing else escapes a store): ``StaleToken`` (the fence check failed; nothing written),
``NotFound`` (no such row), ``Conflict`` (UNIQUE / FOREIGN KEY / EXCLUDE), ``InvalidRequest``
(NOT NULL, CHECK, a value the database refused), ``StoreUnavailable`` (503: the database did
not answer and nothing was committed), ``OutcomeUnknown`` (502: the connection broke while the
write's COMMIT was in flight; it may have committed), ``KeyReused`` (422: an Idempotency-Key
recorded for another request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from lockd.common.fencerule import Fence
from resource_proxy.idempotency import Once, Reply
from resource_proxy.rows.tables import Catalog, Table
from resource_proxy.rows.writes import WriteOp

__all__ = ["Row", "Store"]

Row = dict[str, Any]


@runtime_checkable
class Store(Protocol):
    catalog: Catalog

    async def open(self) -> None:
        """Connect (pool, file) before the first request."""

    async def close(self) -> None:
        """Release every connection."""

    async def ping(self) -> None:
        """Return if the database answers; ``StoreUnavailable`` otherwise."""

    async def write(self, fence: Fence | None, op: WriteOp) -> Row | None:
        """Fence check + ``op`` in one transaction; the row written (None for a delete).
        ``fence`` None: a table the policy declares unfenced, written without a check.

        An update or delete of an absent row raises ``NotFound`` after the fence check passed:
        the token was honoured (the highest may have risen, as for a claim), no row changed.
        """

    async def batch(self, fences: Sequence[Fence], ops: Sequence[WriteOp]) -> list[Row | None]:
        """The fence check of each of ``fences`` (the locks the ops touch, in lock-name order:
        ``fencerule.in_lock_order``; none if empty), then every op, in one transaction.

        A failing op raises its error with ``op_index``; the transaction is rolled back whole.
        A stale fence raises ``StaleToken`` (``op_index`` 0) naming every stale lock when the
        fences come from a multi-lock token; no fence is raised then.
        """

    async def write_once(self, fence: Fence | None, op: WriteOp, once: Once) -> Reply:
        """``write`` with an Idempotency-Key: the reply recorded for ``once.key`` if there is one
        (``KeyReused`` if it was another request's), else the write, with its rendered reply
        recorded in the same transaction."""

    async def batch_once(self, fences: Sequence[Fence], ops: Sequence[WriteOp],
                         once: Once) -> Reply:
        """``batch`` with an Idempotency-Key, as ``write_once``."""

    async def read_row(self, table: Table, key: tuple[Any, ...], fence: Fence | None) -> Row:
        """The row (``NotFound`` if absent); with ``fence``, a fenced read: the fence is claimed
        first (raised like a write's, for ``fence.purpose``), then the row read."""

    async def list_rows(self, table: Table, filters: Mapping[str, Any], limit: int,
                        fence: Fence | None) -> list[Row]:
        """Rows whose columns equal ``filters`` in key order, at most ``limit``; fenced as above."""

    async def claim(self, fence: Fence) -> int:
        """Raise the highest to ``fence`` (for ``fence.purpose``) without touching data; return
        it (``StaleToken``)."""

    async def claim_all(self, fences: Sequence[Fence]) -> list[int]:
        """``claim`` for each of ``fences`` (lock order) in ONE transaction, all or nothing:
        ``StaleToken`` listing every stale lock, and then no fence is raised."""

    async def highest(self, lock: str) -> int:
        """The highest fence honoured for ``lock`` (0 if never fenced)."""
