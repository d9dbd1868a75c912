"""The lock service: single locks in two modes, multi-lock leases, reads, force-release.

It checks each request, hands it to the core's wait queues as a single lock or a set of locks
(``_OneLock``, ``_LockSet``: the store call and the shape of a 409 for each; docs/waiting.md)
and turns the store's grant into a lease with the core signer's token.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

from lockd.common.names import is_lock_name
from lockd.server.core.base import Core, new_lease_id
from lockd.server.core.names import check_name, check_prefix
from lockd.server.core.waiting import Waiter, mode_of
from lockd.server.errors import InvalidRequest, LeaseLost, LockHeld
from lockd.server.store.values import (
    EXCLUSIVE,
    MULTI_PREFIX,
    SHARED,
    SHARED_PREFIX,
    Grant,
    Holder,
    LockState,
    MultiGrant,
)
from lockd.tokens import MAX_LOCKS, MAX_TOKEN_CHARS, multi_token_fits

__all__ = ["LIST_LIMIT_MAX", "Lease", "LockService", "MultiLease", "decode_cursor",
           "encode_cursor"]

LIST_LIMIT_MAX = 1000
MODES = (EXCLUSIVE, SHARED)


def encode_cursor(last_name: str) -> str:
    """The opaque ``next_cursor`` for a page that ended at ``last_name``."""
    return base64.urlsafe_b64encode(last_name.encode()).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> str:
    """The last name of the previous page; ``InvalidRequest`` if ``cursor`` is not one of ours."""
    try:
        name = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("cursor is not valid; pass back next_cursor unchanged") from exc
    if not is_lock_name(name):
        raise InvalidRequest("cursor is not valid; pass back next_cursor unchanged")
    return name


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted or renewed lease, as the API returns it (``ttl_ms``: time left)."""

    lock: str
    lease_id: str
    fence: int
    token: str
    ttl_ms: int
    owner: str
    mode: str = EXCLUSIVE

    def body(self) -> dict[str, Any]:
        return {"lock": self.lock, "lease_id": self.lease_id, "fence": self.fence,
                "token": self.token, "ttl_ms": self.ttl_ms, "owner": self.owner,
                "mode": self.mode}


@dataclass(frozen=True, slots=True)
class MultiLease:
    """A granted or renewed multi-lock lease (``fences``: name -> fence, in name order;
    ``modes``: name -> mode, every lock)."""

    lease_id: str
    fences: dict[str, int]
    token: str
    ttl_ms: int
    owner: str
    modes: dict[str, str]

    def body(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id,
                "locks": [{"lock": name, "fence": fence, "mode": self.modes[name]}
                          for name, fence in self.fences.items()],
                "modes": self.modes, "token": self.token, "ttl_ms": self.ttl_ms,
                "owner": self.owner}


def _held(lock: str, owner: str, ttl_ms: int, mode: str | None = EXCLUSIVE,
          detail: str | None = None) -> LockHeld:
    """409 for one lock and its holder (``mode``: the blocking lease's)."""
    return LockHeld(
        detail or f"lock {lock!r} is held by {owner!r} for another {ttl_ms} ms"
        + (" (shared)" if mode == SHARED else ""),
        lock=lock, owner=owner, ttl_ms=max(0, ttl_ms), mode=mode,
    )


def _held_many(holders: list[Holder], detail: str | None = None) -> LockHeld:
    """409 naming every held lock and its holder (``ttl_ms``: the soonest expiry)."""
    listed = ", ".join(f"{h.lock!r} by {h.owner!r} for {max(0, h.ttl_ms)} ms" for h in holders)
    ttl = min((max(0, h.ttl_ms) for h in holders), default=0)
    return LockHeld(
        detail or f"held: {listed}",
        held=[{"lock": h.lock, "owner": h.owner, "ttl_ms": max(0, h.ttl_ms), "mode": h.mode}
              for h in holders],
        ttl_ms=ttl,
    )


class _OneLock:
    """A single-lock acquire as the wait queues ask it (``waiting.Kind``; the set of one)."""

    __slots__ = ("_service",)

    def __init__(self, service: LockService) -> None:
        self._service = service

    async def ask(self, waiter: Waiter) -> Grant | list[Holder]:
        lock = waiter.locks[0]
        result = await self._service.store.acquire(
            lock, lease_id=waiter.lease_id, ttl_ms=waiter.ttl_ms,
            owner=waiter.owner, client_id=waiter.client_id, mode=mode_of(waiter, lock))
        return [result] if isinstance(result, Holder) else result

    async def release(self, grant: Grant) -> None:
        await self._service.release(grant.lock, grant.lease_id)

    @staticmethod
    def holder(grant: Grant, lock: str) -> Holder:
        return Holder(lock, grant.owner, grant.ttl_ms, grant.fence, grant.mode)

    @staticmethod
    def refused(holders: list[Holder]) -> LockHeld:
        holder = holders[0]
        return _held(holder.lock, holder.owner, holder.ttl_ms, holder.mode)

    async def held_behind_queue(self, locks: tuple[str, ...], waited: bool) -> LockHeld:
        (name,) = locks
        state = await self._service.store.get(name)
        if waited:
            return _held(name, state.owner or "", state.ttl_ms, state.mode)
        return _held(
            name, state.owner or "", state.ttl_ms, state.mode,
            f"lock {name!r} is held or being handed over; "
            f"{self._service.waiters(name)} waiter(s) are queued ahead",
        )


class _LockSet:
    """A multi-lock acquire as the wait queues ask it (``waiting.Kind``): all locks in one
    atomic store step, or none."""

    __slots__ = ("_service",)

    def __init__(self, service: LockService) -> None:
        self._service = service

    def ask(self, waiter: Waiter) -> Awaitable[MultiGrant | list[Holder]]:
        mode = waiter.mode
        return self._service.store.acquire_many(
            waiter.locks, lease_id=waiter.lease_id, ttl_ms=waiter.ttl_ms, owner=waiter.owner,
            client_id=waiter.client_id, modes=None if isinstance(mode, str) else mode)

    async def release(self, grant: MultiGrant) -> None:
        await self._service.release_many(grant.lease_id)

    @staticmethod
    def holder(grant: MultiGrant, lock: str) -> Holder:
        mode = grant.modes.get(lock, EXCLUSIVE) if grant.modes else EXCLUSIVE
        return Holder(lock, grant.owner, grant.ttl_ms, grant.fences[lock], mode)

    @staticmethod
    def refused(holders: list[Holder]) -> LockHeld:
        return _held_many(holders)

    async def held_behind_queue(self, locks: tuple[str, ...], waited: bool) -> LockHeld:
        service = self._service
        holders = []
        for name in locks:
            state = await service.store.get(name)
            if state.held:
                holders.append(Holder(name, state.owner or "", state.ttl_ms, state.fence,
                                      state.mode or EXCLUSIVE))
        queued = sorted(n for n in locks if service.waiters(n))
        detail = (f"locks {', '.join(queued)} have waiters queued ahead"
                  + ("; held: " + ", ".join(f"{h.lock!r} by {h.owner!r}" for h in holders)
                     if holders else ""))
        return _held_many(holders, detail)


class LockService:
    """Locks on ``core``, independent of HTTP. Durations are integer milliseconds. Raises
    ``InvalidRequest`` (bad name/TTL/wait/cursor), ``LockHeld``, ``LeaseLost``,
    ``ClientIdConflict`` and ``StoreUnavailable``."""

    def __init__(self, core: Core):
        self.core = core
        self.store = core.store
        self._signer = core.signer
        self._waiting = core.waiting
        self._queues = self._waiting.queues  # read by the single-lock fast path
        self._may_be_free = self._waiting.may_be_free
        self._one_lock = _OneLock(self)
        self._lock_set = _LockSet(self)
        self._ordered = core.ordered
        self._check_ttl = core.check_ttl
        self._check_wait = core.check_wait

    # --- checks ---------------------------------------------------------------------------------

    check_name = staticmethod(check_name)

    @staticmethod
    def _check_mode(mode: str) -> None:
        if mode not in MODES:
            raise InvalidRequest(f"mode must be 'exclusive' or 'shared' (got {mode[:40]!r})")

    # --- leases ---------------------------------------------------------------------------------

    def _lease(self, grant: Grant) -> Lease:
        mode = grant.mode
        return Lease(grant.lock, grant.lease_id, grant.fence,
                     self._signer.token(grant.lock, grant.fence, mode), grant.ttl_ms,
                     grant.owner, mode)

    async def acquire(self, name: str, *, ttl_ms: int, wait_ms: int = 0, owner: str = "",
                      client_id: str | None = None, mode: str = EXCLUSIVE) -> Lease:
        """Grant ``name`` for ``ttl_ms`` in ``mode`` (EXCLUSIVE or SHARED), waiting up to
        ``wait_ms`` behind earlier waiters (a waiting exclusive request blocks later shared ones).

        Raises ``LockHeld`` if not granted in time, ``StoreUnavailable``, ``InvalidRequest``.
        """
        self.check_name(name)
        self._check_ttl(ttl_ms)
        self._check_wait(wait_ms)
        if mode is not EXCLUSIVE:
            self._check_mode(mode)
        lease_id = (SHARED_PREFIX if mode == SHARED else "") + new_lease_id()
        if (wait_ms == 0 or self._waiting.closing) and not self._queues.get(name):
            # Nobody queued and no wait: one store call (the queues' rule 1, inline).
            result = await self.store.acquire(
                name, lease_id=lease_id, ttl_ms=ttl_ms, owner=owner, client_id=client_id,
                mode=mode)
            if isinstance(result, Grant):
                return self._lease(result)
            raise _held(name, result.owner, result.ttl_ms, result.mode)
        waiter = Waiter((name,), lease_id, ttl_ms, owner, client_id, mode)
        return self._lease(await self._waiting.acquire(self._one_lock, waiter, wait_ms))

    async def renew(self, name: str, lease_id: str, ttl_ms: int | None = None) -> Lease:
        """Extend a live lease to ``ttl_ms`` from now (``None``: the lease's own TTL, the last
        one it was granted or renewed with).

        Same fence (and token). Raises ``LeaseLost`` if the lease is not live.
        """
        self.check_name(name)
        self.check_renewal(lease_id, ttl_ms)
        return self._lease(await self.store.renew(name, lease_id, ttl_ms))

    def check_renewal(self, lease_id: str, ttl_ms: int | None) -> None:
        """What ``renew`` checks of its arguments: ``InvalidRequest`` for a multi-lock lease's
        id or a TTL out of bounds."""
        self._check_single(lease_id)
        if ttl_ms is not None:
            self._check_ttl(ttl_ms)

    async def release(self, name: str, lease_id: str) -> None:
        """End a live lease and hand the lock to the head waiter at once. Raises ``LeaseLost``.

        On a store whose operations apply in call order (``ordered``: SQLite) the head is woken
        before the release is sent: it runs only once this task waits for the store, so its
        acquire is queued right behind the release, often into the same transaction (one fsync
        per handoff, not two). If the release fails, the head's acquire just finds the lock held
        and sleeps again: the store still decides every grant."""
        self.check_name(name)
        self._check_single(lease_id)
        released = self.store.release(name, lease_id)
        if self._ordered:
            self._may_be_free(name)
        await released
        self._may_be_free(name)

    @staticmethod
    def _check_single(lease_id: str) -> None:
        if lease_id.startswith(MULTI_PREFIX):
            raise InvalidRequest("lease_id is a multi-lock lease's: renew or release the whole set"
                                 " with POST /v1/leases/renew or /v1/leases/release")

    # --- multi-lock leases ----------------------------------------------------------------------

    def check_names(self, names: list[str]) -> tuple[str, ...]:
        """The distinct lock names of a multi-lock acquire, in name order (the order every
        store locks them in). ``InvalidRequest`` for none, more than ``MAX_LOCKS``, a bad name
        or a duplicate."""
        if not 1 <= len(names) <= MAX_LOCKS:
            raise InvalidRequest(f"locks must list 1 to {MAX_LOCKS} lock names (got {len(names)})")
        for name in names:
            self.check_name(name)
        ordered = tuple(sorted(set(names)))
        if len(ordered) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise InvalidRequest(f"locks must be distinct; repeated: {', '.join(dupes)}",
                                 locks=dupes)
        if not multi_token_fits(ordered):
            raise InvalidRequest(
                f"the lock names are too long for one token of at most {MAX_TOKEN_CHARS} "
                "characters (it travels in one header); use shorter names or fewer locks")
        return ordered

    def _multi_lease(self, grant: MultiGrant) -> MultiLease:
        modes = {name: (grant.modes or {}).get(name, EXCLUSIVE) for name in grant.fences}
        token = self._signer.set_token(grant.lease_id, grant.fences, modes)
        return MultiLease(grant.lease_id, grant.fences, token, grant.ttl_ms, grant.owner, modes)

    def _check_modes(self, locks: tuple[str, ...],
                     modes: Mapping[str, str] | None) -> dict[str, str] | None:
        """``modes`` of a set (name -> mode; a lock not named is exclusive), or ``None`` when
        every lock is exclusive. ``InvalidRequest`` for a name not in the set or a bad mode."""
        if not modes:
            return None
        stray = sorted(set(modes) - set(locks))
        if stray:
            raise InvalidRequest(f"modes names locks not in locks: {', '.join(stray[:8])}",
                                 locks=stray[:64])
        for mode in modes.values():
            self._check_mode(mode)
        shared = tuple(name for name, mode in modes.items() if mode == SHARED)
        if not shared:
            return None
        if not multi_token_fits(locks + shared):  # the claim "shared" lists them again
            raise InvalidRequest(
                f"the lock names are too long for one token of at most {MAX_TOKEN_CHARS} "
                "characters (shared locks are listed twice); use shorter names or fewer locks")
        return {name: modes.get(name, EXCLUSIVE) for name in locks}

    async def acquire_many(self, names: list[str], *, ttl_ms: int, wait_ms: int = 0,
                           owner: str = "", client_id: str | None = None,
                           modes: Mapping[str, str] | None = None) -> MultiLease:
        """Grant every lock of ``names`` in one atomic step, each in its mode of ``modes``
        (name -> EXCLUSIVE or SHARED; missing names exclusive), waiting up to ``wait_ms``
        behind earlier waiters of any of them (``lockd.server.core.waiting``, rule 3).

        Raises ``LockHeld`` (naming every held lock), ``StoreUnavailable``, ``InvalidRequest``.
        """
        locks = self.check_names(names)
        self._check_ttl(ttl_ms)
        self._check_wait(wait_ms)
        mode = self._check_modes(locks, modes)
        waiter = Waiter(locks, MULTI_PREFIX + new_lease_id(), ttl_ms, owner, client_id,
                        mode or EXCLUSIVE)
        return self._multi_lease(await self._waiting.acquire(self._lock_set, waiter, wait_ms))

    @staticmethod
    def _check_multi(lease_id: str) -> None:
        if not lease_id.startswith(MULTI_PREFIX):
            raise LeaseLost("no live multi-lock lease with that id")

    async def renew_many(self, lease_id: str, ttl_ms: int | None = None) -> MultiLease:
        """Extend every lock of a live multi-lock lease (same fences, same token).
        Raises ``LeaseLost`` unless every lock of the set is still held by it."""
        self._check_multi(lease_id)
        if ttl_ms is not None:
            self._check_ttl(ttl_ms)
        return self._multi_lease(await self.store.renew_many(lease_id, ttl_ms))

    async def release_many(self, lease_id: str) -> None:
        """End a multi-lock lease and wake the head waiter of each of its locks at once.
        Raises ``LeaseLost``."""
        self._check_multi(lease_id)
        freed = await self.store.release_many(lease_id)
        for name in freed:
            self._may_be_free(name)

    # --- reading --------------------------------------------------------------------------------

    def waiters(self, name: str) -> int:
        """How many acquires are queued for ``name`` at this lockd process."""
        return self._waiting.count(name)

    def waiting_owners(self, name: str) -> list[str]:
        """The ``owner`` labels of the acquires queued for ``name`` at this lockd process, head
        first (``""`` for an acquire that gave none). Other replicas' waiters are not included."""
        return self._waiting.owners(name)

    async def get(self, name: str) -> tuple[LockState, int]:
        """The store's view of ``name`` and the number of local waiters."""
        self.check_name(name)
        return await self.store.get(name), self.waiters(name)

    async def list(self, prefix: str = "", limit: int = 100, cursor: str | None = None, *,
                   within: tuple[str, ...] | None = None,
                   ) -> tuple[list[tuple[LockState, int]], str | None]:
        """One page of locks whose name starts with ``prefix``, in name order, and the cursor
        of the next page (``None``: this was the last). ``within``: list these prefixes instead
        (``lockd.server.access.visible_prefixes``: disjoint, sorted; empty: nothing)."""
        check_prefix(prefix)
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidRequest(f"limit must be between 1 and {LIST_LIMIT_MAX} (got {limit})")
        after = decode_cursor(cursor) if cursor else None
        states: list[LockState] = []
        for part in (prefix,) if within is None else within:
            if after is not None and after > part and not after.startswith(part):
                continue  # this prefix's names all sort before the cursor
            states += await self.store.list(part, limit + 1 - len(states), after)
            if len(states) > limit:
                break
        more = len(states) > limit
        states = states[:limit]
        next_cursor = encode_cursor(states[-1].lock) if more else None
        return [(s, self.waiters(s.lock)) for s in states], next_cursor

    async def force_release(self, name: str) -> Holder | None:
        """An operator's override: end every live lease of ``name`` whoever holds it (the
        store notifies waiters like a release; ``LockStore.force_release``)."""
        self.check_name(name)
        return await self.store.force_release(name)
