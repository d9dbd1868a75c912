"""The Python client side of lockd: it talks to lockd and the proxy over HTTP only.

::

    wire.py      the HTTP contract from the client's side: units, paths, names, lease bodies
    lease.py     Lease / AsyncLease (and multi-lock kinds), their states; LeaseRef, LockStatus
    core.py      every client rule that does no I/O (acquire retries, renewal timing, release)
    lock.py      Lock / AsyncLock: the reusable lock object ``client.lock(name, ttl)`` returns
                 (``shared=True``: a shared, read lease)
    permits.py   PermitLease / AsyncPermitLease, SemaphoreStatus: semaphore permits as leases
    leadership.py  LeaderLease / AsyncLeaderLease (with the handover rule), ElectionStatus,
                 ElectionEvent
    primitives.py  the I/O-free rules of semaphores and elections (routes, proclaim, observe)
    semaphore.py Semaphore / AsyncSemaphore: ``client.semaphore(name, limit, ttl)``
    election.py  Election / AsyncElection: ``client.election(name, value=...)``
    sync.py      LockClient (threads): only the I/O of the rules in core.py
    aio.py       AsyncLockClient (asyncio): the same, with ``await``
    fenced.py    FencedSession / AsyncFencedSession: fenced reads and writes through the proxy
    errors.py    the client error tree (LockClientError ...), mapped from problem details
    durations.py "500ms", "30s", "2m" for the command line
    lockctl.py   the ``lockctl`` command (lockctl_more.py: its sem, elect, leader, observe;
                 lockctl_common.py: what both share)

Nothing here imports ``lockd.server`` (a wall checked by ``tests/test_layout.py``). The imports
run one way, ``wire`` <- ``lease`` <- ``permits``, ``leadership`` <- ``core`` <- ``primitives``,
``lock`` <- ``semaphore``, ``election`` <- ``sync``, ``aio``; only this package module imports the
two clients (a lease or a ``Lock`` knows its client by a Protocol).
"""

import logging

from lockd.client.aio import AsyncLockClient
from lockd.client.election import AsyncElection, Election
from lockd.client.leadership import AsyncLeaderLease, ElectionEvent, ElectionStatus, LeaderLease
from lockd.client.lease import (
    AsyncLease,
    AsyncMultiLease,
    HolderInfo,
    Lease,
    LeaseRef,
    LeaseState,
    LockStatus,
    MultiLease,
)
from lockd.client.lock import AsyncLock, Lock
from lockd.client.permits import AsyncPermitLease, PermitInfo, PermitLease, SemaphoreStatus
from lockd.client.semaphore import AsyncSemaphore, Semaphore
from lockd.client.sync import LockClient
from lockd.client.wire import DEFAULT_URL, MAX_WAIT

# a library: silent unless the program configures logging
logging.getLogger("lockd.client").addHandler(logging.NullHandler())

__all__ = [
    "DEFAULT_URL",
    "MAX_WAIT",
    "LeaseState",
    "LeaseRef",
    "LockStatus",
    "Lease",
    "AsyncLease",
    "MultiLease",
    "AsyncMultiLease",
    "LockClient",
    "AsyncLockClient",
    "Lock",
    "AsyncLock",
    "HolderInfo",
    "PermitLease",
    "AsyncPermitLease",
    "PermitInfo",
    "SemaphoreStatus",
    "Semaphore",
    "AsyncSemaphore",
    "LeaderLease",
    "AsyncLeaderLease",
    "ElectionStatus",
    "ElectionEvent",
    "Election",
    "AsyncElection",
]
