"""Statements of the PostgreSQL store's lock modes: shared holders (``lockd.shared``), mixed-mode
lock sets, the schema upgrade that adds them, and the full lock state. The lock row stays the one
point of serialization: every shared write locks it first, and its ``shared_until`` is never
below a live shared holder's expiry, so the exclusive grant refuses while any may be live; a
shared grant after an unclean end raises the fence once (``_EPOCH``). docs/stores/postgres.md,
"Lock modes, semaphores, elections".
"""

from __future__ import annotations

from lockd.server.store.postgres.sql import CHANNEL

__all__ = [
    "CATCH_UP", "DDL", "HOLDERS_ANY", "LEASE_BY_CLIENT", "LEASE_BY_ID", "LEASE_DELETE",
    "LEASE_LIVE", "LEASE_MODES",
    "LOCK_MANY", "LOCK_ONE", "LOCK_ROWS", "MANY_GRANT", "MANY_STATE", "RELEASE_MANY_ROWS",
    "RELEASE_SHARED_ALL", "SCHEMA_CURRENT", "SHARED_FAST", "SHARED_GRANT", "SHARED_RELEASE",
    "SHARED_RELEASED_BY", "SHARED_RENEW", "SHARED_RENEW_MANY", "SHARED_UNTIL_FIX", "STATE",
    "SWEEP_SHARED", "list_sql", "ttl",
]


def ttl(col: str) -> str:
    """Milliseconds left until ``col`` by the server's ``now()`` (0 if past or NULL)."""
    return (f"COALESCE(GREATEST(0, ceil(extract(epoch FROM ({col} - now())) * 1000)), 0)"
            "::bigint")


_NEW_EXPIRY = "now() + %(ttl_ms)s::bigint * interval '1 millisecond'"

# SET items of a shared grant's update of lock row ``l``: a new epoch after an unclean end.
_EPOCH = """fence = l.fence + (l.writer_open AND (l.expires_at > now()) IS NOT TRUE)::int,
       writer_open = l.writer_open AND (l.expires_at > now()) IS TRUE"""

# Idempotent, for a new database and for one of the previous version alike (run under the schema
# advisory lock). A lock row first written by a shared grant has fence 0 ("never written").
DDL = """
ALTER TABLE lockd.locks ADD COLUMN IF NOT EXISTS shared_until timestamptz;
ALTER TABLE lockd.locks DROP CONSTRAINT IF EXISTS locks_fence_check;
DO $$ BEGIN
    ALTER TABLE lockd.locks ADD CONSTRAINT locks_fence_nonneg CHECK (fence >= 0);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
CREATE TABLE IF NOT EXISTS lockd.shared (
    name        text COLLATE "C" NOT NULL,
    lease_id    text NOT NULL,
    owner       text NOT NULL DEFAULT '',
    client_id   text,
    expires_at  timestamptz,
    released_at timestamptz,
    ttl_ms      integer NOT NULL,
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (name, lease_id)
);
CREATE INDEX IF NOT EXISTS shared_lease ON lockd.shared (lease_id);
COMMENT ON TABLE lockd.shared IS
    'lockd shared holders: written only while holding the lock row (see lockd.locks.shared_until)';
ALTER TABLE lockd.leases ADD COLUMN IF NOT EXISTS shared text[] NOT NULL DEFAULT '{}';
ALTER TABLE lockd.locks ADD COLUMN IF NOT EXISTS writer_open boolean NOT NULL DEFAULT true;
"""

# True when every table and column of this version exists (else DDL runs, under the lock).
SCHEMA_CURRENT = """
SELECT to_regclass('lockd.locks') IS NOT NULL AND to_regclass('lockd.leases') IS NOT NULL
   AND to_regclass('lockd.shared') IS NOT NULL AND to_regclass('lockd.semaphores') IS NOT NULL
   AND to_regclass('lockd.sem_permits') IS NOT NULL
   AND to_regclass('lockd.elections') IS NOT NULL
   AND to_regclass('lockd.election_log') IS NOT NULL
   AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('lockd.locks')
                  AND attname = 'shared_until' AND NOT attisdropped)
   AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('lockd.leases')
                  AND attname = 'shared' AND NOT attisdropped)
   AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('lockd.locks')
                  AND attname = 'writer_open' AND NOT attisdropped)
"""

_LIVE_L = "(l.expires_at > now()) IS TRUE"
_LIVE_X = "(x.expires_at > now()) IS TRUE"

# Lock (creating it with fence 0 if new) one lock row and read its exclusive lease.
LOCK_ONE = f"""
INSERT INTO lockd.locks AS l (name, fence, writer_open) VALUES (%(lock)s, 0, false)
ON CONFLICT (name) DO UPDATE SET fence = l.fence
RETURNING l.fence, {_LIVE_L}, l.lease_id, l.owner, l.client_id, {ttl('l.expires_at')}
"""

# After LOCK_ONE found no live exclusive lease: renew this client's (or this lease id's) live
# shared lease, else insert a new one; then raise shared_until to cover it (and start a new
# epoch after an unclean end: ``_EPOCH``).
SHARED_GRANT = f"""
WITH mine AS (
    UPDATE lockd.shared SET expires_at = {_NEW_EXPIRY}, ttl_ms = %(ttl_ms)s::int
     WHERE name = %(lock)s AND expires_at > now()
       AND (lease_id = %(lease_id)s OR (client_id = %(client_id)s AND client_id <> ''))
    RETURNING lease_id, owner, expires_at
), ins AS (
    INSERT INTO lockd.shared (name, lease_id, owner, client_id, expires_at, ttl_ms)
    SELECT %(lock)s, %(lease_id)s, %(owner)s, %(client_id)s, {_NEW_EXPIRY}, %(ttl_ms)s::int
     WHERE NOT EXISTS (SELECT 1 FROM mine)
    ON CONFLICT (name, lease_id) DO UPDATE SET expires_at = excluded.expires_at,
        ttl_ms = excluded.ttl_ms, released_at = NULL
    RETURNING lease_id, owner, expires_at
), g AS (SELECT * FROM mine UNION ALL SELECT * FROM ins)
UPDATE lockd.locks l SET shared_until = GREATEST(l.shared_until, g.expires_at), {_EPOCH}
  FROM g WHERE l.name = %(lock)s
RETURNING l.fence, g.lease_id, g.owner, {ttl('g.expires_at')}
"""

# The common shared grant (no client_id) in one autocommit statement: the lock row's upsert,
# judged on its latest version like the exclusive grant, raises shared_until (and starts a new
# epoch after an unclean end) unless an exclusive lease is live (then nothing comes back and
# LOCK_ONE/SHARED_GRANT explain it); the shared row is written only if the lock row was.
SHARED_FAST = f"""
WITH lk AS (
    INSERT INTO lockd.locks AS l (name, fence, shared_until, writer_open)
    VALUES (%(lock)s, 0, {_NEW_EXPIRY}, false)
    ON CONFLICT (name) DO UPDATE SET
        shared_until = GREATEST(l.shared_until, excluded.shared_until), {_EPOCH}
    WHERE (l.expires_at > now()) IS NOT TRUE
    RETURNING l.fence
), ins AS (
    INSERT INTO lockd.shared (name, lease_id, owner, client_id, expires_at, ttl_ms)
    SELECT %(lock)s, %(lease_id)s, %(owner)s, NULL, {_NEW_EXPIRY}, %(ttl_ms)s::int FROM lk
    ON CONFLICT (name, lease_id) DO UPDATE SET expires_at = excluded.expires_at,
        ttl_ms = excluded.ttl_ms, released_at = NULL
    RETURNING owner, expires_at
)
SELECT lk.fence, ins.owner, {ttl('ins.expires_at')} FROM lk, ins
"""

# Lock rows in name order (a transaction's first step); exclusive lease state of each.
LOCK_ROWS = f"""
SELECT l.name, {_LIVE_L}, l.lease_id, l.fence FROM lockd.locks l
 WHERE l.name = ANY(%(names)s::text[]) ORDER BY l.name COLLATE "C" FOR UPDATE
"""

# One statement; ttl_ms NULL: the lease's own TTL. The lock row is updated (and locked) first,
# judged on its latest version: a lease an exclusive grant has outlived is not renewed, whatever
# this statement's now(); shared_until only rises, so no fresh snapshot is needed.
_OWN = """(SELECT coalesce(%(ttl_ms)s::int, o.ttl_ms) FROM lockd.shared o
           WHERE o.name = %(lock)s AND o.lease_id = %(lease_id)s AND o.expires_at > now())"""
SHARED_RENEW = f"""
WITH lk AS (
    UPDATE lockd.locks l
       SET shared_until = GREATEST(l.shared_until, now() + {_OWN} * interval '1 millisecond')
     WHERE l.name = %(lock)s AND (l.expires_at > now()) IS NOT TRUE AND {_OWN} IS NOT NULL
    RETURNING l.fence
), s AS (
    UPDATE lockd.shared AS s
       SET expires_at = now() + coalesce(%(ttl_ms)s::int, s.ttl_ms) * interval '1 millisecond',
           ttl_ms = coalesce(%(ttl_ms)s::int, s.ttl_ms)
     WHERE name = %(lock)s AND lease_id = %(lease_id)s AND expires_at > now()
       AND EXISTS (SELECT 1 FROM lk)
    RETURNING s.owner, s.expires_at
)
SELECT lk.fence, s.owner, {ttl('s.expires_at')} FROM lk, s
"""

# shared_until from the live shared holders but ``%(lease_id)s`` (run after the rows are locked).
_RECOMPUTE = """
(SELECT max(o.expires_at) FROM lockd.shared o
  WHERE o.name = l.name AND o.lease_id <> %(lease_id)s AND o.expires_at > now())
"""

# After LOCK_ROWS, in the same transaction (its snapshot sees the lock row as locked): a lease
# an exclusive grant has outlived is not released (it is lost already).
SHARED_RELEASE = f"""
WITH r AS (
    UPDATE lockd.shared SET expires_at = NULL, released_at = now()
     WHERE name = %(lock)s AND lease_id = %(lease_id)s AND expires_at > now()
       AND NOT EXISTS (SELECT 1 FROM lockd.locks x WHERE x.name = %(lock)s AND {_LIVE_X})
    RETURNING name
), u AS (
    UPDATE lockd.locks l SET shared_until = {_RECOMPUTE}
      FROM r WHERE l.name = r.name RETURNING l.name
)
SELECT pg_notify('{CHANNEL}', name) FROM u
"""

SHARED_RELEASED_BY = """
SELECT 1 FROM lockd.shared
 WHERE name = %(lock)s AND lease_id = %(lease_id)s AND released_at IS NOT NULL
"""

# An operator's force-release, shared part (after LOCK_ROWS): end every live shared holder.
RELEASE_SHARED_ALL = f"""
WITH r AS (
    UPDATE lockd.shared s SET expires_at = NULL, released_at = now()
      FROM (SELECT lease_id, expires_at AS old FROM lockd.shared
             WHERE name = %(lock)s AND expires_at > now()) o
     WHERE s.name = %(lock)s AND s.lease_id = o.lease_id
    RETURNING s.owner, {ttl('o.old')} AS ttl, o.old
), u AS (
    UPDATE lockd.locks SET shared_until = NULL
     WHERE name = %(lock)s AND EXISTS (SELECT 1 FROM r)
)
SELECT owner, ttl, pg_notify('{CHANNEL}', %(lock)s) FROM r ORDER BY old DESC
"""

# Every live lease of each lock: (name, mode, fence, owner, ttl, lease_id, client_id); for a
# lock, an exclusive row first, then shared rows, the last-ending first.
HOLDERS_ANY = f"""
SELECT name, mode, fence, owner, ttl, lease_id, client_id FROM (
    SELECT l.name, 'exclusive' AS mode, l.fence, l.owner, {ttl('l.expires_at')} AS ttl,
           l.lease_id, l.client_id, l.expires_at AS ends, 0 AS rank
      FROM lockd.locks l WHERE l.name = ANY(%(names)s::text[]) AND {_LIVE_L}
    UNION ALL
    SELECT s.name, 'shared', l.fence, s.owner, {ttl('s.expires_at')}, s.lease_id, s.client_id,
           s.expires_at, 1
      FROM lockd.shared s JOIN lockd.locks l ON l.name = s.name
     WHERE s.name = ANY(%(names)s::text[]) AND s.expires_at > now()
) h ORDER BY name, rank, ends DESC
"""

# -- multi-lock leases with modes ---------------------------------------------------------------

LEASE_BY_CLIENT = """
SELECT lease_id, shared FROM lockd.leases
 WHERE client_id = %(client_id)s AND client_id <> '' AND locks = %(names)s::text[]
   AND expires_at > now()
"""

LEASE_BY_ID = "SELECT 1 FROM lockd.leases WHERE lease_id = %(lease_id)s"

# Whether a multi-lock lease still holds every lock of it, in either mode.
LEASE_LIVE = """
SELECT cardinality(ls.locks) = (
    SELECT count(*) FROM lockd.locks l
     WHERE l.name = ANY(ls.locks) AND l.lease_id = ls.lease_id AND l.expires_at > now())
  + (SELECT count(*) FROM lockd.shared s
      WHERE s.name = ANY(ls.locks) AND s.lease_id = ls.lease_id AND s.expires_at > now())
  FROM lockd.leases ls WHERE ls.lease_id = %(lease_id)s AND ls.expires_at > now()
"""

LEASE_MODES = "SELECT locks, owner, ttl_ms, shared FROM lockd.leases WHERE lease_id = %s FOR UPDATE"

# Lock every row of the set in name order ("C" collation, as every multi-row lock of lockd),
# creating missing ones with fence 0; nothing is written to an existing row.
LOCK_MANY = """
INSERT INTO lockd.locks AS l (name, fence, writer_open)
SELECT n, 0, false FROM unnest(%(names)s::text[]) AS n ORDER BY n COLLATE "C"
ON CONFLICT (name) DO UPDATE SET fence = l.fence WHERE false
"""

# The set's state once locked: name, fence, exclusive live, shared live (any live holder).
MANY_STATE = """
SELECT l.name, l.fence, (l.expires_at > now()) IS TRUE,
       EXISTS (SELECT 1 FROM lockd.shared s WHERE s.name = l.name AND s.expires_at > now())
  FROM lockd.locks l WHERE l.name = ANY(%(names)s::text[])
"""

# Grant a locked, free set: exclusive rows raise their fence, shared rows join (a new epoch
# after an unclean end, per lock); the lease row.
MANY_GRANT = f"""
WITH ex AS (
    UPDATE lockd.locks l SET fence = l.fence + 1, lease_id = %(lease_id)s, owner = %(owner)s,
           client_id = NULL, expires_at = {_NEW_EXPIRY}, ttl_ms = %(ttl_ms)s::int,
           released_at = NULL, writer_open = true
     WHERE l.name = ANY(%(excl)s::text[]) RETURNING l.name, l.fence
), sh AS (
    INSERT INTO lockd.shared (name, lease_id, owner, client_id, expires_at, ttl_ms)
    SELECT n, %(lease_id)s, %(owner)s, NULL, {_NEW_EXPIRY}, %(ttl_ms)s::int
      FROM unnest(%(shared)s::text[]) AS n
    ON CONFLICT (name, lease_id) DO UPDATE SET expires_at = excluded.expires_at,
        ttl_ms = excluded.ttl_ms, released_at = NULL
    RETURNING name, expires_at
), su AS (
    UPDATE lockd.locks l SET shared_until = GREATEST(l.shared_until, sh.expires_at), {_EPOCH}
      FROM sh WHERE l.name = sh.name RETURNING l.name, l.fence
), lease AS (
    INSERT INTO lockd.leases (lease_id, locks, owner, client_id, expires_at, ttl_ms, shared)
    VALUES (%(lease_id)s, %(names)s, %(owner)s, %(client_id)s, {_NEW_EXPIRY}, %(ttl_ms)s,
            %(shared)s)
    ON CONFLICT (lease_id) DO NOTHING
)
SELECT name, fence FROM ex UNION ALL SELECT name, fence FROM su
"""

# Renew the shared part of a multi-lock lease (after LOCK_ROWS).
SHARED_RENEW_MANY = f"""
WITH s AS (
    UPDATE lockd.shared SET expires_at = {_NEW_EXPIRY}, ttl_ms = %(ttl_ms)s::int
     WHERE name = ANY(%(shared)s::text[]) AND lease_id = %(lease_id)s AND expires_at > now()
    RETURNING name, expires_at
)
UPDATE lockd.locks l SET shared_until = GREATEST(l.shared_until, s.expires_at)
  FROM s WHERE l.name = s.name RETURNING l.name, l.fence
"""

# End a multi-lock lease's live rows of both modes (after LOCK_ROWS); NOTIFY each freed lock.
RELEASE_MANY_ROWS = f"""
WITH ex AS (
    UPDATE lockd.locks SET expires_at = NULL, released_at = now(), writer_open = false
     WHERE name = ANY(%(names)s::text[]) AND lease_id = %(lease_id)s AND expires_at > now()
    RETURNING name
), sh AS (
    UPDATE lockd.shared SET expires_at = NULL, released_at = now()
     WHERE name = ANY(%(names)s::text[]) AND lease_id = %(lease_id)s AND expires_at > now()
    RETURNING name
), su AS (
    UPDATE lockd.locks l SET shared_until = {_RECOMPUTE}
      FROM sh WHERE l.name = sh.name RETURNING l.name
), freed AS (SELECT name FROM ex UNION ALL SELECT name FROM su)
SELECT name, pg_notify('{CHANNEL}', name) FROM freed
"""

# Released and long-expired shared rows (no longer needed to answer a retried release).
SWEEP_SHARED = """
DELETE FROM lockd.shared
 WHERE coalesce(expires_at, released_at) < now() - interval '15 minutes'
"""

# -- state ----------------------------------------------------------------------------------------

_STATE_COLUMNS = f"""
l.name, l.fence, CASE WHEN {_LIVE_L} THEN l.owner END, {ttl('l.expires_at')} * ({_LIVE_L})::int,
sh.owners, sh.ttls
"""

_STATE_FROM = f"""
FROM lockd.locks l LEFT JOIN LATERAL (
    SELECT array_agg(s.owner ORDER BY s.seq) AS owners,
           array_agg({ttl('s.expires_at')} ORDER BY s.seq) AS ttls
      FROM lockd.shared s WHERE s.name = l.name AND s.expires_at > now()
) sh ON true
"""

STATE = f"SELECT {_STATE_COLUMNS} {_STATE_FROM} WHERE l.name = %(lock)s"


def list_sql(*, upper: bool, after: bool) -> str:
    """``LockStore.list``'s page with every lock's holders: names from ``%(prefix)s`` (below
    ``%(upper)s`` if ``upper``, above ``%(after)s`` if ``after``), at most ``%(limit)s``."""
    where = ["l.name >= %(prefix)s"]
    if upper:
        where.append("l.name < %(upper)s")
    if after:
        where.append("l.name > %(after)s")
    return (f"SELECT {_STATE_COLUMNS} {_STATE_FROM} WHERE {' AND '.join(where)}"
            " ORDER BY l.name LIMIT %(limit)s")


# Names released since ``%(since)s``, by any kind of lease (the LISTEN connection's catch-up).
CATCH_UP = """
SELECT name FROM lockd.locks WHERE released_at >= %(since)s
UNION SELECT name FROM lockd.shared WHERE released_at >= %(since)s
UNION SELECT '#sem/' || name FROM lockd.sem_permits WHERE released_at >= %(since)s
UNION SELECT name FROM lockd.election_log WHERE at >= %(since)s
ORDER BY 1
"""

# A multi-lock lease that holds some locks shared: its row goes first (as in sql.RELEASE_MANY).
LEASE_DELETE = "DELETE FROM lockd.leases WHERE lease_id = %(lease_id)s RETURNING locks, shared"

# Bring shared_until down to the live shared holders' latest expiry (after LOCK_ROWS: a fresh
# snapshot sees every committed shared grant): a renewal to a shorter TTL left it too high, and
# an exclusive request found nobody live to wait for.
SHARED_UNTIL_FIX = """
UPDATE lockd.locks l SET shared_until = (
    SELECT max(s.expires_at) FROM lockd.shared s WHERE s.name = l.name AND s.expires_at > now())
 WHERE l.name = ANY(%(names)s::text[]) AND l.shared_until > now()
"""
