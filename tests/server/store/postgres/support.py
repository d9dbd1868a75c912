"""Helpers of the PostgreSQL store tests: open a store on the test's database, new lease ids."""

from __future__ import annotations

import contextlib
import secrets

import psycopg

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


def waiting_on_a_row_lock(dsn: str) -> bool:
    """Whether a session on ``dsn``'s database waits on a lock now (a store call blocked on a
    row another transaction holds: the signal that it began, instead of a sleep)."""
    with psycopg.connect(dsn, autocommit=True) as probe:
        return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE"
                             " datname = current_database() AND wait_event_type = 'Lock'"
                             ).fetchone()[0] > 0
