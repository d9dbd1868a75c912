"""The SQL path's floor in two round trips: what ``fenced_transaction`` could at best cost if
the claim travelled with the caller's statement (section 5's limit row for its goal).

Bare psycopg, no lockd code: ``BEGIN; SELECT fencing.claim(lock, fence); UPDATE ...`` as ONE
simple-query message (values as literals), then ``COMMIT``. Fewer is the direct fenced statement
itself (the caller's SQL known in advance); a real ``fenced_transaction`` sends the claim before
the caller's arbitrary statements, one round trip more (bench/NOTES.md, section 5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["fenced_tx_floor"]


async def fenced_tx_floor(spec: dict, i: int
                          ) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """One client of the floor: its own row ``i`` of ``spec["table"]`` under lock
    ``spec["prefix"]/i`` at fence 1, on an autocommit connection."""
    import psycopg

    from bench.loadgen import HttpError

    conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True)
    lock = f"{spec['prefix']}/{i}"
    assert lock.replace("/", "").isalnum()  # a literal with nothing to quote
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        cur = await conn.execute(
            f"BEGIN; SELECT fencing.claim('{lock}'::text, 1::bigint); "  # noqa: S608
            f"UPDATE {spec['table']} SET v = {n} WHERE id = {i} RETURNING id", prepare=False)
        while cur.nextset():  # BEGIN's result, the claim's, then the UPDATE's
            pass
        if cur.rowcount != 1:
            await conn.execute("ROLLBACK")
            raise HttpError(404, f"row {i} not updated".encode())
        await conn.execute("COMMIT", prepare=False)

    await cycle()
    return cycle, conn.close
