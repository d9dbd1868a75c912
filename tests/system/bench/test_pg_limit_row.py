"""Section 1's PostgreSQL limit row sends lockd's own grant and release statements: the schema
it creates must be the one the store creates, or every cycle fails and the limit goal is lost.
"""

from __future__ import annotations

import asyncio

from bench.loadgen import WORKLOADS
from bench.scenarios import _lockd_schema


def test_the_limit_rows_statements_run_on_the_schema_it_creates(pg_dsn: str) -> None:
    dsn = _lockd_schema(pg_dsn)

    async def three_cycles() -> None:
        cycle, close = await WORKLOADS["lockd_sql"]({"dsn": dsn, "prefix": "limit"}, 0)
        try:
            for _ in range(3):  # grant, release, grant again: the release really freed it
                await cycle()
        finally:
            await close()

    asyncio.run(three_cycles())
