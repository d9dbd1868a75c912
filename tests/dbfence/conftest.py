"""Fixtures of the database-side fencing suites: a fresh PostgreSQL database per test (``db``),
the tables a test creates, and a policy built from ``{table: template}``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import psycopg
import pytest
import sqlalchemy as sa

from resource_proxy.policy import Policy, TablePolicy, Template


class Db:
    """A test database: ``engine`` (SQLAlchemy) and ``connect()`` (psycopg, autocommit off)."""

    def __init__(self, dsn: str, url: str):
        self.dsn = dsn
        self.engine = sa.create_engine(url, poolclass=sa.NullPool)

    def connect(self, autocommit: bool = False) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=autocommit)

    def run(self, *statements: str) -> None:
        with self.connect(autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def one(self, query: str, params: object = None):
        with self.connect(autocommit=True) as conn:
            return conn.execute(query, params).fetchone()


@pytest.fixture
def db(pg_dsn: str, pg_url: str) -> Iterator[Db]:
    database = Db(pg_dsn, pg_url)
    yield database
    database.engine.dispose()


def policy(templates: Mapping[str, str]) -> Policy:
    """A policy giving each table its template."""
    return Policy({t: TablePolicy(Template.parse(text, t)) for t, text in templates.items()})
