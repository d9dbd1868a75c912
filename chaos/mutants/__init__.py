"""Mutation testing of the chaos suite: plant one realistic bug at a time, see the checker bite.

Each ``Mutant`` is a list of ``Edit``s (file, a small stable snippet of product code, its
replacement). ``apply_to(root)`` edits a *copy* of the tree (``copy_tree``) and raises
``MutantNoLongerApplies`` naming the mutant and the file when a snippet is not found exactly
once, so drift in the product code fails loudly instead of silently testing nothing.
``run_mutant`` copies the tree, plants the mutant and runs a short chaos run from the copy
(its own ``PYTHONPATH``, so lockd, the proxy and the workers all import the mutated code);
the mutant is *detected* when the checker reports at least one violation. ``python -m
chaos.mutants`` (``make mutants``) runs them all.

The table:

===========================  ==================================================================
``off_by_one``               the proxy accepts a fence one below the highest
``upsert_never_raises``      the fence upsert never raises the highest (a fence >= it passes)
``batch_unchecked``          no fence check for batch writes
``lockd_same_fence``         lockd keeps the same fence on a re-grant after expiry
``batch_no_raise``           batches check the fence but do not raise the highest (claims do)
``check_then_act``           the fence committed in its own transaction, then the batch's write
``check_then_act_stall``     the same, with a 300 ms stall between check and write
``lockd_early_expiry``       lockd treats a lease with < 800 ms left as expired
``single_write_unchecked``   single-row writes (POST/PUT/PATCH/DELETE) skip the fence comparison
``claim_no_raise``           an explicit claim checks but does not raise the highest (``counter``:
                             claim, then plain reads, then write)
``batch_partial_raise``      a multi-lock batch raises only its first lock's fence
                             (``transfer``: blind multi-lock batches)
``dbfence_new_image``        the database's fence trigger computes an UPDATE/DELETE's lock from
                             NEW, not OLD (``sql``)
``dbfence_claim_no_raise``   ``fencing.claim`` records a stale claim instead of raising (``sql``)
``dbfence_cascade_unchecked`` the fence trigger returns early for cascaded writes (``sql``)
``shared_write``             the proxy lets a shared (read-lock) token write (``rw``)
``shared_while_exclusive``   lockd grants a shared lease while an exclusive one is live (``rw``)
``sem_limit_plus_one``       lockd's semaphore grants limit + 1 permits (``sem``)
``two_leaders``              lockd elects a candidate while the leader's lease is live
                             (``election``)
``term_reuses_fence``        a new leader's term reuses the previous leader's fence
                             (``election``)
``sql_shared_claims_write``  ``fenced_transaction`` claims a shared lease's locks to write (``sql``)
``campaign_takes_shared``    a campaign's client_id retry answers the client's SHARED lease, signed
                             as a leader's (``counter``: cross operations)
``election_on_slot_names``   an election may be named like a semaphore's slot lock (``sem``:
                             cross operations)
``shared_keeps_epoch``       a shared grant after an unclean end keeps the lapsed writer's fence
                             (``rw``: ``pause_shared``)
``guard_no_claim``           ``lockd.guard``'s PostgreSQL store writes without claiming the
                             fence (``counter`` through ``chaos.guarded``, ``--via guard``)
``guard_claim_apart``        ``lockd.guard``'s PostgreSQL store claims in a transaction of its
                             own, then writes in another (check-then-act; ``--via guard``)
``object_pointer_unfenced``  an object's pointer is moved without the fence check (``objects``)
``object_inline_unfenced``   an inline object's one-statement PUT claims with the claim that
                             never refuses (``objects``)
``object_blob_early``        a new body is copied over the visible blob before the fence check
                             (``objects``)
``object_stale_blob_kept``   a refused write's blob is not deleted (``objects``)
``guard_redis_no_compare``   ``lockd.guard``'s Redis functions raise the fence but never compare
                             it (``counter`` in Redis, ``--via redis-guard``)
``guard_redis_claim_no_raise`` ``lockd.guard``'s Redis claim function checks the fence but does
                             not raise it (``--via redis-guard``: claim, then read, then write)
``pg_batch_same_fence``      lockd on PostgreSQL keeps the fence when a batch of acquires
                             re-grants an expired lock (``counter``, ``--store postgres``)
===========================  ==================================================================

Each mutant names the workloads whose write paths reach it (``workloads``; its runs use the
first unless ``--workload`` says otherwise). The database-side mutants edit the SQL that
``resource_proxy.dbfence`` installs; their runs install it on the chaos database (``sql``).
The proxy's mutants are in its PostgreSQL store and lockd's in its SQLite store: mutant runs
use lockd on SQLite and a PostgreSQL protected database. A mutant about batches edits the one path
that serves batches of one lock and of several (``_batch_on``), and lockd's mutants edit the
single-lock and the multi-lock grant alike. The runs of lockd's mutants inject
every fault kind; those of the proxy's inject the faults that make frozen holders send stale
writes (``_STALE_FAULTS``: every pause, handoff, kill after read, proxy SIGSTOP, database
latency); ``off_by_one`` the freezes that thaw a holder right after its immediate successor
raised the highest (``_NEXT_FAULTS``); ``batch_no_raise`` the freezes right after a grant
(``_GRANT_FAULTS``),
``batch_unchecked`` the freezes that thaw a holder into its write once a newer holder raised
the highest (``_THAW_FAULTS``), ``single_write_unchecked`` the freeze after a grant whose thawed
holder writes blind (``_BLIND_FAULTS``), and the two check-then-act mutants the faults that hold such a window open
while a stale write arrives (``_WINDOW_FAULTS``), so that 40 s see each of them several times.
A mutant whose window only a coincidence opens runs longer (``length``: ``batch_partial_raise``,
whose stale write needs a successor's blind batch in which the shared lock is not the first;
``single_write_unchecked`` and ``batch_unchecked``, whose thawed holders share their writes
between the two paths; ``dbfence_new_image``, whose window is a key-changing UPDATE of a line
another order left behind, a few a minute). ``python -m chaos.mutants`` prints each mutant's violation count: a
mutant caught by one violation is caught by luck.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Edit", "Mutant", "MUTANTS", "REPO_ROOT", "MutantNoLongerApplies", "copy_tree", "run_mutant"]

REPO_ROOT = Path(__file__).resolve().parents[2]
_IGNORE = shutil.ignore_patterns(".venv", ".git", "results", "__pycache__", "*.egg-info",
                                 ".pytest_cache", "node_modules", ".ruff_cache")


class MutantNoLongerApplies(RuntimeError):
    """A mutant's snippet is not in the product code exactly once (the code drifted)."""


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    caught_by: str
    """How the suite catches it (the README's table)."""
    edits: tuple[Edit, ...]
    faults: str | None = None
    """Fault kinds of its chaos run (None: every kind that applies)."""
    workloads: tuple[str, ...] = ("counter", "transfer")
    """The chaos workloads whose write paths reach the bug (the first one by default)."""
    via: str = "proxy"
    """What its run's workers write through (``guard``: the guarded service, ``chaos.guarded``;
    ``redis-guard``: the guard's Redis functions, ``chaos.redisguarded``)."""
    length: float = 1.0
    """Its run lasts ``length`` x the run length asked for: a mutant whose window only a rare
    coincidence opens gets a longer run, so that it is caught with a margin."""
    near: float | None = None
    """Share of near operations in its run (``--near``; None: the chaos default), for the
    mutants only cross operations reach (``chaos.near``)."""
    store: str | None = None
    """lockd's store in its run (None: the one asked for, SQLite by default), for a bug in one
    store's own code."""
    churn: int | None = None
    """Background churn tasks in its run (``--churn``; None: the chaos default)."""

    def apply_to(self, root: Path) -> None:
        for edit in self.edits:
            path = root / edit.path
            text = path.read_text() if path.exists() else ""
            found = text.count(edit.old)
            if found != 1:
                raise MutantNoLongerApplies(
                    f"mutant {self.name} no longer applies: {edit.path} has its snippet "
                    f"{found} times, not once: {edit.old.strip()[:80]!r}")
            path.write_text(text.replace(edit.old, edit.new))


_PG = "resource_proxy/store/postgres.py"
_SQL = "resource_proxy/store/sql.py"
_FENCING = "lockd/common/fencerule.py"
_LOCKD = "lockd/server/store/sqlite/locks.py"
_LOCKD_PG_SQL = "lockd/server/store/postgres/sql.py"
_PG_BATCH_GRANT = '      FROM req ORDER BY name COLLATE "C"\n{_GRANT_ON_CONFLICT}\n'
_GATE = "gate = f\"EXISTS (SELECT 1 FROM fence WHERE highest = {d.p('fence', 'bigint')})\""
_CHECK = "zip(fences, highests, strict=True) if h != f.fence]"
"""``fencing.check_all``: every fence comparison (single writes, reads, claims, batches of one
lock or several)."""
_UPSERT = "highest = {greatest}(f.highest, excluded.highest) RETURNING highest"
_DB_UPSERT = "ON CONFLICT (lock) DO UPDATE SET highest = GREATEST(f.highest, excluded.highest)"
"""The upsert of ``fencing.try_claim`` (and ``claim``): the proxy's every fence raise on
PostgreSQL (single writes, reads, claims, batches of one lock or several)."""
_DBFENCE_SQL = "resource_proxy/dbfence/sql.py"
_BATCH_RAISE = ("            highest = await self._raise_fences(conn, fences)\n"
                "            try:\n")
"""The batch's fence upsert (one lock or several, ``_batch_on``); claims use their own."""
_BATCH_SELECT = (
    "            highest = []\n"
    "            for f in fences:\n"
    "                cur = await conn.execute(self.sql.d.fence_select, {\"lock\": f.lock})\n"
    "                found = await cur.fetchone()\n"
    "                highest.append(max(found[0] if found else 0, f.fence))\n"
    "            try:\n")
_OWN_TX = ("            async with self._connection() as fconn:  # autocommit: its own transaction\n"
           "                highest = await self._raise_fences(fconn, fences)\n")
_LOCKD_FENCE = "    fence = (row[0] if row is not None else 0) + 1\n"
_LOCKD_FENCE_MANY = "        fence = (rows[name][0] if name in rows else 0) + 1\n"
_LOCKD_LIVE = "    if row is not None and row[1] is not None and row[4] > now:\n"
_LOCKD_LIVE_MANY = "if r[1] is not None and r[3] > now)"
_CLAIM_ONE = ("            cur = await conn.execute(*self._fence_check(fence))\n"
              "            found = await cur.fetchone()\n"
              "        return self._judge(fence, found)\n")
"""The explicit claim of one lock (``POST /v1/fences/{lock}/claim``): the fence upsert (for a
shared token's claim-for-read too: a read claim raises the highest to its epoch)."""
_CLAIM_ONE_SELECT = ("            cur = await conn.execute(self.sql.d.fence_select, "
                     "{\"lock\": fence.lock})\n"
                     "            found = await cur.fetchone()\n"
                     "            found = (max(found[0] if found else 0, fence.fence),)\n"
                     "        return self._judge(fence, found)\n")
_CLAIM_ALL = ("                highest = await self._raise_fences(conn, fences)\n"
              "                check_all(fences, highest)\n")
"""The explicit claim of several locks (``POST /v1/fences/claim``)."""
_CLAIM_ALL_SELECT = (
    "                highest = []\n"
    "                for f in fences:\n"
    "                    cur = await conn.execute(self.sql.d.fence_select, {\"lock\": f.lock})\n"
    "                    found = await cur.fetchone()\n"
    "                    highest.append(max(found[0] if found else 0, f.fence))\n"
    "                check_all(fences, highest)\n")
_BATCH_RAISE_FIRST = (
    "            highest = await self._raise_fences(conn, fences[:1])\n"
    "            for f in fences[1:]:\n"
    "                cur = await conn.execute(self.sql.d.fence_select, {\"lock\": f.lock})\n"
    "                found = await cur.fetchone()\n"
    "                highest.append(max(found[0] if found else 0, f.fence))\n"
    "            try:\n")
_DBFENCE = "resource_proxy/dbfence/sql.py"
_HELD = "    if shared and writing:\n"
"""``fencing.held``: the one refusal of a write under a shared token."""
_LOCKD_SEM = "lockd/server/store/sqlite/semaphores.py"
_SEM_FULL = "    if len(live) >= limit:\n"
_SEM_SLOT = "    slot = next(s for s in range(limit) if s not in taken)\n"
_LOCKD_ELECT = "lockd/server/store/sqlite/elections.py"
_CAMPAIGN = "    got = acquire(conn, now, name, lease_id, ttl_ms, owner, client_id)\n"
"""A campaign's grant: the store's exclusive acquire of the election's lock."""
_NEW_LEADER = "        _append(conn, name, \"leader\", owner, value, got.fence)\n"
_OLD_IMAGE = "        o := {lock_call_old};\n"
"""The guard's lock of the row's OLD image (UPDATE and DELETE)."""
_DB_CLAIM = '    ("fencing.claim(text,bigint)", _claim("claim", _RAISE_STALE)),\n'
_GUARD_TEMPLATED = "    o text;\nBEGIN\n"
_GUARD_LITERAL = "        body = f\"\"\"BEGIN\n"
_DEPTH_SKIP = ("    IF pg_trigger_depth() > 1 THEN  -- a cascade's or another trigger's write\n"
               "        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;\n"
               "        RETURN NEW;\n"
               "    END IF;\n")
_CLAIMSQL = "lockd/client/claimsql.py"
_CLAIM_PURPOSE = "    fn = \"claim\" if fence.writes else \"claim_read\"\n"
"""``fenced_transaction``'s claim of one lock, for its purpose (a shared lease's: to read)."""
_LOCKD_MODES = "lockd/server/store/sqlite/modes.py"
_SHARED_RETRY = ("                if mode != SHARED:\n"
                 "                    raise other_mode(lock, SHARED, mode)\n")
"""A client_id retry of a shared lease answers only a shared request."""
_ELECTIONS = "lockd/server/elections/service.py"
_LEADER_MODE = "        if grant.mode != EXCLUSIVE:\n            raise ClientIdConflict(\n"
_LEADER_TOKEN = "self.core.signer.token(grant.lock, grant.fence, grant.mode, ELECTION)"
_ELECTION_NAME = "        check_name(name, ELECTION)\n"
_SIGNER = "lockd/server/core/signer.py"
_MINTS = "    if not namespace.mints(primitive, lock):\n"
_NEW_EPOCH = "\" UPDATE SET fence = fence + 1, writer_open = 0 WHERE writer_open\""
"""The first shared grant after an unclean end raises the fence (a new epoch)."""
_CROSS_FAULTS = "pause,kill_worker"
"""Cross operations need no fault: any run sends them (``chaos.near``)."""
_CROSS_NEAR = 0.4
"""Near operations in the cross mutants' runs: about one operation in six crosses."""
_KIT = "lockd/guard/stores.py"
_KIT_CLAIM = ("            with claimed_transaction(conn, [fence]):\n"
              "                yield conn\n")
"""``PostgresFences.transaction``: the guard's claim, in the transaction of the service's write."""
_REDIS_KIT = "lockd/guard/redis.py"
_REDIS_COMPARE = "  if highest and below(fence, highest) then\n"
"""The Redis functions' fence comparison (``claim`` in the Lua library, used by every function)."""
_REDIS_CLAIM_FN = ("redis.register_function('lockd_fence_claim', function(keys, args)\n"
                   "  local refused = claim(keys, args)\n"
                   "  if refused then return refused end\n"
                   "  return redis.call('GET', keys[1])\n")
"""``lockd_fence_claim``: a claim before a read, checked and raised."""
_REDIS_CLAIM_CHECK_ONLY = (
    "redis.register_function('lockd_fence_claim', function(keys, args)\n"
    "  local highest = redis.call('GET', keys[1])\n"
    "  if highest and below(args[2], highest) then\n"
    "    return redis.error_reply('STALE lock=' .. args[1] .. ' presented=' .. args[2] ..\n"
    "                             ' highest=' .. highest)\n"
    "  end\n"
    "  return args[2]  -- checked, never raised\n")
_SQL_FAULTS = "pause_grant"
"""The freeze before a claim: a blind SQL operation frozen at its grant, thawed right after a
newer holder of one of its accounts committed, claims a stale fence. (A freeze after an rmw's
read holds its transaction, and so the fence rows, open: its successor waits, nothing is stale;
one with a write in flight catches rmw operations as often.)"""

_WINDOW_FAULTS = "handoff,stop_proxy"
"""The faults that hold a check-then-act window open while a newer holder's claim arrives: the
handoff (its database slowed, B thawed inside A's window) and the proxy's SIGSTOP with a write
in flight. (A pause thaws A after B claimed: its check refuses it first; database latency alone
and a freeze with the write in flight put no second holder in the window.)"""
_STALE_FAULTS = "pause,pause_grant,pause_write,handoff,kill_after_read,stop_proxy,db_delay"
"""Every fault that makes a frozen holder send a stale write (the proxy's mutants)."""
_NEXT_FAULTS = "kill_after_read,pause_grant"
"""The freezes that thaw A right after its immediate successor raised the highest (B's claim and
read, then B killed; B's blind batch): A's fence is then exactly one below the highest. A late
pause has let several holders pass, and a handoff thaws A before B's claim."""
_GRANT_FAULTS = "pause_grant,handoff,kill_after_read"
_BLIND_FAULTS = "pause_grant"
"""The freeze right after a grant, thawed after a newer holder's blind batch: the thawed holder
sends its blind write, a single row more often than not (POST, PUT, DELETE with no claim and
no Idempotency-Key). A keyed single write (an rmw's PATCH) is checked inside the transaction
that wrote it, so a skipped comparison there still ends in a rollback; an rmw thawed after
its read writes an unkeyed single row (PUT) one time in four."""
_THAW_FAULTS = "pause,pause_grant,kill_after_read"
"""The freezes that thaw a holder into its write once a newer holder raised the highest: an
rmw's write after its read (a batch, PATCH or PUT), a blind write after its grant (a batch,
POST, PUT or DELETE). The handoff thaws A before B's claim, and proxy SIGSTOP and database
latency freeze no holder: none of them sends a stale write for a check to let through."""
_RW_FAULTS = "pause,pause_grant,pause_write,kill_worker"
"""Readers frozen at their grant and writers frozen mid-lease: both modes' leases meet."""
"""Freezes right after a grant, thawed when a newer holder's blind batch was acknowledged."""

_OBJ_STORE = "resource_proxy/objects/store.py"
_INLINE_CLAIM = "            query = (f\"SELECT fencing.claim('{fence.lock}'"
"""The one-statement PUT's claim (the database's write rule: it refuses a stale fence)."""
_OBJ_SERVICE = "resource_proxy/objects/service.py"
_OBJ_PUT = ("                conn.execute(self._upsert, params)\n"
            "                return current is None, new\n"
            "        return await self.store.fenced([fence], body, once)\n")
"""The object write's ONE transaction (both databases): fence check, then the pointer moved."""
_OBJ_STORED = ("        staged = (await self.blobs.stage(rest, self.max_object_bytes) if body is None\n"
               "                  else _inline(body))\n"
               "        stored = staged.stored\n")
_OBJ_EARLY = (_OBJ_STORED +
              "        await staged.durable()\n"
              "        early = await self.pointers.get(bucket, key, None)\n"
              "        if early is not None and early.body is None and body is None:  # both blobs:\n"
              "            # the new bytes over the visible blob, before the check\n"
              "            import shutil\n"
              "            shutil.copyfile(self.blobs.path_of(stored.name),\n"
              "                            self.blobs.path_of(early.blob))\n")
_OBJ_CLEAN = ("        except BaseException:\n"
              "            await staged.abandon()\n"
              "            raise\n")

MUTANTS: tuple[Mutant, ...] = (
    Mutant("off_by_one", "the proxy accepts a fence one below the highest",
           "stale_commit, fence_decrease (a thawed holder's write lands after a newer claim)",
           (Edit(_FENCING, _CHECK, _CHECK.replace("h != f.fence", "h not in (f.fence, f.fence + 1)")),
            Edit(_SQL, _GATE, _GATE.replace("highest = {", "highest <= 1 + {"))), _NEXT_FAULTS),
    Mutant("upsert_never_raises", "the fence upsert never raises the highest",
           "stale_commit, fence_decrease, interleaving",
           (Edit(_SQL, _UPSERT, "highest = f.highest RETURNING highest"),
            Edit(_DBFENCE_SQL, _DB_UPSERT, "ON CONFLICT (lock) DO UPDATE SET highest = f.highest"),
            Edit(_FENCING, _CHECK, _CHECK.replace("h != f.fence", "h > f.fence")),
            Edit(_SQL, _GATE, _GATE.replace("highest = {", "highest <= {"))), _STALE_FAULTS),
    Mutant("batch_unchecked", "no fence check for batch writes",
           "stale_commit, fence_decrease, interleaving",
           (Edit(_PG, "            try:\n                check_all(fences, highest)\n"
                      "            except ProxyError",
                 "            try:\n                pass\n            except ProxyError"),),
           _THAW_FAULTS, length=1.5),
    Mutant("lockd_same_fence", "lockd keeps the same fence on a re-grant after expiry",
           "fence_reused, lease_overlap",
           (Edit(_LOCKD, _LOCKD_FENCE,
                 "    fence = (row[0] if row is not None else 0) + (\n"
                 "        0 if row is not None and row[1] is not None else 1)\n"),
            Edit(_LOCKD, _LOCKD_FENCE_MANY,
                 "        fence = (rows[name][0] if name in rows else 0) + (\n"
                 "            0 if name in rows and rows[name][1] is not None else 1)\n"))),
    Mutant("batch_no_raise", "batch checks the fence but does not raise the highest (claims do)",
           "stale_commit, fence_decrease (blind batch writes: no claim hides the bug)",
           (Edit(_PG, _BATCH_RAISE, _BATCH_SELECT),), _GRANT_FAULTS, length=2),
    Mutant("check_then_act", "the fence committed in its own transaction, then the write",
           "stale_commit by the database's commit order (handoff + db_delay, stop_proxy)",
           (Edit(_PG, _BATCH_RAISE, _OWN_TX + "            try:\n"),), _WINDOW_FAULTS),
    Mutant("check_then_act_stall", "the same, with a 300 ms stall between check and write",
           "stale_commit by the database's commit order, interleaving, lost_update",
           (Edit(_PG, _BATCH_RAISE,
                 _OWN_TX + "            await asyncio.sleep(0.3)\n            try:\n"),),
           _WINDOW_FAULTS),
    Mutant("lockd_early_expiry", "lockd treats a lease with < 800 ms left as expired",
           "lease_overlap (renewals logged with their send time)",
           (Edit(_LOCKD, _LOCKD_LIVE, _LOCKD_LIVE.replace("row[4] > now", "row[4] > now + 800")),
            Edit(_LOCKD, _LOCKD_LIVE_MANY, _LOCKD_LIVE_MANY.replace("> now", "> now + 800")))),
    Mutant("single_write_unchecked", "single-row writes skip the fence comparison",
           "rejected_committed, stale_commit (holders frozen at their grant, thawed into a blind "
           "POST/PUT/DELETE after a newer holder's blind batch)",
           (Edit(_SQL, _GATE, _GATE.replace("WHERE highest = {d.p('fence', 'bigint')}", "")),),
           _BLIND_FAULTS, length=1.5),
    Mutant("claim_no_raise", "an explicit claim checks the fence but does not raise the highest",
           "stale_commit, interleaving (claim, then plain reads without the token, then write)",
           (Edit(_PG, _CLAIM_ONE, _CLAIM_ONE_SELECT), Edit(_PG, _CLAIM_ALL, _CLAIM_ALL_SELECT)),
           "kill_after_read", ("counter",)),
    Mutant("batch_partial_raise", "a multi-lock batch checks every fence but raises only its "
           "first lock's", "fence_decrease, stale_commit (blind multi-lock batches: no claim "
           "first)", (Edit(_PG, _BATCH_RAISE, _BATCH_RAISE_FIRST),), "pause_grant",
           ("transfer",), length=3.0),
    Mutant("dbfence_new_image", "the fence trigger computes the lock of UPDATE/DELETE from NEW, "
           "not OLD", "unclaimed_commit (a key-changing UPDATE moves lines out of an account "
           "lock the lease lacks)",
           (Edit(_DBFENCE, _OLD_IMAGE, _OLD_IMAGE.replace("lock_call_old", "lock_call_new")),),
           "pause,kill_worker", ("sql",), length=1.5),
    Mutant("dbfence_claim_no_raise", "fencing.claim records a stale claim instead of raising",
           "fence_decrease, stale_commit (blind SQL writes of frozen holders commit)",
           (Edit(_DBFENCE, _DB_CLAIM, _DB_CLAIM.replace("_RAISE_STALE", '"NULL;"')),),
           _SQL_FAULTS, ("sql",)),
    Mutant("dbfence_cascade_unchecked", "the fence trigger returns early for cascaded writes "
           "(pg_trigger_depth() > 1)", "unclaimed_commit (ON DELETE CASCADE deletes lines of "
           "an account lock the lease lacks)",
           (Edit(_DBFENCE, _GUARD_TEMPLATED, _GUARD_TEMPLATED + _DEPTH_SKIP),
            Edit(_DBFENCE, _GUARD_LITERAL, _GUARD_LITERAL + _DEPTH_SKIP)),
           "pause,kill_worker", ("sql",)),
    Mutant("shared_write", "the proxy lets a token that holds the lock shared write",
           "shared_write (readers try to write under their shared tokens), phantom",
           (Edit(_FENCING, _HELD, "    if False:  # shared tokens write\n"),), _RW_FAULTS, ("rw",)),
    Mutant("shared_while_exclusive", "lockd grants a shared lease while an exclusive one is live",
           "lease_overlap (a shared grant inside the exclusive lease of its epoch)",
           (Edit(_LOCKD, _LOCKD_LIVE, _LOCKD_LIVE.replace("row[4] > now:",
                                                         "row[4] > now and mode != SHARED:")),),
           _RW_FAULTS, ("rw",)),
    Mutant("sem_limit_plus_one", "lockd's semaphore grants one permit more than its limit",
           "sem_overflow (limit + 1 permits provably live at once)",
           (Edit(_LOCKD_SEM, _SEM_FULL, _SEM_FULL.replace(">=", ">")),
            Edit(_LOCKD_SEM, _SEM_SLOT, _SEM_SLOT.replace("range(limit)", "range(limit + 1)"))),
           "pause,kill_worker", ("sem",)),
    Mutant("two_leaders", "a campaign unseats a leader whose lease has < 800 ms left",
           "lease_overlap (a leader elected while the previous one was provably live)",
           (Edit(_LOCKD_ELECT, _CAMPAIGN,
                 "    conn.execute(\"UPDATE locks SET expires_ms = ? WHERE name = ? AND expires_ms\"\n"
                 "                 \" BETWEEN ? AND ?\", (now, name, now + 1, now + 800))\n"
                 + _CAMPAIGN),), "pause,pause_grant,kill_worker", ("election",)),
    Mutant("term_reuses_fence", "a new leader's term reuses the previous leader's fence",
           "fence_reused, two_leaders (entries of one term by two leaders)",
           (Edit(_LOCKD_ELECT, _NEW_LEADER,
                 "        if got.fence > 1:\n"
                 "            conn.execute(\"UPDATE locks SET fence = fence - 1 WHERE name = ?\",\n"
                 "                         (name,))\n"
                 "            got = Grant(got.lock, got.lease_id, got.fence - 1, got.ttl_ms,\n"
                 "                        got.owner)\n" + _NEW_LEADER),),
           "pause,pause_grant,kill_worker", ("election",)),
    Mutant("sql_shared_claims_write", "fenced_transaction claims a shared lease's locks to "
           "write", "unclaimed_commit (cross operations write under their shared leases)",
           (Edit(_CLAIMSQL, _CLAIM_PURPOSE, "    fn = \"claim\"\n"),), _CROSS_FAULTS, ("sql",),
           near=_CROSS_NEAR),
    Mutant("campaign_takes_shared", "a campaign's client_id retry answers the client's shared "
           "lease, signed as a leader's", "unclaimed_commit (cross operations campaign with "
           "their shared lease's client_id, then write with the leadership's token)",
           (Edit(_LOCKD_MODES, _SHARED_RETRY, ""),
            Edit(_ELECTIONS, _LEADER_MODE, _LEADER_MODE.replace("grant.mode != EXCLUSIVE",
                                                                "False")),
            Edit(_ELECTIONS, _LEADER_TOKEN, _LEADER_TOKEN.replace("grant.mode", "EXCLUSIVE"))),
           _CROSS_FAULTS, ("counter", "rw"), near=_CROSS_NEAR),
    Mutant("election_on_slot_names", "an election may be named like a semaphore's slot lock",
           "fence_reused, fence_order, lease_overlap (a slot campaign's grant among the slot "
           "lock's permits)",
           (Edit(_ELECTIONS, _ELECTION_NAME, "        pass\n"),
            Edit(_SIGNER, _MINTS, _MINTS.replace("):", ") and primitive.kind != "
                                                       "\"election\":"))),
           _CROSS_FAULTS, ("sem",), near=_CROSS_NEAR),
    Mutant("shared_keeps_epoch", "a shared grant after an unclean end keeps the lapsed "
           "writer's fence", "lapsed_write (a writer frozen past its lease writes while "
           "readers of the same epoch hold the lock)",
           (Edit(_LOCKD_MODES, _NEW_EPOCH, _NEW_EPOCH.replace("WHERE writer_open", "WHERE 0")),),
           "pause_shared", ("rw",)),
    Mutant("guard_no_claim", "the guard verifies the token, but its PostgreSQL store writes "
           "without claiming the fence", "stale_commit, fence_decrease (a thawed holder's write "
           "through the guarded service lands after a newer holder's)",
           (Edit(_KIT, _KIT_CLAIM, "            with conn.transaction():  # verified, not claimed\n"
                                   "                yield conn\n"),),
           _THAW_FAULTS, ("counter",), via="guard"),
    Mutant("guard_claim_apart", "the guard claims the fence in a transaction of its own, then "
           "writes in another (check-then-act)", "stale_commit (a newer holder's claim and write "
           "land between a holder's claim and its write)",
           (Edit(_KIT, _KIT_CLAIM, "            with claimed_transaction(conn, [fence]):\n"
                                   "                pass  # committed alone: the write comes after\n"
                                   "            with conn.transaction():\n"
                                   "                yield conn\n"),),
           _WINDOW_FAULTS, ("counter",), via="guard"),
    Mutant("object_pointer_unfenced", "an object's pointer moves without the fence check",
           "stale_visible, stale_acked (a thawed holder's PUT replaces a newer holder's)",
           (Edit(_OBJ_STORE, _OBJ_PUT, _OBJ_PUT.replace("fenced([fence]", "fenced([]")),),
           workloads=("objects",)),
    Mutant("object_inline_unfenced", "an inline object's PUT (the claim and the move as one "
           "statement) claims with the claim that never refuses",
           "stale_visible, stale_acked (a thawed holder's small PUT replaces a newer holder's)",
           (Edit(_PG, _INLINE_CLAIM, _INLINE_CLAIM.replace("fencing.claim(",
                                                                  "fencing.try_claim(")),),
           workloads=("objects",)),
    Mutant("object_blob_early", "a new body is copied over the visible blob before the check",
           "torn, stale_visible (a stale writer's bytes visible under the newer pointer)",
           (Edit(_OBJ_SERVICE, _OBJ_STORED, _OBJ_EARLY),), workloads=("objects",), length=2),
    Mutant("object_stale_blob_kept", "a refused write's new blob is not deleted",
           "orphan_kept (an unreferenced blob written after the proxy's last crash)",
           (Edit(_OBJ_SERVICE, _OBJ_CLEAN, "        except BaseException:\n            raise\n"),),
           workloads=("objects",)),
    Mutant("guard_redis_no_compare", "the guard's Redis functions raise the fence to whatever "
           "is presented, never comparing it with the highest", "stale_commit, fence_decrease "
           "(a thawed holder's FCALL lands after a newer holder's claim or write)",
           (Edit(_REDIS_KIT, _REDIS_COMPARE, "  if false and highest then  -- never compared\n"),),
           _THAW_FAULTS, ("counter",), via="redis-guard"),
    Mutant("guard_redis_claim_no_raise", "the guard's Redis claim function checks the fence but "
           "does not raise the highest", "stale_commit, interleaving (a holder claims and reads, "
           "is killed; its frozen predecessor's write lands)",
           (Edit(_REDIS_KIT, _REDIS_CLAIM_FN, _REDIS_CLAIM_CHECK_ONLY),), "kill_after_read",
           ("counter",), via="redis-guard"),
    Mutant("pg_batch_same_fence", "lockd on PostgreSQL keeps the fence when a batch of "
           "acquires re-grants an expired lock (a lone acquire still raises it)",
           "fence_reused, stale_commit (a frozen holder's successor granted in a batch)",
           (Edit(_LOCKD_PG_SQL, _PG_BATCH_GRANT, _PG_BATCH_GRANT.replace(
               "{_GRANT_ON_CONFLICT}",
               "{_GRANT_ON_CONFLICT.replace('ELSE l.fence + 1', 'ELSE l.fence')}")),),
           _GRANT_FAULTS, ("counter",), store="postgres"),
)

def copy_tree(dst: Path, src: Path = REPO_ROOT) -> Path:
    """A copy of the source tree (no venv, git or results) at ``dst``."""
    shutil.copytree(src, dst, ignore=_IGNORE)
    return dst


def run_mutant(mutant: Mutant, *, seconds: float = 40.0, seed: int = 4242, store: str = "sqlite",
               faults: str | None = None, keep: bool = False,
               workload: str | None = None) -> dict[str, Any]:
    """Plant ``mutant`` in a copy of the tree and run chaos there (fenced mode, ``workload``:
    ``counter`` exercises single-lock batches and writes, ``transfer`` multi-lock leases and
    batches) for ``seconds`` x the mutant's ``length``. Returns
    ``{name, detected, kinds, violations, elapsed_s, report}``; ``MutantNoLongerApplies`` if
    a snippet is gone. The venv's python runs the copy (``PYTHONPATH`` puts it first)."""
    started = time.monotonic()
    workload = workload or mutant.workloads[0]
    store = mutant.store or store
    seconds = seconds * mutant.length
    base = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.name}-"))
    try:
        root = copy_tree(base / "tree")
        mutant.apply_to(root)
        results = base / "results"
        argv = [sys.executable, "-m", "chaos", "--store", store, "--seconds", str(seconds),
                "--seed", str(seed), "--results-dir", str(results), "--workload", workload]
        faults = faults or mutant.faults
        if faults:
            argv += ["--faults", faults]
        if mutant.near is not None:
            argv += ["--near", str(mutant.near)]
        if mutant.churn is not None:
            argv += ["--churn", str(mutant.churn)]
        if keep:
            argv.append("--keep")
        if mutant.via != "proxy":
            argv += ["--via", mutant.via]
        env = {**os.environ, "PYTHONPATH": str(root)}
        proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                              timeout=seconds + 300)
        reports = sorted(results.glob("*.json"))
        if not reports:
            raise RuntimeError(f"mutant {mutant.name}: the chaos run left no report "
                               f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-3000:]}")
        report = json.loads(reports[-1].read_text())
        kinds = report["violations_by_kind"]
        return {"name": mutant.name, "detected": report["violation_count"] > 0,
                "kinds": kinds, "violations": report["violation_count"],
                "elapsed_s": round(time.monotonic() - started, 1), "report": report}
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
