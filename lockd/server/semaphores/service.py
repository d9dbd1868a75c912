"""Counting semaphores: ``limit`` permits, each a lease of a slot ``0 .. limit-1`` whose token
fences the lock ``sem/{name}/{slot}`` (the semaphores' own names in the one namespace). The
store counts the permits; waiters queue in the semaphore's one queue, ``sem_key(name)``, in mode
``PERMIT`` (docs/primitives.md, "Semaphores"; docs/waiting.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockd.common.namespace import SEMAPHORE, token_lock
from lockd.server.core.base import Core, new_lease_id
from lockd.server.core.names import check_name
from lockd.server.core.waiting import PERMIT, Waiter
from lockd.server.errors import InvalidRequest, LockHeld
from lockd.server.store.values import SEM_KEY_PREFIX, Holder, SemFull, SemGrant, SemState, sem_key

__all__ = ["LIMIT_MAX", "PermitLease", "SemaphoreService", "slot_lock"]

LIMIT_MAX = 10_000
"""The most permits a semaphore may have."""


def slot_lock(name: str, slot: int) -> str:
    """The lock name a permit's token fences: ``sem/{name}/{slot}`` (``SEMAPHORE``'s row)."""
    return token_lock(SEMAPHORE, name, slot)


@dataclass(frozen=True, slots=True)
class PermitLease:
    """A granted or renewed permit, as the API returns it (``ttl_ms``: time left)."""

    semaphore: str
    lease_id: str
    fence: int
    slot: int
    limit: int
    token: str
    ttl_ms: int
    owner: str

    def body(self) -> dict[str, Any]:
        return {"semaphore": self.semaphore, "lock": slot_lock(self.semaphore, self.slot),
                "lease_id": self.lease_id, "fence": self.fence, "slot": self.slot,
                "limit": self.limit, "token": self.token, "ttl_ms": self.ttl_ms,
                "owner": self.owner}


def _full(name: str, full: SemFull, detail: str | None = None) -> LockHeld:
    """409 ``held``: every permit is taken (``ttl_ms``: until the soonest one expires)."""
    ttl = max(0, full.ttl_ms)
    return LockHeld(
        detail or f"semaphore {name!r} has all {full.limit} permit(s) taken; the soonest "
        f"expires in {ttl} ms",
        semaphore=name, limit=full.limit, owners=list(full.owners), ttl_ms=ttl)


class _Permit:
    """A permit acquire as the wait queues ask it (``waiting.Kind``)."""

    __slots__ = ("_semaphores",)

    def __init__(self, semaphores: SemaphoreService) -> None:
        self._semaphores = semaphores

    async def ask(self, waiter: Waiter) -> SemGrant | list[SemFull]:
        name = waiter.locks[0][len(SEM_KEY_PREFIX):]
        result = await self._semaphores.store.sem_acquire(
            name, limit=waiter.limit, lease_id=waiter.lease_id, ttl_ms=waiter.ttl_ms,
            owner=waiter.owner, client_id=waiter.client_id)
        return [result] if isinstance(result, SemFull) else result

    async def release(self, grant: SemGrant) -> None:
        await self._semaphores.release(grant.name, grant.lease_id)

    @staticmethod
    def holder(grant: SemGrant, lock: str) -> Holder:  # never a hint (a permit refuses nobody)
        return Holder(lock, grant.owner, grant.ttl_ms, grant.fence, PERMIT)

    @staticmethod
    def refused(holders: list[SemFull]) -> LockHeld:
        return _full(holders[0].name, holders[0])

    async def held_behind_queue(self, locks: tuple[str, ...], waited: bool) -> LockHeld:
        name = locks[0][len(SEM_KEY_PREFIX):]
        semaphores = self._semaphores
        state = await semaphores.store.sem_get(name)
        soonest = min((p.ttl_ms for p in state.permits), default=0)
        full = SemFull(name, state.limit, soonest, tuple(p.owner for p in state.permits))
        if waited:
            return _full(name, full)
        return _full(name, full, f"semaphore {name!r} has {semaphores.waiters(name)} waiter(s) "
                                 f"queued ahead; {len(state.permits)} of {state.limit} permit(s)"
                                 " are taken")


class SemaphoreService:
    """Semaphores on ``core``. Durations in milliseconds. Raises ``InvalidRequest`` (bad name,
    limit, TTL or wait), ``LockHeld`` (409 ``held``: every permit taken; ``limit``, ``owners``,
    ``ttl_ms`` of the soonest expiry), ``LimitMismatch``, ``LeaseLost``, ``StoreUnavailable``."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store
        self._waiting = core.waiting
        self._kind = _Permit(self)

    # --- checks ---------------------------------------------------------------------------------

    @staticmethod
    def check_name(name: str, limit: int = 1) -> None:
        """``InvalidRequest`` unless ``name`` is a lock name whose last slot's lock name
        (``sem/{name}/{limit-1}``) is one too (at most 255 characters): the namespace's rule
        (``lockd.server.core.names.check_name``)."""
        check_name(name, SEMAPHORE, limit)

    @staticmethod
    def check_limit(limit: int) -> None:
        if not 1 <= limit <= LIMIT_MAX:
            raise InvalidRequest(f"limit must be between 1 and {LIMIT_MAX} (got {limit})")

    def _permit(self, grant: SemGrant) -> PermitLease:
        token = self.core.signer.token(slot_lock(grant.name, grant.slot), grant.fence,
                                       primitive=SEMAPHORE)
        return PermitLease(grant.name, grant.lease_id, grant.fence, grant.slot, grant.limit,
                           token, grant.ttl_ms, grant.owner)

    # --- permits --------------------------------------------------------------------------------

    async def acquire(self, name: str, *, limit: int, ttl_ms: int, wait_ms: int = 0,
                      owner: str = "", client_id: str | None = None) -> PermitLease:
        """One permit of ``name`` (created with ``limit`` if no permit is live), waiting up to
        ``wait_ms`` behind earlier waiters. Raises ``LockHeld``, ``LimitMismatch``,
        ``StoreUnavailable``, ``InvalidRequest``."""
        self.check_limit(limit)
        self.check_name(name, limit)
        self.core.check_ttl(ttl_ms)
        self.core.check_wait(wait_ms)
        waiter = Waiter((sem_key(name),), new_lease_id(), ttl_ms, owner, client_id, PERMIT,
                        limit)
        return self._permit(await self._waiting.acquire(self._kind, waiter, wait_ms))

    async def renew(self, name: str, lease_id: str, ttl_ms: int | None = None) -> PermitLease:
        """Extend a live permit (same fence, slot and token; ``None``: its own TTL).
        Raises ``LeaseLost``."""
        self.check_name(name)
        if ttl_ms is not None:
            self.core.check_ttl(ttl_ms)
        return self._permit(await self.store.sem_renew(name, lease_id, ttl_ms))

    async def release(self, name: str, lease_id: str) -> None:
        """End a live permit. Raises ``LeaseLost``. The store's notification (``sem_key(name)``,
        here and at every replica) wakes ONE waiter for the freed permit; waking one here too
        would let a later waiter race the head for it."""
        self.check_name(name)
        await self.store.sem_release(name, lease_id)

    # --- reading --------------------------------------------------------------------------------

    def waiters(self, name: str) -> int:
        """How many permit acquires are queued for ``name`` at this lockd process."""
        return self._waiting.count(sem_key(name))

    def waiting_owners(self, name: str) -> list[str]:
        """Their ``owner`` labels, head first (other replicas' waiters not included)."""
        return self._waiting.owners(sem_key(name))

    async def get(self, name: str) -> SemState:
        """The store's view of ``name`` (limit 0 and no permits: never created or all gone)."""
        self.check_name(name)
        return await self.store.sem_get(name)
