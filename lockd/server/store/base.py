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

Errors: ``LeaseLost`` (renew/release of a lease that is not live) and ``StoreUnavailable`` (the
store cannot answer; nothing was changed or the outcome is unknown). Nothing else escapes a store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["MULTI_PREFIX", "Grant", "Holder", "LockState", "MultiGrant", "Store",
           "ReleaseListener"]

MULTI_PREFIX = "m."
"""Every multi-lock lease id starts with this (``.`` never occurs in a single lease's id), so
the single-lock renew/release can refuse one instead of ending part of a set."""


@dataclass(frozen=True, slots=True)
class Grant:
    """A live lease as the store recorded it. ``ttl_ms``: time left, by the store's clock."""

    lock: str
    lease_id: str
    fence: int
    ttl_ms: int
    owner: str


@dataclass(frozen=True, slots=True)
class MultiGrant:
    """A live multi-lock lease: ``fences`` maps each lock (name order) to its own fence;
    ``ttl_ms``: time left, by the store's clock (every lock of the set expires together)."""

    lease_id: str
    fences: dict[str, int]
    ttl_ms: int
    owner: str


@dataclass(frozen=True, slots=True)
class Holder:
    """Why an acquire was not granted: the current holder (never its lease id).

    ``ttl_ms`` is the holder's remaining lease by the store's clock: the waiter retries then.
    """

    lock: str
    owner: str
    ttl_ms: int
    fence: int


@dataclass(frozen=True, slots=True)
class LockState:
    """What ``GET /v1/locks/{name}`` shows. ``fence`` is the last fence issued (0: never)."""

    lock: str
    held: bool
    fence: int
    owner: str | None
    ttl_ms: int


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
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None
    ) -> Grant | Holder:
        """Grant ``lock`` to a new lease ``lease_id`` for ``ttl_ms`` if no live lease holds it.

        The grant's fence is strictly greater than every fence ever issued for ``lock``
        (invariant 1). If the live lease was acquired with the same non-empty ``client_id``, that
        lease is returned (same lease id and fence) and its expiry is pushed to ``ttl_ms`` from
        now: a retried acquire must not deadlock on itself. Otherwise returns the ``Holder``.
        """

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """Push a live lease's expiry to ``ttl_ms`` from now; same fence. Raises ``LeaseLost``.

        ``ttl_ms=None`` keeps the lease's own TTL: the last ``ttl_ms`` it was granted by acquire
        or renewed with (like an etcd/Consul keep-alive). A renew with a TTL makes that the
        lease's own TTL from then on.
        """

    async def release(self, lock: str, lease_id: str) -> None:
        """End a live lease and notify listeners (here and on other lockd processes).

        Raises ``LeaseLost`` if the lease is not live (an expired lease cannot be released).
        """

    async def acquire_many(
        self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int, owner: str,
        client_id: str | None
    ) -> MultiGrant | list[Holder]:
        """Grant ALL of ``locks`` (distinct, in name order) to one new lease, or none of them.

        One atomic store step: each lock's fence is strictly greater than every fence ever
        issued for it (invariant 1, per lock). Returns the ``Holder`` of every lock that is held
        (nothing written, no fence raised). A live lease of exactly these locks acquired with
        the same non-empty ``client_id`` is returned instead (expiry pushed to ``ttl_ms``).
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
        left), or ``None`` if the lock was not held. The fence is kept, so the next grant still
        gets a higher one (invariant 1); the ended lease's renew/release answer ``LeaseLost``.
        """

    async def clock_offset(self) -> float | None:
        """Seconds the store's clock is ahead of lockd's (negative: behind), measured now;
        ``None`` if the store cannot tell. Raises ``StoreUnavailable``."""
