"""Statements of the PostgreSQL store's elections.

The leader is the live exclusive lease of lock ``name`` (its fence sequence is the lock's).
``lockd.elections`` holds, per election, the value and the lease it belongs to (a value shows
only while that lease leads), the pending handover and the lease it addresses, and the last log
seq; ``lockd.election_log`` the append-only log (rows older than the last 1,024 entries of an
election are trimmed now and then). Every write locks the lock row first, then the election row,
runs in one transaction with the grant/renew/release it belongs to, and NOTIFYs the name.
"""

from __future__ import annotations

from lockd.server.store.postgres.sql import CHANNEL, RENEW
from lockd.server.store.postgres.sql_modes import ttl

__all__ = ["DDL", "ELECT_GET", "ELECT_HANDOVER", "ELECT_LEADER", "ELECT_LEASE", "ELECT_LOG",
           "ELECT_RELEASE", "ELECT_RENEW", "ELECT_TRIM", "ELECT_WRITE", "KEEP"]

KEEP = 1024
"""Log entries kept per election at least (the trim runs every 64 appends)."""

DDL = """
CREATE TABLE IF NOT EXISTS lockd.elections (
    name           text COLLATE "C" PRIMARY KEY,
    value          text NOT NULL DEFAULT '',
    lease_id       text,
    handover       text,
    handover_lease text,
    seq            bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lockd.election_log (
    name  text COLLATE "C" NOT NULL,
    seq   bigint NOT NULL,
    kind  text NOT NULL,
    owner text NOT NULL,
    value text NOT NULL,
    fence bigint NOT NULL,
    at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, seq)
);
COMMENT ON TABLE lockd.election_log IS 'lockd election changes; seq per election, never reused';
"""

# The election row of a locked lock row (FOR UPDATE): whose value it holds.
ELECT_LEASE = "SELECT lease_id FROM lockd.elections WHERE name = %(name)s FOR UPDATE"

# The live leader's lock row, locked: fence, owner, ttl.
ELECT_LEADER = f"""
SELECT fence, owner, {ttl('expires_at')}, lease_id FROM lockd.locks
 WHERE name = %(name)s AND expires_at > now() AND (%(lease_id)s::text IS NULL
       OR lease_id = %(lease_id)s) FOR UPDATE
"""

# Append one entry (and set the row's value/lease; ``%(clear)s`` drops a pending handover).
ELECT_WRITE = f"""
WITH e AS (
    INSERT INTO lockd.elections AS e (name, value, lease_id, seq)
    VALUES (%(name)s, %(value)s, %(lease_id)s, 1)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, lease_id = excluded.lease_id,
        handover = CASE WHEN %(clear)s THEN NULL ELSE e.handover END,
        handover_lease = CASE WHEN %(clear)s THEN NULL ELSE e.handover_lease END,
        seq = e.seq + 1
    RETURNING e.seq, e.handover, e.handover_lease
), log AS (
    INSERT INTO lockd.election_log (name, seq, kind, owner, value, fence)
    SELECT %(name)s, e.seq, %(kind)s, %(owner)s, %(value)s, %(fence)s FROM e
)
SELECT seq, CASE WHEN handover_lease = %(lease_id)s THEN handover END,
       pg_notify('{CHANNEL}', %(name)s) FROM e
"""

ELECT_TRIM = "DELETE FROM lockd.election_log WHERE name = %(name)s AND seq <= %(upto)s"

ELECT_HANDOVER = f"""
WITH e AS (
    INSERT INTO lockd.elections AS e (name, handover, handover_lease)
    VALUES (%(name)s, %(target)s, %(lease_id)s)
    ON CONFLICT (name) DO UPDATE SET handover = excluded.handover,
        handover_lease = excluded.handover_lease
    RETURNING e.seq
)
SELECT seq, pg_notify('{CHANNEL}', %(name)s) FROM e
"""

# The leader's renewal and the handover addressed to its lease, in one statement.
ELECT_RENEW = f"""
WITH r AS ({RENEW})
SELECT r.*, (SELECT handover FROM lockd.elections
              WHERE name = %(lock)s AND handover_lease = %(lease_id)s) FROM r
"""

ELECT_RELEASE = """
UPDATE lockd.locks SET expires_at = NULL, released_at = now(), writer_open = false
 WHERE name = %(name)s AND lease_id = %(lease_id)s AND expires_at > now()
RETURNING fence, owner
"""

_LIVE = "(l.expires_at > now()) IS TRUE"

# fence, leader owner (NULL: none), ttl, value of the leader, seq, handover to the leader.
ELECT_GET = f"""
SELECT coalesce(l.fence, 0), CASE WHEN {_LIVE} THEN l.owner END,
       {ttl('l.expires_at')} * ({_LIVE})::int,
       CASE WHEN {_LIVE} AND e.lease_id = l.lease_id THEN e.value ELSE '' END,
       coalesce(e.seq, 0),
       CASE WHEN {_LIVE} AND e.handover_lease = l.lease_id THEN e.handover END
  FROM (SELECT %(name)s::text AS name) n
  LEFT JOIN lockd.locks l ON l.name = n.name
  LEFT JOIN lockd.elections e ON e.name = n.name
"""

ELECT_LOG = """
SELECT seq, kind, owner, value, fence FROM lockd.election_log
 WHERE name = %(name)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s
"""
