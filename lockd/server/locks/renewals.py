"""Renewals batched per client: ``POST /v1/leases/renew-each`` renews many single-lock leases in
one request, each answered on its own (docs/api.md, "Renewing many leases at once").

A process holding 1,000 leases sends one request per renewal tick instead of 1,000. Every item
is checked before anything is renewed (a malformed item fails the whole request with 422,
nothing renewed; a lock outside the caller's scope with 403); then each lease is renewed by the
store exactly as ``POST /v1/locks/{name}/renew`` would (same fence and token, same ``ttl_ms``
rule), concurrently, at most ``CONCURRENCY`` at a time. One lease's failure (410 ``lease_lost``:
expired, released or unknown; 503 from the store) is that item's answer and touches no other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from lockd.common.problems import problem_body
from lockd.server.errors import InvalidRequest, LockdError
from lockd.server.locks.schemas import RENEW_EACH_MAX
from lockd.server.locks.service import Lease, LockService

__all__ = ["CONCURRENCY", "Item", "answer_body", "check_items", "renew_each"]

CONCURRENCY = 64
"""Store calls in flight at once for one request: enough to fill a PostgreSQL pool or one
SQLite group commit, without 1,000 waiters on the pool at once."""

Item = tuple[str, str, int | None]
"""(lock, lease_id, ttl_ms or None: the lease's own TTL)."""


def check_items(service: LockService, items: Sequence[Item]) -> None:
    """``InvalidRequest`` (422) unless there are 1 to ``RENEW_EACH_MAX`` items and each names a
    lock, a single-lock lease id and an allowed TTL; the problem names the item (``index``)."""
    if not 1 <= len(items) <= RENEW_EACH_MAX:
        raise InvalidRequest(f"leases must list 1 to {RENEW_EACH_MAX} leases (got {len(items)})")
    for index, (lock, lease_id, ttl_ms) in enumerate(items):
        try:
            service.check_name(lock)
            service.check_renewal(lease_id, ttl_ms)
        except LockdError as exc:
            raise InvalidRequest(f"leases[{index}]: {exc.detail}", index=index,
                                 **exc.extra) from None


async def renew_each(service: LockService, items: Sequence[Item]) -> list[Lease | LockdError]:
    """Renew every item on its own; in the order given, each its ``Lease`` or the
    ``LockdError`` that refused it. Call ``check_items`` first. Any other exception (a bug)
    propagates once every started renewal has ended."""
    results: list[Lease | LockdError] = []
    for start in range(0, len(items), CONCURRENCY):
        chunk = items[start:start + CONCURRENCY]
        outcomes = await asyncio.gather(
            *(service.renew(lock, lease_id, ttl_ms) for lock, lease_id, ttl_ms in chunk),
            return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, LockdError):
                raise outcome
            results.append(outcome)
    return results


def answer_body(items: Sequence[Item], results: Sequence[Lease | LockdError]) -> dict[str, Any]:
    """The response body: ``results`` in request order, each ``{"lock", "status": 200,
    "lease"}`` or ``{"lock", "status", "problem"}`` (the problem details the single renew
    would have answered)."""
    out: list[dict[str, Any]] = []
    for (lock, _, _), result in zip(items, results, strict=True):
        if isinstance(result, Lease):
            out.append({"lock": lock, "status": 200, "lease": result.body()})
        else:
            out.append({"lock": lock, "status": result.status, "problem": problem_body(
                result.status, result.code, result.title, result.detail, result.extra)})
    return {"results": out}
