"""The ``Store`` protocol every lockd backend implements, and the values it trades in.

A store is the single source of truth for who holds which lock. It judges expiry by ITS clock
(SQLite: lockd's injectable clock, one node; PostgreSQL: the database server's ``now()``; etcd: its
own leases), never a client's. Every method is atomic at the store: two lockd processes on one
PostgreSQL database, or on one etcd cluster, are correct together.

Waiting is NOT the store's job: the service keeps waiters in memory and retries ``acquire`` when
the store reports that a lock may have freed (``subscribe``) or when the holder's lease runs out
(``Holder.ttl_ms``).

Optional: a store whose operations apply in call order (one queue; SQLite) says so with a class
attribute ``ordered = True``; see ``LockService.release``.

Errors: ``LeaseLost`` (renew/release of a lease that is not live), ``ClientIdConflict`` (a
``client_id`` retry that asks for another lease than the live one of that client_id:
``client_id_conflict``; nothing changed), ``LimitMismatch`` (semaphores) and ``StoreUnavailable``
(the store cannot answer; nothing was changed or the outcome is unknown). Nothing else escapes
a store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lockd.server.errors import ClientIdConflict

__all__ = ["MULTI_PREFIX", "SHARED_PREFIX", "SEM_KEY_PREFIX", "EXCLUSIVE", "SHARED", "Grant", "Holder",
           "HolderView", "LockState", "MultiGrant", "Store", "ReleaseListener", "SemGrant",
           "SemFull", "SemState", "Permit", "ElectionEvent", "ElectionState", "not_a_leader",
           "other_mode", "other_modes", "sem_key"]

MULTI_PREFIX = "m."
"""Every multi-lock lease id starts with this (``.`` never occurs in a single lease's id), so
the single-lock renew/release can refuse one instead of ending part of a set."""

SHARED_PREFIX = "s."
"""A shared single-lock lease's id starts with this when lockd drew it: a hint that lets a store
renew or release it as shared first (one statement instead of an exclusive miss, then the shared
one). Only a hint: an id without it may still be shared (drawn by an older lockd), so a store
that misses tries the other mode."""


EXCLUSIVE = "exclusive"
SHARED = "shared"
"""The two lock modes. Any number of live SHARED leases may hold a lock at once; a live
EXCLUSIVE lease excludes every other lease of either mode. An exclusive grant raises the lock's
fence. A shared grant carries the lock's current fence (the epoch, 0 if never written), except
the first one after an exclusive lease that ended WITHOUT a clean release (it expired, or was
force-released): that one raises the fence once, a new epoch, so the lapsed writer's fence is
below every reader's; later shared grants carry it. A store remembers, per lock, whether the
last exclusive lease was released cleanly (a release, a resign, a multi-lock release), atomically
with the grants and releases (docs/primitives.md, "Epochs")."""

SEM_KEY_PREFIX = "#sem/"
"""Release notifications and wait queues of semaphore ``s`` use the key ``#sem/s`` (``#`` is
never in a lock name, so a semaphore's key cannot collide with a lock's)."""


def sem_key(name: str) -> str:
    """The notification / wait-queue key of semaphore ``name``."""
    return SEM_KEY_PREFIX + name


def other_mode(lock: str, held: str, asked: str) -> ClientIdConflict:
    """A single-lock ``client_id`` retry asking ``asked`` while that client_id holds ``lock``
    live in mode ``held``: refused, never answered with the other mode's lease (its token would
    carry the mode the store recorded, not the one the route asked for)."""
    return ClientIdConflict(
        f"client_id already holds lock {lock!r} {held}, not {asked}: a retry must ask for the "
        "same mode (release that lease first, or use another client_id)",
        lock=lock, held_mode=held, asked_mode=asked)


def other_modes(locks: tuple[str, ...] | list[str]) -> ClientIdConflict:
    """A multi-lock ``client_id`` retry of the same locks in other modes than the live lease."""
    return ClientIdConflict(
        "client_id already holds these locks as a multi-lock lease in other modes: a retry must "
        "ask for the same modes (release that lease first, or use another client_id)",
        locks=list(locks)[:64])


def not_a_leader(name: str) -> ClientIdConflict:
    """A campaign's ``client_id`` retry that found that client_id's live lock lease of ``name``
    granted by a lock route, not by a campaign: it does not lead (no value, no term)."""
    return ClientIdConflict(
        f"client_id holds lock {name!r} as a lock lease, not as election {name!r}'s leader: a "
        "campaign retry returns only a leadership (release that lease first, or use another "
        "client_id)", lock=name, election=name, held_mode=EXCLUSIVE)


@dataclass(frozen=True, slots=True)
class Grant:
    """A live lease as the store recorded it. ``ttl_ms``: time left, by the store's clock."""

    lock: str
    lease_id: str
    fence: int
    ttl_ms: int
    owner: str
    mode: str = EXCLUSIVE


@dataclass(frozen=True, slots=True)
class MultiGrant:
    """A live multi-lock lease: ``fences`` maps each lock (name order) to its own fence;
    ``ttl_ms``: time left, by the store's clock (every lock of the set expires together)."""

    lease_id: str
    fences: dict[str, int]
    ttl_ms: int
    owner: str
    modes: dict[str, str] | None = None
    """Each lock's mode; ``None``: every lock exclusive."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Why an acquire was not granted: the current holder (never its lease id).

    ``ttl_ms`` is the holder's remaining lease by the store's clock: the waiter retries then.
    """

    lock: str
    owner: str
    ttl_ms: int
    fence: int
    mode: str = EXCLUSIVE
    """The blocking lease's mode. Refused by shared holders, a store reports the one whose lease
    ends LAST (the lock frees only when every shared holder has gone)."""


@dataclass(frozen=True, slots=True)
class HolderView:
    """One live lease of a lock as ``GET`` shows it (never its lease id)."""

    owner: str
    ttl_ms: int
    mode: str = EXCLUSIVE


@dataclass(frozen=True, slots=True)
class LockState:
    """What ``GET /v1/locks/{name}`` shows. ``fence`` is the last fence issued (0: never).

    ``owner``/``ttl_ms``: the exclusive holder, or (shared) the holder whose lease ends last.
    ``mode``: the held mode (``None`` when free); ``holders``: every live lease, in grant order.
    """

    lock: str
    held: bool
    fence: int
    owner: str | None
    ttl_ms: int
    mode: str | None = None
    holders: tuple[HolderView, ...] = ()


@dataclass(frozen=True, slots=True)
class SemGrant:
    """A live semaphore permit. ``fence``: strictly increasing per semaphore; ``slot``: in
    ``0 .. limit-1``, unique among the semaphore's live permits; ``ttl_ms``: time left."""

    name: str
    lease_id: str
    fence: int
    slot: int
    limit: int
    ttl_ms: int
    owner: str


@dataclass(frozen=True, slots=True)
class SemFull:
    """Why a permit was not granted: ``limit`` live permits are held. ``ttl_ms``: the SOONEST
    expiry among them (a waiter retries then); ``owners``: the permits' owners."""

    name: str
    limit: int
    ttl_ms: int
    owners: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Permit:
    """One live permit as ``GET /v1/semaphores/{name}`` shows it (never its lease id)."""

    owner: str
    slot: int
    ttl_ms: int
    fence: int


@dataclass(frozen=True, slots=True)
class SemState:
    """A semaphore: ``limit`` (0: never created), ``fence`` (last issued, 0: never), live
    ``permits`` in slot order."""

    name: str
    limit: int
    fence: int
    permits: tuple[Permit, ...]


@dataclass(frozen=True, slots=True)
class ElectionEvent:
    """One entry of an election's change log. ``seq`` strictly increases per election (1, 2,
    ...; never reused, survives restarts). ``kind``: ``"leader"`` (a new leader: a new term,
    ``fence`` its lock fence), ``"proclaim"`` (same leader and fence, new ``value``) or
    ``"resign"`` (the leader released; ``value`` empty). A leader that lapsed without resigning
    shows up as the next ``"leader"`` entry."""

    seq: int
    kind: str
    owner: str
    value: str
    fence: int


@dataclass(frozen=True, slots=True)
class ElectionState:
    """An election now. ``leader``: the live lease of lock ``name`` (``None``: no leader);
    ``value``: the leader's value (``""`` with no leader); ``seq``: the last log entry's seq (0:
    none); ``handover``: the pending handover target (an owner, or ``"next"``), ``None`` if
    none."""

    name: str
    leader: HolderView | None
    fence: int
    value: str
    seq: int
    handover: str | None


ReleaseListener = Callable[[str], None]
"""Called on the event loop with a lock name that may have just freed (released anywhere)."""


@runtime_checkable
class Store(Protocol):
    """A lock store. All durations are integer milliseconds."""

    async def open(self) -> None:
        """Connect and create the schema idempotently. Raises ``StoreUnavailable``."""

    async def close(self) -> None:
        """Release every connection; idempotent."""

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        mode: str = EXCLUSIVE
    ) -> Grant | Holder:
        """Grant ``lock`` to a new lease ``lease_id`` for ``ttl_ms`` if no live lease holds it.

        An exclusive grant's fence is strictly greater than every fence ever issued for
        ``lock`` (invariant 1); a shared one's follows ``SHARED``'s rule. If a live single-lock
        lease of ``lock`` was acquired with the same non-empty ``client_id`` IN THE SAME MODE,
        that lease is returned (same lease id and fence) and its expiry is pushed to ``ttl_ms``
        from now: a retried acquire must not deadlock on itself. In the other mode: raises
        ``ClientIdConflict`` (``other_mode``), nothing changed. Otherwise returns the ``Holder``.
        """

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """Push a live lease's expiry to ``ttl_ms`` from now; same fence. Raises ``LeaseLost``.

        ``ttl_ms=None`` keeps the lease's own TTL: the last ``ttl_ms`` it was granted by acquire
        or renewed with (like an etcd/Consul keep-alive). A renew with a TTL makes that the
        lease's own TTL from then on.
        """

    async def release(self, lock: str, lease_id: str) -> None:
        """End a live lease and notify listeners (here and on other lockd processes). Ending
        an exclusive lease this way is a CLEAN release (``SHARED``: no new epoch follows it).

        Raises ``LeaseLost`` if the lease is not live (an expired lease cannot be released).
        """

    async def acquire_many(
        self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int, owner: str,
        client_id: str | None, modes: Mapping[str, str] | None = None
    ) -> MultiGrant | list[Holder]:
        """Grant ALL of ``locks`` (distinct, in name order) to one new lease, or none of them.

        One atomic store step: each lock's fence is strictly greater than every fence ever
        issued for it (invariant 1, per lock). Returns the ``Holder`` of every lock that is held
        (nothing written, no fence raised). A live lease of exactly these locks acquired with
        the same non-empty ``client_id`` in the same modes is returned instead (expiry pushed to
        ``ttl_ms``); in other modes, ``ClientIdConflict`` (``other_modes``).
        """

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """Push every lock of a live multi-lock lease to ``ttl_ms`` from now (``None``: its own
        TTL). Raises ``LeaseLost`` unless EVERY lock of the set is still held by it."""

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """End a multi-lock lease: free every lock of it still held and notify listeners for
        each. Returns the names freed; raises ``LeaseLost`` if the lease was not live (after
        freeing whatever part of it still was, e.g. when an operator force-released one lock).
        """

    async def get(self, lock: str) -> LockState:
        """The lock's state; an unknown lock is ``held=False, fence=0``."""

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """Up to ``limit`` locks whose name starts with ``prefix`` and sorts after ``after``,
        in name order (the cursor is the last name of the previous page)."""

    def subscribe(self, listener: ReleaseListener) -> None:
        """Register ``listener``; called with a lock name whenever a lease of it is released."""

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers."""

    async def force_release(self, lock: str) -> Holder | None:
        """End the live lease of ``lock`` whoever holds it (an operator's override) and notify
        listeners like a release. Returns the lease that was ended (``ttl_ms``: what it had
        left), or ``None`` if the lock was not held. The fence is kept, so the next exclusive
        grant still gets a higher one (invariant 1) and, since this is no clean release, so does
        the next shared one (``SHARED``); the ended lease's renew/release answer ``LeaseLost``.
        """

    async def clock_offset(self) -> float | None:
        """Seconds the store's clock is ahead of lockd's (negative: behind), measured now;
        ``None`` if the store cannot tell. Raises ``StoreUnavailable``."""

    # --- lock modes ------------------------------------------------------------------------
    # ``acquire`` and ``acquire_many`` take the mode as keyword ``mode: str = EXCLUSIVE`` and
    # ``modes: Mapping[str, str] | None = None`` (``None``: all exclusive); ``renew``/``release``
    # work on a lease of either mode (the store knows it); ``release`` of a shared lease notifies
    # listeners like any release; ``force_release`` ends every live lease of the lock (all its
    # shared holders) and returns the one that ended last. A ``client_id`` retry returns the
    # live lease of that client_id only in the mode it asks for (else ``ClientIdConflict``); a
    # single-lock retry never returns a multi-lock lease, nor a multi-lock retry a single one.

    # --- semaphores (notification key: ``sem_key(name)``) -----------------------------------

    async def sem_acquire(
        self, name: str, *, limit: int, lease_id: str, ttl_ms: int, owner: str,
        client_id: str | None
    ) -> SemGrant | SemFull:
        """Grant one permit of semaphore ``name`` if fewer than ``limit`` live permits exist.

        The grant's fence is strictly greater than every fence this semaphore ever issued; its
        slot is the lowest in ``0 .. limit-1`` no live permit holds. A live permit with the same
        non-empty ``client_id`` is returned instead (expiry pushed). Raises ``LimitMismatch``
        (carrying the current limit) if live permits exist under another ``limit``; with no live
        permit the semaphore takes the new ``limit``.
        """

    async def sem_renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        """As ``renew``, for a permit (same fence and slot). Raises ``LeaseLost``."""

    async def sem_release(self, name: str, lease_id: str) -> None:
        """End a live permit and notify listeners with ``sem_key(name)``. Raises ``LeaseLost``."""

    async def sem_get(self, name: str) -> SemState:
        """The semaphore's limit, last fence and live permits (unknown: limit 0, fence 0)."""

    # --- elections (the leader is the EXCLUSIVE holder of lock ``name``) --------------------

    async def elect_campaign(
        self, name: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        value: str
    ) -> Grant | Holder:
        """``acquire(name, mode=EXCLUSIVE)`` that, when it grants a NEW lease, also sets the
        election's value, clears any pending handover and appends a ``"leader"`` log entry, all
        in one atomic step. A ``client_id`` retry returns only that client_id's live
        LEADERSHIP (a lease a campaign granted, which holds the value): a live shared lease of
        it raises ``ClientIdConflict`` (``other_mode``), a lock route's exclusive lease
        ``ClientIdConflict`` (``not_a_leader``); nothing changed."""

    async def elect_renew(self, name: str, lease_id: str,
                          ttl_ms: int | None) -> tuple[Grant, str | None]:
        """``renew`` of the leader's lease (an EXCLUSIVE lease of ``name``; a shared one is not
        a leader's: ``LeaseLost``), answering the pending handover target too (``None``: none).
        Raises ``LeaseLost``."""

    async def elect_resign(self, name: str, lease_id: str) -> None:
        """``release`` of the leader's lease that appends a ``"resign"`` entry and clears the
        value and handover atomically: a clean release. Raises ``LeaseLost``."""

    async def elect_proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """Set the live leader's value (same lease, same fence) and append a ``"proclaim"``
        entry. Raises ``LeaseLost`` unless ``lease_id`` is the live leader."""

    async def elect_handover(self, name: str, target: str) -> ElectionState:
        """Record a handover request (``target``: an owner, or ``"next"``) for the current
        leader to see at its next renewal. Raises ``LeaseLost`` when nobody leads."""

    async def elect_get(self, name: str) -> ElectionState:
        """The election now (unknown: no leader, fence 0, seq 0)."""

    async def elect_log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        """Up to ``limit`` log entries with ``seq > after``, in seq order. A store keeps at least
        the last 1,000 entries per election; older ones may be gone (the caller sees the gap
        from the first ``seq`` it gets)."""

    # Every election write notifies listeners with lock ``name`` (so observers and waiting
    # candidates wake), like a release.
