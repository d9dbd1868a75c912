"""Fixtures shared by every suite. PostgreSQL is required under CI=true (a failure, not a skip)."""

from __future__ import annotations

import os

import pytest

from harness import (
    PG_ADMIN_DSN,
    ThrowawayPostgres,
    create_database,
    drop_database,
    pg_available,
    sqlalchemy_url,
)

# The suites read one process's counters (/metrics, /v1/activity): every resource-proxy they
# start serves from one process unless the test asks for more (tests/proxy/test_workers.py).
os.environ.setdefault("PROXY_WORKERS", "1")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(reason: str | None, what: str) -> None:
    """Skip locally, fail under CI, when a service the test needs is missing."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


@pytest.fixture(scope="session")
def pg_admin_dsn() -> str:
    require(pg_available(PG_ADMIN_DSN), "PostgreSQL")
    return PG_ADMIN_DSN


@pytest.fixture
def pg_dsn(pg_admin_dsn: str):
    """A fresh, empty PostgreSQL database for this test (libpq DSN); dropped afterwards."""
    dsn = create_database(pg_admin_dsn)
    yield dsn
    drop_database(dsn, pg_admin_dsn)


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    """The same fresh database as a SQLAlchemy URL (``postgresql+psycopg://…``)."""
    return sqlalchemy_url(pg_dsn)


@pytest.fixture
def throwaway_pg():
    """A started PostgreSQL cluster of its own, for tests that stop, crash or restart it."""
    cluster = ThrowawayPostgres().init().start()
    yield cluster
    cluster.destroy()


# --- etcd (a 3-member cluster of real etcd processes; see harness/etcd.py) ---------------
import uuid  # noqa: E402

from harness.etcd import EtcdCluster, etcd_available  # noqa: E402


@pytest.fixture(scope="session")
def etcd_shared_cluster():
    """One 3-member etcd cluster for the session (a start takes ~3 s); never faulted."""
    require(etcd_available(), "etcd")
    cluster = EtcdCluster(3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_url(etcd_shared_cluster: EtcdCluster) -> str:
    """``etcd://h:p,h:p,h:p/<prefix>`` on the shared cluster, with a key prefix of its own."""
    return etcd_shared_cluster.url(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def etcd_cluster():
    """A started 3-member etcd cluster of this test's own, for tests that kill or pause members."""
    require(etcd_available(), "etcd")
    cluster = EtcdCluster(3).start()
    yield cluster
    cluster.stop()
