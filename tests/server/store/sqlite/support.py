"""A SQLite store on a temporary file with lockd's injectable clock, for store-level tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from lockd.server.store.sqlite import SqliteStore


class Clock:
    """Wall seconds that move only when a test says so."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000


def run_with_store(tmp_path: Path,
                   scenario: Callable[[SqliteStore, Clock, list[str]], Awaitable[None]]) -> None:
    """Open a store on ``tmp_path/s.db`` and run ``scenario(store, clock, notified)``;
    ``notified`` collects every name the store notifies listeners with."""

    async def main() -> None:
        clock = Clock()
        store = SqliteStore(str(tmp_path / "s.db"), clock=clock)
        await store.open()
        notified: list[str] = []
        store.subscribe(notified.append)
        try:
            await scenario(store, clock, notified)
        finally:
            await store.close()

    asyncio.run(main())
