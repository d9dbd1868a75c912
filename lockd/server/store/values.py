"""The values every store trades in: grants, holders, states, and the lease-id and mode
constants. One module, shared by the ``Store`` protocols (``base``) and every backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockd.server.errors import ClientIdConflict

__all__ = ["EXCLUSIVE", "MULTI_PREFIX", "SEM_KEY_PREFIX", "SHARED", "SHARED_PREFIX", "ElectionEvent",
           "ElectionState", "Grant", "Holder", "HolderView", "LockState", "MultiGrant", "Permit",
           "ReleaseListener", "SemFull", "SemGrant", "SemState", "not_a_leader", "other_mode",
           "other_modes", "sem_key"]

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
"""The two lock modes: any number of live SHARED leases may hold a lock at once; a live
EXCLUSIVE lease excludes every other lease. An exclusive grant raises the lock's fence; a shared
grant carries it (the epoch), raised once only after an exclusive lease that ended without a
clean release (docs/primitives.md, "Epochs")."""


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

