"""Fixtures of the operations suite: real ``lockd serve`` and ``resource-proxy serve`` processes
with their log files kept (the auth tests grep them), and a ``/metrics`` scraper.

``start_lockd(store="sqlite"|"postgres", env=..., args=...)`` and ``start_proxy(lockd, env=...)``
start processes that are stopped after the test; each has ``url`` and ``log()``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.servers import LockdServer, ProxyServer

ITEMS_SQLITE = "CREATE TABLE items (id TEXT PRIMARY KEY, v TEXT, n INTEGER)"
ITEMS_PG = "CREATE TABLE items (id text PRIMARY KEY, v text, n integer)"


class Metrics:
    """One scrape of ``/metrics``: ``value(name, **labels)`` (0.0 when the series is absent)."""

    def __init__(self, text: str):
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.names: set[str] = set()
        for family in text_string_to_metric_families(text):
            self.names.add(family.name)
            for sample in family.samples:
                self.names.add(sample.name)
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """Sum over every series of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)


def scrape(url: str) -> Metrics:
    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Metrics(response.text)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Show the schemathesis request counts (``record_property``) in the summary."""
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key.startswith("schemathesis_") and report.when == "call":
                    lines.append(f"{report.nodeid.rsplit('::', 1)[-1]}: "
                                 f"{key[len('schemathesis_'):]} = {value}")
    if lines:
        terminalreporter.write_sep("-", "schemathesis")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def name() -> str:
    return f"ops/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def start_lockd(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    servers: list[LockdServer] = []

    def start(store: str = "sqlite", *, env: dict[str, str] | None = None,
              args: tuple[str, ...] = (), wrapper: tuple[str, ...] = ()) -> LockdServer:
        if store == "sqlite":
            url = f"sqlite:///{tmp_path}/lockd-{len(servers)}.db"
        elif store == "postgres":
            url = request.getfixturevalue("pg_url")
        else:
            url = store
        server = LockdServer(url, log_dir=tmp_path, env=env, args=args, wrapper=wrapper)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def start_proxy(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    servers: list[ProxyServer] = []

    def start(lockd: LockdServer, *, db: str = "sqlite", env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()) -> ProxyServer:
        if db == "sqlite":
            path = tmp_path / f"resource-{len(servers)}.db"
            with sqlite3.connect(path) as conn:
                conn.execute(ITEMS_SQLITE)
            db_url = f"sqlite:///{path}"
        else:
            import psycopg

            dsn = request.getfixturevalue("pg_dsn")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(ITEMS_PG)
            db_url = dsn
        policy = tmp_path / f"policy-{len(servers)}.yaml"  # one row, one lock: row r1 is lock items/r1
        policy.write_text("tables: {items: 'items/{key}'}\n")
        server = ProxyServer(db_url, lockd.url, log_dir=tmp_path, tables=["items"], policy=policy,
                             env=env, args=args)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()
