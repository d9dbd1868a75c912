"""The release listeners of a store and the one background task that feeds them.

``StoreCore.subscribe`` adds a listener; the store's watch (etcd) or LISTEN connection (PostgreSQL)
calls every listener with the name of each lock it sees released, on the event loop. A
listener's error is logged and never stops that task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from lockd.server.store.values import ReleaseListener

__all__ = ["ReleaseListeners", "stop_task"]


class ReleaseListeners:
    """Listeners called in the order they subscribed; errors logged on ``log``."""

    __slots__ = ("_listeners", "_log")

    def __init__(self, log: logging.Logger):
        self._listeners: list[ReleaseListener] = []
        self._log = log

    def add(self, listener: ReleaseListener) -> None:
        self._listeners.append(listener)

    def notify(self, name: str) -> None:
        """Call every listener with ``name``; a listener that raises is logged and skipped."""
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception:  # a listener's bug must not stop the task that feeds them
                self._log.exception("release listener failed for lock %r", name)


async def stop_task(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended, whatever it raises."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
