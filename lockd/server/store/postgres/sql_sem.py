"""Statements of the PostgreSQL store's semaphores.

``lockd.semaphores`` holds each semaphore's ``lim`` and fence counter (rows never deleted, so
fences strictly increase forever); ``lockd.sem_permits`` one row per (semaphore, slot), reused
like lock rows. A permit is live iff its row's ``expires_at`` is after ``now()`` AND its slot is
below the semaphore's ``lim``. Every grant locks the semaphore row (``FOR UPDATE``), every renew
and release takes it ``FOR SHARE`` first: a grant sees every committed permit change, and a renew
judged by an earlier ``now()`` cannot revive a permit a grant has already counted as gone (the
slot row's latest version, or the limit, refuses it). Slots are unique among live permits and
below the limit, so no more than ``lim`` permits are ever live. Releases NOTIFY ``#sem/<name>``.
"""

from __future__ import annotations

from lockd.server.store.postgres.sql import ASYNC_COMMIT, CHANNEL
from lockd.server.store.postgres.sql_modes import ttl
from lockd.server.store.values import SEM_KEY_PREFIX

__all__ = ["DDL", "SEM_GET", "SEM_GRANT", "SEM_GRANT_FREE", "SEM_KILL", "SEM_LIVE", "SEM_LOCK", "SEM_PERMITS",
           "SEM_RELEASE", "SEM_RELEASED_BY", "SEM_RENEW", "SEM_RENEW_ONE"]

_NEW_EXPIRY = "now() + %(ttl_ms)s::bigint * interval '1 millisecond'"

DDL = """
CREATE TABLE IF NOT EXISTS lockd.semaphores (
    name  text COLLATE "C" PRIMARY KEY,
    lim   integer NOT NULL CHECK (lim > 0),
    fence bigint NOT NULL DEFAULT 0 CHECK (fence >= 0)
);
COMMENT ON TABLE lockd.semaphores IS
    'lockd semaphores: limit and fence counter; never delete rows (fence counter)';
CREATE TABLE IF NOT EXISTS lockd.sem_permits (
    name        text COLLATE "C" NOT NULL,
    slot        integer NOT NULL CHECK (slot >= 0),
    lease_id    text NOT NULL,
    owner       text NOT NULL DEFAULT '',
    client_id   text,
    fence       bigint NOT NULL,
    expires_at  timestamptz,
    released_at timestamptz,
    ttl_ms      integer NOT NULL,
    PRIMARY KEY (name, slot)
);
COMMENT ON TABLE lockd.sem_permits IS 'lockd semaphore permits: one row per slot, reused';
"""

# Lock (creating it) the semaphore row; its limit and last fence.
SEM_LOCK = """
INSERT INTO lockd.semaphores AS s (name, lim) VALUES (%(name)s, %(limit)s)
ON CONFLICT (name) DO UPDATE SET lim = s.lim
RETURNING s.lim, s.fence
"""

# After SEM_LOCK, in its transaction: the live permits (slot, lease_id, owner, client_id,
# fence, ttl).
SEM_LIVE = f"""
SELECT slot, lease_id, owner, client_id, fence, {ttl('expires_at')} FROM lockd.sem_permits
 WHERE name = %(name)s AND expires_at > now()
   AND slot < (SELECT lim FROM lockd.semaphores WHERE name = %(name)s) ORDER BY slot
"""

# The limit changes only with no live permit: end every row still dated live (slots at or above
# the old limit, judged gone) so that a larger limit cannot revive one.
SEM_KILL = """
UPDATE lockd.sem_permits SET expires_at = NULL
 WHERE name = %(name)s AND expires_at IS NOT NULL
"""

SEM_GRANT = f"""
WITH f AS (
    UPDATE lockd.semaphores SET lim = %(limit)s, fence = fence + 1 WHERE name = %(name)s
    RETURNING fence
)
INSERT INTO lockd.sem_permits AS p (name, slot, lease_id, owner, client_id, fence, expires_at,
                                    ttl_ms)
SELECT %(name)s, %(slot)s, %(lease_id)s, %(owner)s, %(client_id)s, f.fence, {_NEW_EXPIRY},
       %(ttl_ms)s::int FROM f
ON CONFLICT (name, slot) DO UPDATE SET lease_id = excluded.lease_id, owner = excluded.owner,
    client_id = excluded.client_id, fence = excluded.fence, expires_at = excluded.expires_at,
    ttl_ms = excluded.ttl_ms, released_at = NULL
 WHERE (p.expires_at > now()) IS NOT TRUE
RETURNING p.fence, {ttl('p.expires_at')}
"""

# After SEM_LOCK, in its transaction (a fresh snapshot sees every committed permit change): the
# common grant in the same round trip as the lock. Only when the limit is unchanged, the
# semaphore not full and no live permit is this lease's or this client's: take the lowest free
# slot with the next fence. Nothing back: SEM_LIVE and the caller decide (retry, mismatch, full).
SEM_GRANT_FREE = f"""
WITH s AS (SELECT lim FROM lockd.semaphores WHERE name = %(name)s),
live AS (
    SELECT p.slot, p.lease_id, p.client_id FROM lockd.sem_permits p, s
     WHERE p.name = %(name)s AND p.expires_at > now() AND p.slot < s.lim
), pick AS (
    SELECT min(c.slot) AS slot FROM (SELECT 0 AS slot UNION ALL SELECT slot + 1 FROM live) c
     WHERE c.slot < %(limit)s AND c.slot NOT IN (SELECT slot FROM live)
       AND (SELECT lim FROM s) = %(limit)s
       AND NOT EXISTS (SELECT 1 FROM live WHERE lease_id = %(lease_id)s
                          OR (client_id = %(client_id)s AND client_id <> ''))
), f AS (
    UPDATE lockd.semaphores SET fence = fence + 1
     WHERE name = %(name)s AND (SELECT slot FROM pick) IS NOT NULL
    RETURNING fence
)
INSERT INTO lockd.sem_permits AS p (name, slot, lease_id, owner, client_id, fence, expires_at,
                                    ttl_ms)
SELECT %(name)s, pick.slot, %(lease_id)s, %(owner)s, %(client_id)s, f.fence, {_NEW_EXPIRY},
       %(ttl_ms)s::int FROM f, pick
ON CONFLICT (name, slot) DO UPDATE SET lease_id = excluded.lease_id, owner = excluded.owner,
    client_id = excluded.client_id, fence = excluded.fence, expires_at = excluded.expires_at,
    ttl_ms = excluded.ttl_ms, released_at = NULL
 WHERE (p.expires_at > now()) IS NOT TRUE
RETURNING p.slot, p.fence, {ttl('p.expires_at')}
"""

_SEM_SHARE = "SELECT lim FROM lockd.semaphores WHERE name = %(name)s FOR SHARE"

# ttl_ms NULL: the permit's own TTL.
SEM_RENEW = f"""
WITH s AS ({_SEM_SHARE})
UPDATE lockd.sem_permits p
   SET expires_at = now() + coalesce(%(ttl_ms)s::int, p.ttl_ms) * interval '1 millisecond',
       ttl_ms = coalesce(%(ttl_ms)s::int, p.ttl_ms)
  FROM s
 WHERE p.name = %(name)s AND p.lease_id = %(lease_id)s AND p.expires_at > now() AND p.slot < s.lim
RETURNING p.fence, p.slot, s.lim, p.owner, {ttl('p.expires_at')}
"""

# Inside a grant's transaction (the semaphore row is locked): a client_id retry's renewal.
SEM_RENEW_ONE = f"""
UPDATE lockd.sem_permits SET expires_at = {_NEW_EXPIRY}, ttl_ms = %(ttl_ms)s::int
 WHERE name = %(name)s AND slot = %(slot)s
RETURNING fence, {ttl('expires_at')}
"""

# The commit does not wait for its WAL flush, like a lock's release (sql.RELEASE): a permit
# whose release a crash loses is live again until its expiry; the grant that took its slot
# committed synchronously, so it cannot survive without the release.
SEM_RELEASE = f"""
WITH s AS ({_SEM_SHARE}), async_commit AS ({ASYNC_COMMIT}), r AS (
    UPDATE lockd.sem_permits p SET expires_at = NULL, released_at = now()
      FROM s
     WHERE p.name = %(name)s AND p.lease_id = %(lease_id)s AND p.expires_at > now()
       AND p.slot < s.lim
    RETURNING p.name
)
SELECT pg_notify('{CHANNEL}', '{SEM_KEY_PREFIX}' || name) FROM r, async_commit
"""

SEM_RELEASED_BY = """
SELECT 1 FROM lockd.sem_permits
 WHERE name = %(name)s AND lease_id = %(lease_id)s AND released_at IS NOT NULL
"""

SEM_GET = "SELECT lim, fence FROM lockd.semaphores WHERE name = %(name)s"

SEM_PERMITS = f"""
SELECT p.owner, p.slot, {ttl('p.expires_at')}, p.fence
  FROM lockd.sem_permits p JOIN lockd.semaphores s ON s.name = p.name
 WHERE p.name = %(name)s AND p.expires_at > now() AND p.slot < s.lim ORDER BY p.slot
"""
