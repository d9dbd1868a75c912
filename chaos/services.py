"""The servers of a chaos run as real processes, with the faults the nemesis needs.

- lockd (``lockd serve``) on its store: ``sqlite`` (a file in the run's directory), ``postgres``
  (a database in the run's throwaway PostgreSQL cluster, the same cluster as the protected
  database, so a PostgreSQL crash also crashes lockd's store) or ``etcd`` (a 3-member cluster of
  its own, ``harness.etcd.EtcdCluster``).
- the fencing proxy (``resource-proxy serve``) in front of the protected database: the
  throwaway PostgreSQL cluster (``harness.ThrowawayPostgres``), or a SQLite file.

lockd keeps its signing keys in the run's directory, so a restarted lockd signs with the same
key and the proxy keeps verifying. Faults: ``kill_lockd``/``start_lockd`` (SIGKILL, restart on
the same port and store), ``crash_pg``/``start_pg`` (``pg_ctl -m immediate``: a power cut,
recovery at the next start), ``kill_etcd``/``restart_etcd`` (SIGKILL of one member),
``stop_proxy``/``cont_proxy`` (SIGSTOP/SIGCONT of the proxy, requests in flight), and
``db_delay`` (the proxy reaches a PostgreSQL protected database through ``chaos.relay.Relay``,
whose per-chunk latency the nemesis raises for a while; so do the ``sql`` workload's workers,
whose tables carry the database's own fence triggers, ``chaos.sqldb.protect``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg

from chaos.db import (
    ACCOUNT_MARKS_TABLE,
    ACCOUNTS,
    ACCOUNTS_TABLE,
    MARKS_TABLE,
    SLOT_MARKS_TABLE,
    TERMS_TABLE,
    ResourceDB,
)
from chaos.near import NEAR_SPACES, NEAR_TABLES
from chaos.relay import Relay
from chaos.sqldb import create_sql_schema, protect
from harness import VENV_BIN, ServiceProcess, ThrowawayPostgres, free_port
from harness.etcd import EtcdCluster
from harness.servers import LockdServer

__all__ = ["STORES", "RESOURCES", "VIAS", "LOCK", "ACCOUNT_LOCKS", "ELECTION", "SEMAPHORE", "Services"]

STORES = ("sqlite", "postgres", "etcd")
RESOURCES = ("postgres", "sqlite")
VIAS = ("proxy", "guard", "redis-guard")
"""What the workers write through: the resource proxy, ``chaos.guarded`` (``lockd.guard``
over PostgreSQL; the counter workload only), or ``chaos.redisguarded`` (the counter in the
machine's Redis, every write one call of the guard's Redis functions; the counter workload)."""
REDIS_URL = os.environ.get("LOCKD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# The one lock the proxy binds the counter and marks tables to (a literal template: a batch
# writes the counter row and a mark row, so both tables are governed by the same lock).
LOCK = "chaos/counter"
ACCOUNT_LOCKS = "accounts/{key}"
"""The ``transfer`` workload: one lock per account row (row 3 is written under accounts/3)."""
ELECTION = "chaos/election"
"""The ``election`` workload's election: its leader's token (lock = the election's name) writes
the ``terms`` table."""
SEMAPHORE = "chaos"
"""The ``sem`` workload's semaphore: the holder of slot N writes ``slot_marks`` rows of slot N
(lock ``sem/chaos/N``)."""


class Services:
    """lockd + proxy (+ PostgreSQL, etcd) for one run; ``start()``, faults, ``close()``.

    ``pg``: a started ``ThrowawayPostgres`` to use (left running at close); by default the run
    makes its own when the store or the protected database is PostgreSQL, and destroys it.
    """

    def __init__(self, store: str, resource: str, workdir: Path, *,
                 pg: ThrowawayPostgres | None = None, accounts: int = ACCOUNTS,
                 workload: str = "counter", via: str = "proxy"):
        if store not in STORES or resource not in RESOURCES:
            raise ValueError(f"store must be one of {STORES}, resource one of {RESOURCES}")
        if via not in VIAS or (via == "guard" and resource != "postgres") or (
                via != "proxy" and workload != "counter"):
            raise ValueError(f"via must be one of {VIAS}; guard: the counter workload on "
                             "postgres; redis-guard: the counter workload")
        self.via = via
        self.store, self.resource, self.dir = store, resource, workdir
        self.accounts = accounts
        self.workload = workload
        self.worker_db_url = ""
        """The protected database as the workers reach it (through the relay, if any)."""
        self.needs_pg = store == "postgres" or resource == "postgres"
        self.pg = pg
        self._own_pg = pg is None and self.needs_pg
        self.pg_up = pg is not None
        self.etcd: EtcdCluster | None = None
        self.lockd: LockdServer | None = None
        self.proxy: ServiceProcess | None = None
        self.guard: ServiceProcess | None = None
        """``via == "guard"``: the guarded service (``chaos.guarded``) the workers write through."""
        self.lockd_port = free_port()
        self.proxy_port = free_port()
        self.guard_port = free_port()
        self.redis_tag = f"chaos_{uuid.uuid4().hex[:12]}"
        """``via == "redis-guard"``: the run's key prefix (``<tag>:``) and library suffix."""
        self.db_url = ""
        self.lockd_store = ""
        self._pg_mutex = threading.Lock()
        self.relay: Relay | None = None
        self.proxy_stopped = False

    @property
    def lockd_url(self) -> str:
        return f"http://127.0.0.1:{self.lockd_port}"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def front_url(self) -> str:
        """Where the workers send their reads and writes: the proxy, or the guarded service."""
        return f"http://127.0.0.1:{self.guard_port}" if self.via != "proxy" else self.proxy_url

    @property
    def front(self) -> ServiceProcess | None:
        """The process the proxy's faults (SIGSTOP) hit: the one in the workers' path."""
        return self.guard if self.via != "proxy" else self.proxy

    # -- lifecycle ---------------------------------------------------------------------------

    def _pg_database(self, prefix: str) -> str:
        assert self.pg is not None
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.pg.dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.pg.dsn.rsplit("/", 1)[0] + "/" + name

    def start(self) -> Services:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._own_pg:
            self.pg = ThrowawayPostgres().init().start()
            self.pg_up = True
        if self.resource == "postgres":
            self.db_url = self._pg_database("chaos_resource")
        else:
            self.db_url = f"sqlite:///{(self.dir / 'resource.db').resolve()}"
        ResourceDB(self.db_url).create_schema(self.accounts, NEAR_SPACES[self.workload])
        if self.workload == "sql":  # the database's own fence triggers, before the proxy starts
            if self.resource != "postgres":
                raise ValueError("the sql workload needs a PostgreSQL protected database")
            create_sql_schema(self.db_url)
            protect(self.db_url)
        proxy_db = self.db_url
        if self.resource == "postgres":
            assert self.pg is not None
            self.relay = Relay("127.0.0.1", self.pg.port).start()
            proxy_db = self.db_url.replace(f"127.0.0.1:{self.pg.port}/",
                                           f"127.0.0.1:{self.relay.port}/", 1)
        self.worker_db_url = proxy_db
        if self.store == "sqlite":
            self.lockd_store = f"sqlite:///{(self.dir / 'lockd.db').resolve()}"
        elif self.store == "postgres":
            self.lockd_store = self._pg_database("chaos_lockd").replace(
                "postgresql://", "postgresql+psycopg://", 1)
        else:
            self.etcd = EtcdCluster(3).start()
            self.lockd_store = self.etcd.url(f"chaos-{uuid.uuid4().hex[:8]}")
        self.lockd = LockdServer(self.lockd_store, log_dir=self.dir, key_dir=self.dir / "lockd-keys",
                                 port=self.lockd_port, args=["--log-level", "warning"])
        self.lockd.start(timeout=30)
        policy = self.dir / "policy.yaml"  # one lock writes the counter AND the marks
        policy.write_text(f"tables: {{counter: {LOCK}, {MARKS_TABLE}: {LOCK}, "
                          f"{ACCOUNTS_TABLE}: \"{ACCOUNT_LOCKS}\", "
                          f"{ACCOUNT_MARKS_TABLE}: \"accounts/{{account}}\", "
                          f"{TERMS_TABLE}: {ELECTION}, "
                          f"{SLOT_MARKS_TABLE}: \"sem/{SEMAPHORE}/{{slot}}\", "
                          + ", ".join(f"{t}: \"{tpl}\"" for t, tpl in
                                      zip(NEAR_TABLES, NEAR_SPACES[self.workload], strict=True))
                          + "}\n")
        self.proxy = ServiceProcess(
            [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", proxy_db,
             "--lockd-url", self.lockd_url, "--tables",
             f"counter,{MARKS_TABLE},{ACCOUNTS_TABLE},{ACCOUNT_MARKS_TABLE},{TERMS_TABLE},"
             f"{SLOT_MARKS_TABLE},{','.join(NEAR_TABLES)}",
             "--policy", str(policy), "--port", str(self.proxy_port), "--log-level", "warning",
             "--workers", "1"],  # one process: the nemesis SIGSTOPs the proxy by its pid
            ready_url=self.proxy_url + "/healthz", log_path=self.dir / "proxy.log")
        self.proxy.start(timeout=30)
        ResourceDB(self.db_url).watch_fences()  # the proxy created its fence table by now
        if self.via == "guard":
            self._start_guard(proxy_db, LOCK)
        elif self.via == "redis-guard":
            self.guard = ServiceProcess(
                [sys.executable, "-m", "chaos.redisguarded", "--lockd", self.lockd_url,
                 "--redis", REDIS_URL, "--prefix", f"{self.redis_tag}:", "--tag", self.redis_tag,
                 "--lock", LOCK, "--port", str(self.guard_port)],
                ready_url=self.front_url + "/healthz", log_path=self.dir / "guard.log")
            self.guard.start(timeout=30)
        return self

    def redis_state(self) -> tuple[int, list[Any]]:
        """``via == "redis-guard"``: the counter and the history rows, read from the run's
        Redis stream (``chaos.redisguarded.RedisHistory``)."""
        import redis

        from chaos.redisguarded import RedisHistory

        client = redis.Redis.from_url(REDIS_URL)
        try:
            return RedisHistory(client, f"{self.redis_tag}:").final_state()
        finally:
            client.close()

    def _drop_redis(self) -> None:
        import redis

        from chaos.redisguarded import LIBRARY_NAME, RedisHistory

        client = redis.Redis.from_url(REDIS_URL)
        try:
            RedisHistory(client, f"{self.redis_tag}:").drop(f"{LIBRARY_NAME}_{self.redis_tag}")
        finally:
            client.close()

    def _start_guard(self, db: str, lock: str) -> None:
        """The guarded service on the protected database, through the relay as the proxy."""
        import sqlalchemy as sa

        from resource_proxy.dbfence import install

        engine = sa.create_engine(db.replace("postgresql://", "postgresql+psycopg://", 1),
                                  poolclass=sa.NullPool)
        try:
            install(engine, tables=[])  # fencing.claim (the proxy made the fence table)
        finally:
            engine.dispose()
        self.guard = ServiceProcess(
            [sys.executable, "-m", "chaos.guarded", "--lockd", self.lockd_url, "--db", db,
             "--lock", lock, "--port", str(self.guard_port)],
            ready_url=self.front_url + "/healthz", log_path=self.dir / "guard.log")
        self.guard.start(timeout=30)

    def heal(self) -> None:
        """Bring back whatever a fault left down (PostgreSQL first: lockd may need it)."""
        self.set_db_delay(0.0)
        self.cont_proxy()
        self.start_pg()
        if self.etcd is not None:
            for i, member in enumerate(self.etcd.members):
                if not member.running:
                    self.etcd.restart_member(i)
            with contextlib.suppress(TimeoutError):
                self.etcd.wait_healthy(20)
        if self.lockd is not None and not self.lockd.running:
            self.start_lockd()

    def close(self) -> None:
        self.cont_proxy()
        for svc in (self.guard, self.proxy, self.lockd):
            if svc is not None:
                svc.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if self.relay is not None:
            self.relay.close()
        if self._own_pg and self.pg is not None:
            self.pg.destroy()
        if self.via == "redis-guard":
            self._drop_redis()

    # -- faults ------------------------------------------------------------------------------

    def kill_lockd(self) -> None:
        assert self.lockd is not None
        self.lockd.kill()

    def start_lockd(self, timeout: float = 30.0) -> None:
        """Start lockd again on the same port, store and keys (retrying while its store recovers)."""
        assert self.lockd is not None
        last: Exception | None = None
        for _ in range(5):
            try:
                self.lockd.start(timeout=timeout)
                return
            except (RuntimeError, TimeoutError) as exc:  # e.g. its store is still recovering
                last = exc
        raise RuntimeError(f"lockd did not come back: {last}")

    def crash_pg(self) -> None:
        """``pg_ctl -m immediate stop``: no checkpoint, no goodbye to clients; recovery at start."""
        assert self.pg is not None
        with self._pg_mutex:
            self.pg.stop("immediate")
            self.pg_up = False

    def start_pg(self) -> None:
        if self.pg is None:
            return
        with self._pg_mutex:
            if not self.pg_up:
                self.pg.start()
                self.pg_up = True

    def etcd_leader(self) -> int | None:
        if self.etcd is None:
            return None
        try:
            return self.etcd.leader(timeout=2.0)
        except TimeoutError:
            return None

    def kill_etcd(self, i: int) -> None:
        assert self.etcd is not None
        self.etcd.kill_member(i)

    def restart_etcd(self, i: int) -> None:
        assert self.etcd is not None
        self.etcd.restart_member(i)

    def stop_proxy(self) -> None:
        """SIGSTOP the proxy (or the guarded service, ``front``): requests in flight freeze
        mid-way (between check and write too)."""
        front = self.front
        if front is not None and front.proc is not None and front.proc.poll() is None:
            os.kill(front.proc.pid, signal.SIGSTOP)
            self.proxy_stopped = True

    def cont_proxy(self) -> None:
        front = self.front
        if self.proxy_stopped and front is not None and front.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(front.proc.pid, signal.SIGCONT)
        self.proxy_stopped = False

    def set_db_delay(self, seconds: float) -> bool:
        """Latency of each chunk between proxy and protected database; False without a relay."""
        if self.relay is None:
            return False
        self.relay.delay = seconds
        return True
