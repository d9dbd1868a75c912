"""Background renewals batched per client: the lock leases' renewals that fall due together go
to lockd as one ``POST /v1/leases/renew-each``, each lease answered on its own.

Each lease keeps its own renewal rule (``ClientCore._renewal_steps``: timing, retries, the
local deadline); only the sending is shared. The first renewal that falls due opens a batch and
waits its window (a tenth of its renewal interval, 1 s at most: ``Send.batch``) for others,
then sends them all (at most ``MAX_ITEMS`` a request) and gives each its own answer: the lease body, or the error the single renew would have raised
(``LeaseLostError`` for a 410, ``ServiceUnavailable`` for a 503...). A failure of the whole
request (no answer, 503) is every item's failure, and each lease's rule retries as it would
have. Leases renewed together fall due together again (each renews ``renew_every`` after it
fell due), within one window, so a process holding 1,000 leases of one TTL acquired within a
window of each other sends one request per tick. A lockd without the route (404/405) is asked one lease at a time from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from lockd.client.core import Send, Steps
from lockd.client.errors import LockClientError, ProtocolError, error_from_problem

__all__ = ["MAX_ITEMS", "RENEW_EACH", "AsyncRenewalBatcher", "RenewalBatcher"]

RENEW_EACH = "/v1/leases/renew-each"
MAX_ITEMS = 1000
"""Leases per request (lockd's limit)."""


class _Pending:
    __slots__ = ("step", "value", "error", "done")

    def __init__(self, step: Send, done: Any) -> None:
        self.step, self.value, self.error, self.done = step, None, None, done

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _window(step: Send) -> float:
    assert step.batch is not None
    return step.batch[3]


def _request_of(batch: Sequence[_Pending]) -> tuple[dict[str, Any], float | None]:
    """The body of one ``renew-each`` and its timeout (the shortest of its items')."""
    leases = []
    for item in batch:
        assert item.step.batch is not None
        lock, lease_id, ttl_ms, _ = item.step.batch
        leases.append({"lock": lock, "lease_id": lease_id,
                       "ttl_ms": ttl_ms() if callable(ttl_ms) else ttl_ms})
    timeouts = [item.step.timeout for item in batch if item.step.timeout is not None]
    return {"leases": leases}, min(timeouts) if timeouts else None


def _settle(batch: Sequence[_Pending], answer: Any) -> None:
    """Give each item its result from ``answer`` (the ``renew-each`` body)."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != len(batch):
        error = ProtocolError(f"POST {RENEW_EACH}: the answer does not list every lease")
        for item in batch:
            item.error = error
        return
    for item, result in zip(batch, results, strict=True):
        status = result.get("status") if isinstance(result, dict) else None
        if status == 200 and isinstance(result.get("lease"), dict):
            item.value = result["lease"]
        elif isinstance(status, int) and status >= 300:
            problem = result.get("problem")
            item.error = error_from_problem(status, problem if isinstance(problem, dict) else {})
        else:
            item.error = ProtocolError(f"POST {RENEW_EACH}: a lease's answer is malformed")


def _unanswered(item: _Pending) -> None:
    """An item the batch ended without answering (its send was interrupted) fails."""
    if item.value is None and item.error is None:
        item.error = ProtocolError(f"POST {RENEW_EACH}: ended without an answer")


def _unsupported(exc: LockClientError) -> bool:
    """The lockd asked predates ``renew-each`` (its route is unknown)."""
    return getattr(exc, "status", None) in (404, 405)


def _single(step: Send) -> Steps[Any]:
    """``step`` sent on its own (a client's ``_run`` must not batch it again)."""
    return (yield replace(step, batch=None))


class _Batching:
    """What both batchers share: the steps of sending one batch (run by the client's own
    ``_run``, so the sync and async clients do the I/O their way)."""

    unsupported = False
    """Set once lockd answered 404/405 to ``renew-each``: every renewal goes alone from then on."""

    def _send_steps(self, batch: Sequence[_Pending]) -> Steps[None]:
        body, timeout = _request_of(batch)
        try:
            answer = yield Send("POST", RENEW_EACH, json=body, timeout=timeout)
        except LockClientError as exc:
            if not _unsupported(exc):
                for item in batch:
                    item.error = exc
                return
            self.unsupported = True
            for item in batch:
                try:
                    item.value = yield from _single(item.step)
                except LockClientError as one:
                    item.error = one
            return
        except Exception as exc:  # noqa: BLE001 - every waiter must hear of it
            for item in batch:
                item.error = exc
            return
        _settle(batch, answer)


class RenewalBatcher(_Batching):
    """Batches a ``LockClient``'s background renewals (threads). ``run`` is the client's
    ``_run`` (sends a rule's steps, errors typed)."""

    def __init__(self, run: Callable[[Steps[Any]], Any]) -> None:
        self._run = run
        self._mutex = threading.Lock()
        self._open: list[_Pending] | None = None

    def renew(self, step: Send) -> Any:
        """The answer to ``step`` (a ``Send`` with ``batch``), sent with whatever else falls
        due within its window; raises its error as the single renew would."""
        if self.unsupported:
            return self._run(_single(step))
        item = _Pending(step, threading.Event())
        with self._mutex:
            leader = self._open is None
            if leader:
                self._open = []
            assert self._open is not None
            self._open.append(item)
        if not leader:
            item.done.wait()
            return item.result()
        time.sleep(_window(step))
        with self._mutex:
            batch, self._open = self._open or [], None
        try:
            for start in range(0, len(batch), MAX_ITEMS):
                self._run(self._send_steps(batch[start:start + MAX_ITEMS]))
        finally:
            for other in batch:
                _unanswered(other)
                other.done.set()
        return item.result()


class AsyncRenewalBatcher(_Batching):
    """``RenewalBatcher`` for an ``AsyncLockClient`` (one event loop). A batch is sent by a task
    of its own, so a lease whose renewal is stopped meanwhile (its task cancelled) takes no
    other lease's answer with it."""

    def __init__(self, run: Callable[[Steps[Any]], Awaitable[Any]]) -> None:
        self._run = run
        self._open: list[_Pending] | None = None
        self._window: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def renew(self, step: Send) -> Any:
        """As ``RenewalBatcher.renew``."""
        if self.unsupported:
            return await self._run(_single(step))
        loop = asyncio.get_running_loop()
        item = _Pending(step, loop.create_future())
        if self._open is None:
            self._open = []
            self._window = loop.call_later(_window(step), self._close_batch)
        self._open.append(item)
        await item.done
        return item.result()

    async def aclose(self) -> None:
        """Stop: the open window closes unsent and a batch in flight is cancelled (each of its
        leases answered with ``ProtocolError``), so nothing is sent on a closed HTTP pool and no
        task outlives the client."""
        if self._window is not None:
            self._window.cancel()
        batch, self._open, self._window = self._open or [], None, None
        for item in batch:
            _unanswered(item)
            if not item.done.done():
                item.done.set_result(None)
        sending = list(self._sending)
        for task in sending:
            task.cancel()
        for task in sending:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _close_batch(self) -> None:
        batch, self._open, self._window = self._open or [], None, None
        task = asyncio.get_running_loop().create_task(self._flush(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _flush(self, batch: list[_Pending]) -> None:
        try:
            for start in range(0, len(batch), MAX_ITEMS):
                await self._run(self._send_steps(batch[start:start + MAX_ITEMS]))
        finally:
            for item in batch:
                _unanswered(item)
                if not item.done.done():  # (cancelled: that lease's renewal was stopped)
                    item.done.set_result(None)
