"""The fence check: the highest fence honoured per lock, kept in the protected database itself.

Why in the same database, in the same transaction as the write: the check and the write must
be one atomic step, or a stale holder slips between them. The timeline the check prevents::

    t0  A acquires lock L, fence 33; A pauses (GC, stalled disk, partition) ...
    t1  A's lease expires; B acquires L, fence 34; B writes row r with fence 34
        -> fences[L].highest = 34, committed together with B's write
    t2  A wakes up, still believes it holds L, writes row r with fence 33
        -> the conditional upsert finds 34 > 33: nothing is written, 409 stale_token

and the concurrent version of t1/t2 (A's and B's writes in flight at once): the fence upsert
takes the fence row's lock and keeps it until COMMIT, so the writes for one lock are serialized
in fence-row order. Whichever comes second re-reads the committed highest: if A (33) comes after
B (34) it is refused; if A comes first it commits before B does, so a lower fence can never commit
after a higher one (invariant 4). Any number of proxies may share the database: the row lock is
the only coordination they need.

The statement::

    INSERT INTO fences (lock, highest) VALUES (:lock, :fence)
    ON CONFLICT (lock) DO UPDATE SET highest = GREATEST(fences.highest, excluded.highest)
    RETURNING highest

is the conditional upsert ``… SET highest = excluded.highest WHERE fences.highest <=
excluded.highest``, written so that it always returns the highest after the check: the presented
fence passed iff the returned value equals it; otherwise the returned value is the ``highest``
of the 409, read under the row lock (a later ``SELECT`` could see an older snapshot). Equal
fences pass: they are the same holder's next write.

Which fence a token presents, and for what (write or read), is ``lockd.common.fencerule``'s one
rule; ``held`` gives its refusal the proxy's 403. Writes, batches and claims raise the highest
for ``WRITE``; fenced reads (and a shared token's claim-for-read) for ``READ``: the same raise
and the same staleness test, but the claim never lets a row be written.

On PostgreSQL the table is ``fencing.fences``, the one the database-side fence triggers read
(``dbfence``), and the proxy raises it through ``fencing.try_claim``/``try_claim_read``/
``try_claim_many``: the same conditional upsert, which also records the claim (for writing or
for reading only) for the transaction, so the proxy's own writes pass the row triggers where
``resource-proxy db install`` put them. At start the proxy creates
that core (schema, table, claim functions; never the triggers) if missing, moving an older
``resource_proxy.fences`` there. SQLite, which has no schemas, keeps ``resource_proxy_fences``
(and serializes writers with ``BEGIN IMMEDIATE``). Both are created idempotently at start, before
any request is served; the ``Idempotency-Key`` records stay in the proxy's own schema
(``resource_proxy``) on PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa

from lockd.common.fencerule import Fence, Purpose, SharedHold, fence_for, fences_of, stale
from lockd.common.names import LOCK_NAME_RULE, is_lock_name
from lockd.tokens import Claims
from resource_proxy.dbfence.grants import not_granted
from resource_proxy.dbfence.install import ensure_core
from resource_proxy.errors import InvalidRequest, SharedToken, StaleToken
from resource_proxy.idempotency import add_fences_column, idempotency_table

__all__ = [
    "PG_SCHEMA",
    "PG_FENCES",
    "SQLITE_TABLE",
    "held",
    "held_all",
    "check",
    "check_all",
    "ClaimNotGranted",
    "create_fence_table",
    "validate_lock_name",
]

PG_SCHEMA = "resource_proxy"  # the proxy's own schema (Idempotency-Key records)
PG_FENCES = "fencing.fences"  # dbfence's: shared with the row triggers and fenced_transaction
SQLITE_TABLE = "resource_proxy_fences"
_LEGACY = "resource_proxy.fences"  # where proxies kept the fences before the fencing schema
_ADVISORY_KEY = 0x5250_4645_4E43  # "RPFENC": serializes concurrent first starts on PostgreSQL

log = logging.getLogger("resource_proxy")
# the claim functions the proxy's statements call (store.sql)
_PROXY_CLAIMS = ("fencing.try_claim(text,bigint)", "fencing.try_claim_read(text,bigint)",
                 "fencing.try_claim_many(text[],bigint[],text[])")
_OWNERS = """SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relname = ANY(%(t)s)"""


class ClaimNotGranted(ValueError):
    """The proxy's database role may not execute a claim function it calls (one line saying
    how to grant it: ``resource-proxy db install --claim-role``)."""


def held(claims: Claims, lock: str, purpose: Purpose | None) -> Fence | None:
    """``fencerule.fence_for`` with the proxy's error: the token's ``Fence`` for ``lock`` (None
    if it does not hold it); 403 ``shared_token`` naming the lock for a ``WRITE`` under a
    shared hold, before the store is called, so nothing is written or raised."""
    try:
        return fence_for(claims, lock, purpose)
    except SharedHold as exc:
        raise SharedToken(exc.lock) from None


def held_all(claims: Claims, purpose: Purpose | None) -> list[Fence]:
    """``fencerule.fences_of`` (every lock of the token, lock order) with the proxy's error."""
    try:
        return fences_of(claims, purpose)
    except SharedHold as exc:
        raise SharedToken(exc.lock) from None


def validate_lock_name(name: str) -> str:
    """``name`` if it is a lock name (``lockd.common.names``: 1-255 of ``A-Za-z0-9._:/-``, no
    empty, ``.`` or ``..`` segment), else ``InvalidRequest`` (422)."""
    if not is_lock_name(name):
        raise InvalidRequest(LOCK_NAME_RULE)
    return name


def check(fence: Fence, highest: int) -> None:
    """Raise ``StaleToken`` unless the upsert's returned ``highest`` is the presented fence."""
    check_all([fence], [highest])


def check_all(fences: Sequence[Fence], highests: Sequence[int]) -> None:
    """Raise ``StaleToken`` unless every upsert returned its presented fence (``fencerule.stale``).

    The error names the first stale lock (lock order) in ``lock``/``presented``/``highest``;
    for a multi-lock token it also lists every stale lock in ``stale``
    (``[{"lock", "presented", "highest"}, ...]``).
    """
    found = stale(fences, highests)
    if not found:
        return
    first, highest = found[0]
    if not any(f.multi for f in fences):
        raise StaleToken(first.lock, first.fence, highest)
    raise StaleToken(first.lock, first.fence, highest, stale=[
        {"lock": f.lock, "presented": f.fence, "highest": h} for f, h in found])


def create_fence_table(engine: sa.Engine, fenced: Sequence[str] = ()) -> None:
    """Create the fence table and the ``Idempotency-Key`` record table (``idempotency``) if they
    are missing, and add the record table's newer columns (safe when several proxies start at
    once). On PostgreSQL: ``dbfence``'s core (``ensure_core``), created for the owner of the
    ``fenced`` tables when they have one owner the proxy's role may act as (so that owner can
    run ``db install`` later); fences of an older proxy's ``resource_proxy.fences`` are kept.
    ``ClaimNotGranted`` if the proxy's role may not execute the claim functions."""
    metadata = sa.MetaData()
    if engine.dialect.name != "postgresql":
        table = sa.Table(SQLITE_TABLE, metadata, sa.Column("lock", sa.Text, primary_key=True),
                         sa.Column("highest", sa.BigInteger, nullable=False))
        records = idempotency_table(engine.dialect.name, metadata, None)
        with engine.begin() as conn:
            table.create(conn, checkfirst=True)
            records.create(conn, checkfirst=True)
            add_fences_column(conn, records)
        return
    records = idempotency_table(engine.dialect.name, metadata, PG_SCHEMA)
    with engine.begin() as conn:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_ADVISORY_KEY)))
        if conn.exec_driver_sql("SELECT to_regnamespace(%(s)s)", {"s": PG_SCHEMA}).scalar() is None:
            conn.execute(sa.schema.CreateSchema(PG_SCHEMA, if_not_exists=True))
        records.create(conn, checkfirst=True)
        add_fences_column(conn, records)
        owners = conn.exec_driver_sql(_OWNERS, {"t": list(fenced)}).scalars().all()
        changed = ensure_core(conn, owner=owners[0] if len(owners) == 1 else None).changed
        if conn.exec_driver_sql(f"SELECT to_regclass('{_LEGACY}')").scalar() is not None:
            _merge_legacy(conn)
        refused = not_granted(conn, _PROXY_CLAIMS)
        if refused is not None:
            me = conn.exec_driver_sql("SELECT current_user").scalar()
            raise ClaimNotGranted(f"role {me!r} may not execute {refused}: resource-proxy db "
                                  f"install --claim-role {me}")
    if changed:
        log.info("fence table and claim functions (schema fencing): %d object(s) created or "
                 "updated", len(changed))


def _merge_legacy(conn: sa.Connection) -> None:
    """Both fence tables exist (an older proxy created its own again after the move): every
    fence of the old one goes into ``fencing.fences`` (the higher of the two wins, fences only
    rise) and the old one is dropped, so a proxy of the older version fails instead of checking
    against a table the others no longer raise."""
    moved = conn.exec_driver_sql(
        f"INSERT INTO {PG_FENCES} AS f (lock, highest) SELECT lock, highest FROM {_LEGACY} "
        "ON CONFLICT (lock) DO UPDATE SET highest = GREATEST(f.highest, excluded.highest)"
    ).rowcount
    conn.exec_driver_sql(f"DROP TABLE {_LEGACY}")
    log.warning("%s existed beside %s (a proxy of an older version?): its %d fence(s) were "
                "merged into %s and it was dropped", _LEGACY, PG_FENCES, moved, PG_FENCES)
