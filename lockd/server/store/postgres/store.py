"""PostgreSQL store: lockd replicas that share one database are correct together.

URL: ``postgresql://…`` or ``postgresql+psycopg://…`` (the ``+psycopg`` is stripped for libpq).
Query parameters the store takes for itself (removed before libpq sees the URL):
``pool_min`` (default 1), ``pool_max`` (32: see "Pool size" below), ``pool_timeout`` (seconds
to wait for a pooled connection, 5), ``op_timeout`` (seconds for a whole call, retry included, 10),
``prepare_threshold`` (psycopg's, 5; ``none`` disables server-side prepared statements, e.g.
behind a transaction-mode pgbouncer). Constructor keyword arguments override the URL.

Layout: one table ``lockd.locks`` in its own schema, created idempotently at ``open()`` under a
transaction-scoped advisory lock (two lockd processes may start at once)::

    name text COLLATE "C" PRIMARY KEY   -- byte order: list() pages and prefix ranges are exact
    fence bigint                        -- last fence issued for this lock
    lease_id, owner, client_id          -- the last grant (kept after release: see release())
    expires_at timestamptz              -- NULL once released; live iff expires_at > now()
    released_at timestamptz             -- set by release(): the LISTEN catch-up reads it

Clock (invariant 2): every expiry decision and every ``ttl_ms`` is computed in SQL from the
database server's ``now()`` (the statement's transaction start; every call is one autocommit
statement). lockd's own clock is never sent. Note ``now()`` is the server's wall clock: a step of
the server's clock moves every expiry with it (PostgreSQL offers no monotonic clock to SQL).

Fence (invariant 1): a per-lock counter kept in the lock row. A grant sets ``fence = fence + 1``
in the same statement that installs the lease, so the fence is durable exactly when the grant is:
the statement is its own transaction and the caller sees the fence only after the commit
returned, which (``synchronous_commit`` is forced from ``off`` to ``on`` on every pooled
connection) means the commit record reached the disk. A PostgreSQL crash can therefore lose only
grants nobody was told about. lockd never deletes lock rows; deleting one by hand would restart
its fences at 1. (A store-wide sequence would allow deleting idle rows, but adds sequence WAL
reasoning for nothing a lock row costs: a few dozen bytes per lock name ever used.) With
asynchronous streaming replication a failover can lose acknowledged grants: use synchronous
replication if the database fails over.

Statements (each one round trip, autocommit, named parameters prepared by psycopg after a few
uses):

- acquire: ``WITH up AS (INSERT … ON CONFLICT (name) DO UPDATE … WHERE <not live> OR <same
  lease_id> OR <same non-empty client_id> RETURNING …) SELECT … FROM up UNION ALL SELECT <holder>
  FROM lockd.locks WHERE … AND NOT EXISTS (SELECT 1 FROM up)``. The holder branch reads the
  statement's snapshot; if that snapshot cannot explain the refusal (the row was inserted or
  freed concurrently) a second statement reads the row again, and a freed lock is retried.
- renew: ``UPDATE … SET expires_at = now() + coalesce(ttl, l.ttl_ms), ttl_ms = coalesce(ttl,
  l.ttl_ms) WHERE name AND lease_id AND expires_at > now() RETURNING …``: a renew without a TTL
  keeps the lease's own (``ttl_ms``: the last one granted or renewed with).
- release: ``WITH r AS (UPDATE … SET expires_at = NULL, released_at = now() WHERE <live and
  ours> RETURNING name) SELECT pg_notify('lockd_release', name) FROM r``: the NOTIFY is sent by
  the same commit that frees the lock, which does not wait for its WAL flush (below).
- force_release (an operator's override, cold): the release statement without the lease id
  check, returning the ended lease's fence, owner and remaining TTL; NOTIFYs the same way.

Why the hot path bypasses SQLAlchemy: on this kind of 2-core machine the cost of a lock call is
the Python server process, not PostgreSQL (about 0.2 ms of database time per acquire+release).
SQLAlchemy's async layer roughly doubles the per-cycle CPU (≈1.1–1.5 ms against ≈0.5–0.8 ms with
the raw driver) and cut measured throughput to about half; an explicit transaction (BEGIN … COMMIT)
adds round trips too. So the statements above go through a psycopg 3 ``AsyncConnectionPool`` of
autocommit connections, one statement each, and the schema DDL (cold) is plain SQL as well.

Release commits: a release sets ``synchronous_commit = off`` for its own transaction only
(``set_config(…, true)`` in the statement). Why: a transaction that NOTIFYs holds PostgreSQL's
notify queue lock from before its commit record until after it, so with a synchronous commit
every release in the database waited in line for one WAL flush after another. pgbench with the
acquire + release statements at 32 clients on the 2-core bench machine: 2,200 cycles/s with the
synchronous release, 7,300 without the NOTIFY, 7,600 with the NOTIFY and this asynchronous
release (bench/notes/postgres.md). Why it is safe: a release only gives something up. The next
grant of that lock commits synchronously, and a WAL flush covers every record before it, so no
grant that depends on the release is acknowledged before the release is on disk. A crash can
lose an acknowledged release only together with every later grant of the lock: the lease is then
live again until its own expiry (the lock is busy longer, as if the release never came), its
fence stays the highest issued, and nothing acknowledged is lost. Grants, renewals (a lost renewal
would shorten a lease its holder was told it has) and force-release stay synchronous.

Pool size: every lock call holds a pooled connection only for its one statement, but a call that
finds the pool empty queues in psycopg_pool, and that wait costs CPU on lockd's one event loop (a
waiter object and an ``asyncio.wait_for`` task per call) besides the wait itself. With the old
default of 10, 32 clients queued on every call: 32 by default measured 1.55× the cycles/s at 32
clients with 0.78× lockd's CPU per cycle (bench/notes/postgres.md). The pool grows only under
load (one connection at a time, from ``pool_min``), so a quiet lockd still holds one connection
(plus the LISTEN one). Each ``--workers`` process has its own pool: N × ``pool_max`` + N
connections at most; keep that under the server's ``max_connections`` (100 by default).

Retries: a call whose connection broke (e.g. PostgreSQL restarted and the pool still held the
old connections) checks the pool and runs once more, which is safe because every statement is
idempotent for its caller: acquire with the same ``lease_id`` returns that lease, renew pushes
the same expiry again, a release retry accepts "already released by this lease id", reads are
reads. Anything else that goes wrong is ``StoreUnavailable`` (503); the detail never contains
the URL or a password.

Notifications: ONE dedicated connection per store runs ``LISTEN lockd_release`` and calls every
subscribed listener, on the event loop, with the released lock's name. It sends a heartbeat
(``SELECT now()``) every ``heartbeat`` seconds and reconnects by itself with backoff (0.05 s up to
2 s) when the connection drops. Notifications sent while it was disconnected are lost by
PostgreSQL, so after reconnecting it reads the locks with ``released_at`` at or after the last
heartbeat (minus a 5 s margin) and calls the listeners for each of them: waiters on those locks
retry at once instead of waiting for the holder's expiry. (That query scans the table; it runs only
on a reconnect.) A waiter never depends on a notification alone: it also retries at the holder's
expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.base import Grant, Holder, LockState, MultiGrant, ReleaseListener

__all__ = ["PostgresStore", "CHANNEL", "libpq_url"]

log = logging.getLogger(__name__)

CHANNEL = "lockd_release"
"""The NOTIFY channel a release signals on; the payload is the lock name."""

_SCHEMA_LOCK_KEY = 0x6C6F636B64  # "lockd": serializes schema creation across processes
_CATCH_UP_MARGIN = dt.timedelta(seconds=5)
_RECONNECT_MIN, _RECONNECT_MAX = 0.05, 2.0
_ACQUIRE_ATTEMPTS = 4
_LEASE_SWEEP_EVERY = 64  # multi-lock grants between two deletes of expired lease rows

_TTL = "COALESCE(GREATEST(0, ceil(extract(epoch FROM (expires_at - now())) * 1000)), 0)::bigint"
_LIVE = "(expires_at > now()) IS TRUE"
_NEW_EXPIRY = "now() + %(ttl_ms)s::bigint * interval '1 millisecond'"

_DDL = """
CREATE SCHEMA IF NOT EXISTS lockd;
CREATE TABLE IF NOT EXISTS lockd.locks (
    name        text COLLATE "C" PRIMARY KEY,
    fence       bigint NOT NULL CHECK (fence > 0),
    lease_id    text,
    owner       text NOT NULL DEFAULT '',
    client_id   text,
    expires_at  timestamptz,
    released_at timestamptz,
    ttl_ms      integer
) WITH (fillfactor = 70);
COMMENT ON TABLE lockd.locks IS
    'lockd leases: one row per lock name ever acquired; never delete rows (fence counter)';
CREATE TABLE IF NOT EXISTS lockd.leases (
    lease_id    text PRIMARY KEY,
    locks       text[] NOT NULL,
    owner       text NOT NULL DEFAULT '',
    client_id   text,
    expires_at  timestamptz NOT NULL,
    ttl_ms      integer NOT NULL
);
COMMENT ON TABLE lockd.leases IS
    'lockd multi-lock leases: the locks each one holds (its lock rows carry its lease_id)';
"""

# Multi-lock grant, inside one transaction: every row is locked in name order ("C" collation:
# every transaction that locks several lock rows does it in this one order, so two never
# deadlock). A live row refuses the update (but stays locked); fewer rows than names come back
# and the transaction is rolled back: nothing granted, no fence raised.
_SQL_ACQUIRE_MANY = f"""
WITH up AS (
    INSERT INTO lockd.locks AS l (name, fence, lease_id, owner, client_id, expires_at, ttl_ms)
    SELECT n, 1, %(lease_id)s, %(owner)s, NULL, {_NEW_EXPIRY}, %(ttl_ms)s::int
      FROM unnest(%(names)s::text[]) AS n ORDER BY n COLLATE "C"
    ON CONFLICT (name) DO UPDATE SET
        fence = l.fence + 1, lease_id = excluded.lease_id, owner = excluded.owner,
        client_id = NULL, expires_at = excluded.expires_at, ttl_ms = excluded.ttl_ms,
        released_at = NULL
    WHERE (l.expires_at > now()) IS NOT TRUE
    RETURNING name, fence, {_TTL} AS ttl
), lease AS (
    INSERT INTO lockd.leases (lease_id, locks, owner, client_id, expires_at, ttl_ms)
    SELECT %(lease_id)s, %(names)s, %(owner)s, %(client_id)s, {_NEW_EXPIRY}, %(ttl_ms)s
     WHERE (SELECT count(*) FROM up) = cardinality(%(names)s::text[])
    ON CONFLICT (lease_id) DO NOTHING
)
SELECT name, fence, ttl FROM up
"""

_SQL_HOLDERS = f"""
SELECT name, fence, owner, {_TTL}, lease_id FROM lockd.locks
 WHERE name = ANY(%(names)s::text[]) AND {_LIVE} ORDER BY name
"""

# The lease's live lock rows, locked in name order.
_SQL_LOCK_SET = """
SELECT name FROM lockd.locks
 WHERE name = ANY(%(names)s::text[]) AND lease_id = %(lease_id)s AND expires_at > now()
 ORDER BY name COLLATE "C" FOR UPDATE
"""

_SQL_RENEW_SET = f"""
WITH sel AS ({_SQL_LOCK_SET})
UPDATE lockd.locks l
   SET expires_at = now() + %(ttl_ms)s::int * interval '1 millisecond', ttl_ms = %(ttl_ms)s::int
  FROM sel WHERE l.name = sel.name
RETURNING l.name, l.fence
"""

# One statement: the lease row (deleted first: the same order as a renew), then the set's live
# lock rows in name order; every freed lock NOTIFYs with the commit.
_SQL_RELEASE_MANY = f"""
WITH lease AS (
    DELETE FROM lockd.leases WHERE lease_id = %(lease_id)s RETURNING locks
), sel AS (
    SELECT name FROM lockd.locks
     WHERE name = ANY((SELECT locks FROM lease)::text[]) AND lease_id = %(lease_id)s
       AND expires_at > now()
     ORDER BY name COLLATE "C" FOR UPDATE
), r AS (
    UPDATE lockd.locks l SET expires_at = NULL, released_at = now()
      FROM sel WHERE l.name = sel.name
    RETURNING l.name, pg_notify('{CHANNEL}', l.name)
)
SELECT (SELECT cardinality(locks) FROM lease), (SELECT array_agg(name) FROM r)
"""

_SQL_ACQUIRE = f"""
WITH up AS (
    INSERT INTO lockd.locks AS l (name, fence, lease_id, owner, client_id, expires_at, ttl_ms)
    VALUES (%(lock)s, 1, %(lease_id)s, %(owner)s, %(client_id)s, {_NEW_EXPIRY}, %(ttl_ms)s::int)
    ON CONFLICT (name) DO UPDATE SET
        fence = CASE WHEN l.expires_at > now() THEN l.fence ELSE l.fence + 1 END,
        lease_id = CASE WHEN l.expires_at > now() THEN l.lease_id ELSE excluded.lease_id END,
        owner = CASE WHEN l.expires_at > now() THEN l.owner ELSE excluded.owner END,
        client_id = CASE WHEN l.expires_at > now() THEN l.client_id ELSE excluded.client_id END,
        expires_at = excluded.expires_at,
        ttl_ms = excluded.ttl_ms,
        released_at = NULL
    WHERE (l.expires_at > now()) IS NOT TRUE
       OR l.lease_id = excluded.lease_id
       OR (l.client_id = excluded.client_id AND excluded.client_id <> '')
    RETURNING lease_id, fence, owner, {_TTL} AS ttl_ms
)
SELECT true, lease_id, fence, owner, ttl_ms FROM up
UNION ALL
SELECT false, NULL, fence, owner, CASE WHEN {_LIVE} THEN {_TTL} ELSE 0 END
  FROM lockd.locks WHERE name = %(lock)s AND NOT EXISTS (SELECT 1 FROM up)
"""

_SQL_HOLDER = f"""
SELECT fence, owner, {_TTL} FROM lockd.locks WHERE name = %(lock)s AND {_LIVE}
"""

# ttl_ms NULL: the lease's own TTL (the last one granted or renewed with).
_SQL_RENEW = f"""
UPDATE lockd.locks AS l
   SET expires_at = now() + coalesce(%(ttl_ms)s::int, l.ttl_ms) * interval '1 millisecond',
       ttl_ms = coalesce(%(ttl_ms)s::int, l.ttl_ms)
 WHERE name = %(lock)s AND lease_id = %(lease_id)s AND expires_at > now()
RETURNING fence, owner, {_TTL}
"""

# The release's commit does not wait for its WAL flush (see "Release commits" in the module
# docstring): ``set_config(…, true)`` lasts for this statement's own transaction only.
_ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"

_SQL_RELEASE = f"""
WITH r AS (
    UPDATE lockd.locks SET expires_at = NULL, released_at = now()
     WHERE name = %(lock)s AND lease_id = %(lease_id)s AND expires_at > now()
    RETURNING name
), async_commit AS ({_ASYNC_COMMIT})
SELECT pg_notify('{CHANNEL}', name) FROM r, async_commit
"""

# An operator's force-release: end whatever lease is live, keep the fence, NOTIFY like a release.
_SQL_FORCE_RELEASE = f"""
WITH old AS (
    SELECT name, fence, owner, expires_at FROM lockd.locks
     WHERE name = %(lock)s AND expires_at > now() FOR UPDATE
), r AS (
    UPDATE lockd.locks l SET expires_at = NULL, released_at = now()
      FROM old WHERE l.name = old.name
    RETURNING old.name, old.fence, old.owner,
              GREATEST(0, ceil(extract(epoch FROM (old.expires_at - now())) * 1000))::bigint AS ttl
)
SELECT fence, owner, ttl, pg_notify('{CHANNEL}', name) FROM r
"""

# Only after a release whose outcome is unknown (the connection broke): did it commit?
_SQL_RELEASED_BY = """
SELECT 1 FROM lockd.locks
 WHERE name = %(lock)s AND lease_id = %(lease_id)s AND released_at IS NOT NULL
"""

_STATE_COLUMNS = f"name, fence, CASE WHEN {_LIVE} THEN owner END, {_TTL} * ({_LIVE})::int"
_SQL_GET = f"SELECT {_STATE_COLUMNS} FROM lockd.locks WHERE name = %(lock)s"

_SQL_CATCH_UP = "SELECT name FROM lockd.locks WHERE released_at >= %(since)s ORDER BY name"

_OWN_PARAMS = {"pool_min", "pool_max", "pool_timeout", "op_timeout", "prepare_threshold"}

T = TypeVar("T")


def libpq_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a store URL into (libpq URL, the store's own query parameters).

    Accepts ``postgresql://``, ``postgres://`` and ``postgresql+psycopg://``.
    Raises ``ValueError`` for any other scheme.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("postgresql", "postgres", "postgresql+psycopg", "postgres+psycopg"):
        raise ValueError(f"not a PostgreSQL URL (scheme {parts.scheme!r})")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in _OWN_PARAMS}
    rest = [(k, v) for k, v in query if k not in _OWN_PARAMS]
    return urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), "")), own


def _prefix_upper(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (code point order)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code == 0xD800:  # surrogates cannot be sent as UTF-8
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:i] + chr(code)
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _param(own: dict[str, str], name: str, default: T, kind: Callable[[str], T]) -> T:
    """The store URL's query parameter ``name`` as ``kind`` (``int``/``float``), else
    ``default``; ``ValueError`` naming the parameter for a value that is not one."""
    if name not in own:
        return default
    try:
        return kind(own[name])
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"PostgreSQL store URL: {name}={own[name]!r} is not {what}") from None


class _Refused(Exception):
    """Internal: a lock of a multi-lock grant is held; roll the transaction back."""


class _ConnectionLost(Exception):
    """Internal: the statement failed because its connection broke; the outcome is unknown."""

    def __init__(self, cause: psycopg.Error):
        super().__init__(str(cause))
        self.cause = cause


class PostgresStore:
    """The ``Store`` protocol on PostgreSQL (see the module docstring for the design).

    ``url``: ``postgresql[+psycopg]://user:pass@host:port/db?…``. Keyword arguments (``None``:
    take the URL's query parameter, else the default): ``pool_min`` 1, ``pool_max`` 32,
    ``pool_timeout`` 5.0 s, ``op_timeout`` 10.0 s, ``prepare_threshold`` 5, ``heartbeat`` 5.0 s
    (LISTEN connection liveness check).
    """

    def __init__(
        self,
        url: str,
        *,
        pool_min: int | None = None,
        pool_max: int | None = None,
        pool_timeout: float | None = None,
        op_timeout: float | None = None,
        prepare_threshold: int | None = None,
        heartbeat: float = 5.0,
    ):
        conninfo, own = libpq_url(url)
        try:  # libpq's own check of the URL, now rather than at each connection attempt
            conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            raise ValueError("PostgreSQL store URL: " + " ".join(str(exc).split())) from None
        self._conninfo = conninfo
        self._pool_min = pool_min if pool_min is not None else _param(own, "pool_min", 1, int)
        self._pool_max = pool_max if pool_max is not None else _param(own, "pool_max", 32, int)
        self._pool_max = max(self._pool_max, self._pool_min, 1)
        self._pool_timeout = (
            pool_timeout if pool_timeout is not None
            else _param(own, "pool_timeout", 5.0, float)
        )
        self._op_timeout = (
            op_timeout if op_timeout is not None
            else _param(own, "op_timeout", self._pool_timeout + 5.0, float)
        )
        if prepare_threshold is None:
            raw = own.get("prepare_threshold", "5")
            self._prepare_threshold = (None if raw.lower() == "none"
                                       else _param(own, "prepare_threshold", 5, int))
        else:
            self._prepare_threshold = prepare_threshold
        self._heartbeat = heartbeat
        # libpq connection parameters lockd sets unless the URL does.
        self._conn_kwargs: dict[str, Any] = {}
        present = {k for k, _ in parse_qsl(urlsplit(conninfo).query)}
        if "connect_timeout" not in present:
            self._conn_kwargs["connect_timeout"] = max(1, round(self._pool_timeout))
        if "application_name" not in present:
            self._conn_kwargs["application_name"] = "lockd"
        self._listeners: list[ReleaseListener] = []
        self._grants = 0
        self._pool: AsyncConnectionPool | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._listening: asyncio.Event | None = None

    async def _connect_error(self) -> str:
        """``": <why>"`` from one direct connection attempt (the pool only logs its errors), so
        the final line says ``database "x" does not exist`` rather than only a timeout."""
        try:
            async with asyncio.timeout(self._pool_timeout):
                conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._conn_kwargs)
            await conn.close()
        except psycopg.Error as exc:
            return ": " + " ".join(str(exc).split())
        except (TimeoutError, OSError) as exc:
            return f": {type(exc).__name__} {exc}".rstrip()
        return ""

    def __repr__(self) -> str:
        parts = urlsplit(self._conninfo)
        host = parts.netloc.rsplit("@", 1)[-1]
        return f"PostgresStore(postgresql://{host}{parts.path})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the pool, create the schema, start the LISTEN connection.

        Raises ``StoreUnavailable`` if PostgreSQL does not answer within ``pool_timeout``.
        """
        if self._pool is not None:
            return
        pool = AsyncConnectionPool(
            self._conninfo,
            kwargs={**self._conn_kwargs, "autocommit": True,
                    "prepare_threshold": self._prepare_threshold},
            min_size=self._pool_min,
            max_size=self._pool_max,
            timeout=self._pool_timeout,
            # Give up background reconnection quickly: later requests grow the pool again at
            # once, instead of waiting out an exponential backoff after the database is back.
            reconnect_timeout=self._pool_timeout,
            configure=self._configure,
            name="lockd",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self._pool_timeout)
            self._pool = pool
            await self._run(self._create_schema, retry=True)
            self._listening = asyncio.Event()
            self._listen_task = asyncio.create_task(self._listen_forever(), name="lockd-listen")
            try:
                async with asyncio.timeout(self._pool_timeout):
                    await self._listening.wait()
            except TimeoutError:
                raise StoreUnavailable(
                    f"PostgreSQL store: LISTEN connection not ready within {self._pool_timeout} s"
                ) from None
        except PoolTimeout as exc:
            await self.close()
            await pool.close()
            raise StoreUnavailable(
                f"PostgreSQL store: could not connect within {self._pool_timeout} s"
                f"{await self._connect_error()}"
            ) from exc
        except BaseException:
            await self.close()
            await pool.close()
            raise

    async def close(self) -> None:
        """Stop the LISTEN connection and close the pool; idempotent."""
        task, self._listen_task = self._listen_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close(timeout=5.0)

    @staticmethod
    async def _configure(conn: psycopg.AsyncConnection) -> None:
        # A grant acknowledged before its commit is durable could hand out its fence again
        # after a crash: never let lockd's connections run with synchronous_commit = off.
        await conn.execute(
            "SELECT set_config('synchronous_commit', 'on', false)"
            " WHERE current_setting('synchronous_commit') = 'off'"
        )

    @staticmethod
    async def _create_schema(conn: psycopg.AsyncConnection, retried: bool) -> None:
        cur = await conn.execute("SELECT to_regclass('lockd.locks') IS NOT NULL")
        row = await cur.fetchone()
        cur = await conn.execute("SELECT to_regclass('lockd.leases') IS NOT NULL")
        leases = await cur.fetchone()
        if row and row[0] and leases and leases[0]:
            return  # nothing to do (and no CREATE privilege needed)
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", [_SCHEMA_LOCK_KEY])
            await conn.execute(_DDL)

    # -- the one place errors are translated ------------------------------------------------

    async def _run(
        self,
        op: Callable[[psycopg.AsyncConnection, bool], Awaitable[T]],
        *,
        retry: bool,
    ) -> T:
        """Run ``op(conn, retried)`` on a pooled connection, within ``op_timeout``.

        If the connection broke and ``retry`` is set, the pool is checked (broken idle
        connections dropped) and ``op`` runs once more with ``retried=True``.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("PostgreSQL store is not open")
        try:
            async with asyncio.timeout(self._op_timeout):
                retried = False
                while True:
                    try:
                        return await self._once(pool, op, retried)
                    except _ConnectionLost as lost:
                        if not retry or retried:
                            raise lost.cause from None
                        log.warning("PostgreSQL connection lost (%s); retrying once",
                                    _first_line(lost.cause))
                        await pool.check()
                        retried = True
        except (LeaseLost, StoreUnavailable):
            raise
        except PoolTimeout as exc:
            raise StoreUnavailable(
                f"PostgreSQL store: no database connection within {self._pool_timeout} s"
            ) from exc
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"PostgreSQL store: no answer within {self._op_timeout} s"
            ) from exc
        except psycopg.OperationalError as exc:
            log.warning("PostgreSQL store unavailable: %s", _first_line(exc))
            raise StoreUnavailable(
                f"PostgreSQL store: database unavailable ({_kind(exc)})"
            ) from exc
        except psycopg.Error as exc:
            log.error("PostgreSQL store error: %s", _first_line(exc))
            raise StoreUnavailable(f"PostgreSQL store: database error ({_kind(exc)})") from exc

    @staticmethod
    async def _once(pool: AsyncConnectionPool, op, retried: bool):
        async with pool.connection() as conn:
            try:
                return await op(conn, retried)
            except psycopg.OperationalError as exc:
                if conn.closed:
                    raise _ConnectionLost(exc) from exc
                raise

    # -- Store protocol ------------------------------------------------------------------------

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None
    ) -> Grant | Holder:
        """See ``Store.acquire``. One statement; a second only when a refusal needs explaining."""
        params = {"lock": lock, "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant | Holder:
            holder: Holder | None = None
            for _ in range(_ACQUIRE_ATTEMPTS):
                cur = await conn.execute(_SQL_ACQUIRE, params)
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return Grant(lock=lock, lease_id=row[1], fence=row[2], ttl_ms=row[4],
                                 owner=row[3])
                if row is not None and row[4] > 0:
                    return Holder(lock=lock, owner=row[3], ttl_ms=row[4], fence=row[2])
                # The statement's snapshot did not show the lease that refused us (it was
                # inserted or replaced concurrently): look again with a fresh snapshot.
                cur = await conn.execute(_SQL_HOLDER, params)
                live = await cur.fetchone()
                if live is not None:
                    return Holder(lock=lock, owner=live[1], ttl_ms=max(1, live[2]), fence=live[0])
                if row is not None:  # freed in between: try again
                    holder = Holder(lock=lock, owner=row[3], ttl_ms=1, fence=row[2])
            return holder or Holder(lock=lock, owner="", ttl_ms=1, fence=0)

        return await self._run(op, retry=True)

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """See ``Store.renew``. Raises ``LeaseLost`` unless the lease is live by the server."""
        params = {"lock": lock, "lease_id": lease_id,
                  "ttl_ms": None if ttl_ms is None else int(ttl_ms)}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Grant:
            cur = await conn.execute(_SQL_RENEW, params)
            row = await cur.fetchone()
            if row is None:
                raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)
            return Grant(lock=lock, lease_id=lease_id, fence=row[0], ttl_ms=row[2], owner=row[1])

        return await self._run(op, retry=True)

    async def release(self, lock: str, lease_id: str) -> None:
        """See ``Store.release``: frees the lock and NOTIFYs in one statement; keeps the fence."""
        params = {"lock": lock, "lease_id": lease_id}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            cur = await conn.execute(_SQL_RELEASE, params)
            if await cur.fetchone() is not None:
                return
            if retried:  # the first attempt's outcome was unknown: did it commit?
                cur = await conn.execute(_SQL_RELEASED_BY, params)
                if await cur.fetchone() is not None:
                    return
            raise LeaseLost(f"lease on {lock!r} is not live", lock=lock)

        await self._run(op, retry=True)

    async def acquire_many(self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int,
                           owner: str, client_id: str | None) -> MultiGrant | list[Holder]:
        """See ``Store.acquire_many``: one transaction that upserts every lock row (in name
        order) and the lease row, or rolls back. A deadlock (with a hand-written transaction
        locking rows in another order) is retried."""
        params = {"names": list(locks), "lease_id": lease_id, "ttl_ms": int(ttl_ms),
                  "owner": owner or "", "client_id": client_id or None}

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant | list[Holder]:
            for _ in range(_ACQUIRE_ATTEMPTS):
                try:
                    async with conn.transaction():
                        cur = await conn.execute(_SQL_ACQUIRE_MANY, params)
                        rows = await cur.fetchall()
                        if len(rows) != len(locks):
                            raise _Refused  # roll back: nothing granted, no fence raised
                except _Refused:
                    pass
                except psycopg.errors.DeadlockDetected:
                    continue
                else:
                    self._grants += 1
                    if self._grants % _LEASE_SWEEP_EVERY == 0:  # lease rows of expired sets
                        await conn.execute("DELETE FROM lockd.leases WHERE expires_at < now()")
                    fences = {r[0]: r[1] for r in rows}
                    return MultiGrant(lease_id, {n: fences[n] for n in locks}, rows[0][2],
                                      owner or "")
                cur = await conn.execute(_SQL_HOLDERS, params)
                live = await cur.fetchall()
                if not live:
                    continue  # freed in between: try again
                if client_id and len(live) == len(locks) and len({r[4] for r in live}) == 1:
                    cur = await conn.execute(
                        "SELECT client_id, locks FROM lockd.leases WHERE lease_id = %s",
                        [live[0][4]])
                    lease = await cur.fetchone()
                    if lease is not None and lease[0] == client_id and lease[1] == list(locks):
                        try:
                            return await self._renew_many(conn, live[0][4], ttl_ms)
                        except LeaseLost:
                            continue
                if len(live) == len(locks) and all(r[4] == lease_id for r in live):
                    # A retry after a lost answer: our first attempt committed the grant.
                    return MultiGrant(lease_id, {r[0]: r[1] for r in live},
                                      min(r[3] for r in live), owner or "")
                return [Holder(lock=r[0], owner=r[2], ttl_ms=max(1, r[3]), fence=r[1])
                        for r in live]
            raise StoreUnavailable("PostgreSQL store: the locks kept changing hands; try again")

        return await self._run(op, retry=True)

    @staticmethod
    async def _renew_many(conn: psycopg.AsyncConnection, lease_id: str,
                          ttl_ms: int | None) -> MultiGrant:
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT locks, owner, ttl_ms FROM lockd.leases WHERE lease_id = %s FOR UPDATE",
                [lease_id])
            lease = await cur.fetchone()
            if lease is None:
                raise LeaseLost("the multi-lock lease is not live")
            names, owner, own_ttl = lease
            ttl = int(own_ttl if ttl_ms is None else ttl_ms)
            params = {"names": names, "lease_id": lease_id, "ttl_ms": ttl}
            cur = await conn.execute(_SQL_RENEW_SET, params)
            fences = dict(await cur.fetchall())
            if len(fences) != len(names):
                raise LeaseLost("the multi-lock lease is not live")  # rolls back
            await conn.execute(
                "UPDATE lockd.leases SET expires_at = now() + %(ttl_ms)s::int"
                " * interval '1 millisecond', ttl_ms = %(ttl_ms)s WHERE lease_id = %(lease_id)s",
                params)
        return MultiGrant(lease_id, {n: fences[n] for n in names}, ttl, owner)

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """See ``Store.renew_many``: one transaction (lease row, then lock rows in name order)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> MultiGrant:
            return await self._renew_many(conn, lease_id, ttl_ms)

        return await self._run(op, retry=True)

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """See ``Store.release_many``: one statement that deletes the lease row and frees its
        live lock rows (a NOTIFY for each, sent by the commit)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> tuple[tuple[str, ...], bool]:
            cur = await conn.execute(_SQL_RELEASE_MANY, {"lease_id": lease_id})
            row = await cur.fetchone()
            total, names = row if row is not None else (None, None)
            if total is None:
                return (), retried  # a retry: our first attempt's commit deleted the lease row
            freed = tuple(sorted(names or ()))
            return freed, len(freed) == total

        freed, whole = await self._run(op, retry=True)
        if not whole:
            raise LeaseLost("the multi-lock lease is not live")
        return freed

    async def get(self, lock: str) -> LockState:
        """See ``Store.get``."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> LockState:
            cur = await conn.execute(_SQL_GET, {"lock": lock})
            row = await cur.fetchone()
            if row is None:
                return LockState(lock=lock, held=False, fence=0, owner=None, ttl_ms=0)
            return _state(row)

        if "\x00" in lock or not _utf8(lock):
            return LockState(lock=lock, held=False, fence=0, owner=None, ttl_ms=0)
        return await self._run(op, retry=True)

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """See ``Store.list``: a name range scan, so ``%`` and ``_`` in ``prefix`` are literal."""
        if limit <= 0 or "\x00" in prefix or not _utf8(prefix):
            return []
        where = ["name >= %(prefix)s"]
        params: dict[str, Any] = {"prefix": prefix, "limit": int(limit)}
        upper = _prefix_upper(prefix)
        if upper is not None:
            where.append("name < %(upper)s")
            params["upper"] = upper
        if after is not None:
            # No name contains NUL, so "names after a\0b" are exactly "names after a" but "a".
            after = after.split("\x00", 1)[0]
            if not _utf8(after):
                return []
            where.append("name > %(after)s")
            params["after"] = after
        sql = (f"SELECT {_STATE_COLUMNS} FROM lockd.locks WHERE {' AND '.join(where)}"
               " ORDER BY name LIMIT %(limit)s")

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> list[LockState]:
            cur = await conn.execute(sql, params)
            return [_state(row) for row in await cur.fetchall()]

        return await self._run(op, retry=True)

    async def force_release(self, lock: str) -> Holder | None:
        """See ``Store.force_release``: one statement that frees the lock and NOTIFYs."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> Holder | None:
            cur = await conn.execute(_SQL_FORCE_RELEASE, {"lock": lock})
            row = await cur.fetchone()
            return None if row is None else Holder(lock=lock, owner=row[1], ttl_ms=row[2],
                                                   fence=row[0])

        return await self._run(op, retry=True)

    async def clock_offset(self) -> float:
        """PostgreSQL's ``clock_timestamp()`` minus lockd's ``time.time()`` at the midpoint of
        the round trip, in seconds (error at most half the round trip)."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> float:
            sent = time.time()
            cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            row = await cur.fetchone()
            answered = time.time()
            assert row is not None
            return float(row[0]) - (sent + answered) / 2

        return await self._run(op, retry=False)

    def subscribe(self, listener: ReleaseListener) -> None:
        """See ``Store.subscribe``: called on the event loop from the one LISTEN connection."""
        self._listeners.append(listener)

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless PostgreSQL answers ``SELECT 1``."""

        async def op(conn: psycopg.AsyncConnection, retried: bool) -> None:
            await conn.execute("SELECT 1")

        await self._run(op, retry=True)

    # -- LISTEN connection -------------------------------------------------------------------

    def _dispatch(self, name: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception:
                log.exception("release listener failed for lock %r", name)

    async def _listen_forever(self) -> None:
        """Keep one ``LISTEN`` connection alive forever; see the module docstring."""
        assert self._listening is not None
        delay = _RECONNECT_MIN
        last_seen: dt.datetime | None = None
        while True:
            conn: psycopg.AsyncConnection | None = None
            try:
                async with asyncio.timeout(self._pool_timeout + self._heartbeat):
                    conn = await psycopg.AsyncConnection.connect(
                        self._conninfo, autocommit=True, row_factory=tuple_row,
                        **self._conn_kwargs)
                    await conn.execute(f"LISTEN {CHANNEL}")
                    now = await _server_now(conn)
                    missed: list[str] = []
                    if last_seen is not None:
                        cur = await conn.execute(
                            _SQL_CATCH_UP, {"since": last_seen - _CATCH_UP_MARGIN})
                        missed = [r[0] for r in await cur.fetchall()]
                if last_seen is not None:
                    log.info("LISTEN connection re-established; waking waiters of %d lock(s)"
                                " released meanwhile", len(missed))
                last_seen = now
                self._listening.set()
                delay = _RECONNECT_MIN
                for name in missed:
                    self._dispatch(name)
                while True:
                    async for notify in conn.notifies(timeout=self._heartbeat):
                        self._dispatch(notify.payload)
                    async with asyncio.timeout(self._heartbeat):
                        last_seen = await _server_now(conn)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if self._listening.is_set():
                    log.warning("LISTEN connection lost (%s); reconnecting", _first_line(exc))
                else:
                    log.debug("LISTEN connection attempt failed: %s", _first_line(exc))
                self._listening.clear()
            except Exception:
                log.exception("LISTEN loop failed; reconnecting")
                self._listening.clear()
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(1.0):
                            await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX)


async def _server_now(conn: psycopg.AsyncConnection) -> dt.datetime:
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]


def _state(row: tuple) -> LockState:
    name, fence, owner, ttl_ms = row
    return LockState(lock=name, held=owner is not None, fence=fence, owner=owner, ttl_ms=ttl_ms)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _kind(exc: psycopg.Error) -> str:
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}, SQLSTATE {state}" if state else type(exc).__name__
