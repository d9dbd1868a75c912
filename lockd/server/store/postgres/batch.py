"""Exclusive single-lock acquires, releases and renewals sent together: every such request made
within one event-loop turn goes to PostgreSQL in one set-based autocommit statement (one round
trip, one commit) instead of one statement each (``sql.ACQUIRE_BATCH``, ``sql.RELEASE_BATCH``,
``sql.RENEW_BATCH``).

How a batch forms: a request made while no other is under way (acquire, release or renewal: the
batchers share one count) is sent at once, alone (a lone client's requests never wait).
Otherwise the first request of a turn schedules the send for the next turn
(``loop.call_soon``); every request made before then joins it, at most one per lock name and
``MAX_BATCH`` in all. The others (a second request on a lock already in the batch) wait for
the next turn's batch, so a statement never meets a row twice (PostgreSQL would refuse it) and
a lock's requests are sent in the order they were made. A batch of one runs the
single-request code.

Answers and durability are those of the request sent alone: the statement commits before any
future is resolved. A request whose answer the batch cannot give by itself (a refusal whose
holder its snapshot did not show, a shared holder; a release that freed nothing; a renewal that
renewed nothing) runs alone with the single-request code. If the batch statement fails (any error: a bad value in one
request fails the whole statement, and nothing of it is committed), every request runs alone,
so one request's failure is its own. A connection lost during the batch statement is retried
once, as for any request (``PostgresStore._run``): the statement is idempotent for requests that
committed (their own lease id renews), and a release that then frees nothing is checked
against the first attempt's commit (``sql.RELEASED_BY``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

__all__ = ["ALONE", "MAX_BATCH", "STATS", "Batcher", "Entry", "answer"]

MAX_BATCH = 128
"""Requests in one batch statement at most; more wait for the next turn's batch."""

STATS = ("batches", "batched", "failed", "alone")
"""The counters of ``Batcher.stats``."""

R = TypeVar("R")

Entry = tuple[str, Any, "asyncio.Future[Any]"]
"""(lock name, the request, its future)."""


ALONE: Any = object()
"""A future's result that tells its caller to run its request alone (single-request code)."""


class Batcher(Generic[R]):
    """Collects the requests of one event-loop turn and hands them to ``send`` together.

    ``busy``: a one-item list counting the requests under way, shared with other batchers.
    ``send(entries)`` resolves each entry's future that is not done (``Entry``) with its answer,
    its error, or ``ALONE``: its caller then runs ``alone(request)`` in its own task (a batch of
    one, without a send; a request the statement could not answer; every request of a failed
    statement), so a request's failure stays its own. An exception ``send`` raises goes to
    the callers it left unresolved. ``stats`` (counts, for tests and operators): ``batches``
    sent (two or more requests), ``batched`` requests in them, ``failed`` requests that ran
    alone because their batch statement failed, ``alone`` other requests of a batch that ran
    alone.
    """

    def __init__(self, send: Callable[[list[Entry]], Awaitable[None]],
                 alone: Callable[[Any], Awaitable[R]], busy: list[int] | None = None):
        self._send = send
        self._alone = alone
        self._pending: list[Entry] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy = busy if busy is not None else [0]  # requests under way (shared)
        self.stats = dict.fromkeys(STATS, 0)

    async def submit(self, lock: str, request: Any) -> R:
        """``request`` on ``lock``: its answer (or error). Sent at once and alone if no other
        request of this batcher is under way (nothing to wait for: one client's requests go
        without the turn's wait), else with the others of this turn."""
        self._busy[0] += 1
        try:
            if self._busy[0] == 1:
                return await self._alone(request)
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[Any] = loop.create_future()
            self._pending.append((lock, request, fut))
            if not self._scheduled:
                self._scheduled = True
                loop.call_soon(self._flush)
            answer = await fut
            if answer is ALONE:
                return await self._alone(request)
            return answer
        finally:
            self._busy[0] -= 1

    def _flush(self) -> None:
        self._scheduled = False
        take: list[Entry] = []
        rest: list[Entry] = []
        names: set[str] = set()
        for entry in self._pending:
            if entry[2].done():  # its caller gave up before it was sent
                continue
            if entry[0] in names or len(take) >= MAX_BATCH:
                rest.append(entry)
            else:
                names.add(entry[0])
                take.append(entry)
        self._pending = rest
        if rest:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        if len(take) == 1:
            take[0][2].set_result(ALONE)
        elif take:
            self.stats["batches"] += 1
            self.stats["batched"] += len(take)
            task = asyncio.ensure_future(self._sent(take))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _sent(self, entries: list[Entry]) -> None:
        try:
            await self._send(entries)
        except BaseException as exc:  # noqa: BLE001 - handed to each waiting caller
            for _, _, fut in entries:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise


def answer(fut: asyncio.Future[Any], result: Any) -> None:
    """Resolve ``fut`` with ``result`` unless its caller gave up."""
    if not fut.done():
        fut.set_result(result)
