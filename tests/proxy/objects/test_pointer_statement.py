"""On PostgreSQL a PUT moves the object's pointer with ONE statement inside the fence's
transaction (the locked read and the upsert folded: a round trip less), and that statement still
gives the write everything the separate read gave: the previous version (created or replaced,
the next version number), the replaced blob to delete (none for an inline body) and the
preconditions judged on the previous row, a failure rolling the transaction back whole.

The row store is stood in for by a real psycopg transaction that counts the statements the
pointer code sends (the fence claim is ``PostgresStore.fenced``'s, tested with the store)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from lockd.common.fencerule import Fence
from resource_proxy.errors import PreconditionFailed
from resource_proxy.fencing import PG_SCHEMA
from resource_proxy.objects.blobs import Stored
from resource_proxy.objects.store import Pointers, Preconditions


class _Counting:
    """A connection that counts ``execute`` calls."""

    def __init__(self, conn: psycopg.AsyncConnection):
        self.conn = conn
        self.statements = 0

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return await self.conn.execute(*args, **kwargs)


class _Store:
    """``fenced``: ``body`` in one transaction on a real connection; ``plain``: autocommit."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.counted: list[int] = []

    async def _connect(self) -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

    async def fenced(self, fences: Any, body: Any, once: Any = None) -> Any:
        async with await self._connect() as conn:
            counting = _Counting(conn)
            try:
                async with conn.transaction():
                    return await body(counting)
            finally:
                self.counted.append(counting.statements)

    @staticmethod
    async def claimed_statement(*args: Any) -> None:  # the move always goes through fenced here
        return None

    async def plain(self, body: Any) -> Any:
        async with await self._connect() as conn:
            return await body(conn)


@pytest.fixture
def pointers(pg_dsn: str) -> tuple[Pointers, _Store]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{PG_SCHEMA}"')
    store = _Store(pg_dsn)
    made = Pointers(store, postgres=True)
    asyncio.run(made.create())
    return made, store


def test_one_statement_moves_the_pointer_and_returns_the_previous_row(pointers) -> None:
    made, store = pointers
    fence = Fence("bench", 3)

    async def scenario() -> None:
        async def put(name: str, inline: bytes | None = None,
                      conditions: Preconditions = Preconditions()) -> tuple[Any, list[str]]:
            replaced: list[str] = []
            result = await made.put(fence, "b", "k", Stored(name, 4, "ab" * 32), "text/plain",
                                    conditions, None, replaced, inline=inline)
            return result, replaced

        (created, first), replaced = await put("blob-1")
        assert created and first.version == 1 and replaced == []
        (created, second), replaced = await put("blob-2", conditions=Preconditions(
            if_match=(first.etag,)))
        assert not created and second.version == 2 and replaced == ["blob-1"]
        with pytest.raises(PreconditionFailed):  # judged on the previous row: rolled back
            await put("blob-3", conditions=Preconditions(if_none_match=True))
        with pytest.raises(PreconditionFailed):
            await put("blob-3", conditions=Preconditions(if_match=(first.etag,)))
        now = await made.get("b", "k", None)
        assert now is not None and (now.version, now.blob) == (2, "blob-2")
        (_, third), replaced = await put("name-3", inline=b"tiny")
        assert third.version == 3 and replaced == ["blob-2"]
        (_, fourth), replaced = await put("blob-4")  # an inline body has no blob to delete
        assert fourth.version == 4 and replaced == []
        (created, _), _ = await put("blob-5", conditions=Preconditions(if_match=("*",)))
        assert not created

    asyncio.run(scenario())
    assert store.counted == [1] * 7, store.counted
