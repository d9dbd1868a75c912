"""The ``Store`` protocols: one per primitive over a core, and ``Store``, their composition.

A store is the one source of truth of who holds what, judged by ITS clock; every method is
atomic at the store, so lockd replicas sharing one are correct together. Waiting is not the
store's job: the service queues waiters and retries when ``subscribe`` reports a release or a
holder's ``ttl_ms`` runs out. Durations are integer milliseconds. Each backend package
(``sqlite``, ``postgres``, ``etcd``) has one file per protocol; the design of each:
docs/stores/.

Errors, the same for every method that names them: ``LeaseLost`` (the lease is not live:
expired, released, unknown; an expired lease cannot be renewed or released back to life),
``ClientIdConflict`` (a ``client_id`` retry asking for another lease than that client_id's live
one; nothing changed), ``LimitMismatch`` (semaphores) and ``StoreUnavailable`` (the store cannot
answer; nothing changed, or the outcome is unknown). Nothing else escapes a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from lockd.server.store.values import (
    EXCLUSIVE,
    ElectionEvent,
    ElectionState,
    Grant,
    Holder,
    LockState,
    MultiGrant,
    ReleaseListener,
    SemFull,
    SemGrant,
    SemState,
)

__all__ = ["ElectionStore", "LockStore", "SemaphoreStore", "Store", "StoreCore"]


@runtime_checkable
class StoreCore(Protocol):
    """What every primitive's store stands on: a connection, its clock and its notifications.

    Optional: a store whose operations apply in call order (one queue; SQLite) says so with a
    class attribute ``ordered = True`` (``LockService.release`` uses it).
    """

    async def open(self) -> None:
        """Connect and create the schema idempotently. Raises ``StoreUnavailable``."""

    async def close(self) -> None:
        """Release every connection; idempotent."""

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers."""

    def subscribe(self, listener: ReleaseListener) -> None:
        """Register ``listener``: called on the event loop with a name whenever a lease of it
        ends by a release (here or at another lockd process) or an election of it is written.
        A semaphore's name is notified as ``sem_key(name)``."""

    async def clock_offset(self) -> float | None:
        """Seconds the store's clock is ahead of lockd's (negative: behind), measured now;
        ``None`` if the store cannot tell. Raises ``StoreUnavailable``."""


@runtime_checkable
class LockStore(StoreCore, Protocol):
    """Locks: single leases in two modes, multi-lock leases, reads and the operator's override.

    Fences: an exclusive grant's fence is strictly greater than every fence ever issued for its
    lock, across release, expiry and restarts; a renewal keeps it; a shared grant carries the
    lock's epoch (``SHARED``). ``renew``/``release`` work on a lease of either mode (the store
    knows it). A ``client_id`` retry returns the live lease of that client_id only in the mode
    (a set: the locks and modes) it asks for, else ``ClientIdConflict``; a single-lock retry
    never returns a multi-lock lease, nor the reverse.
    """

    async def acquire(
        self, lock: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        mode: str = EXCLUSIVE
    ) -> Grant | Holder:
        """Grant ``lock`` in ``mode`` to a new lease ``lease_id`` for ``ttl_ms`` if no live
        lease excludes it; else the ``Holder`` that does (shared holders: the one whose lease
        ends last). A live single-lock lease of the same non-empty ``client_id`` in the same
        mode is returned instead (same lease id and fence), its expiry pushed to ``ttl_ms``
        from now: a retried acquire must not deadlock on itself."""

    async def renew(self, lock: str, lease_id: str, ttl_ms: int | None) -> Grant:
        """Push a live lease's expiry to ``ttl_ms`` from now; same fence. ``None`` keeps the
        lease's own TTL (the last one it was granted or renewed with). Raises ``LeaseLost``."""

    async def release(self, lock: str, lease_id: str) -> None:
        """End a live lease and notify listeners. Ending an exclusive lease this way is a
        clean release (no new epoch follows it). Raises ``LeaseLost``."""

    async def acquire_many(
        self, locks: tuple[str, ...], *, lease_id: str, ttl_ms: int, owner: str,
        client_id: str | None, modes: Mapping[str, str] | None = None
    ) -> MultiGrant | list[Holder]:
        """Grant ALL of ``locks`` (distinct, in name order; ``modes``: name -> mode, ``None``:
        all exclusive) to one new lease in one atomic step, each lock's fence by the single-lock
        rule; or none, answering the ``Holder`` of every lock that refuses (nothing written).
        A live lease of exactly these locks and modes with the same ``client_id`` is returned
        instead (expiry pushed)."""

    async def renew_many(self, lease_id: str, ttl_ms: int | None) -> MultiGrant:
        """``renew`` of every lock of a multi-lock lease. Raises ``LeaseLost`` unless EVERY
        lock of the set is still held by it."""

    async def release_many(self, lease_id: str) -> tuple[str, ...]:
        """End a multi-lock lease: free every lock of it still held (a clean release), notify
        each, return their names. Raises ``LeaseLost`` if the lease was not whole (after
        freeing what still was, e.g. once an operator force-released one lock)."""

    async def get(self, lock: str) -> LockState:
        """The lock's state; an unknown lock is ``held=False, fence=0``."""

    async def list(self, prefix: str, limit: int, after: str | None) -> list[LockState]:
        """Up to ``limit`` locks whose name starts with ``prefix`` and sorts after ``after``,
        in name order (the cursor is the last name of the previous page)."""

    async def force_release(self, lock: str) -> Holder | None:
        """End every live lease of ``lock`` whoever holds it (an operator's override) and
        notify like a release. Returns the lease that ended last (``ttl_ms``: what it had left),
        ``None`` if none was live. The fence is kept, and this is no clean release: the next
        grant of either mode gets a higher fence. The ended leases' renew/release raise
        ``LeaseLost``."""


@runtime_checkable
class SemaphoreStore(StoreCore, Protocol):
    """Counting semaphores: ``limit`` permits, each a lease of a slot with its own fence."""

    async def sem_acquire(
        self, name: str, *, limit: int, lease_id: str, ttl_ms: int, owner: str,
        client_id: str | None
    ) -> SemGrant | SemFull:
        """One permit of ``name`` if fewer than ``limit`` are live, else ``SemFull``. Its fence
        is strictly greater than every fence this semaphore issued; its slot the lowest in
        ``0 .. limit-1`` no live permit holds. A live permit with the same ``client_id`` is
        returned instead (expiry pushed). Raises ``LimitMismatch`` (carrying the current
        limit) while live permits hold another ``limit``; with none live the new one holds."""

    async def sem_renew(self, name: str, lease_id: str, ttl_ms: int | None) -> SemGrant:
        """``LockStore.renew`` of a permit (same fence and slot). Raises ``LeaseLost``."""

    async def sem_release(self, name: str, lease_id: str) -> None:
        """End a live permit and notify ``sem_key(name)``. Raises ``LeaseLost``."""

    async def sem_get(self, name: str) -> SemState:
        """The semaphore's limit, last fence and live permits (unknown: limit 0, fence 0)."""


@runtime_checkable
class ElectionStore(StoreCore, Protocol):
    """Elections: the leader is the live EXCLUSIVE lease of lock ``name`` (the lock's fence
    sequence), plus a value, a pending handover and a change log. Every write notifies
    ``name``."""

    async def elect_campaign(
        self, name: str, *, lease_id: str, ttl_ms: int, owner: str, client_id: str | None,
        value: str
    ) -> Grant | Holder:
        """``LockStore.acquire(name, mode=EXCLUSIVE)`` that, when it grants a NEW lease, also
        sets the value, clears any handover and appends a ``"leader"`` entry, in one atomic
        step. A ``client_id`` retry returns only that client_id's live leadership (a lease a
        campaign granted): its shared lease or a lock route's lease raises
        ``ClientIdConflict``, nothing changed."""

    async def elect_renew(self, name: str, lease_id: str,
                          ttl_ms: int | None) -> tuple[Grant, str | None]:
        """``LockStore.renew`` of the leader's lease (only an exclusive lease of ``name``),
        with the pending handover target (``None``: none). Raises ``LeaseLost``."""

    async def elect_resign(self, name: str, lease_id: str) -> None:
        """Release the leader's lease (a clean release), append ``"resign"``, clear the value
        and handover, atomically. Raises ``LeaseLost``."""

    async def elect_proclaim(self, name: str, lease_id: str, value: str) -> ElectionState:
        """Set the live leader's value (same lease and fence), append ``"proclaim"``. Raises
        ``LeaseLost`` unless ``lease_id`` leads."""

    async def elect_handover(self, name: str, target: str) -> ElectionState:
        """Record a handover request (``target``: an owner, or ``"next"``) for the current
        leader's next renewal. Raises ``LeaseLost`` when nobody leads."""

    async def elect_get(self, name: str) -> ElectionState:
        """The election now (unknown: no leader, fence 0, seq 0)."""

    async def elect_log(self, name: str, after: int, limit: int) -> list[ElectionEvent]:
        """Up to ``limit`` log entries with ``seq > after``, in seq order. At least the last
        1,000 entries of each election are kept; a caller sees a gap from the first ``seq``."""


@runtime_checkable
class Store(LockStore, SemaphoreStore, ElectionStore, Protocol):
    """Every primitive's store: what lockd opens (``lockd.server.store.open_store``)."""
