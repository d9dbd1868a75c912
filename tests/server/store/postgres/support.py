"""Helpers of the PostgreSQL store tests: open a store on the test's database, new lease ids."""

from __future__ import annotations

import contextlib
import secrets

from lockd.server.store.postgres import PostgresStore


def lease_id() -> str:
    return secrets.token_urlsafe(24)


@contextlib.asynccontextmanager
async def opened(url: str, **kwargs):
    """A ``PostgresStore`` on ``url``, open for the block (a second one is a second process's)."""
    store = PostgresStore(url, **kwargs)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
