"""The PostgreSQL store's statements on exclusive leases, its first schema and the NOTIFY channel
(lock modes, semaphores and elections: ``sql_modes``, ``sql_sem``, ``sql_elect``).

All text is constant (values are psycopg's named parameters), so statements are prepared after a
few uses. Expiry is judged only by the database's ``now()``; a grant raises the lock row's fence
in the statement that installs the lease and sets ``writer_open`` (its lease has not ended by a
clean release: see ``sql_modes``); a release clears it and NOTIFYs ``CHANNEL`` with the lock name
in its own commit. The reasoning behind each statement: docs/stores/postgres.md ("Statements").
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE", "ACQUIRE_BATCH", "ACQUIRE_MANY", "ASYNC_COMMIT", "CHANNEL", "CLOCK", "CONFIGURE",
    "DDL", "FORCE_RELEASE", "LISTEN", "NOW", "PING", "RELEASE", "RELEASED_BY", "RELEASE_BATCH",
    "RELEASE_MANY", "RENEW", "RENEW_BATCH", "RENEW_LEASE_ROW", "RENEW_SET", "SCHEMA_LOCK", "SCHEMA_LOCK_KEY",
    "SWEEP_LEASES",
]

CHANNEL = "lockd_release"
"""The NOTIFY channel a release signals on; the payload is the lock name."""

SCHEMA_LOCK_KEY = 0x6C6F636B64  # "lockd": serializes schema creation across processes

# -- fragments ----------------------------------------------------------------------------------

_TTL = "COALESCE(GREATEST(0, ceil(extract(epoch FROM (expires_at - now())) * 1000)), 0)::bigint"
_LIVE = "(expires_at > now()) IS TRUE"
_NEW_EXPIRY = "now() + %(ttl_ms)s::bigint * interval '1 millisecond'"

DDL = """
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
ACQUIRE_MANY = f"""
WITH up AS (
    INSERT INTO lockd.locks AS l (name, fence, lease_id, owner, client_id, expires_at, ttl_ms,
                                  writer_open)
    SELECT n, 1, %(lease_id)s, %(owner)s, NULL, {_NEW_EXPIRY}, %(ttl_ms)s::int, true
      FROM unnest(%(names)s::text[]) AS n ORDER BY n COLLATE "C"
    ON CONFLICT (name) DO UPDATE SET
        fence = l.fence + 1, lease_id = excluded.lease_id, owner = excluded.owner,
        client_id = NULL, expires_at = excluded.expires_at, ttl_ms = excluded.ttl_ms,
        released_at = NULL, writer_open = true
    WHERE (l.expires_at > now()) IS NOT TRUE AND (l.shared_until > now()) IS NOT TRUE
    RETURNING name, fence, {_TTL} AS ttl
), lease AS (
    INSERT INTO lockd.leases (lease_id, locks, owner, client_id, expires_at, ttl_ms)
    SELECT %(lease_id)s, %(names)s, %(owner)s, %(client_id)s, {_NEW_EXPIRY}, %(ttl_ms)s
     WHERE (SELECT count(*) FROM up) = cardinality(%(names)s::text[])
    ON CONFLICT (lease_id) DO NOTHING
)
SELECT name, fence, ttl FROM up
"""

# The lease's live lock rows, locked in name order.
_LOCK_SET = """
SELECT name FROM lockd.locks
 WHERE name = ANY(%(names)s::text[]) AND lease_id = %(lease_id)s AND expires_at > now()
 ORDER BY name COLLATE "C" FOR UPDATE
"""

RENEW_SET = f"""
WITH sel AS ({_LOCK_SET})
UPDATE lockd.locks l
   SET expires_at = now() + %(ttl_ms)s::int * interval '1 millisecond', ttl_ms = %(ttl_ms)s::int
  FROM sel WHERE l.name = sel.name
RETURNING l.name, l.fence
"""

# One statement: the lease row (deleted first: the same order as a renew), then the set's live
# lock rows in name order; every freed lock NOTIFYs with the commit. A lease holding some locks
# shared is not matched: sql_modes.RELEASE_MANY_ROWS ends it, in a transaction.
RELEASE_MANY = f"""
WITH lease AS (
    DELETE FROM lockd.leases WHERE lease_id = %(lease_id)s AND shared = '{{}}' RETURNING locks
), sel AS (
    SELECT name FROM lockd.locks
     WHERE name = ANY((SELECT locks FROM lease)::text[]) AND lease_id = %(lease_id)s
       AND expires_at > now()
     ORDER BY name COLLATE "C" FOR UPDATE
), r AS (
    UPDATE lockd.locks l SET expires_at = NULL, released_at = now(), writer_open = false
      FROM sel WHERE l.name = sel.name
    RETURNING l.name, pg_notify('{CHANNEL}', l.name)
)
SELECT (SELECT cardinality(locks) FROM lease), (SELECT array_agg(name) FROM r)
"""

# A live shared holder keeps ``shared_until`` in the future (see sql_modes): the exclusive
# grant is refused, judged on the row's latest version like everything else here.
# The upsert's conflict arm, shared by ACQUIRE and ACQUIRE_BATCH: a live lease is kept (its
# own lease id or client id asking again renews it: a retry), a free row is granted anew.
_GRANT_ON_CONFLICT = """
    ON CONFLICT (name) DO UPDATE SET
        fence = CASE WHEN l.expires_at > now() THEN l.fence ELSE l.fence + 1 END,
        lease_id = CASE WHEN l.expires_at > now() THEN l.lease_id ELSE excluded.lease_id END,
        owner = CASE WHEN l.expires_at > now() THEN l.owner ELSE excluded.owner END,
        client_id = CASE WHEN l.expires_at > now() THEN l.client_id ELSE excluded.client_id END,
        expires_at = excluded.expires_at,
        ttl_ms = excluded.ttl_ms,
        released_at = NULL,
        writer_open = true
    WHERE ((l.expires_at > now()) IS NOT TRUE AND (l.shared_until > now()) IS NOT TRUE)
       OR ((l.expires_at > now()) IS TRUE
           AND (l.lease_id = excluded.lease_id
                OR (l.client_id = excluded.client_id AND excluded.client_id <> '')))"""

# A live shared holder keeps ``shared_until`` in the future (see sql_modes): the exclusive
# grant is refused, judged on the row's latest version like everything else here.
ACQUIRE = f"""
WITH up AS (
    INSERT INTO lockd.locks AS l (name, fence, lease_id, owner, client_id, expires_at, ttl_ms,
                                  writer_open)
    VALUES (%(lock)s, 1, %(lease_id)s, %(owner)s, %(client_id)s, {_NEW_EXPIRY}, %(ttl_ms)s::int,
            true)
{_GRANT_ON_CONFLICT}
    RETURNING lease_id, fence, owner, {_TTL} AS ttl_ms
)
SELECT true, lease_id, fence, owner, ttl_ms FROM up
UNION ALL
SELECT false, NULL, fence, owner, CASE WHEN {_LIVE} THEN {_TTL} ELSE 0 END
  FROM lockd.locks WHERE name = %(lock)s AND NOT EXISTS (SELECT 1 FROM up)
"""

# ACQUIRE for several requests, each on a different lock (one upsert must not meet a row twice),
# in one autocommit statement: one commit (one WAL flush) for all of them. Rows are taken in
# name order like every other statement that locks several. A granted request comes back from
# ``up``; a refused one with its row as the statement's snapshot saw it, as from ACQUIRE.
ACQUIRE_BATCH = f"""
WITH req AS (
    SELECT * FROM unnest(%(locks)s::text[], %(lease_ids)s::text[], %(owners)s::text[],
                         %(client_ids)s::text[], %(ttls)s::int[])
                  AS r(name, lease_id, owner, client_id, ttl_ms)
), up AS (
    INSERT INTO lockd.locks AS l (name, fence, lease_id, owner, client_id, expires_at, ttl_ms,
                                  writer_open)
    SELECT name, 1, lease_id, owner, client_id,
           now() + ttl_ms::bigint * interval '1 millisecond', ttl_ms, true
      FROM req ORDER BY name COLLATE "C"
{_GRANT_ON_CONFLICT}
    RETURNING name, lease_id, fence, owner, {_TTL} AS ttl_ms
)
SELECT true, name, lease_id, fence, owner, ttl_ms FROM up
UNION ALL
SELECT false, name, NULL, fence, owner, CASE WHEN {_LIVE} THEN {_TTL} ELSE 0 END
  FROM lockd.locks
 WHERE name = ANY(%(locks)s::text[]) AND name NOT IN (SELECT name FROM up)
"""

# ttl_ms NULL: the lease's own TTL (the last one granted or renewed with).
RENEW = f"""
UPDATE lockd.locks AS l
   SET expires_at = now() + coalesce(%(ttl_ms)s::int, l.ttl_ms) * interval '1 millisecond',
       ttl_ms = coalesce(%(ttl_ms)s::int, l.ttl_ms)
 WHERE name = %(lock)s AND lease_id = %(lease_id)s AND expires_at > now()
RETURNING fence, owner, {_TTL}
"""

# RENEW for several (lock, lease id, ttl_ms) triples in one statement: the live rows locked in
# name order like every statement that locks several; the renewed ones come back (a triple not
# renewed is not live as an exclusive lease: the caller asks again alone).
RENEW_BATCH = f"""
WITH q AS (
    SELECT * FROM unnest(%(locks)s::text[], %(lease_ids)s::text[], %(ttls)s::int[])
                  AS q(name, lease_id, ttl_ms)
), sel AS (
    SELECT l.name, q.ttl_ms FROM lockd.locks l JOIN q ON l.name = q.name AND l.lease_id = q.lease_id
     WHERE l.expires_at > now()
     ORDER BY l.name COLLATE "C" FOR UPDATE OF l
)
UPDATE lockd.locks AS l
   SET expires_at = now() + coalesce(sel.ttl_ms, l.ttl_ms) * interval '1 millisecond',
       ttl_ms = coalesce(sel.ttl_ms, l.ttl_ms)
  FROM sel WHERE l.name = sel.name
RETURNING l.name, l.fence, l.owner, {_TTL}
"""

# The release's commit does not wait for its WAL flush (see "Release commits" in
# docs/stores/postgres.md): ``set_config(…, true)`` lasts for this statement's own transaction only
# (shared and permit releases run it too, inside their transaction or as a CTE).
ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"

RELEASE = f"""
WITH r AS (
    UPDATE lockd.locks SET expires_at = NULL, released_at = now(), writer_open = false
     WHERE name = %(lock)s AND lease_id = %(lease_id)s AND expires_at > now()
    RETURNING name
), async_commit AS ({ASYNC_COMMIT})
SELECT pg_notify('{CHANNEL}', name) FROM r, async_commit
"""

# RELEASE for several (lock, lease id) pairs in one statement: the live rows locked in name
# order, each freed one NOTIFYs; the freed names come back (a pair not freed is not a release).
RELEASE_BATCH = f"""
WITH sel AS (
    SELECT l.name, l.lease_id FROM lockd.locks l
      JOIN unnest(%(locks)s::text[], %(lease_ids)s::text[]) AS q(name, lease_id)
        ON l.name = q.name AND l.lease_id = q.lease_id
     WHERE l.expires_at > now()
     ORDER BY l.name COLLATE "C" FOR UPDATE OF l
), r AS (
    UPDATE lockd.locks l SET expires_at = NULL, released_at = now(), writer_open = false
      FROM sel WHERE l.name = sel.name AND l.lease_id = sel.lease_id AND l.expires_at > now()
    RETURNING l.name
), async_commit AS ({ASYNC_COMMIT})
SELECT name, pg_notify('{CHANNEL}', name) FROM r, async_commit
"""

# An operator's force-release: end whatever lease is live, keep the fence, NOTIFY like a release.
# No clean release: ``writer_open`` stays true (the next shared grant starts a new epoch).
FORCE_RELEASE = f"""
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
RELEASED_BY = """
SELECT 1 FROM lockd.locks
 WHERE name = %(lock)s AND lease_id = %(lease_id)s AND released_at IS NOT NULL
"""

# -- multi-lock lease rows ---------------------------------------------------------------------

RENEW_LEASE_ROW = """
UPDATE lockd.leases SET expires_at = now() + %(ttl_ms)s::int * interval '1 millisecond',
       ttl_ms = %(ttl_ms)s
 WHERE lease_id = %(lease_id)s
"""

# Lease rows of expired sets (their lock rows expire by themselves): deleted now and then.
SWEEP_LEASES = "DELETE FROM lockd.leases WHERE expires_at < now()"

# -- schema, connections, health ----------------------------------------------------------------

SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(%s)"

# A grant acknowledged before its commit is durable could hand out its fence again after a
# crash: never let lockd's connections run with synchronous_commit = off.
CONFIGURE = """
SELECT set_config('synchronous_commit', 'on', false)
 WHERE current_setting('synchronous_commit') = 'off'
"""

LISTEN = f"LISTEN {CHANNEL}"

NOW = "SELECT now()"

PING = "SELECT 1"

CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"

