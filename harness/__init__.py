"""The one process harness that the tests, the benchmarks and the chaos runs share.

Everything here talks to real things: servers are real processes stopped with real signals
(``processes``), databases are created on the machine's PostgreSQL or in a throwaway cluster
(``postgres``), etcd clusters are real ``etcd`` members (``etcd``), and TLS material is made by
``certs``. See docs/development.md, "The test harness".
"""

from harness.pgrelay import PgRelay
from harness.postgres import (
    PG_ADMIN_DSN,
    PG_BIN,
    ThrowawayPostgres,
    create_database,
    drop_database,
    pg_available,
    sqlalchemy_url,
)
from harness.processes import (
    TIMING_SLACK,
    VENV_BIN,
    ServiceProcess,
    free_port,
    wait_for,
    wait_for_async,
)
from harness.zygote import run_program

__all__ = [
    "PG_ADMIN_DSN",
    "PG_BIN",
    "VENV_BIN",
    "free_port",
    "wait_for",
    "wait_for_async",
    "TIMING_SLACK",
    "ServiceProcess",
    "run_program",
    "create_database",
    "drop_database",
    "sqlalchemy_url",
    "ThrowawayPostgres",
    "pg_available",
    "PgRelay",
]
