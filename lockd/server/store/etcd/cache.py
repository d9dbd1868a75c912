"""The etcd store's per-process lease cache: lockd lease id → (lock, etcd lease, TTL, fence, owner).

With it a renew is ONE etcd call (a keep-alive of the etcd lease) and a release is ONE (a revoke
of it) instead of a read of the lock key first. Safe because of an invariant the store keeps,
not the cache's freshness: an etcd lease that ever held a lease's lock key is used for nothing
else and is revoked before any operation that takes the key off it answers, so a stale entry
points at a dead etcd lease and its keep-alive or revoke fails (the store then reads the key).
Entries are only hints; nothing a client sends is cached.

Bounded: at most ``size`` entries (default ``DEFAULT_SIZE``, ~7 MB at most), least recently
used evicted first; ``size`` 0 disables the cache. See docs/stores/etcd.md ("The lease cache").
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

__all__ = ["CachedLease", "LeaseCache", "DEFAULT_SIZE"]

DEFAULT_SIZE = 16384


class CachedLease(NamedTuple):
    """What this process knows of a live lease (see the module docstring)."""

    lock: str
    etcd_lease: int
    ttl_ms: int  # the TTL asked for, in ms: what a renew without one keeps
    fence: int
    owner: str
    mode: str = "exclusive"  # the lease's lock mode (a permit's: "exclusive")
    slot: int = -1  # a semaphore permit's slot (``lock`` is then ``#sem/<name>``)
    limit: int = 0  # a semaphore permit's limit


class LeaseCache:
    """An LRU map lease id → ``CachedLease`` of at most ``size`` entries (0: stores nothing)."""

    __slots__ = ("_entries", "_size")

    def __init__(self, size: int = DEFAULT_SIZE):
        if size < 0:
            raise ValueError("lease cache size must be >= 0")
        self._entries: OrderedDict[str, CachedLease] = OrderedDict()
        self._size = size

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, lease_id: str, lock: str) -> CachedLease | None:
        """The entry for ``lease_id`` if it is for ``lock`` (marked as recently used)."""
        entry = self._entries.get(lease_id)
        if entry is None or entry.lock != lock:
            return None
        self._entries.move_to_end(lease_id)
        return entry

    def put(self, lease_id: str, entry: CachedLease) -> None:
        """Remember ``entry`` (replacing any older one), evicting the least recently used."""
        if self._size == 0:
            return
        self._entries[lease_id] = entry
        self._entries.move_to_end(lease_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def drop(self, lease_id: str, etcd_lease: int | None = None) -> None:
        """Forget ``lease_id`` (only if it still points at ``etcd_lease``, when given: a newer
        entry written meanwhile by a concurrent renew of the same lease stays)."""
        entry = self._entries.get(lease_id)
        if entry is not None and (etcd_lease is None or entry.etcd_lease == etcd_lease):
            del self._entries[lease_id]
