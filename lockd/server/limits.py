"""Per-identity bounds, so one key cannot exhaust a lockd's waiters, streams or the store's rows.

``max_leases`` (``--max-leases-per-identity``, default 100 000): live leases one identity may
hold that this lockd granted; ``max_waiters`` (``--max-waiters-per-identity``, default 10 000):
acquires it may have queued (``wait_ms`` > 0) here at once. Over either, the acquire is answered
429 ``too_many_leases`` / ``too_many_waiters`` with ``Retry-After`` and counted in
``lockd_identity_limited_total{identity, limit}``. Identities are named as in
``lockd.server.access.identity_name`` (``anonymous`` without keys).

The counts are this process's: leases it granted or renewed, forgotten on their release here or
at their TTL. A lease released at another replica or force-released keeps counting until its TTL
runs out, so the count can only be high, never low: the bound holds, at worst early. Memory is
bounded by the limits (one entry per counted lease).

An acquire of any kind (lock, shared, multi-lock, permit, campaign) counts from the moment it is
accepted: ``reserve`` checks and takes a place in one step (no await between them), before the
store is asked, and the place becomes the lease when it is granted or is given back when it is
not (409, a wait that ends, a client that goes away, an error). So acquires sent at once cannot
all pass the check before any is counted; a waiting acquire holds its place while it waits.

Event streams (``StreamSlots``): every stream of this lockd, lock events and election observers
alike, holds one of ``max_event_streams`` slots while it is open, and an identity at most a
quarter of them (rounded up, at least one), so it takes four identities to fill a lockd. A lockd
that needs no key has one identity for every caller, bounded by the total only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from lockd.server.errors import TooManyLeases, TooManyWaiters

__all__ = ["STREAM_SHARE", "IdentityLimits", "Reservation", "StreamSlots"]

STREAM_SHARE = 4
"""An identity may hold at most ``1/STREAM_SHARE`` of a lockd's stream slots (rounded up)."""


class IdentityLimits:
    """Live leases and queued waiters per identity name (see the module docstring).

    ``on_limited(identity, limit)`` is called for each refusal (``limit``: ``leases`` or
    ``waiters``), for the metric. ``clock``: monotonic seconds.
    """

    def __init__(self, max_leases: int = 100_000, max_waiters: int = 10_000, *,
                 on_limited: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.max_leases = max_leases
        self.max_waiters = max_waiters
        self._on_limited = on_limited
        self._clock = clock
        self._leases: dict[str, dict[str, float]] = {}  # identity -> lease id -> expiry
        self._reserved: dict[str, int] = {}  # identity -> acquires accepted, not yet answered
        self._waiters: dict[str, int] = {}

    def check_lease(self, identity: str) -> None:
        """Raise ``TooManyLeases`` if ``identity`` holds ``max_leases`` live leases here, the
        acquires in flight counted (``reserve``) as leases."""
        held = self._leases.get(identity)
        reserved = self._reserved.get(identity, 0)
        if (0 if held is None else len(held)) + reserved < self.max_leases:
            return
        now = self._clock()
        if held is not None:
            for lease_id in [k for k, expiry in held.items() if expiry <= now]:
                del held[lease_id]
            if len(held) + reserved < self.max_leases:
                return
        self._refused(identity, "leases")
        retry = max(1, math.ceil(min(held.values()) - now)) if held else 1
        raise TooManyLeases(f"identity {identity!r} holds {len(held or ())} live leases and "
                            f"has {reserved} acquires in flight, its limit "
                            f"(--max-leases-per-identity); release some or retry later",
                            identity=identity, limit=self.max_leases, retry_after_s=retry)

    def reserve(self, identity: str) -> Reservation:
        """Take a lease's place for an acquire of ``identity`` before the store is asked (see
        the module docstring); ``TooManyLeases`` if it has none left. The acquire's answer
        must end it: ``Reservation.granted`` or ``Reservation.cancel``."""
        self.check_lease(identity)
        self._reserved[identity] = self._reserved.get(identity, 0) + 1
        return Reservation(self, identity)

    def _unreserve(self, identity: str) -> None:
        left = self._reserved.get(identity, 1) - 1
        if left > 0:
            self._reserved[identity] = left
        else:
            self._reserved.pop(identity, None)

    def held(self, identity: str, lease_id: str, ttl_ms: int) -> None:
        """A lease of ``identity`` was granted or renewed: it counts until ``ttl_ms`` from now."""
        leases = self._leases.get(identity)
        if leases is None:
            leases = self._leases[identity] = {}
        leases[lease_id] = self._clock() + ttl_ms / 1000

    def released(self, identity: str, lease_id: str) -> None:
        """A lease of ``identity`` ended (released here)."""
        leases = self._leases.get(identity)
        if leases is not None:
            leases.pop(lease_id, None)

    def leases(self, identity: str) -> int:
        """How many leases ``identity`` is counted for (live or not yet forgotten, and the
        acquires in flight)."""
        return len(self._leases.get(identity, ())) + self._reserved.get(identity, 0)

    def enter_wait(self, identity: str) -> None:
        """Count one queued acquire of ``identity`` (pair with ``leave_wait``);
        ``TooManyWaiters`` if it has ``max_waiters`` already."""
        count = self._waiters.get(identity, 0)
        if count >= self.max_waiters:
            self._refused(identity, "waiters")
            raise TooManyWaiters(f"identity {identity!r} has {count} acquires waiting, its limit "
                                 f"(--max-waiters-per-identity); retry later",
                                 identity=identity, limit=self.max_waiters, retry_after_s=1)
        self._waiters[identity] = count + 1

    def leave_wait(self, identity: str) -> None:
        """One queued acquire of ``identity`` was answered or gave up."""
        left = self._waiters.get(identity, 1) - 1
        if left > 0:
            self._waiters[identity] = left
        else:
            self._waiters.pop(identity, None)

    def waiters(self, identity: str) -> int:
        """How many acquires of ``identity`` are queued here."""
        return self._waiters.get(identity, 0)

    def _refused(self, identity: str, limit: str) -> None:
        if self._on_limited is not None:
            self._on_limited(identity, limit)


class Reservation:
    """One acquire's place among its identity's leases (``IdentityLimits.reserve``); ended
    once, by ``granted`` or ``cancel`` (a second end is a no-op, so ``cancel`` may follow a
    grant in a ``finally``)."""

    __slots__ = ("_limits", "_identity", "_open")

    def __init__(self, limits: IdentityLimits, identity: str) -> None:
        self._limits, self._identity, self._open = limits, identity, True

    def granted(self, lease_id: str, ttl_ms: int) -> None:
        """The acquire was granted lease ``lease_id``: it counts in the place reserved (a
        client_id retry's lease, counted already, frees it)."""
        self.cancel()
        self._limits.held(self._identity, lease_id, ttl_ms)

    def cancel(self) -> None:
        """The acquire was not granted: give its place back."""
        if self._open:
            self._open = False
            self._limits._unreserve(self._identity)


class StreamSlots:
    """The open event streams of this lockd, ``total`` at most, ``share`` (``total`` /
    ``STREAM_SHARE``, rounded up, at least 1) per identity (see the module docstring).
    ``take`` checks and takes a slot in one step; ``give_back`` returns it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.share = max(1, math.ceil(total / STREAM_SHARE))
        self.open = 0
        self._held: dict[str, int] = {}

    def take(self, identity: str | None) -> str | None:
        """Take a slot for a stream of ``identity`` (``None``: a lockd without keys, where the
        total alone bounds). Returns ``None`` when taken, else why not: ``"total"`` (every slot
        is taken) or ``"identity"`` (the identity holds its share)."""
        if self.open >= self.total:
            return "total"
        if identity is not None:
            held = self._held.get(identity, 0)
            if held >= self.share:
                return "identity"
            self._held[identity] = held + 1
        self.open += 1
        return None

    def give_back(self, identity: str | None) -> None:
        """A stream of ``identity`` that ``take`` let in has ended."""
        self.open -= 1
        if identity is not None:
            left = self._held.get(identity, 1) - 1
            if left > 0:
                self._held[identity] = left
            else:
                self._held.pop(identity, None)

    def held(self, identity: str) -> int:
        """The streams ``identity`` has open."""
        return self._held.get(identity, 0)
